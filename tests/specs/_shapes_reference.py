"""Today's (before issue 27) Block and per-slice selection, kept as the reference the fast paths equal.

:func:`blocks_reference` is the Block kernel as it was: the norms from
``torch.linalg.vector_norm`` over the blocks' view, the selection over the
grid, the mask expanded by torch. :func:`per_slice_reference` selects each
slice with the sort path of ``funcprune._select`` (a stable sort and a
cumulative count per row), which the long-rows path must equal.
"""

from __future__ import annotations

import torch

from funcprune._select import Slices, Target, eligible_per_group, keep, resolve_count
from funcprune._select._choose import _as_rows, _keep_rows
from funcprune._specs._kernels import as_bool, keep_all, unpruned_count
from funcprune._specs._shape_kernels import block_view

Tensor = torch.Tensor


def kept_blocks_reference(mask: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Whether each block keeps an entry, as ``kept_blocks`` computed it."""
    view, inner = block_view(shape, mask)
    return mask.reshape(view).any(dim=inner)


def block_norms_reference(scores: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The blocks' norms, as ``blocks`` computed them."""
    view, inner = block_view(shape, scores)
    norms: Tensor = torch.linalg.vector_norm(scores.reshape(view), dim=inner)
    return norms


def blocks_reference(amount: Target, shape: tuple[int, ...], scores: Tensor, default_mask: Tensor | None) -> Tensor:
    """The Block kernel as it was."""
    view, inner = block_view(shape, scores)
    default_mask = as_bool(default_mask)
    norms = torch.linalg.vector_norm(scores.reshape(view), dim=inner)
    eligible = None if default_mask is None else kept_blocks_reference(default_mask, shape)
    k = resolve_count(amount, unpruned_count(norms, eligible, norms.numel()), norms.numel())
    if isinstance(k, int) and k == 0:
        return keep_all(scores, default_mask)
    kept = keep(norms, k, eligible)
    for d in inner:
        kept = kept.unsqueeze(d)
    kept = kept.expand(view).reshape(scores.shape)
    return kept if default_mask is None else kept & default_mask


def per_slice_reference(amount: Target, dim: int, keys: Tensor, scores: Tensor, default_mask: Tensor | None) -> Tensor:
    """``per_slice_unstructured`` with every slice selected by the sort path."""
    default_mask = as_bool(default_mask)
    if scores.shape[dim] == 0:
        return keep_all(scores, default_mask)
    size = scores.numel() // scores.shape[dim]
    group = Slices(dim)
    available = size if default_mask is None else eligible_per_group(default_mask, group)
    k = resolve_count(amount, available, size)
    if isinstance(k, int) and k == 0:
        return keep_all(scores, default_mask)
    rows, restore = _as_rows(keys, group)
    eligible_rows = None if default_mask is None else _as_rows(default_mask, group)[0]
    return restore(_keep_rows(rows, k, eligible_rows))
