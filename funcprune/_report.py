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
import torch.nn.utils.prune as torch_prune
from torch import nn

from ._dtensor import refuse_in
from ._names import check_masks, check_params, unknown_name
from ._types import Params
from ._validate import non_binary

Tensor = torch.Tensor

__all__ = ["SparsityRow", "SparsityReport", "sparsity_report"]


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


def _refuse_hook_mode(module: nn.Module) -> None:
    """Raise if a pruning hook (torch's or compat's) recomputes a tensor of ``module``."""
    for prefix, submodule in module.named_modules():
        for hook in submodule._forward_pre_hooks.values():
            if isinstance(hook, torch_prune.BasePruningMethod):
                name = getattr(hook, "_tensor_name", "?")
                raise ValueError(
                    f"sparsity_report: the module is in hook mode: "
                    f"{f'{prefix}.{name}' if prefix else name!r} has a pruning hook "
                    f"({type(hook).__name__}), so its parameters hold the unpruned values. "
                    "Report its masks instead: "
                    "fp.sparsity_report(funcprune.compat.masks_from_module(module))"
                )


def _row(name: str, mask: Tensor) -> SparsityRow:
    return SparsityRow(name, tuple(mask.shape), int((mask == 0).sum()))


def _checked_row(name: str, mask: object) -> SparsityRow:
    """The row of a mask given without parameters, checked to be a 0/1 tensor."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"sparsity_report: the mask for {name!r} must be a tensor, got {mask!r}")
    bad = non_binary(mask, 3)
    if bad:
        raise ValueError(
            f"sparsity_report: the mask for {name!r} must hold only 0 and 1 (or be "
            f"torch.bool), got values such as {bad}"
        )
    return _row(name, mask)


def sparsity_report(
    source: Mapping[str, Tensor] | nn.Module, *, params: Params | None = None
) -> SparsityReport:
    """Per-tensor and global pruned fractions of a mask dict or a module.

    Args:
        source: a dict of masks keyed by parameter name (``torch.bool``,
            or 0/1 numbers; 0 or ``False`` = pruned), or a plain module (no
            pruning hooks), whose parameters are read: one row per entry of
            ``named_parameters()``, counting the exact zeros of its values
            (pruning baked in, as after ``funcprune.compat.remove`` or
            :func:`funcprune.apply_masks_`). For a module in hook mode pass
            ``funcprune.compat.masks_from_module(module)``.
        params: with a mask dict, the parameters: the report then has a row
            for every parameter (0 pruned where there is no mask), in their
            order, and masks are checked against them.

    Returns:
        A :class:`SparsityReport`; ``str(report)`` is the table.

    Raises:
        TypeError: if ``source`` is neither a mapping of tensors nor a
            module, or ``params`` is given with a module.
        ValueError: if a mask holds values other than 0 and 1, or the
            module is in hook mode (a pruning hook of ``torch.nn.utils.prune``
            or ``funcprune.compat`` on it or a submodule).
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

    A plain module reports the zeros of its parameters:

    >>> fc = torch.nn.Linear(2, 2)
    >>> kept = {"weight": torch.tensor([[True, False], [False, False]])}
    >>> fp.apply_masks_(dict(fc.named_parameters()), kept)
    >>> [(row.name, row.pruned) for row in fp.sparsity_report(fc).rows]
    [('weight', 3), ('bias', 0)]
    """
    if isinstance(source, nn.Module):
        if params is not None:
            raise TypeError("sparsity_report: params= goes with a mask dict, not a module")
        _refuse_hook_mode(source)
        refuse_in("sparsity_report", dict(source.named_parameters()))
        rows = (_row(name, p.detach()) for name, p in source.named_parameters())
        return SparsityReport(tuple(rows))
    if not isinstance(source, Mapping):
        kind = type(source).__name__
        raise TypeError(f"sparsity_report: source must be a dict of masks or a module, got {kind}")
    refuse_in("sparsity_report", source, "mask")
    refuse_in("sparsity_report", params)
    if params is None:
        return SparsityReport(tuple(_checked_row(name, mask) for name, mask in source.items()))
    check_params("sparsity_report", params)
    checked = check_masks("sparsity_report", params, source)
    return SparsityReport(
        tuple(
            _row(name, checked.get(name, torch.ones_like(p, dtype=torch.bool)))
            for name, p in params.items()
        )
    )
