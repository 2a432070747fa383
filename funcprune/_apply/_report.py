"""Sparsity reports: how much of each tensor, and of all of them, is pruned.

:func:`sparsity_report` reads masks, or a module in hook mode, and returns a
:class:`SparsityReport` (its ``str()`` is a table); DTensors are counted
block by block and summed in one ``all_reduce`` per mesh dim (``README.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, final

import torch
from torch import nn

from .._dtensor import all_reduce, check_layouts, layout_of
from .._names import check_masks, check_params, pruning_hook, unknown_name
from .._types import Params, is_dtensor
from .._validate import non_binary

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

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
    hooked = pruning_hook(module)
    if hooked is not None:
        name, hook = hooked
        raise ValueError(
            f"sparsity_report: the module is in hook mode: {name!r} has a pruning hook "
            f"({type(hook).__name__}), so its parameters hold the unpruned values. "
            "Report its masks instead: "
            "fp.sparsity_report(funcprune.compat.masks_from_module(module))"
        )


#: A row to count: its name, its (whole) shape, what errors call its tensor, and the tensor
#: whose exact zeros are its pruned entries (``None``: nothing pruned).
_Entry = tuple[str, tuple[int, ...], str, Tensor | None]


def _checked_mask(name: str, mask: object) -> Tensor:
    """A mask given without parameters, checked to be a 0/1 tensor (a DTensor: ``torch.bool``)."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"sparsity_report: the mask for {name!r} must be a tensor, got {mask!r}")
    if is_dtensor(mask) and mask.dtype != torch.bool:
        raise TypeError(
            f"sparsity_report: the mask for {name!r} is a DTensor of dtype {mask.dtype}; DTensor "
            "masks must be torch.bool (funcprune's are): checking that numbers are 0 and 1 would "
            "read one process's block only; convert it with `mask != 0`"
        )
    bad = non_binary(mask, 3)
    if bad:
        raise ValueError(
            f"sparsity_report: the mask for {name!r} must hold only 0 and 1 (or be "
            f"torch.bool), got values such as {bad}"
        )
    return mask


def _zeros(tensors: list[tuple[str, Tensor | None]]) -> list[int]:
    """The exact zeros of each tensor (0 for ``None``); a DTensor's, of the whole tensor.

    A plain tensor is counted here. Every DTensor's layout is checked first
    (``what`` names it in errors), then its block counted on one of the
    processes holding it (:attr:`Layout.counted`) and the counts of the
    DTensors on one mesh summed in one ``all_reduce`` per mesh dim, mesh by
    mesh in order of first appearance: the same collectives on every process.
    """
    counts = [0] * len(tensors)
    meshes: list[tuple[DeviceMesh, list[int], list[Tensor]]] = []
    for i, (what, t) in enumerate(tensors):
        if t is not None and t.is_meta:
            raise ValueError(
                f"sparsity_report: {what} is on the meta device, which holds shapes but no values to "
                "count; pass tensors with values (materialize the module or the masks first)"
            )
        if t is None or not is_dtensor(t):
            counts[i] = 0 if t is None else int((t == 0).sum())
            continue
        layout, local = layout_of("sparsity_report", what, t), t.to_local()
        mine = (local == 0).sum() if layout.counted else local.new_zeros((), dtype=torch.int64)
        group = next((g for g in meshes if g[0] == layout.mesh), None)
        if group is None:
            meshes.append(group := (layout.mesh, [], []))
        group[1].append(i)
        group[2].append(mine)
    for mesh, indices, blocks in meshes:
        summed: list[int] = all_reduce(torch.stack(blocks), mesh).tolist()
        for i, n in zip(indices, summed, strict=True):
            counts[i] = n
    return counts


def _rows(entries: list[_Entry]) -> SparsityReport:
    """The report of ``entries``, counted by :func:`_zeros`."""
    counts = _zeros([(what, t) for _, _, what, t in entries])
    rows = (SparsityRow(name, shape, n) for (name, shape, _, _), n in zip(entries, counts, strict=True))
    return SparsityReport(tuple(rows))


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
            ``funcprune.compat.masks_from_module(module)``. Masks and
            parameters may be DTensors (DTensor masks ``torch.bool``), beside
            plain tensors or not: then every process of their meshes must
            call it, and each gets the report of the whole tensors (shapes,
            counts), counted block by block and summed, never gathered.
        params: with a mask dict, the parameters: the report then has a row
            for every parameter (0 pruned where there is no mask), in their
            order, and masks are checked against them (a DTensor parameter's
            mask a DTensor of its mesh and placements, a plain one's plain).

    Returns:
        A :class:`SparsityReport`; ``str(report)`` is the table, the same
        on every process.

    Raises:
        TypeError: if ``source`` is neither a mapping of tensors nor a
            module, ``params`` is given with a module, a DTensor mask is
            not ``torch.bool``, or (with ``params``) a DTensor meets a plain
            tensor.
        ValueError: if a mask holds values other than 0 and 1, the module
            is in hook mode (a pruning hook of ``torch.nn.utils.prune`` or
            ``funcprune.compat`` on it or a submodule), a DTensor mask's
            mesh or placements differ from its parameter's, or a DTensor's
            block is not cut as ``torch.chunk`` cuts it.
        NotImplementedError: for a DTensor placed otherwise than
            ``Shard(dim)``, ``Replicate()`` or FSDP2's ``_StridedShard``
            (``Partial``), or whose blocks are no boxes.
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
    fn = "sparsity_report"
    if isinstance(source, nn.Module):
        if params is not None:
            raise TypeError(f"{fn}: params= goes with a mask dict, not a module")
        _refuse_hook_mode(source)
        named = source.named_parameters()
        return _rows([(n, tuple(p.shape), f"the parameter {n!r}", p.detach()) for n, p in named])
    if not isinstance(source, Mapping):
        kind = type(source).__name__
        raise TypeError(f"{fn}: source must be a dict of masks or a module, got {kind}")
    if params is None:
        masks = {name: _checked_mask(name, mask) for name, mask in source.items()}
        return _rows([(n, tuple(m.shape), f"the mask for {n!r}", m) for n, m in masks.items()])
    check_params(fn, params)
    check_layouts(fn, params, source)  # before check_masks reads the values of numeric masks
    checked = check_masks(fn, params, source)
    return _rows(
        [(n, tuple(p.shape), f"the mask for {n!r}", checked.get(n)) for n, p in params.items()]
    )
