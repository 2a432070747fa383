"""Today's (before issue 27) N:M kernel, kept as the reference the fast paths equal.

:func:`n_m_reference` is ``funcprune._specs._shape_kernels.n_m`` as it was:
``|scores|`` ranked by ``funcprune._select.keep`` over ``Runs(m, dim)``,
a group's count ``m - n``, or ``max(0, eligible - n)`` with an earlier mask.
"""

from __future__ import annotations

import torch

from funcprune._select import Runs, eligible_per_group, keep
from funcprune._specs._kernels import as_bool, keep_all

Tensor = torch.Tensor


def n_m_reference(n: int, m: int, dim: int, scores: Tensor, default_mask: Tensor | None) -> Tensor:
    """The N:M kernel as it was (its checks of ``dim`` and ``m`` left to the caller)."""
    default_mask = as_bool(default_mask)
    group = Runs(m, dim)
    if default_mask is None:
        if n == m:
            return keep_all(scores, None)
        return keep(scores.abs(), m - n, group=group)
    k = torch.clamp(eligible_per_group(default_mask, group) - n, min=0)
    return keep(scores.abs(), k, default_mask, group=group)
