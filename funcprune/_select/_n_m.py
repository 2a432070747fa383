"""N:M masks without a sort: the native kernel, a torch path by comparisons, the selection beyond.

:func:`kept_n_m` answers what :func:`~._shape_kernels.n_m` asks, by the
first path that applies; all three give the same flags, bit for bit:

- the native kernel (``funcprune._native.n_m``): float32, float64, float16 and bfloat16 scores,
  contiguous, on the CPU, eager, groups of at most ``N_M_MAX`` (64): one
  read of the scores, one byte written per entry, along any dim without a
  transposed copy;
- :func:`n_m_by_comparisons`, in torch: float16, bfloat16, float32 and
  float64 scores, groups of at most :data:`PORTABLE_MAX_M`; what runs
  without the kernels, and under ``vmap``, ``grad`` and ``torch.compile``
  (Python control flow depends on shapes and Python numbers only);
- :func:`n_m_by_selection`: ``funcprune._select.keep`` over ``Runs`` of
  ``m`` (the implementation before issue 27), for anything else.

The rule, as ``_select``'s: in each group the ``max(0, eligible - n)``
eligible entries of lowest ``|score|`` go, ties to the lower index first,
NaN above every number (all NaNs tie), ``-0.0`` equal to ``0.0``.
Equivalently, an eligible entry is kept where fewer than ``n`` eligible
entries of its group *beat* it: an entry at ``s`` beats one at ``t`` where
its ``|score|`` is greater, or equal with ``s > t``. Both fast paths rank
so, on integer order codes of ``|score|`` (the bits with the sign cleared,
every NaN one code above ``+inf``).
"""

from __future__ import annotations

from typing import cast

import torch

from .. import _native
from .._types import Mask, Tensor
from .._validate import is_concrete
from ._choose import eligible_per_group, keep
from ._groups import Runs

__all__ = ["PORTABLE_MAX_M", "kept_n_m", "n_m_by_comparisons", "n_m_by_selection"]

#: The longest group :func:`n_m_by_comparisons` ranks (``m (m - 1) / 2`` comparisons a group, each
#: one torch op over many groups); longer groups go to the selection path.
PORTABLE_MAX_M = 16
#: Entries ranked at a time by the torch path in eager mode: a chunk's codes and counts stay in
#: cache, and reuse memory freed by the chunk before (a fresh 64 MiB buffer costs more to fault
#: in than to compute).
_CHUNK = 1 << 18
#: Per floating dtype: the integer type of its width, and the order code of NaN among magnitudes
#: (one above ``+inf``'s bits).
_CODES = {torch.float16: (torch.int16, 0x7C01), torch.bfloat16: (torch.int16, 0x7F81),
          torch.float32: (torch.int32, 0x7F800001), torch.float64: (torch.int64, 0x7FF0000000000001)}  # fmt: skip


def kept_n_m(n: int, m: int, dim: int, scores: Tensor, eligible: Mask) -> Tensor:
    """In each group of ``m`` consecutive entries along ``dim``, the ``n`` eligible ones of largest ``|score|``.

    ``eligible`` (``torch.bool`` or ``None``: all) counts as ``default_mask``
    does: a group keeps ``min(n, eligible in it)``, never an entry not
    eligible. ``m`` divides the length along ``dim``; ``0 <= n <= m``.
    Returns a new ``torch.bool`` tensor of ``scores``' shape.
    """
    if is_concrete(scores) and (eligible is None or is_concrete(eligible)):
        fast = _native.n_m(scores, eligible, n, m, dim)
        if fast is not None:
            return fast
    if scores.dtype in _CODES and m <= PORTABLE_MAX_M and (eligible is None or eligible.shape == scores.shape):
        return n_m_by_comparisons(n, m, dim, scores, eligible)
    return n_m_by_selection(n, m, dim, scores, eligible)


def n_m_by_selection(n: int, m: int, dim: int, scores: Tensor, eligible: Mask) -> Tensor:
    """:func:`kept_n_m` by ``funcprune._select.keep`` over ``Runs(m, dim)`` of ``|scores|``."""
    group = Runs(m, dim)
    if eligible is None:
        return keep(scores.abs(), m - n, group=group)
    k = torch.clamp(eligible_per_group(eligible, group) - n, min=0)
    return keep(scores.abs(), k, eligible, group=group)


def n_m_by_comparisons(n: int, m: int, dim: int, scores: Tensor, eligible: Mask) -> Tensor:
    """:func:`kept_n_m` in torch, each entry ranked by comparisons with the others of its group.

    ``scores`` is viewed as ``(units, m, inner)`` (a group: ``m`` entries
    ``inner`` apart), its order codes laid out group place by group place,
    so that each of the ``m (m - 1) / 2`` comparisons is one torch op over
    contiguous codes; each entry counts the entries that beat it (an
    ``uint8``), and is kept where fewer than ``n`` do. No sort, no
    ``kthvalue``; in eager mode a chunk of groups at a time. Float16,
    bfloat16, float32 and float64 ``scores``; ``eligible`` of their shape.
    """
    shape = scores.shape
    if n >= m or n == 0 or scores.numel() == 0:  # every eligible entry kept, or none
        if n and eligible is not None:
            return eligible.clone(memory_format=torch.contiguous_format)
        return torch.full(shape, bool(n), dtype=torch.bool, device=scores.device)
    d = dim % len(shape) if shape else 0
    inner = 1
    for length in shape[d + 1 :]:
        inner *= length
    x = scores.detach().reshape(-1, m, inner)
    e = None if eligible is None else eligible.reshape(-1, m, inner)
    units, step = x.shape[0], max(1, _CHUNK // (m * inner))
    if units <= step or not (is_concrete(x) and (e is None or is_concrete(e))):
        return _ranked(x, e, n, m).reshape(shape)
    kept = torch.empty(x.shape, dtype=torch.bool, device=x.device)
    for start in range(0, units, step):
        stop = start + step
        kept[start:stop] = _ranked(x[start:stop], None if e is None else e[start:stop], n, m)
    return kept.reshape(shape)


def _ranked(x: Tensor, e: Mask, n: int, m: int) -> Tensor:
    """Kept flags of ``x`` viewed as ``(units, m, inner)``, ``e`` alike or ``None``; ``0 < n < m``."""
    integer, nan = _CODES[x.dtype]
    bits = torch.finfo(x.dtype).bits
    # codes of |x|: (m, units, inner), one contiguous row per place in the group
    codes = x.view(integer).movedim(1, 0).clone(memory_format=torch.contiguous_format)
    codes.bitwise_and_((1 << (bits - 1)) - 1).clamp_max_(nan)
    if e is not None:  # one above for the eligible, 0 for the others: they beat no eligible entry
        codes = codes.add_(1).mul(e.movedim(1, 0))
    rows = codes.unbind(0)
    # beaten[t]: how many entries of t's group beat it; to start with, every one after it
    beaten: list[Tensor | int] = [m - 1 - t for t in range(m)]
    for s in range(m):
        for t in range(s + 1, m):
            ahead = torch.gt(rows[s], rows[t]).view(torch.uint8)  # s beats t; else t beats s
            beaten[t] = beaten[t] + ahead
            beaten[s] = beaten[s] - ahead
    kept = torch.stack(cast(list[Tensor], beaten), 1) < n  # all tensors: every place was compared (m > 1)
    return kept if e is None else kept & e
