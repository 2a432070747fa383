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
#: More units than any tensor holds: a larger integer amount prunes the same.
_MAX_COUNT = 2**62


def is_concrete(t: torch.Tensor) -> bool:
    """Whether ``t`` holds real values that Python may read.

    False while ``torch.compile`` traces, when ``t`` is wrapped by a
    ``torch.func`` transform (``vmap``, ``grad``, ...) and for tensors on the
    ``meta`` device, which have shapes but no values. Only concrete inputs
    take the eager paths that read values (``int(...)``).
    """
    if torch.compiler.is_compiling() or t.is_meta:
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
    if isinstance(amount, numbers.Integral):  # capped below int64's range first
        return torch.clamp(available, max=min(int(amount), _MAX_COUNT))
    return torch.round(available.to(torch.float64) * float(amount)).to(torch.int64)


def lowest(keys: torch.Tensor, k: Count, eligible: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean flags for the ``k`` lowest ``keys`` among the eligible entries.

    ``keys`` is 1-D. NaN ranks above everything (as in :func:`torch.topk`),
    so it is picked last. Among equal keys the lower index is picked first,
    so exactly ``k`` entries are flagged whatever the ties (``k`` is capped
    at the number of eligible entries).

    A Python ``int`` count over all entries takes a threshold path (one
    :func:`torch.kthvalue`, linear time); otherwise the keys are sorted.
    Both give the same flags and both work under transforms.
    """
    if eligible is None and isinstance(k, int):
        return _lowest_by_threshold(keys, k)
    return lowest_by_sort(keys, k, eligible)


def lowest_by_sort(
    keys: torch.Tensor, k: Count, eligible: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`lowest` by a stable sort: any count, any eligibility."""
    order = torch.sort(keys, stable=True).indices
    if eligible is None:
        ranks = torch.arange(1, keys.numel() + 1, device=keys.device)
        picked_sorted = ranks <= k
    else:
        eligible_sorted = eligible.gather(0, order)
        picked_sorted = eligible_sorted & (torch.cumsum(eligible_sorted, 0) <= k)
    return torch.zeros_like(keys, dtype=torch.bool).scatter(0, order, picked_sorted)


def _lowest_by_threshold(keys: torch.Tensor, k: int) -> torch.Tensor:
    """:func:`lowest` for ``0 <= k <= keys.numel()``, via the k-th lowest key."""
    if k <= 0:
        return torch.zeros_like(keys, dtype=torch.bool)
    v = torch.kthvalue(keys, k).values  # NaN ranks last here too
    nan = keys.isnan()
    below = (keys < v) | (v.isnan() & ~nan)
    ties = (keys == v) | (nan & v.isnan())
    left = k - below.sum()
    return below | (ties & (torch.cumsum(ties, 0) <= left))


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
