"""Sparsity reports: how much of each tensor, and of all of them, is pruned.

:func:`sparsity_report` reads a dict of masks, or a module that
``torch.nn.utils.prune`` (or ``funcprune.compat``) left in hook mode, and
returns a frozen :class:`SparsityReport` whose ``str()`` is an aligned table
like the figures of the pruning tutorial. It reads tensor values, so it runs
in eager mode, outside ``torch.func`` transforms and ``torch.compile``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import final

import torch
from torch import nn

from ._names import check_masks, check_params, unknown_name
from ._types import Params
from ._validate import non_binary

Tensor = torch.Tensor

__all__ = ["SparsityRow", "SparsityReport", "sparsity_report"]


def _percent(pruned: int, numel: int) -> float:
    return 100.0 * pruned / numel if numel else 0.0


@final
@dataclass(frozen=True, slots=True)
class SparsityRow:
    """One tensor of a :class:`SparsityReport`.

    Attributes:
        name: the parameter's name, as in ``named_parameters()``.
        shape: the tensor's shape.
        pruned: how many of its entries are pruned.
    """

    name: str
    shape: tuple[int, ...]
    pruned: int

    @property
    def numel(self) -> int:
        """The number of entries."""
        n = 1
        for size in self.shape:
            n *= size
        return n

    @property
    def fraction(self) -> float:
        """The pruned fraction in [0, 1] (0 for an empty tensor)."""
        return self.pruned / self.numel if self.numel else 0.0


@final
@dataclass(frozen=True, slots=True)
class SparsityReport:
    """Per-tensor and global pruned fractions; ``str()`` is an aligned table.

    Attributes:
        rows: one :class:`SparsityRow` per tensor, in parameter order.
    """

    rows: tuple[SparsityRow, ...]

    @property
    def pruned(self) -> int:
        """How many entries are pruned in all the tensors together."""
        return sum(row.pruned for row in self.rows)

    @property
    def numel(self) -> int:
        """How many entries the tensors hold together."""
        return sum(row.numel for row in self.rows)

    @property
    def fraction(self) -> float:
        """The global pruned fraction: pruned entries over all entries."""
        return self.pruned / self.numel if self.numel else 0.0

    @property
    def fractions(self) -> dict[str, float]:
        """The pruned fraction of each tensor, by name."""
        return {row.name: row.fraction for row in self.rows}

    def __getitem__(self, name: str) -> SparsityRow:
        for row in self.rows:
            if row.name == name:
                return row
        raise unknown_name(
            "SparsityReport", f"no row named {name!r}", name, tuple(r.name for r in self.rows)
        )

    def __str__(self) -> str:
        table = [("tensor", "shape", "pruned", "total", "sparsity")]
        for row in self.rows:
            shape = "x".join(map(str, row.shape)) or "scalar"
            table.append(
                (row.name, shape, str(row.pruned), str(row.numel), f"{100 * row.fraction:.2f}%")
            )
        table.append(
            ("global", "", str(self.pruned), str(self.numel), f"{100 * self.fraction:.2f}%")
        )
        widths = [max(len(line[i]) for line in table) for i in range(5)]
        lines = []
        for line in table:
            left = [cell.ljust(w) for cell, w in zip(line[:2], widths[:2], strict=True)]
            right = [cell.rjust(w) for cell, w in zip(line[2:], widths[2:], strict=True)]
            lines.append("  ".join(left + right).rstrip())
        return "\n".join(lines)


def _hook_masks(module: nn.Module) -> dict[str, Tensor]:
    """The ``<name>_mask`` buffers of a hook-mode module, keyed ``<name>``."""
    masks: dict[str, Tensor] = {}
    for prefix, sub in module.named_modules():
        own_params = dict(sub.named_parameters(recurse=False))
        for buffer_name, buffer in sub.named_buffers(recurse=False):
            base = buffer_name[: -len("_mask")]
            if buffer_name.endswith("_mask") and base + "_orig" in own_params:
                masks[f"{prefix}.{base}" if prefix else base] = buffer
    return masks


def _row(name: str, mask: Tensor) -> SparsityRow:
    return SparsityRow(name, tuple(mask.shape), int((mask == 0).sum()))


def sparsity_report(
    source: Mapping[str, Tensor] | nn.Module, *, params: Params | None = None
) -> SparsityReport:
    """Per-tensor and global pruned fractions of a mask dict or a module.

    Args:
        source: a dict of masks keyed by parameter name (``torch.bool``,
            or 0/1 numbers; 0 or ``False`` = pruned), or a module in hook
            mode (``<name>_orig`` parameters and ``<name>_mask`` buffers, as
            ``torch.nn.utils.prune`` leaves it), whose masks are read: one
            row per pruned tensor, module by module, in the order in which
            each module's tensors were first pruned.
        params: with a mask dict, the parameters: the report then has a row
            for every parameter (0 pruned where there is no mask), in their
            order, and masks are checked against them.

    Returns:
        A :class:`SparsityReport`; ``str(report)`` is the table.

    Raises:
        TypeError: if ``source`` is neither a mapping of tensors nor a
            module, or ``params`` is given with a module.
        UnknownNameError: if ``params`` is given and a mask names none of
            them.

    >>> import torch, funcprune as fp
    >>> masks = {"conv1.weight": torch.tensor([[True, False], [True, True]]),
    ...          "fc1.weight": torch.tensor([False, False, True, True, True, True])}
    >>> report = fp.sparsity_report(masks)
    >>> print(report)
    tensor        shape  pruned  total  sparsity
    conv1.weight  2x2         1      4    25.00%
    fc1.weight    6           2      6    33.33%
    global                    3     10    30.00%
    >>> report.fraction, report["fc1.weight"].pruned
    (0.3, 2)
    """
    if isinstance(source, nn.Module):
        if params is not None:
            raise TypeError("sparsity_report: params= goes with a mask dict, not a module")
        masks = _hook_masks(source)
        return SparsityReport(tuple(_row(name, mask) for name, mask in masks.items()))
    if not isinstance(source, Mapping):
        kind = type(source).__name__
        raise TypeError(f"sparsity_report: source must be a dict of masks or a module, got {kind}")
    if params is None:
        for name, mask in source.items():
            if not isinstance(mask, torch.Tensor):
                raise TypeError(
                    f"sparsity_report: the mask for {name!r} must be a tensor, got {mask!r}"
                )
            bad = non_binary(mask, 3)
            if bad:
                raise ValueError(
                    f"sparsity_report: the mask for {name!r} must hold only 0 and 1 (or be "
                    f"torch.bool), got values such as {bad}"
                )
        return SparsityReport(tuple(_row(name, mask) for name, mask in source.items()))
    check_params("sparsity_report", params)
    checked = check_masks("sparsity_report", params, source)
    return SparsityReport(
        tuple(
            _row(name, checked.get(name, torch.ones_like(p, dtype=torch.bool)))
            for name, p in params.items()
        )
    )
