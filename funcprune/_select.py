"""Exact bottom-k selection: the one module that decides how it is done.

Every function here answers the same question with the same polarity: which
entries are **kept** (``True``, as in a mask) when, in each group, the ``k``
eligible entries with the lowest keys are pruned. Ineligible entries (pruned
earlier) are never kept. Three rules hold on every path:

- exactly ``k`` eligible entries are pruned per group (capped at the number
  eligible), whatever the ties;
- among equal keys the lower index is pruned first (the lower index of the
  concatenation, for parts ranked jointly);
- NaN ranks above every number (as in :func:`torch.topk`), so it goes last.

Groups are first-class: :data:`WHOLE` (all entries), :class:`Slices` (each
slice along a dim, on its own), :class:`Blocks` (each run of ``size``
consecutive entries along a dim) and :class:`Shard` (this process holds one
block of a larger tensor; the group is the whole tensor, selected exactly
across processes by :mod:`._sharded`). :func:`keep_jointly` ranks several
tensors as if concatenated, without concatenating them, and over shards when
its parts are shards.

Paths, chosen here and nowhere else (all give identical flags, tested):

- *sort* (a stable sort, then a cumulative count): any count, including a
  tensor of per-group counts under ``vmap``, and any eligibility;
- *threshold* (one :func:`torch.kthvalue`): a Python ``int`` count over a
  whole tensor with every entry eligible; works under every transform;
- *shards* (eager): a radix select whose per-round histograms are summed
  across processes; the only path for :class:`Shard` groups;
- *bracket* (eager, from :data:`FAST_MIN_KEYS` keys): a strided sample
  brackets the k-th key, one pass per part counts the keys below the bracket
  and collects the few inside, ``kthvalue`` finishes on those. Where the
  sample misleads or the threshold is not finite it steps aside for the sort.

Python control flow depends on shapes and Python numbers only, except on the
bracket path, which runs only on concrete (eager) tensors.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Union, final

import torch

from torch._C._functorch import is_batchedtensor

from ._batched import make_keep_lowest
from ._sharded import Shard, keep_over_shards
from ._types import Amount, Count, Mask, Tensor
from ._validate import count_to_prune, is_concrete, validate_count

__all__ = [
    "FAST_MIN_KEYS",
    "WHOLE",
    "Blocks",
    "Group",
    "KeyPart",
    "Shard",
    "Slices",
    "Sparsity",
    "Target",
    "Whole",
    "keep",
    "keep_jointly",
    "magnitude_of",
    "resolve_count",
]

#: From this many keys on, eager selection brackets instead of sorting.
FAST_MIN_KEYS = 1 << 16
#: About how many keys the bracketing sample holds.
_SAMPLE = 1 << 17
#: More units than any tensor holds: a larger integer amount prunes the same.
_MAX_COUNT = 2**62


@final
@dataclass(frozen=True, slots=True)
class Whole:
    """One group: every entry of the tensor."""


@final
@dataclass(frozen=True, slots=True)
class Slices:
    """One group per index along ``dim``: each slice selects on its own."""

    dim: int


@final
@dataclass(frozen=True, slots=True)
class Blocks:
    """One group per run of ``size`` consecutive entries along ``dim``."""

    size: int
    dim: int = -1


Group = Union[Whole, Slices, Blocks, Shard]
#: The default group.
WHOLE = Whole()


@final
@dataclass(frozen=True, slots=True)
class Sparsity:
    """A cumulative target: this fraction of all units pruned after the call."""

    value: float


#: How much a spec prunes: an ``int`` count or a ``float`` fraction of what is
#: left (torch's ``amount``), or a cumulative :class:`Sparsity`.
Target = Union[Amount, Sparsity]


def resolve_count(amount: Target, available: Count, total: int) -> Count:
    """The number of units to prune out of ``available`` ones (of ``total`` in all).

    With a Python ``int`` for ``available``, torch's rule applies and an
    integer amount larger than ``available`` raises ``ValueError``. With a
    tensor (the per-element count under a transform), the fraction is rounded
    half to even in float64, exactly as Python's ``round`` does, and an
    integer amount is capped at ``available`` since no error can be raised
    on a value there. A :class:`Sparsity` prunes what it takes for
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
    if isinstance(amount, numbers.Integral):  # capped below int64's range first
        return torch.clamp(available, max=min(int(amount), _MAX_COUNT))
    return torch.round(available.to(torch.float64) * float(amount)).to(torch.int64)


def keep(keys: Tensor, k: Count, eligible: Mask = None, *, group: Group = WHOLE) -> Tensor:
    """Kept flags of ``keys``' shape: in each group the ``k`` lowest eligible keys go.

    Args:
        keys: the keys; lower means less important.
        k: the count to prune per group: a Python ``int``, or an integer
            tensor (a 0-d count for :data:`WHOLE`, one count per group
            otherwise, or a 0-d count shared by all groups). For a
            :class:`Shard`, a Python ``int``: the count over the whole tensor.
        eligible: ``torch.bool`` flags of ``keys``' shape; ``None`` means all.
        group: how the entries are grouped.

    Returns:
        A new ``torch.bool`` tensor: eligible and not among the pruned.
    """
    flat = None if eligible is None else eligible.reshape(-1)
    if isinstance(group, Whole):
        return _keep_flat(keys.reshape(-1), k, flat).reshape(keys.shape)
    if isinstance(group, Shard):
        return keep_jointly([KeyPart(keys.reshape(-1), eligible=flat, shard=group)], k)[0].reshape(keys.shape)
    rows, restore = _as_rows(keys, group)
    eligible_rows = None if eligible is None else _as_rows(eligible, group)[0]
    return restore(_keep_rows(rows, k, eligible_rows))


def _keep_flat(keys: Tensor, k: Count, eligible: Mask) -> Tensor:
    """:func:`keep` over one 1-D group."""
    return keep_jointly([KeyPart(keys, eligible=eligible)], k)[0]


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
    assert isinstance(group, Blocks)
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


# --- several parts ranked as one: the bracket ---------------------------------


def _identity(t: Tensor) -> Tensor:
    return t


def magnitude_of(t: Tensor) -> Tensor:
    """``|t|``: as a :class:`KeyPart`'s key, the part's keys are its magnitudes."""
    return t.abs()


@final
@dataclass(frozen=True, slots=True)
class KeyPart:
    """One part of keys ranked jointly, computed slice by slice (never all at once).

    Attributes:
        source: the 1-D tensor the keys come from (its size, device, and
            whether its values can be read: eager or traced).
        key: maps any slice of ``source`` to the slice's keys, entry by
            entry, in the group's common dtype (the identity where
            ``source`` holds the keys).
        eligible: 1-D ``torch.bool`` flags; ``None`` means all.
        shard: where the part sits in a larger tensor whose other blocks
            other processes hold; ``None`` when this process holds it all.
    """

    source: Tensor
    key: Callable[[Tensor], Tensor] = _identity
    eligible: Mask = None
    shard: Shard | None = None

    @property
    def numel(self) -> int:
        """How many keys the part has."""
        return self.source.numel()

    def keys(self) -> Tensor:
        """All the part's keys."""
        return self.key(self.source)


def keep_jointly(parts: Sequence[KeyPart], k: Count) -> list[Tensor]:
    """Per part, 1-D kept flags: the ``k`` lowest eligible keys of all parts go.

    Equal to :func:`keep` on the concatenated keys and eligibility, split
    back. Eager parts from :data:`FAST_MIN_KEYS` keys in all are bracketed
    part by part; otherwise the parts are concatenated. Parts that are
    shards (all or none) are ranked with the other processes' blocks, as
    if the whole tensors were concatenated; ``k`` is then a Python ``int``
    counting over the whole group.
    """
    shards = [p.shard for p in parts if p.shard is not None]
    if shards:
        if len(shards) != len(parts) or not isinstance(k, int):
            raise ValueError(
                "parts ranked over shards must all be shards, with a Python int count; got "
                f"{len(shards)} shards among {len(parts)} parts and a count of type {type(k).__name__}"
            )
        return keep_over_shards([p.keys for p in parts], [p.eligible for p in parts], shards, k)
    total = sum(p.numel for p in parts)
    tensors = [t for p in parts for t in (p.source, p.eligible) if t is not None]
    if isinstance(k, int) and total >= FAST_MIN_KEYS and all(map(is_concrete, tensors)):
        bracketed = _keep_by_bracket(parts, k)
        if bracketed is not None:
            return bracketed
    if len(parts) == 1:
        part = parts[0]
        if isinstance(k, int) and _batched(part) and _keep_lowest is not None:
            magnitude = part.key is magnitude_of
            return [_keep_lowest(part.source if magnitude else part.keys(), k, magnitude)]
        return [_keep_sorted(part.keys(), k, part.eligible)]
    keys = torch.cat([p.keys() for p in parts])
    eligible = None
    if any(p.eligible is not None for p in parts):
        eligible = torch.cat([_flags(p) for p in parts])
    return list(torch.split(_keep_sorted(keys, k, eligible), [p.numel for p in parts]))


def _batched(part: KeyPart) -> bool:
    """Whether a part (with an int count) goes to ``funcprune::keep_lowest``: batched by vmap, not compiled.

    Its vmap rule selects row by row eagerly, as a loop of eager calls would,
    instead of tracing a full-row ``kthvalue`` and ``cumsum`` per row.
    """
    return (
        part.eligible is None
        and is_batchedtensor(part.source)
        and not torch.compiler.is_compiling()
    )


def _flags(part: KeyPart) -> Tensor:
    if part.eligible is not None:
        return part.eligible
    return torch.ones(part.numel, dtype=torch.bool, device=part.source.device)


def _keep_by_bracket(parts: Sequence[KeyPart], k: int) -> list[Tensor] | None:
    """The bracket path; ``None`` where it cannot answer (then the caller sorts).

    One scan over each part, chunk by chunk (the chunk's keys stay in cache):
    count the keys below the bracket, collect the few inside. A ``kthvalue``
    over those finds the threshold; one comparison per entry, again chunk by
    chunk, writes the mask.
    """
    total = sum(p.numel for p in parts)
    if not 0 < k <= total:
        return None
    lo, hi = _bounds(torch.cat([_sample(p, _stride(total)) for p in parts]), k / total)
    chunk = _CHUNK * min(torch.get_num_threads(), 64)  # each thread's share stays in its cache
    below: list[Tensor] = []
    found: list[Tensor] = []  # per part, the keys inside the bracket in index order
    for part in parts:
        collected = []
        for start in range(0, part.numel, chunk):
            count, keys = _scan(_eligible_keys(part, start, start + chunk), lo, hi)
            below.append(count)
            collected.append(keys)
        found.append(torch.cat(collected))
    n_below = int(torch.stack(below).sum(dtype=torch.float64))
    n_inside = sum(f.numel() for f in found)
    if not n_below < k <= n_below + n_inside:
        return None
    v = torch.kthvalue(torch.cat(found), k - n_below).values
    if not bool(torch.isfinite(v)):
        return None
    ties_to_prune = k - n_below
    for f in found:
        ties_to_prune -= int(torch.count_nonzero(f < v))
    kept = []
    for part, candidates in zip(parts, found, strict=True):
        ties = int(torch.count_nonzero(candidates == v))
        take = min(ties, ties_to_prune)
        ties_to_prune -= take
        kept.append(_survivors(part, v, ties, take, chunk))
    return kept


#: Entries scanned at a time, per thread: their keys and flags stay in cache.
_CHUNK = 1 << 16
_EIGHT = 8


def _stride(total: int) -> int:
    """The sample's stride: about ``4 * total ** (2/3)`` keys, at most 1/16 of them.

    A sample of ``m`` keys costs two ``kthvalue`` over ``m``; the bracket it
    gives holds about ``4 / sqrt(m)`` of the keys, to collect and to rank
    with one more ``kthvalue``: this balances the two (measured).
    """
    return max(16, total // min(_SAMPLE, 4 * round(math.pow(total, 2 / 3))))


def _eligible_keys(part: KeyPart, start: int, stop: int) -> Tensor:
    """The keys of ``part.source[start:stop]``, ``+inf`` where ineligible (never picked)."""
    keys = part.key(part.source[start:stop])
    if part.eligible is None:
        return keys
    return keys.masked_fill(part.eligible[start:stop].logical_not(), torch.inf)


def _scan(keys: Tensor, lo: float, hi: float) -> tuple[Tensor, Tensor]:
    """How many ``keys`` lie below the bracket, and those inside (in index order).

    The count is a 0-d float tensor (exact: a chunk is far below 2**24 keys).
    NaN is neither below nor inside. A finite bracket is tested on one
    shifted copy ``d = keys - mid``: ``d < -half`` below, ``|d| <= half``
    inside. Rounding is monotone, so these are consecutive ranges of the
    keys' order whatever the rounding, and a comparison written as floats
    runs vectorized where a ``torch.bool`` output does not. The keys inside
    are found 8 flags (one int64 word) at a time.
    """
    flags = torch.empty(keys.shape, dtype=torch.float32, device=keys.device)
    if math.isfinite(lo) and math.isfinite(hi):
        mid, half = (lo + hi) / 2, (hi - lo) / 2
        d = keys - mid
        below = torch.lt(d, -half, out=flags).sum()
        inside = _at_most(d.abs_(), half)
    else:
        below = torch.lt(keys, lo, out=flags).sum()
        inside = (keys >= lo).logical_and_(keys <= hi)
    if keys.numel() % _EIGHT:
        return below, keys[inside]
    words = inside.view(torch.int64).nonzero().squeeze(1)
    rows = inside.view(-1, _EIGHT).index_select(0, words)
    return below, keys.view(-1, _EIGHT).index_select(0, words)[rows]


def _at_most(keys: Tensor, bound: float | Tensor, out: Tensor | None = None) -> Tensor:
    """``keys <= bound`` as ``torch.bool``, written as int8 (``out``, if given).

    A comparison storing int8 runs vectorized on CPU, about 2.5x faster than
    one storing ``torch.bool``; the 0/1 bytes are then viewed as bool.
    """
    if out is None:
        out = torch.empty(keys.shape, dtype=torch.int8, device=keys.device)
    return torch.le(keys, bound, out=out).view(torch.bool)


def _sample(part: KeyPart, stride: int) -> Tensor:
    sample = part.key(part.source[::stride])
    if part.eligible is None:
        return sample
    return sample.masked_fill(part.eligible[::stride].logical_not(), torch.inf)


def _survivors(part: KeyPart, v: Tensor, ties: int, take: int, chunk: int) -> Tensor:
    """Kept flags when every key below ``v`` and the first ``take`` of ``ties`` go."""
    if take == ties:  # chunk by chunk: written while the chunk's keys are in cache
        kept = torch.empty(part.numel, dtype=torch.int8, device=part.source.device)
        for start in range(0, part.numel, chunk):
            stop = start + chunk
            flags = _at_most(part.key(part.source[start:stop]), v, kept[start:stop]).logical_not_()
            if part.eligible is not None:
                flags.logical_and_(part.eligible[start:stop])
        return kept.view(torch.bool)
    keys = _eligible_keys(part, 0, part.numel)
    pruned = keys < v
    if take:
        pruned.index_fill_(0, (keys == v).nonzero().squeeze(1)[:take], True)
    kept = pruned.logical_not_()
    return kept if part.eligible is None else kept.logical_and_(part.eligible)


def _bounds(sample: Tensor, q: float) -> tuple[float, float]:
    """Bounds likely to hold the q-quantile of the keys, from a sample."""
    m = sample.numel()
    margin = 4.0 * (m * q * (1.0 - q)) ** 0.5 + 8.0
    r_lo, r_hi = int(q * m - margin), int(q * m + margin) + 1
    lo = float(torch.kthvalue(sample, r_lo).values) if r_lo >= 1 else -torch.inf
    hi = float(torch.kthvalue(sample, r_hi).values) if r_hi <= m else torch.inf
    return lo, hi


#: Rows shorter than this are selected at once; longer ones one by one, as
#: eager calls would (a batched ``kthvalue`` is the slower from there, on CPU).
_SHORT_ROWS = 1 << 12


def _keep_lowest_eagerly(rows: Tensor, k: int, magnitude: bool) -> Tensor:
    """Per row of eager 2-D values: kept flags once the ``k`` lowest keys go."""
    key = magnitude_of if magnitude else _identity
    if rows.shape[1] < _SHORT_ROWS:
        return _keep_by_threshold(key(rows), k)
    return torch.stack([keep_jointly([KeyPart(row, key)], k)[0] for row in rows])


_keep_lowest = make_keep_lowest(_keep_lowest_eagerly)
