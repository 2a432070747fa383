"""torch's ``PruningContainer`` slicing, for methods without a kernel.

A :class:`~funcprune.compat.PruningContainer` folds a new method onto the
still-unpruned part of a tensor. Built-in methods run funcprune's fold;
other methods (user-defined ones, mocks) get exactly torch's treatment: the
method's ``compute_mask`` is called on the slice that its ``PRUNING_TYPE``
selects, and the result is written back into the mask.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["combine_masks"]

Tensor = torch.Tensor


def combine_masks(method: Any, t: Tensor, mask: Tensor) -> Tensor:
    """torch's ``PruningContainer`` slicing, for methods without a kernel."""
    new_mask = mask.to(dtype=t.dtype)
    slc: Any
    if method.PRUNING_TYPE == "unstructured":
        slc = mask == 1
    elif method.PRUNING_TYPE == "structured":
        if not hasattr(method, "dim"):
            raise AttributeError(
                "Pruning methods of PRUNING_TYPE "
                '"structured" need to have the attribute `dim` defined.'
            )
        n_dims = t.dim()
        dim = method.dim
        if dim < 0:
            dim = n_dims + dim
        if dim < 0:
            raise IndexError(f"Index is out of bounds for tensor with dimensions {n_dims}")
        keep_channel = mask.sum(dim=[d for d in range(n_dims) if d != dim]) != 0
        slc = [slice(None)] * n_dims
        slc[dim] = keep_channel
    elif method.PRUNING_TYPE == "global":
        slc = [slice(None)] * len(t.shape)
    else:
        raise ValueError(f"Unrecognized PRUNING_TYPE {method.PRUNING_TYPE}")
    if isinstance(slc, list):
        slc = tuple(slc)
    partial_mask = method.compute_mask(t[slc], default_mask=mask[slc])
    new_mask[slc] = partial_mask.to(dtype=new_mask.dtype)
    return new_mask
