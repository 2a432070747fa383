"""A plain float64 reference of SparseGPT's layer pruning, for checking the optimized one.

SparseGPT (Frantar & Alistarh 2023, "SparseGPT: Massive Language Models Can Be
Accurately Pruned in One-Shot", Algorithm 1) prunes the weight ``W`` (out, in)
of a linear layer column by column, each pruned weight's error being spread
over the columns to its right through the rows of the upper Cholesky factor of
the inverse (damped) Hessian ``H = sum x x^T`` of the layer's inputs. The mask
is chosen one column block at a time ("adaptive mask selection"), and the
updates of the columns right of the block are batched ("lazy batch updates").

Written from ``sparsegpt.py`` (``SparseGPT.fasterprune`` and ``add_batch``) of
https://github.com/IST-DASLab/sparsegpt at commit
147d2159dc4f3e9f73e47b32c04d7b3708f44436, following the same math step for
step but not its code. ``add_batch`` only accumulates ``2/nsamples * sum x x^T``;
a positive scale of ``H`` changes nothing here (the damping scales with it, the
scores are all scaled alike and the error feedback ``err / d * Hinv[i, i:]``
cancels it), so the unscaled sum is taken. The one exception, as in the
original: the unit diagonal given to dead inputs (``diag(H) == 0``) does not
scale, and it enters the mean that sets the damping, so with dead inputs the
result depends (slightly) on the scale of ``H``.

Where this departs from the original:

* ``exact=True`` (the default) prunes exactly
  ``round(sparsity * (rows * cols_in_block))`` weights of each column block
  (Python's ``round``, half to even), the smallest scores first, ties broken
  toward the lower row-major flat index of the block (a stable sort). The
  original prunes every score ``<=`` the one at sorted position
  ``int(numel * sparsity)``, that is ``int(numel * sparsity) + 1`` weights
  when the scores are distinct (more on ties); ``exact=False`` reproduces that
  rule (at ``sparsity=1``, where the original indexes past the end, the
  position is clamped, pruning the whole block).
  ``per_row=True`` (not in the original) takes the count in each row of the
  block instead.
* For N:M, ``nm=(n, m)`` names the number KEPT (the original's ``prunen`` is
  the number pruned, ``m - n`` here); with ``exact=True`` ties go to the lower
  column, with ``exact=False`` the choice is ``torch.topk(largest=False)`` as
  in the original.
* Everything runs in float64 on the CPU (the original: float32 on CUDA with
  TF32 off); there is no quantizer, no loss bookkeeping, no preset mask, and no
  layer handling (Conv1D transposes, Conv2d flattening): the caller passes the
  (out, in) matrix.
"""

from __future__ import annotations

import torch

__all__ = ["reference_sparsegpt"]


def _check_arguments(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    sparsity: float | None,
    per_row: bool,
    nm: tuple[int, int] | None,
    blocksize: int,
    percdamp: float,
    exact: bool,
) -> None:
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (out, in), got shape {tuple(weight.shape)}")
    if not (weight.is_floating_point() and hessian.is_floating_point()):
        raise ValueError("weight and hessian must be floating point")
    columns = weight.shape[1]
    if tuple(hessian.shape) != (columns, columns):
        raise ValueError(
            f"hessian must be ({columns}, {columns}) for weight {tuple(weight.shape)}, got {tuple(hessian.shape)}"
        )
    if not bool(torch.isfinite(hessian).all()):
        raise ValueError("hessian has non-finite entries")
    if (sparsity is None) == (nm is None):
        raise ValueError("give exactly one of sparsity and nm")
    if isinstance(blocksize, bool) or not isinstance(blocksize, int) or blocksize < 1:
        raise ValueError(f"blocksize must be a positive int, got {blocksize!r}")
    if not percdamp >= 0.0:
        raise ValueError(f"percdamp must be >= 0, got {percdamp!r}")
    if sparsity is not None:
        if not 0.0 <= sparsity <= 1.0:
            raise ValueError(f"sparsity must be in [0, 1], got {sparsity!r}")
        if per_row and not exact:
            raise ValueError("per_row is only defined with exact=True")
    if nm is not None:
        if per_row:
            raise ValueError("per_row applies to sparsity, not to nm")
        n, m = nm
        if m < 1 or not 0 <= n <= m:
            raise ValueError(f"nm=(n, m) needs m >= 1 and 0 <= n <= m, got {nm!r}")
        if blocksize % m != 0:
            raise ValueError(f"blocksize {blocksize} must be a multiple of m={m}")
        if columns % m != 0:
            raise ValueError(f"in_features {columns} must be a multiple of m={m}")


def _unstructured_block_mask(
    scores: torch.Tensor, sparsity: float, per_row: bool, exact: bool
) -> torch.Tensor:
    """Boolean (rows, cols) mask, True = pruned, of one column block."""
    rows, cols = scores.shape
    pruned = torch.zeros(rows, cols, dtype=torch.bool)
    if per_row:
        # k smallest of each row; a stable sort puts the lower column first on ties.
        k = round(sparsity * cols)
        order = torch.sort(scores, dim=1, stable=True).indices
        pruned.scatter_(1, order[:, :k], True)
        return pruned
    flat = scores.flatten()
    numel = flat.numel()
    if exact:
        # k smallest of the block; stable sort = ties to the lower row-major flat index.
        k = round(sparsity * numel)
        order = torch.sort(flat, stable=True).indices
        pruned.view(-1)[order[:k]] = True
        return pruned
    # The original's rule: everything at or below the sorted value at int(numel * sparsity).
    # (At sparsity == 1 the original indexes past the end; clamped here, it prunes all.)
    position = min(int(numel * sparsity), numel - 1)
    thresh = torch.sort(flat).values[position]
    return scores <= thresh


def reference_sparsegpt(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    *,
    sparsity: float | None = None,
    per_row: bool = False,
    nm: tuple[int, int] | None = None,
    blocksize: int = 128,
    percdamp: float = 0.01,
    exact: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SparseGPT-prune ``weight`` (out, in) given ``hessian`` (in, in) = sum of x x^T.

    Exactly one of ``sparsity`` (unstructured: the fraction pruned in each
    column block, or with ``per_row`` in each row of each column block) and
    ``nm=(n, m)`` (keep n of every m consecutive input columns, groups aligned
    at column 0). Returns ``(new_weight, mask)``: the pruned and compensated
    weight in float64, and a bool mask of the same shape, True where kept.
    Neither input is modified.
    """
    _check_arguments(weight, hessian, sparsity, per_row, nm, blocksize, percdamp, exact)
    rows, columns = weight.shape
    W = weight.detach().to(device="cpu", dtype=torch.float64).clone()
    H = hessian.detach().to(device="cpu", dtype=torch.float64).clone()

    # 1. Dead inputs (never active in calibration): unit diagonal, zero weight.
    dead = torch.diag(H) == 0
    dead_index = dead.nonzero().flatten()
    H[dead_index, dead_index] = 1.0
    W[:, dead] = 0.0

    # 2. Damping, then Hinv = the upper Cholesky factor of H^{-1}.
    damp = percdamp * torch.mean(torch.diag(H))
    H = H + damp * torch.eye(columns, dtype=torch.float64)
    lower = torch.linalg.cholesky(H)
    H_inverse = torch.cholesky_inverse(lower)
    Hinv = torch.linalg.cholesky(H_inverse, upper=True)

    pruned = torch.zeros(rows, columns, dtype=torch.bool)

    for i1 in range(0, columns, blocksize):
        i2 = min(i1 + blocksize, columns)
        count = i2 - i1

        W1 = W[:, i1:i2].clone()
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        d1 = torch.diag(Hinv1)

        # 3. Unstructured: the block's mask, from the weights as updated by earlier blocks.
        if sparsity is not None:
            scores = W1**2 / d1.reshape(1, -1) ** 2
            mask1 = _unstructured_block_mask(scores, sparsity, per_row, exact)
        else:
            mask1 = torch.zeros(rows, count, dtype=torch.bool)

        # 5. Column by column: prune, then feed the error to the block's later columns.
        for i in range(count):
            # 4. N:M: a group's mask, from the current (updated within the block) weights.
            # Global column i1 + i starts a group iff i does, blocksize being a multiple of m.
            if nm is not None and i % nm[1] == 0:
                n, m = nm
                group_scores = W1[:, i : i + m] ** 2 / d1[i : i + m].reshape(1, -1) ** 2
                if exact:
                    chosen = torch.sort(group_scores, dim=1, stable=True).indices[:, : m - n]
                else:
                    chosen = torch.topk(group_scores, m - n, dim=1, largest=False).indices
                mask1.scatter_(1, i + chosen, True)

            w = W1[:, i]
            d = Hinv1[i, i]
            q = w.clone()
            q[mask1[:, i]] = 0.0
            Q1[:, i] = q
            err1 = (w - q) / d
            W1[:, i:] -= err1.unsqueeze(1) @ Hinv1[i, i:].unsqueeze(0)
            Err1[:, i] = err1

        W[:, i1:i2] = Q1
        # Lazy batch update of everything right of the block.
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]
        pruned[:, i1:i2] = mask1

    # 6. Dead columns are zero in W; their mask entries follow the selection like any
    # other column (their score is 0, so they are usually among the pruned ones).
    return W, ~pruned
