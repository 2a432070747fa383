"""DTensor inputs: masks computed block by block where the tensors lie, never gathered.

A parameter sharded by FSDP2 (``fully_shard``) or laid out by hand as a
:class:`~torch.distributed.tensor.DTensor` is pruned in place: each process
runs the kernels on its own block (``to_local()``), described by a
:class:`~funcprune._sharded.Shard` (where the block sits in the whole
tensor), and gets its block of the mask, wrapped as a DTensor with the
scores' mesh and placements. Only counts cross processes: one number for the
unpruned total, and the radix select's fixed-size histograms. No process
gathers a parameter, its scores or a mask, and the masks equal, bit for bit,
what one process computes on the whole tensors (ties pruned in order of the
global index, NaN last).

What is supported (everything else is refused with an error naming the
argument; nothing is ever gathered or redistributed behind your back):

- layouts: a device mesh of any number of dims, each placing the tensor
  ``Shard(d)`` (any dim; uneven and empty blocks included, as
  ``torch.chunk`` cuts them, a dim cut again by a later mesh dim as
  DTensor cuts it) or ``Replicate()`` (HSDP's ``(Replicate(), Shard(0))``
  included), or ``_StridedShard(d)`` where the cuts after it leave every
  process one box (FSDP2 over tensor parallelism:
  ``(_StridedShard(0, split_factor=2), Shard(0))``; see
  :mod:`._dtensor_cuts`); an earlier mask or given scores laid out exactly
  as their tensor;
- specs: ``L1Unstructured``, ``RandomUnstructured``, ``LnStructured``,
  ``RandomStructured`` (``amount`` or ``sparsity=``), ``Identity``,
  ``CustomFromMask`` (its mask whole, each process taking its block, or a
  DTensor of the scores' layout) and chains of them (see
  :mod:`._dtensor_kernels` for what is exact and how random draws are
  made); groups ranked jointly
  (global plans) of DTensors on one mesh, each with its own placements;
  earlier masks and given scores laid out as their parameter, DTensor
  masks ``torch.bool`` where funcprune would read their values.

Counts are reduced over the mesh dims that cut the group's tensors only,
one ``all_reduce`` per such mesh dim (:func:`all_reduce`): processes that
differ along the other mesh dims hold the same blocks and decide alike on
their own (HSDP's replicas send nothing to one another), and a group with
no ``Shard`` at all is computed by every process on its own. Where copies
of a block lie along a mesh dim that is reduced over (a group mixing
layouts), one copy counts it (:attr:`Layout.counted`).

``torch.distributed.tensor`` is only imported once a DTensor exists:
:func:`is_dtensor` looks it up in ``sys.modules`` first. This module says
where a DTensor's block sits and checks layouts; :mod:`._dtensor_masks`
runs the specs on the blocks.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, final

import torch
import torch.distributed as dist
from torch import nn

from ._dtensor_cuts import box, cut_dim, strided
from ._select import LocalShard, reduced_over
from ._types import Tensor, is_dtensor

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Placement

ReduceOp = dist.ReduceOp.RedOpType
SUM = dist.ReduceOp.SUM

__all__ = [
    "Layout",
    "agree_on_failure",
    "all_reduce",
    "block_of",
    "check_layouts",
    "check_like",
    "check_not_fsdp",
    "groups",
    "refuse_in",
    "is_dtensor",
    "layout_of",
    "wrap",
]

#: What the refusals say is supported.
_SUPPORTED_LAYOUTS = "Shard(dim), Replicate() or FSDP2's _StridedShard(dim) on each dim of a device mesh"


@final
@dataclass(frozen=True, slots=True, eq=False)
class Layout:
    """Where this process's block of a DTensor sits in the whole tensor.

    Attributes:
        mesh: the DTensor's device mesh (of any number of dims).
        placements: its placements, one per mesh dim: ``Shard(d)``,
            ``Replicate()`` or ``_StridedShard(d)`` (see :mod:`._dtensor_cuts`).
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
        """The block as :mod:`._sharded` describes it, selected over the mesh dims ``dims``.

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
        return _shown(self.placements, self.mesh)


def _every_box(
    shape: tuple[int, ...], mesh: DeviceMesh, placements: Sequence[Placement]
) -> list[tuple[tuple[int, ...], tuple[int, ...]] | None]:
    """:func:`~._dtensor_cuts.box` of every process of ``mesh``, in the mesh's order."""
    coordinates = itertools.product(*(range(n) for n in mesh.shape))
    return [box(shape, tuple(mesh.shape), c, placements) for c in coordinates]


def _shown(placements: Sequence[Placement], mesh: DeviceMesh) -> str:
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
            f"{fn}: {what} is a DTensor laid out as {_shown(placements, mesh)}; funcprune computes "
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
            f"{fn}: {what} is a DTensor laid out as {_shown(placements, mesh)}, which leaves some "
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
            f"{fn}: {what} is laid out as {_shown(t.placements, t.device_mesh)} but {like} as "
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


# --- checks before any work ----------------------------------------------------------


def check_layouts(
    fn: str, params: Mapping[str, Tensor], masks: object, scores: object = None, *, bool_masks: bool = True
) -> None:
    """Refuse masks and scores laid out otherwise than their parameters.

    A DTensor parameter takes masks and scores that are DTensors of its mesh
    and placements; a plain one takes plain ones. With ``bool_masks``, a
    DTensor mask must be ``torch.bool``: checking that numbers are 0 and 1
    would read this process's block only (a ``Partial`` reduction), and
    processes that decide differently hang. Entries that are not tensors,
    or name no parameter, are left to the other checks.

    Raises:
        TypeError: if a DTensor meets a plain tensor, or a DTensor mask is not ``torch.bool``.
        ValueError: if a DTensor's mesh or placements differ from its parameter's.
    """
    for kind, given in (("mask for", masks), ("scores for", scores)):
        if not isinstance(given, Mapping):
            continue
        for name, t in given.items():
            param = params.get(name) if isinstance(name, str) else None
            if isinstance(t, torch.Tensor) and isinstance(param, torch.Tensor):
                check_like(fn, f"the {kind} {name!r}", t, "the parameter", param)
                if kind == "mask for" and bool_masks and is_dtensor(t) and t.dtype != torch.bool:
                    raise TypeError(
                        f"{fn}: the mask for {name!r} is a DTensor of dtype {t.dtype}; DTensor masks "
                        "must be torch.bool (funcprune's are): checking that numbers are 0 and 1 "
                        "would read one process's block only; convert it with `mask != 0`"
                    )


def check_like(fn: str, what: str, t: Tensor, like: str, other: Tensor) -> None:
    """Refuse ``t`` unless it is laid out as ``other``: both plain, or DTensors of one mesh and placements.

    Raises:
        TypeError: if one is a DTensor and the other not.
        ValueError: if their meshes or placements differ.
    """
    if is_dtensor(other) and is_dtensor(t):
        if t.device_mesh != other.device_mesh or tuple(t.placements) != tuple(other.placements):
            raise ValueError(
                f"{fn}: {what} is laid out as {_shown(t.placements, t.device_mesh)} but {like} as "
                f"{_shown(other.placements, other.device_mesh)}; they must have the same mesh and "
                "placements (funcprune never redistributes: call .redistribute(mesh, placements) "
                "yourself if you mean to pay for it)"
            )
    elif is_dtensor(other) or is_dtensor(t):
        kinds = ("a DTensor", "a plain torch.Tensor") if is_dtensor(t) else ("a plain torch.Tensor", "a DTensor")
        raise TypeError(
            f"{fn}: {what} is {kinds[0]} but {like} is {kinds[1]}; give both as DTensors with the "
            "same mesh and placements (as funcprune returns masks), or neither"
        )


def check_not_fsdp(fn: str, module: nn.Module) -> None:
    """Refuse a module tree holding an FSDP2 module: ``functional_call`` cannot replace its parameters.

    FSDP2's pre-forward hook all-gathers the module's own sharded parameters
    into place, so the tensors that :func:`torch.func.functional_call`
    passes are silently ignored.
    """
    fsdp = sys.modules.get("torch.distributed.fsdp")
    kind = getattr(fsdp, "FSDPModule", None)
    if kind is None:
        return  # never imported: no module can be one
    for name, sub in module.named_modules():
        if isinstance(sub, kind):
            where = "module" if not name else f"module.{name}"
            raise TypeError(
                f"{fn}: {where} is an FSDP2 module (fully_shard): its forward gathers its own "
                "parameters and ignores those functional_call passes, so the masks would silently "
                "not apply; train it in place instead: fp.mask_gradients_(params, masks) after "
                "backward(), optimizer.step(), then fp.apply_masks_(params, masks)"
            )


def refuse_in(fn: str, tensors: Mapping[str, object] | None, what: str = "parameter") -> None:
    """Refuse DTensors where a function rebuilds whole tensors (payoff: bake, shrink, to_sparse).

    Rebuilt into a module or a sparse tensor, a DTensor would be gathered,
    or be that process's block only. Not supported yet, so refused.
    """
    for name, t in (tensors or {}).items():
        if is_dtensor(t):
            raise NotImplementedError(
                f"{fn}: the {what} {name!r} is a DTensor ({_shown(t.placements, t.device_mesh)}); "
                f"{fn} does not support DTensors yet (it would rebuild this process's "
                "block only); DTensors are supported by compute_mask, the plans, the "
                "apply functions and sparsity_report"
            )
