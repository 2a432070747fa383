"""SparseGPT's column loop as a torch function: ``kernels.c``'s ``fp_sparsegpt_block``, or ``None``: use torch."""

from __future__ import annotations

import torch

from .._types import Tensor
from . import _calls  # (its functions read through the module: tests replace _calls._threads)

__all__ = ["sparsegpt_block"]


def sparsegpt_block(w: Tensor, start: int, stop: int, u: Tensor, pruned: Tensor, n: int, m: int) -> Tensor | None:
    """SparseGPT's column loop over ``w[:, start:stop]``, in place; its errors, or ``None``: use torch.

    ``w`` is ``(rows, cols)``; ``u`` the upper Cholesky factor of ``H⁻¹``,
    ``(cols, cols)``; ``pruned`` the block's ``(rows, stop - start)``
    ``torch.bool`` flags, read, or for N:M (``m > 0``) written group by
    group (the ``m - n`` of lowest ``w² / d²`` as updated so far go, ties
    to the lower column). Per column, as the torch loop of
    ``funcprune/_criteria/_sparsegpt.py``, bit for bit: the kept value (0
    where pruned) is written into ``w``, the error ``(w - kept) / d`` into
    the result, and each later column of the block updated by ``error *
    u``. ``None`` (nothing written) where the kernel does not apply: dtype,
    device, layout, a transform's wrapper, an N:M it does not take.
    """
    kernel = _calls._declared("sparsegpt_block", w)
    if (
        kernel is None
        or u.dtype != w.dtype
        or not _calls.plain(u)
        or pruned.dtype != torch.bool
        or not _calls.plain(pruned)
        or w.dim() != 2
        or tuple(u.shape) != (w.shape[1], w.shape[1])
        or tuple(pruned.shape) != (w.shape[0], stop - start)
        or not 0 <= start < stop <= w.shape[1]
    ):
        return None
    rows, width = pruned.shape
    err = torch.empty(rows, width, dtype=w.dtype)
    at = start * w.element_size()
    status = kernel(
        w.data_ptr() + at, w.shape[1], rows, width, u.data_ptr() + start * u.shape[1] * u.element_size() + at,
        u.shape[1], pruned.data_ptr(), n, m, err.data_ptr(), _calls._threads(rows * width * width),
    )  # fmt: skip
    if status == -2:
        raise MemoryError(f"sparsegpt: no memory for a row of {width} columns in the native column loop")
    return None if status != 0 else err
