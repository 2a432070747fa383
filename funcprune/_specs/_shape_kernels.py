"""Kernels for mask shapes: N:M groups, blocks, and a spec applied per slice.

Like those of ``_kernels.py``, each kernel is a pure function of the
method's hyper-parameters, the ``scores`` and an optional ``default_mask``,
returning a new ``torch.bool`` mask of the scores' shape that never keeps an
entry ``default_mask`` pruned. These act on the whole tensor and respect the
earlier mask themselves (their specs' ``pruning_type`` is ``"global"``):

- :func:`n_m`: in every run of ``m`` consecutive entries along a dim, the
  ``n`` of largest ``|score|`` are kept; entries pruned before count among
  a group's pruned;
- :func:`blocks`: whole blocks go, those of smallest L2 norm, counted in
  blocks (a block pruned before is one with no entry left);
- :func:`per_slice_unstructured` and :func:`per_slice`: a method applied
  independently within each slice along a dim, each slice with its own
  exact count.

Which entries go is decided by :mod:`funcprune._select`, with its groups
(``Runs``, ``Slices``); ties go to the
lower index and NaN last, as everywhere.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._select import (
    Slices,
    Target,
    block_norms,
    blocks_with_an_entry,
    eligible_per_group,
    expand_blocks,
    keep,
    kept_n_m,
    resolve_count,
)
from .._types import Count, Mask, Tensor
from .._validate import is_concrete, refuse_dtensors, validate_dim_range
from ._kernels import as_bool, keep_all, unpruned_count

__all__ = ["blocks", "kept_blocks", "n_m", "per_slice", "per_slice_unstructured"]


# --- N:M --------------------------------------------------------------------


def n_m(n: int, m: int, dim: int, scores: Tensor, default_mask: Mask) -> Tensor:
    """Keep the ``n`` largest ``|scores|`` of every ``m`` consecutive entries along ``dim``.

    A group holding entries pruned before keeps ``min(n, still kept)``: the
    earlier pruned count among its ``m - n``. Ties go to the lower index
    first, NaN is kept first, ``-0.0`` ties ``0.0``. No sort: the native
    kernel (float32/float64 scores on the CPU, eager, ``m <= 64``: one read
    of the scores, one byte written per entry, along any dim), else torch
    ranking each entry by comparisons with its group's others (``m <= 16``,
    under transforms too), else ``funcprune._select`` over ``Runs``; all
    three give the same mask (``_n_m.py``).
    """
    validate_dim_range(scores, dim)
    length = scores.shape[dim] if scores.dim() else 1
    if length % m:
        raise ValueError(
            f"NM: the length along dim={dim} is {length}, not a multiple of m={m} "
            f"(scores of shape {tuple(scores.shape)}); choose a dim whose length m divides"
        )
    default_mask = as_bool(default_mask)
    refuse_dtensors("compute_mask", scores, default_mask)
    if default_mask is None and n == m:
        return keep_all(scores, None)
    return kept_n_m(n, m, dim, scores, default_mask)


# --- blocks -------------------------------------------------------------------


def block_view(shape: tuple[int, ...], scores: Tensor) -> tuple[list[int], list[int]]:
    """The scores' shape split into (blocks, within a block) pairs, and the inner dims."""
    if len(shape) > scores.dim():
        raise ValueError(
            f"Block: shape={shape} has {len(shape)} dims, more than the scores' "
            f"{scores.dim()} (shape {tuple(scores.shape)}); blocks tile the last dims"
        )
    lead = list(scores.shape[: scores.dim() - len(shape)])
    view, inner = lead[:], []
    for i, (length, size) in enumerate(zip(scores.shape[len(lead) :], shape, strict=True)):
        if length % size:
            raise ValueError(
                f"Block: shape={shape} does not tile scores of shape {tuple(scores.shape)}: "
                f"dim {len(lead) + i} has length {length}, not a multiple of {size}"
            )
        view += [length // size, size]
        inner.append(len(lead) + 2 * i + 1)
    return view, inner


def kept_blocks(mask: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Whether each block of ``shape`` keeps an entry of ``mask``: the grid of blocks, as bool.

    A block counts as remaining while any of its entries is kept (what
    :func:`blocks` selects among, and what a BSR tensor stores). Read a
    block row's width at a time where it can be (``funcprune._select``'s ``_blocks.py``).
    """
    view, inner = block_view(shape, mask)
    grid = [n for i, n in enumerate(view) if i not in inner]
    fast = blocks_with_an_entry(mask, shape, grid) if mask.dtype == torch.bool else None
    return fast if fast is not None else mask.reshape(view).any(dim=inner)


def blocks(amount: Target, shape: tuple[int, ...], scores: Tensor, default_mask: Mask) -> Tensor:
    """Prune the ``amount`` remaining blocks of ``shape`` of smallest L2 norm.

    Blocks tile the last ``len(shape)`` dims; every index of the dims before
    is a row of blocks of its own. A block is remaining while one of its
    entries is kept; ``amount`` and :class:`~._select.Sparsity` count blocks.
    Ties go to the lower block index (row-major over the grid of blocks).

    Eagerly, each pass is one pass over the whole tensor (``funcprune._select``'s ``_blocks.py``):
    the norms summed natively exactly as ``torch.linalg.vector_norm`` sums
    them (the same keys, so the same ranking), the selection over the grid
    of blocks, and the mask written a block row's width at a time.
    """
    view, inner = block_view(shape, scores)
    default_mask = as_bool(default_mask)
    norms = block_norms(scores, shape, view, inner)
    eligible = None if default_mask is None else kept_blocks(default_mask, shape)
    k = resolve_count(amount, unpruned_count(norms, eligible, norms.numel()), norms.numel())
    if isinstance(k, int) and k == 0:
        return keep_all(scores, default_mask)
    kept = keep(norms, k, eligible)
    mask = expand_blocks(kept, shape, scores, default_mask)
    if mask is not None:
        return mask
    for d in inner:
        kept = kept.unsqueeze(d)
    kept = kept.expand(view).reshape(scores.shape)
    return kept if default_mask is None else kept & default_mask


# --- per slice ------------------------------------------------------------------


def per_slice_unstructured(
    amount: Target, dim: int, keys: Tensor | None, scores: Tensor, default_mask: Mask
) -> Tensor:
    """Prune ``amount`` of each slice's remaining entries along ``dim``, lowest ``keys`` first.

    Each slice (``scores.select(dim, i)``) prunes its own exact count: an
    ``int`` amount, or a fraction of its unpruned entries, or what its
    :class:`~._select.Sparsity` target takes; ties go to the lower index
    within the slice. ``keys`` has the scores' shape; ``None`` ranks
    ``|scores|`` (computed only where the selection needs them). Eagerly,
    every slice is selected at once (``funcprune._select``'s long-rows
    path), each with its own count.
    """
    validate_dim_range(scores, dim)
    default_mask = as_bool(default_mask)
    if scores.shape[dim] == 0:
        return keep_all(scores, default_mask)
    size = scores.numel() // scores.shape[dim]
    group = Slices(dim)
    available: Count = size if default_mask is None else eligible_per_group(default_mask, group)
    k = resolve_count(amount, available, size)
    if isinstance(k, int) and k == 0:
        return keep_all(scores, default_mask)
    if keys is None:
        return keep(scores.detach(), k, default_mask, group=group, magnitude=True)
    return keep(keys, k, default_mask, group=group)


MaskOf = Callable[[Tensor, Mask], Tensor]


def per_slice(mask_of: MaskOf, dim: int, scores: Tensor, default_mask: Mask, *, one_by_one: bool = False) -> Tensor:
    """``mask_of`` (a spec's mask) applied to each slice along ``dim``, stacked back.

    The slices go through :func:`torch.func.vmap` (``randomness="different"``:
    each slice draws its own numbers), so ``mask_of`` must run under it, as
    every built-in spec does; with ``one_by_one`` (in eager mode only), they
    run one after another instead, each raising as it would alone.
    """
    validate_dim_range(scores, dim)
    d = dim % scores.dim()
    if scores.shape[d] == 0:
        return keep_all(scores, default_mask)
    default_mask = as_bool(default_mask)
    eager = is_concrete(scores)  # outside transforms and compilation: a slice raises as it would alone
    if eager and (one_by_one or scores.numel() == 0):  # empty slices too: norms of nothing fail under vmap
        return torch.stack([_one_slice(mask_of, scores, default_mask, d, i) for i in range(scores.shape[d])], d)
    batched = torch.func.vmap(  # out_dims=0, then moved: a mask that does not depend on
        # the scores (Identity's) comes out wrong from out_dims > 0 (pytorch/pytorch#178425)
        mask_of, in_dims=(d, None if default_mask is None else d), out_dims=0, randomness="different"
    )
    mask: Tensor = batched(scores, default_mask).movedim(0, d)
    if eager:  # vmap caps a count a slice cannot meet, emptying it: only emptied slices run again, alone
        emptied = ~mask.movedim(d, 0).reshape(mask.shape[d], -1).any(1)
        for i in emptied.nonzero().flatten().tolist():
            _one_slice(mask_of, scores, default_mask, d, i)
    return mask


def _one_slice(mask_of: MaskOf, scores: Tensor, default_mask: Tensor | None, d: int, i: int) -> Tensor:
    """``mask_of`` on slice ``i`` alone, its errors naming the slice."""
    try:
        return mask_of(scores.select(d, i), None if default_mask is None else default_mask.select(d, i))
    except (ValueError, IndexError) as e:
        raise type(e)(f"PerSlice: slice {i}: {e}") from e
