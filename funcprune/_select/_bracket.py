"""The bracket path: a strided sample brackets the k-th key, one scan collects the few inside.

:func:`keep_by_bracket` answers what ``keep_jointly`` asks, or steps aside
with ``None`` (then the sort runs); natively where the kernels apply
(``README.md``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .. import _native
from .._types import Tensor
from ._groups import KeyPart, identity, magnitude_of

__all__ = ["chunk_size", "keep_by_bracket", "sample_keys", "sample_stride", "scan_part", "survivors"]

#: About how many keys the bracketing sample holds, at most.
_SAMPLE = 1 << 17


def keep_by_bracket(parts: Sequence[KeyPart], k: int) -> list[Tensor] | None:
    """The bracket path; ``None`` where it cannot answer (then the caller sorts).

    One scan over each part, chunk by chunk (the chunk's keys stay in cache):
    count the keys below the bracket, collect the few inside. A ``kthvalue``
    over those finds the threshold; one comparison per entry, again chunk by
    chunk, writes the mask.
    """
    total = sum(p.numel for p in parts)
    if not 0 < k <= total:
        return None
    lo, hi, share = _bounds(torch.cat([sample_keys(p, sample_stride(total)) for p in parts]), k / total)
    chunk = chunk_size()
    n_below = 0
    found: list[Tensor] = []  # per part, the keys inside the bracket in index order
    for part in parts:
        count, inside = scan_part(part, lo, hi, share, chunk)
        n_below += count
        found.append(inside)
    n_inside = sum(f.numel() for f in found)
    if not n_below < k <= n_below + n_inside:
        return None
    v = _order_statistics(torch.cat(found), k - n_below)[0]
    if not math.isfinite(v):
        return None
    ties_to_prune = k - n_below
    for f in found:
        ties_to_prune -= int(torch.count_nonzero(f < v))
    kept = []
    for part, candidates in zip(parts, found, strict=True):
        ties = int(torch.count_nonzero(candidates == v))
        take = min(ties, ties_to_prune)
        ties_to_prune -= take
        kept.append(survivors(part, v, ties, take, chunk))
    return kept


#: Entries scanned at a time, per thread: their keys and flags stay in cache.
_CHUNK = 1 << 16
_EIGHT = 8


def chunk_size() -> int:
    """Entries scanned at a time: each thread's share stays in its cache."""
    return _CHUNK * min(torch.get_num_threads(), 64)


def scan_part(
    part: KeyPart, lo: float, hi: float, share: float, chunk: int, *, exact: bool = False
) -> tuple[int, Tensor]:
    """How many of the part's eligible keys lie below ``lo``, and those in ``[lo, hi]`` in index order.

    One native pass where the kernels apply (exact comparisons), else chunk
    by chunk in torch: with ``exact``, by comparisons too (processes that
    take either path then classify every key alike); otherwise by the
    shifted comparison of :func:`_scan` (consecutive ranges of the keys'
    order, which is all one process needs).
    """
    scanned = _native_scan(part, lo, hi, share)
    if scanned is not None:
        return scanned
    below, collected = [], []
    for start in range(0, part.numel, chunk):
        count, keys = _scan(_eligible_keys(part, start, start + chunk), lo, hi, exact=exact)
        below.append(count)
        collected.append(keys)
    n_below = int(torch.stack(below).sum(dtype=torch.float64)) if below else 0
    return n_below, torch.cat(collected) if collected else _eligible_keys(part, 0, 0)


def sample_stride(total: int) -> int:
    """The sample's stride: about ``8 * total ** (2/3)`` keys, at most 1/16 of them.

    The bracket a sample of ``m`` keys gives holds about ``4 / sqrt(m)`` of
    the keys, to collect and to rank; the sample's own two order statistics
    cost little (:func:`_order_statistics`), so it is as large as a read of
    one key per cache line allows (measured).
    """
    return max(16, total // min(_SAMPLE, 8 * round(math.pow(total, 2 / 3))))


def _eligible_keys(part: KeyPart, start: int, stop: int) -> Tensor:
    """The keys of ``part.source[start:stop]``, ``+inf`` where ineligible (never picked)."""
    keys = part.key(part.source[start:stop])
    if part.eligible is None:
        return keys
    return keys.masked_fill(part.eligible[start:stop].logical_not(), torch.inf)


def _scan(keys: Tensor, lo: float, hi: float, *, exact: bool = False) -> tuple[Tensor, Tensor]:
    """How many ``keys`` lie below the bracket, and those inside (in index order).

    The count is a 0-d float tensor (exact: a chunk is far below 2**24 keys).
    NaN is neither below nor inside. Unless ``exact``, a finite bracket is tested on one
    shifted copy ``d = keys - mid``: ``d < -half`` below, ``|d| <= half``
    inside. Rounding is monotone, so these are consecutive ranges of the
    keys' order whatever the rounding, and a comparison written as floats
    runs vectorized where a ``torch.bool`` output does not. The keys inside
    are found 8 flags (one int64 word) at a time.
    """
    flags = torch.empty(keys.shape, dtype=torch.float32, device=keys.device)
    if math.isfinite(lo) and math.isfinite(hi) and not exact:
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


def sample_keys(part: KeyPart, stride: int) -> Tensor:
    sample = part.key(part.source[::stride])
    if part.eligible is None:
        return sample
    return sample.masked_fill(part.eligible[::stride].logical_not(), torch.inf)


def survivors(part: KeyPart, v: float, ties: int, take: int, chunk: int) -> Tensor:
    """Kept flags when every key below ``v`` and the first ``take`` of ``ties`` go."""
    absolute = _absolute(part)
    if absolute is not None:
        kept = _native.survivors(part.source, part.eligible, absolute, v, None if take == ties else take)
        if kept is not None:
            return kept
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


def _bounds(sample: Tensor, q: float) -> tuple[float, float, float]:
    """Bounds likely to hold the q-quantile of the keys, from a sample, and the share of the sample inside."""
    m = sample.numel()
    margin = 4.0 * (m * q * (1.0 - q)) ** 0.5 + 8.0
    r_lo, r_hi = int(q * m - margin), int(q * m + margin) + 1
    lo, hi = _order_statistics(sample, max(r_lo, 1), min(r_hi, m))
    share = (min(r_hi, m) - max(r_lo, 1) + 1) / m
    return (lo if r_lo >= 1 else -math.inf), (hi if r_hi <= m else math.inf), share


#: From this many keys on, order statistics are found in a window of the keys.
_WINDOW_MIN = 1 << 13


def _order_statistics(keys: Tensor, *ranks: int) -> list[float]:
    """The ``r``-th lowest of the 1-D ``keys`` for each of ``ranks`` (1-based), as ``kthvalue`` gives them.

    ``kthvalue`` costs about 10 ns per key; on many keys, a strided
    sub-sample brackets the ranks, one pass keeps the keys inside that
    window, and ``kthvalue`` runs on those. Where the window misses a rank
    (or its ends are not finite), all the keys are ranked instead.
    """
    m = keys.numel()
    if m >= _WINDOW_MIN:
        stride = max(1, round(math.sqrt(m / 64)))  # a sub-sample of about 8 * sqrt(m) keys
        sub = keys[::stride]
        margin = 2.0 * math.sqrt(sub.numel()) + 8.0  # 4 standard deviations of a rank, or more
        i_lo, i_hi = int(min(ranks) / stride - margin), int(max(ranks) / stride + margin) + 1
        if 1 <= i_lo and i_hi <= sub.numel():
            a, b = _kth(sub, i_lo), _kth(sub, i_hi)
            if math.isfinite(a) and math.isfinite(b):
                below, window = _window(keys, a, b, (i_hi - i_lo + 1) / sub.numel())
                if all(below < r <= below + window.numel() for r in ranks):
                    return [_kth(window, r - below) for r in ranks]
    return [_kth(keys, r) for r in ranks]


def _window(keys: Tensor, a: float, b: float, share: float) -> tuple[int, Tensor]:
    """How many ``keys`` lie below ``a``, and those in ``[a, b]`` (about ``share`` of them)."""
    scanned = _native.scan(keys, None, False, a, b, _capacity(keys.numel(), share))
    if scanned is not None:
        return scanned
    return int(torch.count_nonzero(keys < a)), keys[(keys >= a).logical_and_(keys <= b)]


def _capacity(n: int, share: float) -> int:
    """Room for the keys a bracket holding about ``share`` of ``n`` collects, with a wide margin."""
    return int(2 * share * n) + 4096


def _absolute(part: KeyPart) -> bool | None:
    """Whether the part's keys are ``|source|`` (True) or ``source`` (False) in its dtype; ``None``: other keys."""
    if part.key is magnitude_of:
        return True
    if part.key is identity:
        return False
    return None


def _native_scan(part: KeyPart, lo: float, hi: float, share: float) -> tuple[int, Tensor] | None:
    """:func:`_scan` over the whole part in one native pass; ``None``: scan chunk by chunk."""
    absolute = _absolute(part)
    if absolute is None:
        return None
    return _native.scan(part.source, part.eligible, absolute, lo, hi, _capacity(part.numel, share))


def _kth(keys: Tensor, r: int) -> float:
    return float(torch.kthvalue(keys, r).values)
