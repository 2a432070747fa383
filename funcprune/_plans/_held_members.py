"""Where a plan over units finds its members: whole tensors, or this process's blocks of DTensors.

:class:`HeldMembers` gives :func:`~._unit_keys.unit_keys` each member's values as
this process holds them, reduces the per-unit numbers over the processes
that hold parts of the units, makes every process keep the same units, and
writes each member's mask where its parameter lies.

For DTensor parameters (FSDP2's ``fully_shard``, tensor parallelism's
``parallelize_module``, both on a 2-D mesh, or any layout ``funcprune``'s
DTensor support takes), the DTensor members must lie on one device mesh;
plain tensors beside them (what tensor parallelism leaves whole: a MoE
layer's experts, a norm) are copies every process holds alike.
The reductions run over the mesh dims that cut some member (one
``all_reduce`` per such mesh dim, of a few numbers per unit); copies of a
block along the other mesh dims count once. Each process then ranks the
same keys and keeps the same units; for ``RandomStructured`` the units the
mesh's first process draws (from its generator, as one process draws them)
are everyone's, sent as one more sum. Each mask is a DTensor of its
parameter's layout, built from the kept units and where this process's
block lies; nothing of a weight is gathered or sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, final

import torch
import torch.distributed as dist

from .._dtensor import Layout, all_reduce, layout_of, parameter_block, wrap
from .._specs import RandomStructured, StructuredSpec
from .._types import Params, Scores, Tensor, is_dtensor
from .._units import Member
from ._unit_keys import Piece

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["HeldMembers", "keep_along", "sharded_members"]


def sharded_members(names: Sequence[str], params: Params) -> bool:
    """Whether some member is a DTensor."""
    return any(is_dtensor(params[name]) for name in names)


def keep_along(member: Member, size: int, units: Tensor, length: int) -> Tensor:
    """The member's keep flags along its dim (``length`` indices): ``False`` on the slices of units not kept."""
    if member.unit is None:
        inside = units.repeat_interleave(member.width, dim=-1)
    else:  # a member of one unit: its slice follows that unit
        inside = units.narrow(-1, member.unit, 1).expand(*units.shape[:-1], member.width)
    before = torch.ones(member.start, dtype=torch.bool, device=units.device)
    after = torch.ones(length - member.end(size), dtype=torch.bool, device=units.device)
    if not (member.start or after.numel()):
        return inside
    return torch.cat([before, inside, after], -1)


def _ranked(values: Tensor, mask: Tensor | None, given: bool) -> Tensor:
    """What a member's units are ranked by: given scores, else the parameter as currently pruned."""
    values = values.detach()
    return values if given or mask is None else values * mask.to(values.dtype)


def _expanded(flags: Tensor, dim: int, shape: Sequence[int]) -> Tensor:
    view = [1] * len(shape)
    view[dim] = shape[dim]
    return flags.reshape(view).expand(tuple(shape))


@final
@dataclass(slots=True, eq=False)
class HeldMembers:
    """The members' values, earlier masks and layouts as this process holds them: whole tensors, or its
    blocks of DTensors (see the module's docstring)."""

    values: dict[str, Tensor]
    masks: dict[str, Tensor | None]
    shapes: dict[str, tuple[int, ...]]
    layouts: dict[str, Layout] = field(default_factory=dict)
    mesh: DeviceMesh | None = None
    span: tuple[int, ...] = ()

    @classmethod
    def whole(cls, names: Sequence[str], params: Params, masks: Mapping[str, Tensor], scores: Scores) -> HeldMembers:
        values, kept = {}, {}
        for name in names:
            mask, given = masks.get(name), scores.get(name)
            values[name], kept[name] = _ranked(params[name] if given is None else given, mask, given is not None), mask
        return cls(values, kept, {n: tuple(params[n].shape) for n in names})

    @classmethod
    def of(
        cls, fn: str, names: Sequence[str], params: Params, masks: Mapping[str, Tensor], scores: Scores
    ) -> HeldMembers:
        """This process's blocks of the DTensor members (and of their earlier masks and given scores).

        Plain members beside them are copies that every process holds alike
        (a module tensor parallelism leaves whole): counted once.
        """
        sharded = [n for n in names if is_dtensor(params[n])]
        layouts = {n: layout_of(fn, f"the parameter {n!r}", params[n]) for n in sharded}  # type: ignore[arg-type]
        first = layouts[sharded[0]]
        for name, layout in layouts.items():
            if layout.mesh != first.mesh:
                raise NotImplementedError(
                    f"{fn}: the units' members lie on different device meshes ({sharded[0]!r} on "
                    f"{first.mesh}, {name!r} on {layout.mesh}); funcprune ranks units over one mesh"
                )
        plain = [n for n in names if n not in layouts]
        whole = cls.whole(plain, params, masks, scores)
        values, kept = dict(whole.values), dict(whole.masks)
        for name, layout in layouts.items():
            given = scores.get(name)
            block = parameter_block(fn, name, layout, params[name] if given is None else given, masks.get(name))
            values[name], kept[name] = _ranked(block.scores, block.mask, given is not None), block.mask
        span = tuple(sorted({i for layout in layouts.values() for i in layout.span}))
        shapes = {n: layouts[n].shape if n in layouts else tuple(params[n].shape) for n in names}
        return cls(values, kept, shapes, layouts, first.mesh, span)

    def piece(self, member: Member) -> Piece:
        """The member's :class:`~._unit_keys.Piece` on this process."""
        shape = self.shapes[member.name]
        entries = 1
        for i, n in enumerate(shape):
            entries *= 1 if i == member.dim else n
        layout = self.layouts.get(member.name)
        offset = 0 if layout is None else layout.offsets[member.dim]
        if layout is not None:
            counted = layout.counted_in(self.span)
        else:  # a plain tensor beside DTensors: a copy on every process, counted on the first along the span
            coordinate = () if self.mesh is None else tuple(self.mesh.get_coordinate() or ())
            counted = all(coordinate[i] == 0 for i in self.span)
        return Piece(member, self.values[member.name], self.masks[member.name], offset, entries, counted)

    def reduce(self, values: Tensor, how: Literal["sum", "max"]) -> Tensor:
        """``values`` reduced over the processes that hold different blocks (nothing in one process)."""
        if self.mesh is None or not self.span:
            return values
        op = dist.ReduceOp.SUM if how == "sum" else dist.ReduceOp.MAX
        return all_reduce(values, self.mesh, self.span, op)

    def agreed(self, kept: Tensor, spec: StructuredSpec) -> Tensor:
        """The units every process keeps: ``kept`` ranked from the same keys, or the first process's draw."""
        mesh = self.mesh
        if mesh is None or not isinstance(spec, RandomStructured) or mesh.size() == 1:
            return kept
        first = all(c == 0 for c in mesh.get_coordinate() or ())
        mine = kept.to(torch.int64) if first else torch.zeros(kept.shape, dtype=torch.int64, device=kept.device)
        return all_reduce(mine, mesh) > 0

    def mask(self, name: str) -> Tensor | None:
        """The block of ``name``'s earlier mask."""
        return self.masks[name]

    def keep(self, member: Member, size: int, units: Tensor) -> Tensor:
        """The block of the member's mask that clears the slices of the units not kept."""
        shape = self.shapes[member.name]
        flags = keep_along(member, size, units, shape[member.dim])
        layout = self.layouts.get(member.name)
        if layout is None:
            return _expanded(flags, member.dim, shape)
        d = member.dim
        return _expanded(flags.narrow(-1, layout.offsets[d], layout.size[d]), d, layout.size)

    def wrapped(self, name: str, local: Tensor) -> Tensor:
        """``name``'s mask as the caller gets it: itself, or a DTensor of its parameter's layout."""
        layout = self.layouts.get(name)
        return local if layout is None else wrap(local.contiguous(), layout)
