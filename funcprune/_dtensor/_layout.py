"""Where a DTensor's block sits in the whole tensor (:class:`Layout`), and the collectives over its mesh.

:func:`layout_of` reads a DTensor's layout (refusing what funcprune does not
support), :func:`block_of` takes this process's block of a tensor laid out
alike, :func:`wrap` turns a block back into a DTensor, and
:func:`all_reduce` reduces over the mesh dims that cut a group. What is
supported, and what crosses processes: ``README.md`` in this folder.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, final

import torch
import torch.distributed as dist

from .._select import LocalShard, reduced_over
from .._specs import as_bool
from .._types import Mask, Tensor, is_dtensor
from ._cuts import box, cut_dim, strided

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Placement

ReduceOp = dist.ReduceOp.RedOpType
SUM = dist.ReduceOp.SUM

__all__ = [
    "Layout", "LocalBlock", "ReduceOp", "agree_on_failure", "all_reduce", "block_of", "groups", "layout_of",
    "parameter_block", "shards_of", "shown", "wrap",
]  # fmt: skip

#: What the refusals say is supported.
_SUPPORTED_LAYOUTS = "Shard(dim), Replicate() or FSDP2's _StridedShard(dim) on each dim of a device mesh"


@final
@dataclass(frozen=True, slots=True, eq=False)
class Layout:
    """Where this process's block of a DTensor sits in the whole tensor.

    Attributes:
        mesh: the DTensor's device mesh (of any number of dims).
        placements: its placements, one per mesh dim: ``Shard(d)``,
            ``Replicate()`` or ``_StridedShard(d)`` (see ``_cuts.py``).
        shape: the whole tensor's shape.
        offsets: where the block starts, along each dim.
        size: the block's shape.
        coordinate: this process's coordinate in the mesh.
        span: the mesh dims whose placement cuts (``Shard``,
            ``_StridedShard``), in order: the
            processes along them hold different blocks; along the others,
            copies of the same block.
    """

    mesh: DeviceMesh
    placements: tuple[Placement, ...]
    shape: tuple[int, ...]
    offsets: tuple[int, ...]
    size: tuple[int, ...]
    coordinate: tuple[int, ...]
    span: tuple[int, ...]

    @property
    def sharded(self) -> bool:
        """Whether some process of the mesh holds another block (else each holds the whole tensor)."""
        return bool(self.span)

    @property
    def counted(self) -> bool:
        """Whether this process counts its block in a sum over the whole mesh.

        Of the processes holding copies of one block (they differ only along
        the mesh dims that replicate it), the one at coordinate 0 along each
        of those dims counts it.
        """
        return self.counted_in(range(self.mesh.ndim))

    def counted_in(self, dims: Iterable[int]) -> bool:
        """Whether this process counts its block in a sum over the mesh dims ``dims``."""
        return all(self.coordinate[i] == 0 for i in dims if i not in self.span)

    def describes(self, t: DTensor) -> bool:
        """Whether ``t`` has this layout's mesh and placements."""
        return t.device_mesh == self.mesh and tuple(t.placements) == self.placements

    def shard(self, dims: Sequence[int], mesh: DeviceMesh | None = None) -> LocalShard:
        """The block as ``funcprune._select`` describes it, selected over the mesh dims ``dims``.

        The process groups are ``mesh``'s (one equal to the layout's), or the layout's own.
        """
        mesh = self.mesh if mesh is None else mesh
        return LocalShard(self.shape, self.offsets, self.size, self.counted_in(dims), groups(mesh, dims))

    def boxes(self) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """The offsets and size of the block of every process of the mesh, in the mesh's order.

        The same on every process (computed from the layout alone): checks
        that must pass on all processes or on none look at these.
        """
        every = _every_box(self.shape, self.mesh, self.placements)
        assert all(b is not None for b in every)  # layout_of refused blocks that are no box
        return [b for b in every if b is not None]

    def __str__(self) -> str:
        return shown(self.placements, self.mesh)


def _every_box(
    shape: tuple[int, ...], mesh: DeviceMesh, placements: Sequence[Placement]
) -> list[tuple[tuple[int, ...], tuple[int, ...]] | None]:
    """:func:`~._cuts.box` of every process of ``mesh``, in the mesh's order."""
    coordinates = itertools.product(*(range(n) for n in mesh.shape))
    return [box(shape, tuple(mesh.shape), c, placements) for c in coordinates]


def shown(placements: Sequence[Placement], mesh: DeviceMesh) -> str:
    return f"{list(placements)} on {mesh}"


def groups(mesh: DeviceMesh, dims: Iterable[int]) -> tuple[ProcessGroup, ...]:
    """The process groups of the mesh dims ``dims``: reducing over each in turn reduces over all of them."""
    return tuple(mesh.get_group(i) for i in dims)


def all_reduce(values: Tensor, mesh: DeviceMesh, dims: Iterable[int] | None = None, op: ReduceOp = SUM) -> Tensor:
    """``values`` reduced (in place; returned) over the processes of ``mesh`` along ``dims`` (all if ``None``).

    One ``all_reduce`` per mesh dim, in order: the processes that differ
    along those dims only end with the reduction of all of theirs. Sums
    must count each block once (:attr:`Layout.counted`); maxima and minima
    need not.
    """
    return reduced_over(values, groups(mesh, range(mesh.ndim) if dims is None else dims), op)


def agree_on_failure(
    failure: Exception | None, mesh: DeviceMesh, dims: Iterable[int] | None, elsewhere: Callable[[], Exception]
) -> None:
    """Raise on every process of ``mesh`` along ``dims`` (all if ``None``) if one failed (one ``all_reduce``).

    ``failure`` is this process's error, or ``None``: a process that failed
    raises its own; the others raise ``elsewhere()``; if none failed,
    nothing happens. So no process goes on to a later collective alone.
    """
    flag = torch.tensor([failure is not None], dtype=torch.int64, device=mesh.device_type)
    if int(all_reduce(flag, mesh, dims)[0]):
        if failure is not None:
            raise failure
        raise elsewhere()


def layout_of(fn: str, what: str, t: DTensor) -> Layout:
    """The layout of this process's block of ``t``, refusing what is not supported.

    Raises:
        NotImplementedError: for a placement other than ``Shard``,
            ``_StridedShard`` and ``Replicate`` (``Partial``), or a
            ``_StridedShard`` that leaves a process entries that are no box
            (checked for every process of the mesh, so all refuse alike).
        ValueError: if this process is not in the mesh, or its block does
            not have the shape DTensor's cut gives. (Only the processes
            whose block is wrong can see it, without a collective: the
            others go on and wait in the first all-reduce until the
            group's timeout. Such a DTensor comes from ``from_local`` with
            ``run_check=False`` and blocks cut otherwise.)
    """
    from torch.distributed.tensor import Replicate

    mesh, placements = t.device_mesh, tuple(t.placements)
    shape = tuple(t.shape)
    cuts = [cut_dim(p, len(shape)) if shape else None for p in placements]
    if not all(c is not None or type(p) is Replicate for c, p in zip(cuts, placements, strict=True)):
        raise NotImplementedError(
            f"{fn}: {what} is a DTensor laid out as {shown(placements, mesh)}; funcprune computes "
            f"masks of DTensors laid out as {_SUPPORTED_LAYOUTS} only (not yet Partial); "
            "redistribute it yourself with .redistribute(mesh, placements) if you mean to pay for "
            "that communication"
        )
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ValueError(
            f"{fn}: this process is not in {what}'s device mesh {mesh}; call it on the mesh's processes only"
        )
    span = tuple(i for i, c in enumerate(cuts) if c is not None)
    mine = box(shape, tuple(mesh.shape), coordinate, placements)
    if mine is None or (any(strided(p) for p in placements) and None in _every_box(shape, mesh, placements)):
        raise NotImplementedError(
            f"{fn}: {what} is a DTensor laid out as {shown(placements, mesh)}, which leaves some "
            f"process of the mesh entries of shape {shape} that are no box (a _StridedShard not "
            "undone by a Shard after it, as FSDP2 over tensor parallelism gives); funcprune computes "
            "masks of blocks that are boxes only"
        )
    offsets, size = mine
    local = tuple(t.to_local().shape)
    if local != size:
        raise ValueError(
            f"{fn}: {what} holds a block of shape {local} on this process, but {list(placements)} of "
            f"shape {shape} over a mesh of shape {tuple(mesh.shape)} gives {size} (torch.chunk's "
            "cut); build it with distribute_tensor, or from_local with blocks cut that way"
        )
    return Layout(mesh, placements, shape, offsets, size, tuple(coordinate), span)


def wrap(local: Tensor, layout: Layout) -> Tensor:
    """``local`` (this process's block) as a DTensor of ``layout``; nothing communicated."""
    from torch.distributed.tensor import DTensor

    strides, step = [], 1
    for n in reversed(layout.shape):  # contiguous, as torch gives for the whole shape
        strides.append(step)
        step *= max(n, 1)
    return DTensor.from_local(
        local, layout.mesh, layout.placements, run_check=False,
        shape=torch.Size(layout.shape), stride=tuple(reversed(strides)),
    )  # fmt: skip


def block_of(fn: str, what: str, t: Tensor, like: str, layout: Layout) -> Tensor:
    """This process's block of ``t``, which must be laid out as ``like`` (``layout``)."""
    if not is_dtensor(t):
        raise TypeError(
            f"{fn}: {what} is a plain torch.Tensor but {like} is a DTensor ({layout}); give both "
            "as DTensors with the same mesh and placements, or neither"
        )
    if not layout.describes(t):
        raise ValueError(
            f"{fn}: {what} is laid out as {shown(t.placements, t.device_mesh)} but {like} as "
            f"{layout}; they must have the same mesh and placements (funcprune never "
            "redistributes: call .redistribute(mesh, placements) yourself if you mean to pay for it)"
        )
    local = t.to_local()
    if tuple(local.shape) != layout.size:
        raise ValueError(
            f"{fn}: {what} holds a block of shape {tuple(local.shape)} on this process but {like} "
            f"one of shape {layout.size}; build both with the same cut (distribute_tensor, or the "
            "mask funcprune returns)"
        )
    return local


class LocalBlock(NamedTuple):
    """One tensor of a group as this process holds it."""

    scores: Tensor  # this process's block of the scores
    mask: Mask  # and of the earlier mask (torch.bool), or None
    layout: Layout

    def whole(self) -> Tensor:
        """The whole tensor's shape and dtype, no values (``meta``): for one process's checks."""
        return torch.empty(self.layout.shape, dtype=self.scores.dtype, device="meta")


def parameter_block(fn: str, name: str, layout: Layout, scores: Tensor, mask: Mask) -> LocalBlock:
    """This process's blocks of a plan's DTensor parameter ``name`` (laid out as ``layout``): its scores
    and earlier mask, which must be laid out as it."""
    what = f"the parameter {name!r}"
    kept = None if mask is None else as_bool(block_of(fn, f"the mask for {name!r}", mask, what, layout))
    return LocalBlock(block_of(fn, f"the scores for {name!r}", scores, what, layout), kept, layout)


def shards_of(layouts: Sequence[Layout]) -> list[LocalShard] | None:
    """The blocks' shards, ranked over the mesh dims that shard any of them; ``None`` if none does.

    Processes that differ only along the other mesh dims hold the same
    blocks of every part, so they compute the same masks on their own. The
    layouts' meshes are equal (checked); their process groups are taken
    from the first's for all: a DTensor made by an operation may carry
    another, equal, mesh object, cached by DTensor from an earlier call,
    whose groups are other objects.
    """
    span = sorted({i for layout in layouts for i in layout.span})
    if not span:
        return None  # replicated: each process computes the same masks on its own
    return [layout.shard(span, layouts[0].mesh) for layout in layouts]
