"""A plan's rule over DTensor parameters: each parameter's fold, block by block, in order.

:func:`fold_rule` is the one entry a :class:`~funcprune.Plan` calls for a
rule that names a DTensor: each parameter's steps are folded as the plan
folds a plain one (a DTensor's step by step through :func:`compute_mask`),
and a rule of one ``L1Unstructured`` runs its DTensors' selections in
lockstep (:func:`l1_each`: the all-reduces of all of them shared).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import torch

from .._select import (
    SHARDED_BRACKET_MIN_KEYS,
    Selection,
    keep_over_shards_each,
    processes,
    resolve_count,
)
from .._specs import (
    Chain,
    L1Unstructured,
    RuleItem,
    Spec,
    Step,
    checked_mask,
    fold,
    l1_part,
    l1_unstructured_jointly,
)
from .._types import Mask, Tensor, is_dtensor
from ._dispatch import check_supported, compute_mask
from ._layout import Layout, layout_of, parameter_block, wrap

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

__all__ = ["LOCKSTEP_MAX_KEYS", "Naming", "fold_rule", "l1_each"]


#: The context that names what is pruned (``repr(name)`` of a parameter, or a group) and its spec
#: in the errors raised within it.
Naming = Callable[[str, Spec], AbstractContextManager[None]]


def fold_rule(
    fn: str, spec: Spec, items: Sequence[RuleItem], generator: torch.Generator | None, naming: Naming
) -> dict[str, Tensor]:
    """Each item's mask: the rule's ``spec`` (a chain's steps one by one) folded on its earlier mask.

    Items are folded in order, a DTensor parameter block by block
    (:func:`fold_step`), a plain one as a plan folds it, each within
    ``naming`` of its name and ``spec``. A rule of one ``L1Unstructured``
    (or a list of one) runs its DTensors' selections first, in lockstep (:func:`l1_each`;
    deterministic, so the random draws of the others keep their order).
    """
    steps = spec.specs if isinstance(spec, Chain) else (spec,)
    out: dict[str, Tensor] = {}
    if len(steps) == 1 and isinstance(steps[0], L1Unstructured):  # a spec, or a list of one
        l1 = steps[0]
        sharded = [(it.name, it.param, l1, it.scores_of(0, it.mask), it.mask) for it in items if is_dtensor(it.param)]
        out.update(l1_each(fn, sharded, naming))
    for item in items:
        if item.name in out:
            continue
        with naming(repr(item.name), spec):
            step = fold_step(fn, item.name, item.param, steps) if is_dtensor(item.param) else checked_mask
            out[item.name] = fold(steps, item.scores_of, item.mask, generator, step=step)
    return out


def fold_step(fn: str, name: str, param: DTensor, steps: Sequence[Spec]) -> Step:
    """How a plan's fold (:func:`funcprune._specs.fold`) computes each step over the DTensor parameter ``name``.

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
L1Item = tuple[str, Tensor, L1Unstructured, Tensor, Mask]
#: A parameter waiting for its lockstep batch: name, spec, scores' and earlier mask's blocks, layout.
_Pending = tuple[str, L1Unstructured, Tensor, Mask, Layout]


def l1_each(fn: str, items: Sequence[L1Item], naming: Naming) -> dict[str, Tensor]:
    """Each parameter's ``L1Unstructured`` mask, the selections over shards run in lockstep.

    Every mask is the one :func:`compute_mask` gives the parameter alone;
    the selections over the same mesh dims share their all-reduces (one per
    round for all: ``funcprune._select``'s ``keep_over_shards_each``), so a plan's
    rule over ``n`` sharded tensors costs the rounds of one, not ``n``
    times them. Replicated parameters are computed where they lie.
    """
    out: dict[str, Tensor] = {}
    batches: dict[tuple[DeviceMesh, tuple[int, ...]], list[_Pending]] = {}
    for name, param, spec, scores, mask in items:
        assert is_dtensor(param)  # the caller's choice
        with naming(repr(name), spec):
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


def _count_of(spec: L1Unstructured, total: int, name: str, naming: Naming) -> Callable[[int], int]:
    """How many of ``name``'s ``total`` entries ``spec`` prunes, from how many are unpruned (errors named)."""

    def count(unpruned: int) -> int:
        with naming(repr(name), spec):
            k = resolve_count(spec.target, unpruned, total)
        assert isinstance(k, int)  # of Python ints
        return k

    return count
