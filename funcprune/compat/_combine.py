"""How a ``PruningContainer`` folds its latest method onto the earlier mask.

The new method acts on the part of the tensor still unpruned, which its
``PRUNING_TYPE`` selects (:func:`funcprune._specs.unpruned_units`, the
rule the kernels' fold follows too). Where funcprune's fold gives exactly
torch's mask (a method whose mask is its spec's, floating scores, a 0/1
earlier mask: :func:`foldable`), the spec is folded with
:func:`funcprune.compute_mask`. Otherwise (user-defined methods, mocks, odd
inputs) the method gets torch's treatment, errors included: its
``compute_mask`` is called on the slice of the unpruned part and the result
written back into the mask (:func:`combine_masks`).
"""

from __future__ import annotations

from typing import Any

import torch

from .._plans import compute_mask as fold_mask
from .._specs import Spec, unpruned_units
from .._validate import non_binary

__all__ = ["combine_masks", "fold_latest", "foldable"]

Tensor = torch.Tensor


def foldable(t: object, default_mask: object) -> bool:
    """Whether funcprune's fold reproduces torch's container on these inputs.

    ``t`` must be a non-empty floating tensor (empty channels trip the
    kernels' fold), and ``default_mask`` a 0/1 mask of its shape and device.
    """
    return (
        isinstance(t, Tensor)
        and isinstance(default_mask, Tensor)
        and t.is_floating_point()
        and t.numel() > 0
        and default_mask.shape == t.shape
        and default_mask.device == t.device
        and not non_binary(default_mask, 1)
    )


def fold_latest(method: Any, spec: Spec | None, t: Tensor, default_mask: Tensor) -> Tensor:
    """The container's mask: ``method`` applied to the unpruned part of ``t``.

    Args:
        method: the latest method.
        spec: its spec where :func:`foldable` holds and the spec's mask is
            the method's; ``None`` for torch's slicing.
        t: the scores.
        default_mask: the mask of the earlier methods.

    Returns:
        The combined mask, in ``t``'s dtype (``default_mask`` itself, written
        into, where the dtypes match, as torch does).
    """
    if spec is None:
        return combine_masks(method, t, default_mask)
    folded = fold_mask(spec, t.detach(), default_mask)  # masks need no graph
    new_mask = default_mask.to(dtype=t.dtype)
    new_mask.copy_(folded)
    return new_mask


def combine_masks(method: Any, t: Tensor, mask: Tensor) -> Tensor:
    """torch's ``PruningContainer`` slicing, for methods without a kernel."""
    new_mask = mask.to(dtype=t.dtype)
    dim = _channel_dim(method, t) if method.PRUNING_TYPE == "structured" else 0
    flags = unpruned_units(method.PRUNING_TYPE, mask, dim, t.dim())
    slc: Any = flags
    if flags is None or method.PRUNING_TYPE == "structured":
        parts: list[Any] = [slice(None)] * t.dim()
        if flags is not None:
            parts[dim] = flags  # an IndexError past the last dim, as in torch
        slc = tuple(parts)
    partial_mask = method.compute_mask(t[slc], default_mask=mask[slc])
    new_mask[slc] = partial_mask.to(dtype=new_mask.dtype)
    return new_mask


def _channel_dim(method: Any, t: Tensor) -> int:
    """A structured method's ``dim``, made non-negative with torch's checks."""
    if not hasattr(method, "dim"):
        raise AttributeError(
            "Pruning methods of PRUNING_TYPE "
            '"structured" need to have the attribute `dim` defined.'
        )
    n_dims = t.dim()
    dim: int = method.dim
    if dim < 0:
        dim = n_dims + dim
    if dim < 0:
        raise IndexError(f"Index is out of bounds for tensor with dimensions {n_dims}")
    return dim
