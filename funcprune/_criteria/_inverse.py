"""The factor SparseGPT reads ``H⁻¹`` through: ``U`` upper triangular with ``UᵀU = H⁻¹``, from a dampened ``H``.

One Cholesky factorization of ``H`` with its indices reversed, and one
triangle's inverse (:func:`factor`), where the reference
(IST-DASLab/sparsegpt) factors ``H``, inverts it and factors the inverse.
From :data:`_BLOCKED_MIN` columns, eagerly on the CPU, both are made by
blocks of matrix products and in place (the reversals too), so that the
runner's Hessian, which it gives up, becomes its own factor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._types import Tensor
from .._validate import is_concrete

__all__ = ["Factor", "factor"]

#: A Hessian made ready: ``(U, dead, info)``, the upper Cholesky factor of the dampened ``H⁻¹``, the inputs
#: that never carried a value, and the factorization's ``info`` (``0``: positive definite).
Factor = tuple[Tensor, Tensor, Tensor]


def factor(percdamp: float, consume: bool = False) -> Callable[[Tensor], Factor]:
    def made(h: Tensor) -> Factor:
        """``U`` with ``H⁻¹ = UᵀU``, upper triangular with a positive diagonal (the upper Cholesky factor of the
        dampened ``H⁻¹``), row-major; the dead inputs; the factorization's ``info``.

        With ``P`` the reversal of the indices and ``L`` the lower Cholesky factor of ``P H P``, ``H⁻¹ =
        (P L⁻¹ P)ᵀ (P L⁻¹ P)``, and ``P L⁻¹ P`` is upper triangular with a positive diagonal: it is ``U``.
        One factorization and one triangle's inverse, where the reference factors ``H``, inverts it from its
        factor and factors the inverse (twice the operations). From :data:`_BLOCKED_MIN` columns, eagerly on
        the CPU, both by blocks of matrix products, in place, and the reversals too: one ``(cols, cols)``
        matrix lives besides the caller's ``h`` (and products of a quarter of it), and none where ``consume``
        gives ``h`` up (it becomes ``U``). Otherwise by LAPACK (under ``vmap`` too): two at most, each dropped
        once the next is made. ``consume`` changes no bit of the result.
        """
        n = h.shape[-1]
        blocked = n >= _BLOCKED_MIN and h.device.type == "cpu" and is_concrete(h)
        if blocked and consume and h.is_contiguous():
            r = h
            _reverse_in_place(r)  # P H P, in the Hessian given up
        else:
            r = h.flip(-1, -2).contiguous()  # P H P: a copy of its own, row-major (a strided h's flip is not)
        diagonal = torch.diagonal(r)
        dead_reversed = diagonal == 0
        diagonal.add_(dead_reversed.to(r.dtype))  # a zero diagonal: a zero row and column (H is PSD)
        diagonal.add_(percdamp * diagonal.mean())
        del diagonal
        if not blocked:
            lower, info = torch.linalg.cholesky_ex(r)
            del r
            eye = torch.eye(n, dtype=lower.dtype, device=lower.device).expand_as(lower)
            inverse = torch.linalg.solve_triangular(lower, eye, upper=False)
            del lower
            u = inverse.flip(-1, -2)
            del inverse
            u = u.contiguous()  # (LAPACK's results are column-major: rows, for the native column loop)
            return u, dead_reversed.flip(-1), info
        failed = _cholesky_in_place(r)  # r becomes L
        info = torch.tensor(failed, dtype=torch.int32)
        if not failed:  # (a failure: the caller raises)
            _invert_lower_in_place(r)  # L⁻¹
            _reverse_in_place(r)  # P L⁻¹ P
        return r, dead_reversed.flip(-1), info

    return made


#: From this many columns, eagerly on the CPU, :func:`factor`'s factorization and inverse are made by blocks of
#: matrix products: LAPACK's Cholesky factorization ran at a fifth of the matrix product's rate here (1 thread).
_BLOCKED_MIN = 512
#: Columns of a panel of the blocked Cholesky factorization, and of the smallest triangle inverted whole.
_PANEL = 256


def _cholesky_in_place(a: Tensor) -> int:
    """``a`` (symmetric) overwritten by its lower Cholesky factor, a panel of :data:`_PANEL` columns at a time
    (its upper triangle zeroed); LAPACK's ``info``: ``0``, or the order of the first minor not positive
    definite."""
    n = a.shape[0]
    for k in range(0, n, _PANEL):
        e = min(k + _PANEL, n)
        diagonal, info = torch.linalg.cholesky_ex(a[k:e, k:e])
        if int(info):
            return k + int(info)
        a[k:e, k:e] = diagonal
        if e == n:
            break
        panel = torch.linalg.solve_triangular(diagonal.mT, a[e:, k:e], upper=True, left=False)  # A21 L11⁻ᵀ
        a[e:, k:e] = panel
        for j in range(e, n, _PANEL):  # the trailing matrix's lower blocks: A22 -= L21 L21ᵀ
            f = min(j + _PANEL, n)
            a[j:, j:f] -= panel[j - e :] @ panel[j - e : f - e].mT
    a.tril_()
    return 0


def _invert_lower_in_place(lower: Tensor) -> None:
    """``L`` (lower triangular, zeros above) overwritten by ``L⁻¹``: ``[[A, 0], [B, C]]⁻¹ = [[A⁻¹, 0], [-C⁻¹ B
    A⁻¹, C⁻¹]]``, halves inverted in turn down to :data:`_PANEL` columns (solved against the identity)."""
    n = lower.shape[0]
    if n <= _PANEL:
        eye = torch.eye(n, dtype=lower.dtype, device=lower.device)
        lower.copy_(torch.linalg.solve_triangular(lower, eye, upper=False))
        return
    half = (n // 2 + _PANEL - 1) // _PANEL * _PANEL
    _invert_lower_in_place(lower[:half, :half])
    _invert_lower_in_place(lower[half:, half:])
    lower[half:, :half] = -(lower[half:, half:] @ (lower[half:, :half] @ lower[:half, :half]))


def _reverse_in_place(t: Tensor) -> None:
    """A contiguous ``t``'s entries in reverse order (a matrix's rows and columns both), a piece of
    :data:`_PIECE` entries from each end swapped at a time: ``P t P`` of a square ``t``, without its copy."""
    flat = t.view(-1)
    count = flat.numel()
    for start in range(0, count // 2, _PIECE):
        size = min(_PIECE, count // 2 - start)
        head = flat[start : start + size].clone()
        tail = flat[count - start - size : count - start]
        flat[start : start + size] = tail.flip(0)
        tail.copy_(head.flip(0))


#: Entries of :func:`_reverse_in_place`'s pieces (1 MiB of float32).
_PIECE = 1 << 18
