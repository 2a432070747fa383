"""The fast eager selection path: the k lowest keys without a full sort.

:func:`funcprune._select.lowest` sorts, which works under every transform
but costs O(n log n). Eager code that knows its count as a Python ``int``
takes this path instead: a strided sample brackets the k-th lowest key, one
pass per part counts the keys below the bracket and collects the few inside
it, :func:`torch.kthvalue` finishes on those, and a last pass writes the
flags. The keys may come in several parts (the tensors of a global group),
ranked as if concatenated, so a global group is never concatenated.

The result equals :func:`~funcprune._select.lowest`'s exactly: ties at the
threshold go to the lower (concatenated) index first, and NaN ranks last.
Where the threshold is not a finite number (the pick reaches NaN, infinite or
ineligible keys) or the sample misled the bracket, the functions here return
``None`` (or defer to the sort), never a different answer.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ._select import is_concrete, lowest
from ._types import Amount
from ._validate import count_to_prune

Tensor = torch.Tensor

#: Below this many keys the sort-based ``lowest`` is as fast.
FAST_MIN_KEYS = 1 << 16
#: About how many keys the bracketing sample holds.
_SAMPLE = 1 << 17


@dataclass(frozen=True, slots=True)
class KeyPart:
    """One part of the keys: how to compute them (1-D), and a strided sample.

    Ineligible entries must have the key ``+inf``.
    """

    keys: Callable[[], Tensor]
    sample: Callable[[int], Tensor]
    numel: int


def kept_by_selection(parts: Sequence[KeyPart], k: int) -> list[Tensor] | None:
    """Per part, the flags of the keys that survive pruning the ``k`` lowest.

    Returns ``None`` where the answer is not a finite threshold (see the
    module docstring); the caller then takes the sort path.
    """
    total = sum(p.numel for p in parts)
    if not 0 < k <= total:
        return None
    stride = max(16, total // _SAMPLE)  # a sample of 1/16 of the keys at most
    lo, hi = _bounds(torch.cat([p.sample(stride) for p in parts]), k / total)
    below, candidates = 0, []
    for part in parts:
        keys = part.keys()
        under_lo = keys < lo  # NaN is neither below nor inside
        below += int(torch.count_nonzero(under_lo))
        candidates.append(keys[(keys <= hi).logical_and_(under_lo.logical_not_())])
    inside = torch.cat(candidates)
    if not below < k <= below + inside.numel():
        return None
    v = torch.kthvalue(inside, k - below).values
    if not bool(torch.isfinite(v)):
        return None
    need = k - below - int(torch.count_nonzero(inside < v))
    return [_survivors(part.keys(), v, c, need_left) for part, c, need_left in _share_ties(parts, candidates, v, need)]


def _share_ties(
    parts: Sequence[KeyPart], candidates: list[Tensor], v: Tensor, need: int
) -> list[tuple[KeyPart, Tensor, int]]:
    """Give the ``need`` ties at ``v`` to the parts in order, lowest first."""
    shares = []
    for part, c in zip(parts, candidates, strict=True):
        ties = int(torch.count_nonzero(c == v))
        take = min(ties, need)
        need -= take
        shares.append((part, c, take))
    return shares


def _survivors(keys: Tensor, v: Tensor, candidates: Tensor, take: int) -> Tensor:
    """Flags of the keys kept when all below ``v`` and ``take`` ties go."""
    ties = int(torch.count_nonzero(candidates == v))
    if take == ties:
        return (keys <= v).logical_not_()
    pruned = keys < v
    if take:
        pruned.index_fill_(0, (keys == v).nonzero().squeeze(1)[:take], True)
    return pruned.logical_not_()


def _bounds(sample: Tensor, q: float) -> tuple[float, float]:
    """Bounds likely to hold the q-quantile of the keys, from a sample."""
    m = sample.numel()
    margin = 4.0 * (m * q * (1.0 - q)) ** 0.5 + 8.0
    r_lo, r_hi = int(q * m - margin), int(q * m + margin) + 1
    lo = float(torch.kthvalue(sample, r_lo).values) if r_lo >= 1 else -torch.inf
    hi = float(torch.kthvalue(sample, r_hi).values) if r_hi <= m else torch.inf
    return lo, hi


def lowest_fast(
    keys: Tensor, k: int, eligible: Tensor | None = None, *, complement: bool = False
) -> Tensor:
    """The flags of :func:`~funcprune._select.lowest`, by selection.

    With ``complement=True`` it returns the flags of the keys *not* picked
    (negated in place, without another tensor). Reads values: eager only.
    """
    if eligible is not None:
        keys = torch.where(eligible, keys, torch.inf)
    part = KeyPart(lambda: keys, lambda stride: keys[::stride], keys.numel())
    kept = kept_by_selection([part], k) if k > 0 else [torch.ones_like(keys, dtype=torch.bool)]
    if kept is None:
        picked = lowest(keys, k, eligible)
        return picked.logical_not_() if complement else picked
    return kept[0] if complement else kept[0].logical_not_()


def joint_l1_kept(
    scores: Sequence[Tensor], defaults: Sequence[Tensor | None], amount: Amount
) -> list[Tensor] | None:
    """``L1Unstructured(amount)`` over several tensors as if concatenated.

    The masks equal those of ``compute_mask`` on the concatenated scores and
    default masks, without building the concatenation. Returns ``None``
    where this path does not apply (traced or small inputs, a count of 0 or
    past what is left, a non-finite threshold); the caller then
    concatenates.
    """
    total = sum(s.numel() for s in scores)
    tensors = [*scores, *(d for d in defaults if d is not None)]
    if total < FAST_MIN_KEYS or not all(is_concrete(t) for t in tensors):
        return None
    available = sum(s.numel() if d is None else int(d.sum()) for s, d in zip(scores, defaults, strict=True))
    if isinstance(amount, numbers.Integral) and int(amount) > available:
        return None
    k = count_to_prune(amount, available)
    dtype = functools.reduce(torch.promote_types, (s.dtype for s in scores))
    parts = [_l1_part(s, d, dtype) for s, d in zip(scores, defaults, strict=True)]
    kept = kept_by_selection(parts, k)
    if kept is None:
        return None
    return [
        (m if d is None else m.logical_and_(d.reshape(-1))).reshape(s.shape)
        for m, s, d in zip(kept, scores, defaults, strict=True)
    ]


def _l1_part(scores: Tensor, default: Tensor | None, dtype: torch.dtype) -> KeyPart:
    """The keys ``|scores|`` in the group's promoted ``dtype``.

    torch ranks a global group after concatenating it, which promotes every
    tensor to one dtype; ranking each part in its own dtype would compare,
    say, float16 keys with a float32 threshold rounded to float16.
    """
    flat = scores.detach().reshape(-1)

    def magnitudes(t: Tensor) -> Tensor:
        return t.abs().to(dtype)  # |x| is exact in any dtype; so is widening

    if default is None:
        return KeyPart(lambda: magnitudes(flat), lambda stride: magnitudes(flat[::stride]), flat.numel())
    kept = default.reshape(-1)

    def keys() -> Tensor:
        return magnitudes(flat).masked_fill_(kept.logical_not(), torch.inf)

    def sample(stride: int) -> Tensor:
        return torch.where(kept[::stride], magnitudes(flat[::stride]), torch.inf)

    return KeyPart(keys, sample, flat.numel())
