"""Selection helpers shared by the kernels: counts and exact bottom-k picks.

Everything here works on concrete tensors and under ``torch.func`` transforms
and ``torch.compile``: Python control flow depends on shapes and on Python
numbers only, never on tensor values. A count may be a Python ``int`` or an
integer tensor (under ``vmap`` each batch element may prune a different
number of units).
"""

from __future__ import annotations

import numbers
from typing import Union

import torch

from ._types import Amount
from ._validate import count_to_prune, validate_count

Count = Union[int, torch.Tensor]


def is_concrete(t: torch.Tensor) -> bool:
    """Whether ``t`` holds real values that Python may read.

    False while ``torch.compile`` traces or when ``t`` is wrapped by a
    ``torch.func`` transform (``vmap``, ``grad``, ...). Only concrete inputs
    take the eager paths that read values (``int(...)``).
    """
    if torch.compiler.is_compiling():
        return False
    return not torch._C._functorch.is_functorch_wrapped_tensor(t)


def resolve_count(amount: Amount, available: Count) -> Count:
    """The number of units to prune out of ``available`` ones.

    With a Python ``int`` for ``available``, torch's rule applies and an
    integer amount larger than ``available`` raises ``ValueError``. With a
    tensor (the per-element count under a transform), the fraction is rounded
    half to even in float64, exactly as Python's ``round`` does, and an
    integer amount is capped at ``available`` since no error can be raised
    on a value there.
    """
    if isinstance(available, int):
        validate_count(amount, available)
        return count_to_prune(amount, available)
    if isinstance(amount, numbers.Integral):
        return torch.clamp(available, max=int(amount))
    return torch.round(available.to(torch.float64) * float(amount)).to(torch.int64)


def lowest(keys: torch.Tensor, k: Count, eligible: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean flags for the ``k`` lowest ``keys`` among the eligible entries.

    ``keys`` is 1-D. NaN ranks above everything (as in :func:`torch.topk`),
    so it is picked last. Among equal keys the lower index is picked first,
    so exactly ``k`` entries are flagged whatever the ties (``k`` is capped
    at the number of eligible entries).
    """
    order = torch.sort(keys, stable=True).indices
    if eligible is None:
        ranks = torch.arange(1, keys.numel() + 1, device=keys.device)
        picked_sorted = ranks <= k
    else:
        eligible_sorted = eligible.gather(0, order)
        picked_sorted = eligible_sorted & (torch.cumsum(eligible_sorted, 0) <= k)
    return torch.zeros_like(keys, dtype=torch.bool).scatter(0, order, picked_sorted)


def spread(values: torch.Tensor, eligible: torch.Tensor | None, fill: float) -> torch.Tensor:
    """Place ``values`` at the eligible positions, in order; ``fill`` elsewhere.

    The eager counterpart of ``t[eligible] = values``, used to lay random
    draws made only for the unpruned units (as torch draws them) over all
    units. Needs a concrete ``eligible``.
    """
    if eligible is None:
        return values
    out = torch.full(eligible.shape, fill, dtype=values.dtype, device=values.device)
    return out.masked_scatter(eligible.to(values.device), values)


# --- the fast eager path --------------------------------------------------------

#: Below this many keys the sort-based :func:`lowest` is as fast; above it the
#: eager kernels use :func:`lowest_fast`.
FAST_MIN_KEYS = 1 << 16
_SAMPLE = 1 << 17


def lowest_fast(
    keys: torch.Tensor, k: int, eligible: torch.Tensor | None = None, *, complement: bool = False
) -> torch.Tensor:
    """The flags of :func:`lowest` for concrete inputs, without a full sort.

    Finds the k-th lowest eligible key by selection: a strided sample brackets
    it, two comparison passes count what lies below the bracket and collect
    the few keys inside it, and :func:`torch.kthvalue` finishes on those.
    Ties at the threshold go to the lower indices first and NaN ranks last,
    so the flags equal :func:`lowest`'s exactly (the tests check it); where
    the threshold is not a finite number (the pick reaches NaN, infinite or
    ineligible keys) it defers to :func:`lowest`. Reads values: eager only.
    With ``complement=True`` it returns the flags of the keys *not* picked
    (negated in place, without another tensor).
    """
    if k <= 0:
        none = torch.zeros_like(keys, dtype=torch.bool)
        return ~none if complement else none
    if eligible is not None:
        keys = torch.where(eligible, keys, torch.inf)
    lo, hi = _bracket(keys, k)
    under_lo = keys < lo
    below = int(torch.count_nonzero(under_lo))  # NaN is neither below nor inside
    inside = (keys <= hi).logical_and_(under_lo.logical_not_())
    candidates = keys[inside]
    if not below < k <= below + candidates.numel():  # the sample misled us
        inside = keys < lo if below >= k else keys >= lo
        below = 0 if below >= k else below
        candidates = keys[inside]
        if not below < k <= below + candidates.numel():
            picked = lowest(keys, k, eligible)
            return ~picked if complement else picked
    v = torch.kthvalue(candidates, k - below).values
    if not bool(torch.isfinite(v)):
        picked = lowest(keys, k, eligible)
        return ~picked if complement else picked
    need = k - below - int(torch.count_nonzero(candidates < v))
    ties = candidates == v
    if need == int(torch.count_nonzero(ties)):
        picked = keys <= v
        return picked.logical_not_() if complement else picked  # NaN: never picked
    tie_index = inside.nonzero().squeeze(1)[ties][:need]
    picked = (keys < v).index_fill_(0, tie_index, True)
    return picked.logical_not_() if complement else picked


def _bracket(keys: torch.Tensor, k: int) -> tuple[float, float]:
    """Bounds likely to hold the k-th lowest key, from a strided sample."""
    n = keys.numel()
    sample = torch.sort(keys[:: max(1, n // _SAMPLE)]).values
    m = sample.numel()
    q = k / n
    margin = 4.0 * (m * q * (1.0 - q)) ** 0.5 + 8.0
    r_lo = int(q * m - margin)
    r_hi = int(q * m + margin) + 1
    lo = float(sample[r_lo - 1]) if r_lo >= 1 else -torch.inf
    hi = float(sample[r_hi - 1]) if r_hi <= m else torch.inf
    return lo, hi
