"""Exact bottom-k selection: which path runs is decided here, and nowhere else.

:func:`keep` (groups of one tensor) and :func:`keep_jointly` (several parts
ranked as one, over shards where they are shards) pick the sort, threshold,
short-rows, long-rows, bracket or shards path; all give identical flags. The three
rules every path keeps, and when each runs: ``README.md`` in this folder.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence

import torch

from .. import _native
from .._torch_private import is_batched
from .._types import Count, Mask, Tensor
from .._validate import count_to_prune, is_concrete, refuse_dtensors, validate_count
from ._batched import make_keep_lowest
from ._bracket import keep_by_bracket as _keep_by_bracket
from ._groups import (
    WHOLE,
    CountOf,
    Group,
    KeyPart,
    LocalShard,
    Runs,
    Slices,
    Sparsity,
    Target,
    Whole,
    identity,
    magnitude_of,
)
from ._rows import RAGGED_DTYPES, keep_in_ragged_rows, keep_in_rows
from ._sharded import keep_over_shards, processes
from ._sharded_bracket import keep_by_bracket_over_shards
from ._short_rows import SHORT_ROW_MAX, keep_in_short_rows

__all__ = [
    "FAST_MIN_KEYS", "SHARDED_BRACKET_MIN_KEYS", "eligible_per_group", "keep", "keep_each", "keep_jointly",
    "resolve_count",
]  # fmt: skip

#: From this many keys on, eager selection brackets instead of sorting.
FAST_MIN_KEYS = 1 << 16
#: From this many keys per process (the group's, over the processes it spans), a selection over
#: shards is bracketed (:mod:`._sharded_bracket`): below it, its two more all-reduces and its
#: sample cost more than the passes they save (2 gloo processes on 2 cores: bracketed/radix
#: time 1.6 at 1M keys each, 1.2 at 2M, 0.76 at 4M, 0.42 at 12.5M).
SHARDED_BRACKET_MIN_KEYS = 1 << 22
#: More units than any tensor holds: a larger integer amount prunes the same.
_MAX_COUNT = 2**62


def resolve_count(amount: Target, available: Count, total: int) -> Count:
    """The number of units to prune out of ``available`` ones (of ``total`` in all).

    With a Python ``int`` for ``available``, torch's rule applies and an
    integer amount larger than ``available`` raises ``ValueError``; so it
    does for per-group counts held in an eager tensor, against the smallest.
    With a tensor (per group, or the per-element count under a transform),
    the fraction is rounded half to even in float64, exactly as Python's
    ``round`` does; under a transform an integer amount is capped at
    ``available`` since no error can be raised on a value there. A :class:`Sparsity` prunes what it takes for
    ``round(value * total)`` units to be pruned, counting the
    ``total - available`` pruned before, and nothing if that many already are.
    """
    if isinstance(amount, Sparsity):
        goal = total - round(amount.value * total)  # units left after the call
        if isinstance(available, int):
            return max(0, available - goal)
        return torch.clamp(available - goal, min=0)
    if isinstance(available, int):
        validate_count(amount, available)
        return count_to_prune(amount, available)
    if isinstance(amount, numbers.Integral) and is_concrete(available) and available.numel():
        validate_count(amount, int(available.min()))
    if isinstance(amount, numbers.Integral):  # capped below int64's range first
        return torch.clamp(available, max=min(int(amount), _MAX_COUNT))
    return torch.round(available.to(torch.float64) * float(amount)).to(torch.int64)


def keep(keys: Tensor, k: Count, eligible: Mask = None, *, group: Group = WHOLE, magnitude: bool = False) -> Tensor:
    """Kept flags of ``keys``' shape: in each group the ``k`` lowest eligible keys go.

    Args:
        keys: the keys; lower means less important (with ``magnitude``, the
            values whose magnitudes ``|keys|`` are the keys: computed only
            where a path needs them).
        k: the count to prune per group: a Python ``int``, or an integer
            tensor (a 0-d count for :data:`WHOLE`, one count per group
            otherwise, or a 0-d count shared by all groups). For a
            :class:`Shard`, a Python ``int``: the count over the whole tensor.
        eligible: ``torch.bool`` flags of ``keys``' shape; ``None`` means all.
        group: how the entries are grouped.
        magnitude: rank ``|keys|``.

    Returns:
        A new ``torch.bool`` tensor: eligible and not among the pruned.
    """
    refuse_dtensors("compute_mask", keys, eligible)
    flat = None if eligible is None else eligible.reshape(-1)
    key = magnitude_of if magnitude else identity
    if isinstance(group, Whole):  # one group: one long row, where that path takes it
        row, flags = keys.reshape(1, -1), None if flat is None else flat.reshape(1, -1)
        if _at_once(row, k, flags) and _eager(row, k, flags):
            kept = keep_in_rows(row, k, flags, absolute=magnitude)
            if kept is not None:
                return kept.reshape(keys.shape)
        return keep_jointly([KeyPart(keys.reshape(-1), key, eligible=flat)], k)[0].reshape(keys.shape)
    if isinstance(group, LocalShard):
        return keep_jointly([KeyPart(keys.reshape(-1), key, eligible=flat, shard=group)], k)[0].reshape(keys.shape)
    rows, restore = _as_rows(keys, group)
    eligible_rows = None if eligible is None else _as_rows(eligible, group)[0]
    if rows.shape[1] <= SHORT_ROW_MAX and _eager(rows, k, eligible_rows):
        return restore(keep_in_short_rows(key(rows), k, eligible_rows))
    if _at_once(rows, k, eligible_rows) and _eager(rows, k, eligible_rows):
        kept = keep_in_rows(rows, k, eligible_rows, absolute=magnitude)
        if kept is not None:
            return restore(kept)
    if eligible is None and isinstance(k, int):  # one count for every row: no sort
        if is_concrete(rows):
            return restore(_keep_lowest_eagerly(rows, k, magnitude))
        return restore(_keep_by_threshold(key(rows), k))
    return restore(_keep_rows(key(rows), k, eligible_rows))


#: Rows up to this long go to the long-rows path whatever the thread count: one thread selects
#: such a row faster than the bracket's passes on all of them (4M keys: 5 ms against 11 at one
#: thread, 2 cores; 1M: 1.2 against 4.2).
ROW_ALONE_MAX = 1 << 22


def _at_once(rows: Tensor, k: Count, eligible: Mask) -> bool:
    """Whether the long-rows path (:mod:`._rows`) takes these rows (each row one thread's).

    Rows longer than short rows; but a few rows longer than :data:`ROW_ALONE_MAX`
    (fewer than torch's threads), with one ``int`` count and every key
    eligible, are bracketed one by one instead, each on all the threads.
    """
    count, length = rows.shape
    if length <= SHORT_ROW_MAX:
        return False
    if eligible is not None or not isinstance(k, int):
        return True  # the alternative is the sort
    return length <= ROW_ALONE_MAX or count >= torch.get_num_threads()


def _eager(rows: Tensor, k: Count, eligible: Mask) -> bool:
    """Whether every input holds values Python may read (the eager paths' condition)."""
    return all(is_concrete(t) for t in (rows, k, eligible) if isinstance(t, torch.Tensor))


def eligible_per_group(eligible: Tensor, group: Slices | Runs) -> Tensor:
    """How many entries of each group are eligible, as :func:`keep` orders the groups.

    The per-group counts that :func:`keep` takes for ``k`` are computed from these.
    Long eager groups are counted natively (one pass; a torch sum of bool
    along a row costs several nanoseconds a flag).
    """
    rows = _as_rows(eligible, group)[0]
    if rows.shape[1] > SHORT_ROW_MAX and rows.dtype == torch.bool and is_concrete(rows):
        counts = _native.row_counts(rows.contiguous())
        if counts is not None:
            return counts
    return rows.sum(1)


def _keep_sorted(keys: Tensor, k: Count, eligible: Mask) -> Tensor:
    """:func:`keep` over one 1-D group by the threshold or the sort path."""
    if eligible is None and isinstance(k, int):
        return _keep_by_threshold(keys, k)
    return _keep_rows(keys[None], k, None if eligible is None else eligible[None])[0]


def _as_rows(t: Tensor, group: Group) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """``t`` as a 2-D tensor, one group a row, and the inverse reshaping."""
    if isinstance(group, Slices):
        moved = t.movedim(group.dim, 0)
        return moved.reshape(moved.shape[0], -1), lambda r: r.reshape(moved.shape).movedim(0, group.dim)
    assert isinstance(group, Runs)
    moved = t.movedim(group.dim, -1)
    if moved.shape[-1] % group.size:
        raise ValueError(
            f"blocks of {group.size} entries along dim {group.dim} do not tile a length of "
            f"{moved.shape[-1]}; the length must be a multiple of the block size"
        )
    return moved.reshape(-1, group.size), lambda r: r.reshape(moved.shape).movedim(-1, group.dim)


def _keep_rows(rows: Tensor, k: Count, eligible: Mask) -> Tensor:
    """Per row of a 2-D tensor, by a stable sort: any count, any eligibility."""
    order = torch.sort(rows, dim=1, stable=True).indices
    limit = k if isinstance(k, int) or k.dim() == 0 else k.reshape(-1, 1)
    if eligible is None:
        ranks = torch.arange(1, rows.shape[1] + 1, device=rows.device).expand(rows.shape)
        pruned_sorted = ranks <= limit
    else:
        eligible_sorted = eligible.gather(1, order)
        pruned_sorted = eligible_sorted & (torch.cumsum(eligible_sorted, 1) <= limit)
    kept = torch.ones_like(rows, dtype=torch.bool).scatter(1, order, ~pruned_sorted)
    return kept if eligible is None else kept.logical_and_(eligible)


def _keep_by_threshold(keys: Tensor, k: int) -> Tensor:
    """:func:`keep` along the last dim for ``0 <= k <= n``, all eligible, via the k-th key."""
    if k <= 0:
        return torch.ones_like(keys, dtype=torch.bool)
    v = torch.kthvalue(keys, k, dim=-1, keepdim=True).values  # NaN ranks last here too
    nan = keys.isnan()
    below = (keys < v) | (v.isnan() & ~nan)
    ties = (keys == v) | (nan & v.isnan())
    ties_to_prune = k - below.sum(-1, keepdim=True)
    return ~(below | (ties & (torch.cumsum(ties, -1) <= ties_to_prune)))


# --- several parts ranked as one ---------------------------------------------


def keep_jointly(parts: Sequence[KeyPart], k: Count | CountOf) -> list[Tensor]:
    """Per part, 1-D kept flags: the ``k`` lowest eligible keys of all parts go.

    Equal to :func:`keep` on the concatenated keys and eligibility, split
    back. Eager parts from :data:`FAST_MIN_KEYS` keys in all are bracketed
    part by part; otherwise the parts are concatenated. Parts that are
    shards (all or none) are ranked with the other processes' blocks, as
    if the whole tensors were concatenated; ``k`` is then a Python ``int``
    counting over the whole group, or the function that says it from the
    number of eligible keys over all processes (found on the way, without
    an all-reduce of its own).
    """
    refuse_dtensors("compute_mask", *(t for p in parts for t in (p.source, p.eligible)))
    shards = [p.shard for p in parts if p.shard is not None]
    if shards:
        if len(shards) != len(parts) or not (isinstance(k, int) or callable(k)):
            raise ValueError(
                "parts ranked over shards must all be shards, with a Python int count; got "
                f"{len(shards)} shards among {len(parts)} parts and a count of type {type(k).__name__}"
            )
        total = sum(s.numel for s in shards)
        concrete = all(map(is_concrete, _tensors(parts)))  # (else refused below, before any collective)
        large = total >= SHARDED_BRACKET_MIN_KEYS and total >= SHARDED_BRACKET_MIN_KEYS * processes(shards)
        if concrete and (callable(k) or k > 0) and large:
            found = keep_by_bracket_over_shards(parts, shards, k)  # a miss on every process alike
            if not isinstance(found, int):
                return found
            k = found  # the count, resolved: rank every key
        return keep_over_shards([p.keys for p in parts], [p.eligible for p in parts], shards, k)
    if callable(k):
        raise TypeError("keep_jointly: a count function goes with shards only")
    total = sum(p.numel for p in parts)
    if isinstance(k, int) and total >= FAST_MIN_KEYS and all(map(is_concrete, _tensors(parts))):
        bracketed = _keep_by_bracket(parts, k)
        if bracketed is not None:
            return bracketed
    if len(parts) == 1:
        part = parts[0]
        if isinstance(k, int) and _goes_to_vmap_op(part) and _keep_lowest is not None:
            magnitude = part.key is magnitude_of
            return [_keep_lowest(part.source if magnitude else part.keys(), k, magnitude)]
        return [_keep_sorted(part.keys(), k, part.eligible)]
    keys = torch.cat([p.keys() for p in parts])
    eligible = None
    if any(p.eligible is not None for p in parts):
        eligible = torch.cat([_flags(p) for p in parts])
    return list(torch.split(_keep_sorted(keys, k, eligible), [p.numel for p in parts]))


# --- several parts, each ranked on its own ------------------------------------


def keep_each(parts: Sequence[KeyPart], counts: Sequence[int], available: Sequence[int]) -> list[Tensor]:
    """Per part, 1-D kept flags once *its own* ``counts[i]`` lowest eligible keys go.

    Equal to ``keep_jointly([part], k)`` for each part and its count (a
    plan's per-tensor selections). The eager CPU parts whose keys are their
    values or magnitudes are selected together, each a row of the long-rows
    kernel (:func:`~._rows.keep_in_ragged_rows`: one call, the rows shared
    among the threads, each row one thread's); but a part longer than
    :data:`ROW_ALONE_MAX`, while torch has several threads, is bracketed on
    all of them, and every part the kernel does not take is selected alone.

    Args:
        parts: the parts (no shards).
        counts: per part, how many of its eligible keys go (a Python ``int``).
        available: per part, how many of its keys are eligible (exactly).
    """
    if len(counts) != len(parts) or len(available) != len(parts):
        raise ValueError(f"keep_each: {len(parts)} parts, {len(counts)} counts, {len(available)} available")
    refuse_dtensors("compute_mask", *(t for p in parts for t in (p.source, p.eligible)))
    at_once = [i for i, p in enumerate(parts) if _in_ragged_rows(p, counts[i])]
    kept: list[Tensor | None] = [None] * len(parts)
    if at_once:
        found = keep_in_ragged_rows(
            [parts[i].source for i in at_once],
            [counts[i] for i in at_once],
            [parts[i].eligible for i in at_once],
            [available[i] for i in at_once],
            [parts[i].key is magnitude_of for i in at_once],
        )
        for i, flags in zip(at_once, found, strict=True):
            kept[i] = flags
    return [keep_jointly([p], counts[i])[0] if k is None else k for i, (p, k) in enumerate(zip(parts, kept))]


def _in_ragged_rows(part: KeyPart, k: int) -> bool:
    """Whether a part goes to the long-rows kernel with the others (:func:`keep_each`)."""
    source, eligible = part.source, part.eligible
    return (
        part.shard is None
        and isinstance(k, int)
        and (part.key is magnitude_of or part.key is identity)
        and source.device.type == "cpu"
        and source.dtype in RAGGED_DTYPES
        and (source.numel() <= ROW_ALONE_MAX or torch.get_num_threads() == 1)
        and is_concrete(source)
        and (eligible is None or (eligible.dtype == torch.bool and is_concrete(eligible)))
    )


def _tensors(parts: Sequence[KeyPart]) -> list[Tensor]:
    return [t for p in parts for t in (p.source, p.eligible) if t is not None]

def _goes_to_vmap_op(part: KeyPart) -> bool:
    """Whether a part (with an int count) goes to ``funcprune::keep_lowest``: batched by vmap, not compiled.

    Its vmap rule selects row by row eagerly, as a loop of eager calls would,
    instead of tracing a full-row ``kthvalue`` and ``cumsum`` per row.
    """
    return (
        part.eligible is None
        and is_batched(part.source)
        and not torch.compiler.is_compiling()
    )


def _flags(part: KeyPart) -> Tensor:
    if part.eligible is not None:
        return part.eligible
    return torch.ones(part.numel, dtype=torch.bool, device=part.source.device)


#: Rows shorter than this are selected at once; longer ones one by one, as
#: eager calls would (a batched ``kthvalue`` is the slower from there, on CPU).
_SHORT_ROWS = 1 << 12


def _keep_lowest_eagerly(rows: Tensor, k: int, magnitude: bool) -> Tensor:
    """Per row of eager 2-D values: kept flags once the ``k`` lowest keys go."""
    if _at_once(rows, k, None):
        kept = keep_in_rows(rows, k, None, absolute=magnitude)
        if kept is not None:
            return kept
    if rows.shape[1] < _SHORT_ROWS:
        return _keep_by_threshold(rows.abs() if magnitude else rows, k)
    parts = (KeyPart(row, magnitude_of) if magnitude else KeyPart(row) for row in rows)
    return torch.stack([keep_jointly([part], k)[0] for part in parts])


_keep_lowest = make_keep_lowest(_keep_lowest_eagerly)
