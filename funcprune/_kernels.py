"""Kernels: one small pure function per leaf spec, computing its mask.

Each kernel takes importance ``scores``, an optional boolean ``default_mask``
(already checked) and an optional generator, and returns a new ``torch.bool``
mask of the scores' shape. With a default mask, the spec acts on the part of
the tensor that is still unpruned, exactly as torch's ``PruningContainer``
does: unpruned entries for unstructured specs, channels not entirely pruned
for structured ones, everything for :class:`CustomFromMask`. A float amount
is a fraction of that part; nothing pruned earlier is ever revived.
"""

from __future__ import annotations

from typing import Callable

import torch

from ._fastselect import FAST_MIN_KEYS, lowest_fast
from ._select import Count, is_concrete, lowest, resolve_count, spread
from ._specs import (
    CustomFromMask,
    Identity,
    L1Unstructured,
    LnStructured,
    RandomStructured,
    RandomUnstructured,
    Spec,
)
from ._validate import validate_dim_range, validate_structured

Tensor = torch.Tensor
Mask = Tensor | None


def _left(scores: Tensor, eligible: Mask, total: int) -> Count:
    """How many units are still unpruned: a Python int wherever it can be.

    A tensor only where the values cannot be read (under a transform); the
    random kernels draw per unpruned unit, as torch does, where it is an int.
    """
    if eligible is None:
        return total
    n = eligible.sum()
    return int(n) if is_concrete(scores) and is_concrete(eligible) else n


def _rand(
    n: int,
    generator: torch.Generator | None,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
) -> Tensor:
    """``n`` uniform draws, as torch's pruning methods draw them."""
    return torch.rand(n, generator=generator, dtype=dtype, device=device)


def _kept(keys: Tensor, k: Count, eligible: Mask) -> Tensor:
    """Flags of the eligible keys that survive pruning the ``k`` lowest.

    Takes the selection path when eager and large, the sort path otherwise
    (the two agree exactly).
    """
    if isinstance(k, int) and keys.numel() >= FAST_MIN_KEYS and is_concrete(keys):
        kept = lowest_fast(keys, k, eligible, complement=True)
    else:
        kept = ~lowest(keys, k, eligible)
    return kept if eligible is None else kept.logical_and_(eligible)


# --- unstructured -----------------------------------------------------------


def _unstructured(
    keys_of: Callable[[Tensor, Mask, Count], Tensor],
    amount: float | int,
    scores: Tensor,
    default_mask: Mask,
) -> Tensor:
    """Prune the ``amount`` lowest keys among the unpruned entries."""
    eligible = None if default_mask is None else default_mask.reshape(-1)
    left = _left(scores, eligible, scores.numel())
    k = resolve_count(amount, left)
    if isinstance(k, int) and k == 0:  # torch draws nothing then either
        return keep_all(scores, default_mask)
    keys = keys_of(scores, eligible, left)
    return _kept(keys, k, eligible).reshape(scores.shape)


def _l1_unstructured(
    spec: L1Unstructured, scores: Tensor, default_mask: Mask, generator: torch.Generator | None
) -> Tensor:
    return _unstructured(lambda s, e, c: s.abs().reshape(-1), spec.amount, scores, default_mask)


def _random_unstructured(
    spec: RandomUnstructured,
    scores: Tensor,
    default_mask: Mask,
    generator: torch.Generator | None,
) -> Tensor:
    def keys(s: Tensor, eligible: Mask, left: Count) -> Tensor:
        # torch draws one number per *unpruned* entry and prunes the largest.
        if eligible is not None and isinstance(left, int):  # eager: draw as torch does
            drawn = _rand(left, generator, s.dtype, s.device)
            return -spread(drawn, eligible, 0.0)
        return -_rand(s.numel(), generator, s.dtype, s.device)

    return _unstructured(keys, spec.amount, scores, default_mask)


# --- structured -------------------------------------------------------------


def _channels(scores: Tensor, dim: int) -> tuple[int, list[int]]:
    validate_structured(scores)
    validate_dim_range(scores, dim)
    d = dim % scores.dim()
    return d, [i for i in range(scores.dim()) if i != d]


def _structured(
    keys_of: Callable[[Tensor, int, list[int], Mask, Count], Tensor],
    amount: float | int,
    dim: int,
    scores: Tensor,
    default_mask: Mask,
) -> Tensor:
    """Prune the ``amount`` lowest-key channels among those not all pruned."""
    d, others = _channels(scores, dim)
    n_channels = scores.shape[d]
    eligible = None
    if default_mask is not None:
        eligible = default_mask.movedim(d, 0).flatten(1).any(dim=1)
    left = _left(scores, eligible, n_channels)
    k = resolve_count(amount, left)
    if isinstance(k, int) and k == 0:  # torch draws nothing then either
        return keep_all(scores, default_mask)
    keys = keys_of(scores, d, others, eligible, left)
    kept = _kept(keys, k, eligible)
    shape = [1] * scores.dim()
    shape[d] = n_channels
    kept = kept.reshape(shape)
    if default_mask is None:
        return kept.expand(scores.shape).contiguous()
    return kept & default_mask


def _check_matrix_norm(n: object, scores: Tensor) -> None:
    """Refuse a matrix norm the channels' shape cannot take, whatever the amount."""
    if n == "nuc" and scores.dim() != 3 or n == "fro" and scores.dim() > 3:
        need = "exactly 3 dims" if n == "nuc" else "at most 3 dims"
        raise ValueError(
            f"LnStructured: n={n!r} needs scores with {need} (a matrix norm over the dims "
            f"other than dim), got shape {tuple(scores.shape)}; use a number such as n=2"
        )


def _ln_structured(
    spec: LnStructured, scores: Tensor, default_mask: Mask, generator: torch.Generator | None
) -> Tensor:
    _channels(scores, spec.dim)
    _check_matrix_norm(spec.n, scores)

    def keys(s: Tensor, d: int, others: list[int], eligible: Mask, left: Count) -> Tensor:
        norm: Tensor = torch.norm(s, p=spec.n, dim=others)
        return norm

    return _structured(keys, spec.amount, spec.dim, scores, default_mask)


def _random_structured(
    spec: RandomStructured,
    scores: Tensor,
    default_mask: Mask,
    generator: torch.Generator | None,
) -> Tensor:
    def keys(s: Tensor, d: int, others: list[int], eligible: Mask, left: Count) -> Tensor:
        # torch draws one default-dtype CPU number per remaining channel and
        # prunes the smallest.
        device = generator.device if generator is not None else "cpu"
        if eligible is not None and isinstance(left, int):  # eager: draw as torch does
            drawn = _rand(left, generator, device=device)
            return spread(drawn, eligible.to(drawn.device), 0.0).to(s.device)
        return _rand(s.shape[d], generator, device=device).to(s.device)

    return _structured(keys, spec.amount, spec.dim, scores, default_mask)


# --- whole-tensor specs -----------------------------------------------------


def keep_all(scores: Tensor, default_mask: Mask) -> Tensor:
    if default_mask is None:
        return torch.ones(scores.shape, dtype=torch.bool, device=scores.device)
    return default_mask.clone(memory_format=torch.contiguous_format)


def _identity(
    spec: Identity, scores: Tensor, default_mask: Mask, generator: torch.Generator | None
) -> Tensor:
    return keep_all(scores, default_mask)


def _custom_from_mask(
    spec: CustomFromMask, scores: Tensor, default_mask: Mask, generator: torch.Generator | None
) -> Tensor:
    if spec.mask.shape != scores.shape:
        raise ValueError(
            f"CustomFromMask: the spec's mask has shape {tuple(spec.mask.shape)} but the "
            f"scores have shape {tuple(scores.shape)}; they must be equal"
        )
    mask = spec.mask.to(scores.device)
    return mask.clone() if default_mask is None else mask & default_mask


def leaf_mask(
    spec: Spec, scores: Tensor, default_mask: Mask, generator: torch.Generator | None
) -> Tensor:
    """Dispatch a leaf (non-chain) spec to its kernel."""
    match spec:
        case Identity():
            return _identity(spec, scores, default_mask, generator)
        case RandomUnstructured():
            return _random_unstructured(spec, scores, default_mask, generator)
        case L1Unstructured():
            return _l1_unstructured(spec, scores, default_mask, generator)
        case RandomStructured():
            return _random_structured(spec, scores, default_mask, generator)
        case LnStructured():
            return _ln_structured(spec, scores, default_mask, generator)
        case CustomFromMask():
            return _custom_from_mask(spec, scores, default_mask, generator)
    raise TypeError(
        f"spec must be a funcprune spec (Identity, RandomUnstructured, L1Unstructured, "
        f"RandomStructured, LnStructured, CustomFromMask or Chain), got {spec!r}"
    )
