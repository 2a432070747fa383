"""DTensor masks: the specs funcprune computes on DTensors, block by block (the dispatch).

:func:`compute_mask` and :func:`compute_joint_masks` check a DTensor's
layout, run the spec's block kernel on each process's blocks and wrap the
masks back as DTensors; :func:`fold_step` is the plan fold's step over a
DTensor parameter, and :func:`l1_each` runs a plan rule's L1 selections in
lockstep. Anything unsupported is refused by :func:`check_supported` before
any work.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import torch

from .._select import (
    SHARDED_BRACKET_MIN_KEYS,
    LocalShard,
    Selection,
    keep_over_shards_each,
    processes,
    resolve_count,
)
from .._specs import (
    NM,
    Block,
    Chain,
    CustomFromMask,
    Identity,
    L1Unstructured,
    LnStructured,
    PerSlice,
    RandomStructured,
    RandomUnstructured,
    Spec,
    as_bool,
    custom_from_mask,
    keep_all,
    l1_part,
    l1_unstructured_jointly,
)
from .._types import Mask, Tensor, is_dtensor
from .._validate import check_same_shape
from ._layout import Layout, LocalBlock, block_of, layout_of, wrap
from ._random import random_unstructured
from ._shapes import blocks, check_cut, check_slice_spec, n_m, per_slice
from ._structured import check_layout, structured

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

    from .._specs import Step

__all__ = ["check_group", "check_supported", "compute_joint_masks", "compute_mask", "fold_step", "l1_each", "parameter_block", "shards_of"]

#: What the refusals say is supported.
_SUPPORTED_SPECS = (
    "L1Unstructured, RandomUnstructured, LnStructured, RandomStructured, Identity, CustomFromMask, "
    "NM, Block, PerSlice and chains of them"
)
_SUPPORTED = (
    L1Unstructured, RandomUnstructured, LnStructured, RandomStructured, Identity, CustomFromMask, NM, Block,
    PerSlice,
)


# --- specs ---------------------------------------------------------------------


def check_supported(fn: str, what: str, spec: Spec, layout: Layout | None = None) -> None:
    """Refuse a spec (or a chain's step) that cannot prune DTensors block by block.

    A ``PerSlice`` must run a deterministic spec in its slices
    (:func:`~._shapes.check_slice_spec`). With ``layout``
    (``what``'s), also what that layout cannot give: a nuclear norm across
    processes (:func:`~._structured.check_layout`), the groups of
    ``NM``, ``Block`` or ``PerSlice`` cut across processes
    (:func:`~._shapes.check_cut`).

    Raises:
        NotImplementedError: naming the spec and what is supported.
    """
    steps = spec.specs if isinstance(spec, Chain) else (spec,)
    for step in steps:
        if not isinstance(step, _SUPPORTED):
            raise NotImplementedError(
                f"{fn}: {what} is a DTensor, and {step!r} cannot prune DTensors yet; on DTensors "
                f"funcprune runs {_SUPPORTED_SPECS} (block by block, nothing gathered). To use "
                "another spec on one process, gather the tensor yourself with .full_tensor()"
            )
        if isinstance(step, PerSlice):
            check_slice_spec(fn, what, step)
        if layout is not None:
            check_layout(fn, what, step, layout)
            check_cut(fn, what, step, layout)


def _masks_of(spec: Spec, parts: Sequence[LocalBlock], generator: torch.Generator | None = None) -> list[Tensor]:
    """This process's blocks of the masks ``spec`` gives for the group ``parts`` (checked spec).

    Structured specs and mask shapes come with one part (a group ranked jointly is unstructured).
    """
    match spec:
        case L1Unstructured():
            scores = [p.scores for p in parts]
            return l1_unstructured_jointly(spec.target, scores, [p.mask for p in parts], shards=shards_of([p.layout for p in parts]))
        case RandomUnstructured():
            return random_unstructured(spec.target, parts, shards_of([p.layout for p in parts]), generator)
        case LnStructured() | RandomStructured():
            return [structured(spec, p, generator) for p in parts]
        case NM():
            return [n_m(spec, p) for p in parts]
        case Block():
            return [blocks(spec, p) for p in parts]
        case PerSlice():
            return [per_slice(spec, p, generator) for p in parts]
        case Identity() | Chain(specs=()):
            return [keep_all(p.scores, p.mask) for p in parts]
        case CustomFromMask():
            return [custom_from_mask(_customblock_of(spec.mask, p.layout), p.scores, p.mask) for p in parts]
        case Chain():
            return _chained(spec.specs, parts, generator)
    raise AssertionError(f"unchecked spec {spec!r}")  # check_supported refused it


def _chained(steps: Sequence[Spec], parts: Sequence[LocalBlock], generator: torch.Generator | None) -> list[Tensor]:
    """A chain's fold: step ``i > 0`` scores the tensor as pruned so far, as :class:`Chain` does."""
    kept = _masks_of(steps[0], parts, generator)
    for step in steps[1:]:
        now = [LocalBlock(p.scores * m.to(p.scores.dtype), m, p.layout) for p, m in zip(parts, kept, strict=True)]
        kept = _masks_of(step, now, generator)
    return kept


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


def _customblock_of(mask: Tensor, layout: Layout) -> Tensor:
    """This process's block of a :class:`CustomFromMask`'s mask (whole, or a DTensor of the scores' layout)."""
    if is_dtensor(mask):
        return block_of("CustomFromMask", "the spec's mask", mask, "the scores", layout)
    whole = torch.Size(layout.shape)
    check_same_shape("CustomFromMask", "the spec's mask", mask.shape, "the scores", whole, plural=True)
    box = tuple(slice(o, o + s) for o, s in zip(layout.offsets, layout.size, strict=True))
    return mask[box]


# --- entry points ----------------------------------------------------------------


def compute_mask(
    fn: str,
    spec: Spec,
    scores: Tensor,
    default_mask: Mask,
    names: tuple[str, str] = ("scores", "default_mask"),
    *,
    generator: torch.Generator | None = None,
) -> Tensor:
    """:func:`funcprune.compute_mask` where ``scores`` or ``default_mask`` is a DTensor.

    ``names`` name the two in messages; ``generator`` seeds the random specs
    (torch's default CPU generator if ``None``). Returns a DTensor of the
    scores' layout.
    """
    if not is_dtensor(scores):
        raise TypeError(
            f"{fn}: {names[1]} is a DTensor but {names[0]} is a plain torch.Tensor; give both as "
            "DTensors with the same mesh and placements, or neither"
        )
    check_supported(fn, names[0], spec)
    layout = layout_of(fn, names[0], scores)
    check_supported(fn, names[0], spec, layout)
    mask = None if default_mask is None else as_bool(block_of(fn, names[1], default_mask, names[0], layout))
    (kept,) = _masks_of(spec, [LocalBlock(scores.to_local(), mask, layout)], generator)
    return wrap(kept, layout)


def check_group(fn: str, names: Sequence[str], tensors: Sequence[Tensor], spec: Spec) -> None:
    """Refuse a group ranked jointly unless all are DTensors of supported layouts on one mesh,
    and ``spec`` is supported.

    Raises:
        TypeError: if the group mixes DTensors and plain tensors.
        ValueError: if the DTensors are on different meshes (or see :func:`layout_of`).
        NotImplementedError: if a layout or ``spec`` is not supported.
    """
    first = next(i for i, t in enumerate(tensors) if is_dtensor(t))
    head = tensors[first]
    assert is_dtensor(head)
    mesh = head.device_mesh
    for name, t in zip(names, tensors, strict=True):
        if not is_dtensor(t):
            raise TypeError(
                f"{fn}: {name} is a plain torch.Tensor but {names[first]} is a DTensor; a group "
                "ranked jointly must be all DTensors on one device mesh, or none"
            )
        if t.device_mesh != mesh:
            raise ValueError(
                f"{fn}: {name} is on {t.device_mesh} but {names[first]} on {mesh}; a group ranked "
                "jointly must share one device mesh"
            )
        layout_of(fn, name, t)
    check_supported(fn, names[first], spec)


def compute_joint_masks(
    fn: str,
    spec: Spec,
    scores: Sequence[Tensor],
    default_masks: Sequence[Mask],
    *,
    generator: torch.Generator | None = None,
) -> list[Tensor]:
    """:func:`funcprune.compute_joint_masks` where any tensor is a DTensor; DTensor masks back.

    ``generator`` seeds the random specs (torch's default CPU generator if ``None``).
    """
    for i, (s, d) in enumerate(zip(scores, default_masks, strict=True)):
        if is_dtensor(d) and not is_dtensor(s):
            raise TypeError(
                f"{fn}: default_masks[{i}] is a DTensor but scores[{i}] is a plain torch.Tensor; "
                "give both as DTensors with the same mesh and placements, or neither"
            )
    names = [f"scores[{i}]" for i in range(len(scores))]
    check_group(fn, names, scores, spec)
    parts = []
    for i, (s, d) in enumerate(zip(scores, default_masks, strict=True)):
        assert is_dtensor(s)  # checked by check_group
        layout = layout_of(fn, names[i], s)
        mask = None if d is None else as_bool(block_of(fn, f"default_masks[{i}]", d, names[i], layout))
        parts.append(LocalBlock(s.to_local(), mask, layout))
    return [wrap(kept, p.layout) for kept, p in zip(_masks_of(spec, parts, generator), parts, strict=True)]


def fold_step(fn: str, name: str, param: DTensor, steps: Sequence[Spec]) -> Step:
    """How a plan's fold (:func:`._fold.fold`) computes each step over the DTensor parameter ``name``.

    Every step is checked first, before any work (each process refuses
    alike, none is left waiting); then each step's mask is computed block
    by block (:func:`compute_mask`), its scores DTensors of the parameter's
    layout. (An empty fold runs ``Identity()``: nothing pruned.)
    """
    names = (f"the parameter {name!r}", f"the mask for {name!r}")
    layout = layout_of(fn, names[0], param)
    for spec in steps:
        check_supported(fn, names[0], spec, layout)

    def step(spec: Spec, scores: Tensor, mask: Mask, generator: torch.Generator | None) -> Tensor:
        return compute_mask(fn, spec, scores, mask, names, generator=generator)

    return step


#: A parameter of a plan's rule with one ``L1Unstructured`` step: its name, the DTensor, the
#: spec, its scores and its earlier mask (both laid out as the parameter).
Item = tuple[str, Tensor, L1Unstructured, Tensor, Mask]
#: The context that names a parameter and its spec in the errors raised within it.
Naming = Callable[[str, Spec], AbstractContextManager[None]]
#: A parameter waiting for its lockstep batch: name, spec, scores' and earlier mask's blocks, layout.
_Pending = tuple[str, L1Unstructured, Tensor, Mask, Layout]


def l1_each(fn: str, items: Sequence[Item], naming: Naming) -> dict[str, Tensor]:
    """Each parameter's ``L1Unstructured`` mask, the selections over shards run in lockstep.

    Every mask is the one :func:`compute_mask` gives the parameter alone;
    the selections over the same mesh dims share their all-reduces (one per
    round for all, :func:`~._sharded.keep_over_shards_each`), so a plan's
    rule over ``n`` sharded tensors costs the rounds of one, not ``n``
    times them. Replicated parameters are computed where they lie.
    """
    out: dict[str, Tensor] = {}
    batches: dict[tuple[DeviceMesh, tuple[int, ...]], list[_Pending]] = {}
    for name, param, spec, scores, mask in items:
        assert is_dtensor(param)  # the caller's choice
        with naming(name, spec):
            layout = layout_of(fn, f"the parameter {name!r}", param)
            local, kept, _ = parameter_block(fn, name, layout, scores, mask)
            shard = layout.shard(layout.span)
            if not layout.sharded or shard.numel >= SHARDED_BRACKET_MIN_KEYS * processes([shard]):
                # a whole copy on every process (one process's kernel), or large enough to bracket alone
                shards = [shard] if layout.sharded else None
                out[name] = wrap(l1_unstructured_jointly(spec.target, [local], [kept], shards=shards)[0], layout)
                continue
        batches.setdefault((layout.mesh, layout.span), []).append((name, spec, local, kept, layout))
    for (mesh, span), batch in batches.items():
        for chunk in _chunks(batch, span, mesh):
            selections = []
            for name, spec, local, kept, layout in chunk:
                shard = layout.shard(span, mesh)
                part = l1_part(local, kept, local.dtype, shard)
                selections.append(Selection([part.keys], [part.eligible], [shard], _count_of(spec, shard.numel, name, naming)))
            for (name, _, local, _, layout), flags in zip(chunk, keep_over_shards_each(selections), strict=True):
                out[name] = wrap(flags[0].reshape(local.shape), layout)
    return out


#: Keys per process that the selections run in lockstep hold at once (their keys and kept flags,
#: about 5 bytes each): larger rules run in several lockstep batches, one after another.
LOCKSTEP_MAX_KEYS = 1 << 24


def _chunks(batch: list[_Pending], span: tuple[int, ...], mesh: DeviceMesh) -> list[list[_Pending]]:
    """``batch`` cut, in order, into runs of at most :data:`LOCKSTEP_MAX_KEYS` keys per process.

    Cut by the whole tensors' sizes over the processes the span holds, the
    same on every process (a process's own blocks may be uneven).
    """
    budget = LOCKSTEP_MAX_KEYS * math.prod(mesh.size(i) for i in span)
    chunks: list[list[_Pending]] = [[]]
    held = 0
    for pending in batch:
        size = math.prod(pending[4].shape)
        if chunks[-1] and held + size > budget:
            chunks.append([])
            held = 0
        chunks[-1].append(pending)
        held += size
    return chunks


def parameter_block(fn: str, name: str, layout: Layout, scores: Tensor, mask: Mask) -> LocalBlock:
    """This process's blocks of a plan's DTensor parameter ``name`` (laid out as ``layout``): its scores
    and earlier mask, which must be laid out as it."""
    what = f"the parameter {name!r}"
    kept = None if mask is None else as_bool(block_of(fn, f"the mask for {name!r}", mask, what, layout))
    return LocalBlock(block_of(fn, f"the scores for {name!r}", scores, what, layout), kept, layout)


def _count_of(spec: L1Unstructured, total: int, name: str, naming: Naming) -> Callable[[int], int]:
    """How many of ``name``'s ``total`` entries ``spec`` prunes, from how many are unpruned (errors named)."""

    def count(unpruned: int) -> int:
        with naming(name, spec):
            k = resolve_count(spec.target, unpruned, total)
        assert isinstance(k, int)  # of Python ints
        return k

    return count
