"""The unit keys' per-index passes as torch functions: ``kernels.c``'s ``fp_unit_abs_max`` and
``fp_unit_rounded``, or ``None``: use torch (``funcprune/_plans/_unit_keys.py`` says what they compute)."""

from __future__ import annotations

from typing import Any

import torch

from .._types import Tensor
from . import _calls  # (its functions read through the module: tests replace _calls._threads)

__all__ = ["unit_abs_max", "unit_rounded"]


def _along(x: Tensor, dim: int) -> tuple[int, int, int, int] | None:
    """``x`` read as ``[A, L, B]`` along ``dim`` (``L = x.shape[dim]``): ``(A, L, B, stride of A)``.

    ``None`` where its layout is not that: the dims after ``dim`` contiguous,
    ``dim``'s stride their length, those before it one run of equal steps
    (a narrow along ``dim`` of a contiguous tensor is such a view).
    """
    shape, strides = x.shape, x.stride()
    inner = 1
    for d in range(x.dim() - 1, dim, -1):
        if shape[d] != 1 and strides[d] != inner:
            return None
        inner *= shape[d]
    if shape[dim] != 1 and strides[dim] != inner:
        return None
    outer, step = 1, shape[dim] * inner
    for d in range(dim - 1, -1, -1):
        if shape[d] == 1:
            continue
        if outer == 1:
            step = strides[d]
        elif strides[d] != step * outer:
            return None
        outer *= shape[d]
    return outer, shape[dim], inner, step


def _per_index_kernel(kind: str, x: Tensor, dim: int) -> tuple[Any, tuple[int, int, int, int]] | None:
    kernel = _calls._declared(kind, x, contiguous=False)
    if kernel is None or x.dim() == 0 or x.numel() == 0 or not 0 <= dim < x.dim():
        return None
    layout = _along(x, dim)
    return None if layout is None else (kernel, layout)


def unit_abs_max(x: Tensor, dim: int) -> Tensor | None:
    """The largest ``|x|`` per index along ``dim``, as float64 (NaN where one is NaN); ``None``: use torch.

    What ``torch.maximum(x.amax(others), -x.amin(others))`` holds, converted
    exactly to float64, in one read; ``x`` may be a narrow along ``dim`` of
    a contiguous tensor.
    """
    found = _per_index_kernel("unit_abs_max", x, dim)
    if found is None:
        return None
    kernel, (a, length, b, step) = found
    out = torch.empty(length, dtype=torch.float64)
    kernel(x.data_ptr(), a, length, b, step, out.data_ptr(), _calls._threads(x.numel()))
    return out


def unit_rounded(x: Tensor, dim: int, big: Tensor, square: bool) -> Tensor | None:
    """Per index ``l`` along ``dim``: the sum of ``(t + big[l]) - big[l]`` over its entries; ``None``: use torch.

    ``t`` is ``x * x`` (``square``) or ``|x|``, in float64; ``big`` is
    float64, one per index. Where ``big`` makes every rounded term and every
    partial sum exact (``funcprune/_plans/_unit_keys.py`` chooses it so),
    the sums do not depend on their order: they are the torch path's, bit
    for bit, in one read of ``x``.
    """
    found = _per_index_kernel("unit_rounded", x, dim)
    if found is None or big.dtype != torch.float64 or not _calls.plain(big) or big.shape != (x.shape[dim],):
        return None
    kernel, (a, length, b, step) = found
    out = torch.empty(length, dtype=torch.float64)
    kernel(x.data_ptr(), a, length, b, step, big.data_ptr(), int(square), out.data_ptr(), _calls._threads(x.numel()))
    return out
