"""The selection over shards, bracketed: a sample's order statistics narrow the scan to a few keys.

:func:`keep_by_bracket_over_shards` gives what ``keep_over_shards`` gives
from ``SHARDED_BRACKET_MIN_KEYS`` keys per process, or the count ``k`` where
the bracket misses (then the radix select runs over every key; ``README.md``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from .._types import Tensor
from ._bracket import chunk_size, sample_keys, sample_stride, scan_part, survivors
from ._groups import CountOf, KeyPart, LocalShard
from ._radix import BINS, check_block, radix_shift
from ._sharded import common_groups, reduced_over, select_codes
from ._short_rows import key_of_code, order_codes

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["keep_by_bracket_over_shards"]

#: Sample rounds: each resolves 12 bits of the bracket's ends.
_ROUNDS = 2
Groups = tuple["ProcessGroup | None", ...]


def keep_by_bracket_over_shards(
    parts: Sequence[KeyPart], shards: Sequence[LocalShard], k: int | CountOf
) -> list[Tensor] | int:
    """Per part (with its shard), 1-D kept flags once the ``k`` lowest eligible keys of all processes go.

    ``k`` is positive, or the function that says it from the number of
    eligible keys in all (that number rides along the sample's first
    round). Where the bracket missed, the count ``k`` on every process alike
    (then nothing is decided: rank every key, :func:`~._sharded.keep_over_shards`).
    """
    dtype, device = _dtype(parts), parts[0].source.device
    for part, shard in zip(parts, shards, strict=True):  # as keep_over_shards checks its blocks
        check_block(dtype, part.source.shape, part.eligible, shard)
    groups = common_groups(shards)
    bases = [sum(s.numel for s in shards[:i]) for i in range(len(shards))]
    total = sum(s.numel for s in shards)
    counted = [p for p, s in zip(parts, shards, strict=True) if s.counted]
    samples = [sample_keys(p, sample_stride(total)) for p in counted]
    eligible = None if not callable(k) else sum(p.numel if p.eligible is None else _count(p.eligible) for p in counted)
    k, bracket = _bracket_of_sample(samples, dtype, total, k, eligible, groups, device)
    if k == 0:  # nothing to prune (an amount resolved to 0)
        return [torch.ones(p.numel, dtype=torch.bool, device=p.source.device) if p.eligible is None else p.eligible.clone() for p in parts]
    if bracket is None:
        return k
    lo, hi, share = bracket
    chunk = chunk_size()
    scanned = [scan_part(p, lo, hi, share, chunk, exact=True) for p in counted]
    sums = [sum(b for b, _ in scanned), sum(f.numel() for _, f in scanned)]
    n_below, n_inside = reduced_over(torch.tensor(sums, dtype=torch.int64, device=device), groups).tolist()
    if not n_below < k <= n_below + n_inside:
        return k  # the bracket missed: every process sees it in the same sums
    found = [f for _, f in scanned]
    codes = [order_codes(f.to(dtype)).to(torch.int64) for f in found]
    cut, need, ties = select_codes(codes, _code(lo, dtype), _code(hi, dtype), k - n_below, groups, device)
    v = None if cut is None else key_of_code(cut, dtype)
    assert v is not None  # the (k - n_below)-th of the keys inside: a finite key
    if need == ties:  # every tie at v goes: one pass per block
        return [survivors(p, v, 1, 1, chunk) for p in parts]
    at = _ties_at(parts, shards, found, v)
    positions = [base + s.positions(t) for s, base, t in zip(shards, bases, at, strict=True) if s.counted and t.numel()]
    last, _, _ = select_codes(positions, 0, max(total - 1, 0), need, groups, device)
    assert last is not None  # need > 0 ties exist
    kept = []
    for part, shard, base, tied in zip(parts, shards, bases, at, strict=True):
        flags = survivors(part, v, 1, 1, chunk)  # every tie at v goes, but
        if tied.numel():  # those past the last to prune stay
            flags[tied[base + shard.positions(tied) > last]] = True
        kept.append(flags)
    return kept


def _dtype(parts: Sequence[KeyPart]) -> torch.dtype:
    """The keys' common dtype (what each part's ``key`` gives)."""
    return parts[0].key(parts[0].source[:0]).dtype


def _code(key: float, dtype: torch.dtype) -> int:
    return int(order_codes(torch.tensor([key], dtype=dtype))[0])


def _bracket_of_sample(
    samples: list[Tensor],
    dtype: torch.dtype,
    total: int,
    k: int | CountOf,
    eligible: int | None,
    groups: Groups,
    device: torch.device,
) -> tuple[int, tuple[float, float, float] | None]:
    """The count ``k``; finite keys ``lo <= hi`` likely to hold the k-th key, and the sample's share between them.

    All processes' samples are ranked by :data:`_ROUNDS` rounds of
    histograms of their codes; the bracket spans the bins of the ranks
    ``q * m`` minus and plus a margin of 4 standard deviations (``m``
    sampled keys in all, ``q = k / total``), as :func:`._bracket._bounds`
    does on one process. Where ``k`` is a function, this process's
    ``eligible`` count rides along the first round, and ``k`` is its value
    at their sum. The bracket is ``None`` where ``k`` is 0 or it reaches an
    infinite or NaN key.
    """
    sample = torch.cat(samples).to(dtype) if samples else torch.empty(0, dtype=dtype, device=device)
    codes = order_codes(sample).to(torch.int64)
    bits = torch.finfo(dtype).bits
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    ranks, m, share, ends = (1, 1), 0, 1.0, (False, False)
    for round_ in range(_ROUNDS):
        shift = radix_shift(lo, hi)
        base = lo >> shift
        codes = codes[(codes >= lo) & (codes <= hi)]
        histogram = torch.bincount((codes >> shift) - base, minlength=BINS)
        if round_ == 0 and eligible is not None:  # the count rides along
            histogram = reduced_over(torch.cat([histogram, histogram.new_tensor([eligible])]), groups)
            k = k(int(histogram[-1])) if callable(k) else k
            histogram = histogram[:-1]
        else:
            histogram = reduced_over(histogram, groups)
        assert not callable(k)  # resolved in the first round
        if k == 0:
            return 0, None
        cumulative = histogram.cumsum(0)
        if round_ == 0:
            m, q = int(cumulative[-1]), k / total
            margin = 4.0 * (m * q * (1.0 - q)) ** 0.5 + 8.0
            low, high = int(q * m - margin), int(q * m + margin) + 1
            ends = (low < 1, high > m)  # the k-th key may lie past the sample's ends: open them
            ranks = (max(low, 1), max(min(high, m), 1))
        b_lo, b_hi = (int(torch.searchsorted(cumulative, r)) for r in ranks)
        if b_hi >= BINS:  # fewer keys than the rank (no sample at all)
            return k, None
        under = int(cumulative[b_lo - 1]) if b_lo else 0
        share = (int(cumulative[b_hi]) - under) / max(m, 1)
        ranks = (ranks[0] - under, ranks[1] - under)
        lo, hi = max(lo, (base + b_lo) << shift), min(hi, ((base + b_hi + 1) << shift) - 1)
    assert not callable(k)
    return k, _keys_of(lo, hi, dtype, share, ends)


def _keys_of(
    lo: int, hi: int, dtype: torch.dtype, share: float, ends: tuple[bool, bool]
) -> tuple[float, float, float] | None:
    """The bracket of codes ``[lo, hi]`` as keys, if both are finite; ``ends`` open it.

    The one code no key has (``-0.0``'s, as ``order_codes`` maps it to
    ``0.0``'s) is moved inward: the bracket holds the same keys. An open
    low end is ``-inf`` (nothing below: the k-th key may be below every
    sampled one); an open high end, or one at ``+inf`` or NaN, is the
    largest finite key (the k-th key may be above every sampled finite
    one, but is never looked for at ``+inf``, as ineligible keys are
    scanned: a k-th key at ``+inf`` or NaN misses the bracket).
    """
    low, high = key_of_code(lo, dtype), key_of_code(hi, dtype)
    if low is None:
        low = key_of_code(lo + 1, dtype)
    if high is None:
        high = key_of_code(hi - 1, dtype)
    if ends[0]:
        low = -math.inf
    if ends[1] or high is None or not high < math.inf:  # (NaN is not below +inf either)
        high = torch.finfo(dtype).max
    if low is None or high is None or math.isnan(low) or not math.isfinite(high) or low > high or low == math.inf:
        return None
    return low, high, share


def _ties_at(parts: Sequence[KeyPart], shards: Sequence[LocalShard], found: list[Tensor], v: float) -> list[Tensor]:
    """Per part, the local flat indices of its eligible keys equal to ``v``.

    A counted part's ties are among the keys its scan found inside the
    bracket: only a part that found some is searched (a replica always is).
    """
    inside = iter(found)
    at = []
    for part, shard in zip(parts, shards, strict=True):
        if shard.counted and not bool((next(inside) == v).any()):
            at.append(torch.empty(0, dtype=torch.int64, device=part.source.device))
            continue
        equal = part.key(part.source) == v
        if part.eligible is not None:
            equal &= part.eligible
        at.append(equal.nonzero().squeeze(1))
    return at


def _count(flags: Tensor) -> int:
    """How many flags are set (``count_nonzero``: a bool ``sum`` costs about 25x more)."""
    return int(torch.count_nonzero(flags))
