"""Channels of several DTensors ranked together: the collective half of ``global_structured``.

Each tensor's channels are normed where they lie whole, or reduced across
the processes that share them (``_structured.channels``), normalized with
sums or maxima reduced across processes, and the group's channel vector is
ranked by the exact selection over shards: only fixed-size all-reduces
cross processes, nothing is gathered (``README.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from .._specs import (
    ChannelKeys,
    LnStructured,
    Normalize,
    RandomStructured,
    StructuredSpec,
    check_channels,
    expand_channels,
    l1_unstructured_jointly,
    normalized,
)
from .._types import Tensor, is_dtensor
from ._dispatch import check_group
from ._layout import LocalBlock, layout_of, parameter_block, shards_of, wrap
from ._random import random_unstructured
from ._rules import Naming
from ._structured import (
    Channels,
    agree_on_failures,
    all_reduced,
    channels,
    check_layout,
)

__all__ = ["keep_channels_across"]


def keep_channels_across(
    fn: str,
    spec: StructuredSpec,
    selected: Sequence[str],
    params: Mapping[str, Tensor],
    masks: Mapping[str, Tensor],
    scores_of: Callable[[str], Tensor],
    normalize: Normalize,
    generator: torch.Generator | None,
    naming: Naming,
) -> list[Tensor]:
    """The masks of a global structured group of DTensors: channels ranked across processes, nothing gathered.

    Each tensor's channels are keyed where they lie (:func:`~._structured.channels`),
    normalized with sums and maxima reduced across processes, and the
    group's channel vector is ranked by the exact selection over shards
    (``LnStructured``) or by random keys (``RandomStructured``). Each
    tensor's scores are ``scores_of(name)``, asked for once its layout is
    checked; errors are raised within ``naming`` (of ``repr(name)`` for a
    tensor's own, of the whole group for the selection).
    """
    labels = [f"the parameter {name!r}" for name in selected]
    check_group(fn, labels, [params[name] for name in selected], spec)
    blocks = []
    for name, label in zip(selected, labels, strict=True):
        param = params[name]
        assert is_dtensor(param)  # checked by check_group
        layout = layout_of(fn, label, param)
        check_layout(fn, label, spec, layout)
        each = scores_of(name)
        blocks.append(parameter_block(fn, name, layout, each, masks.get(name)))
    for name, block in zip(selected, blocks, strict=True):  # one process's checks, before any communication
        with naming(repr(name), spec):
            check_channels(spec, block.whole())
    parts = [channels(spec, block, spec.dim % len(block.layout.shape)) for block in blocks]
    if isinstance(spec, LnStructured) and spec.n == "nuc" and any(p.layout.sharded for p in parts):
        agree_on_failures(spec, parts)  # an SVD may fail on one process only: then all raise
    for part in parts:
        if part.failure is not None:  # every process holds the same values: all fail alike
            raise part.failure
    keys = _normalized_across(parts, normalize)
    total = sum(p.layout.shape[0] for p in parts)
    what = f"the {total} channels of [" + ", ".join(map(repr, selected)) + "] jointly"
    shards = shards_of([p.layout for p in parts])
    with naming(what, spec):
        if isinstance(spec, RandomStructured):
            vectors = [LocalBlock(k, p.eligible, p.layout) for k, p in zip(keys, parts, strict=True)]
            kept = random_unstructured(spec.target, vectors, shards, generator)
        else:
            kept = l1_unstructured_jointly(spec.target, keys, [p.eligible for p in parts], shards=shards)
    out = []
    for flags, part, block in zip(kept, parts, blocks, strict=True):
        local = expand_channels(flags, ChannelKeys(flags, None, part.dim, block.scores.shape, block.mask))
        out.append(wrap(local, block.layout))
    return out


def _normalized_across(parts: Sequence[Channels], normalize: Normalize) -> list[Tensor]:
    """Each tensor's channel keys scaled as ``normalized`` scales them on one process, over all its processes.

    Channels whole on every process are normalized there, exactly as one
    process does. A tensor whose channels are cut across processes sums
    (``"mean"``: in float64, rounded once to the norms' dtype, so within an
    ulp of one process's float32 sum) or maximizes (``"max"``: exact) its
    part of each tensor's numbers: one ``all_reduce`` per mesh dim for the
    whole group. Where copies of a block of channels lie along some mesh
    dims, one of them adds its numbers (three copies would triple a sum,
    not always exactly).
    """
    if normalize is None:
        return [p.keys for p in parts]
    cut = [i for i, p in enumerate(parts) if p.layout.sharded]
    numbers: list[float] = []
    for i in cut:
        norms, eligible = parts[i].keys, parts[i].eligible
        if not parts[i].layout.counted:  # a copy of channels another process counts
            numbers += [0.0, 0.0] if normalize == "mean" else [0.0]
            continue
        counted = norms.isfinite() if eligible is None else norms.isfinite() & eligible
        values = torch.where(counted, norms, torch.zeros_like(norms))
        if normalize == "mean":
            numbers += [float(values.sum(dtype=torch.float64)), float(counted.sum())]
        else:
            numbers.append(float(values.amax()) if values.numel() else 0.0)
    reduced: list[float] = []
    if cut:
        op = dist.ReduceOp.SUM if normalize == "mean" else dist.ReduceOp.MAX
        reduced = all_reduced(numbers, parts[cut[0]].layout, op, parts[cut[0]].keys.device)
    out = []
    for i, part in enumerate(parts):
        norms = part.keys
        if i not in cut:
            out.append(normalized(norms, part.eligible, normalize))
            continue
        j = cut.index(i)
        if normalize == "mean":
            total = torch.tensor(reduced[2 * j], dtype=torch.float64, device=norms.device).to(norms.dtype)
            scale = total / torch.tensor(max(reduced[2 * j + 1], 1.0), device=norms.device).to(norms.dtype)
        else:
            scale = torch.tensor(reduced[j], device=norms.device).to(norms.dtype)
        out.append(norms / torch.where(scale > 0, scale, torch.ones_like(scale)))
    return out
