"""The checks bake, shrink and to_sparse share: mask dtypes, and the names of tied parameters."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from .._torch_private import is_functorch_wrapped
from .._types import Masks, Tensor

__all__ = ["check_mask_dtypes", "first_names", "one_mask_per_parameter"]


def check_mask_dtypes(fn: str, masks: object) -> Mapping[str, Tensor]:
    """``masks``, after refusing any mask that is neither ``torch.bool`` nor floating-point.

    Names, shapes and values are checked after, by :func:`~funcprune._names.check_masks`.
    """
    if not isinstance(masks, Mapping):
        raise TypeError(
            f"{fn}: masks must be a mapping of names to masks, got {type(masks).__name__}"
        )
    for name, mask in masks.items():
        if isinstance(mask, torch.Tensor) and is_functorch_wrapped(mask):
            raise ValueError(
                f"{fn}: the mask for {name!r} is inside a torch.func transform (vmap, grad...), and {fn} "
                "builds a new module from the masks' values, which transforms do not support: call "
                f"{fn} outside the transform (once per mask dict)"
            )
        if isinstance(mask, torch.Tensor) and not (
            mask.dtype == torch.bool or mask.is_floating_point()
        ):
            raise TypeError(
                f"{fn}: the mask for {name!r} has dtype {mask.dtype}; expected torch.bool "
                "(True = kept) or a floating-point 0/1 mask; convert it with `mask != 0`"
            )
    return masks


def first_names(module: nn.Module) -> dict[str, str]:
    """Each name of each parameter, to its first (its ``named_parameters()`` name)."""
    first: dict[int, str] = {}
    return {
        name: first.setdefault(id(p), name)
        for name, p in module.named_parameters(remove_duplicate=False)
    }


def one_mask_per_parameter(fn: str, names: Mapping[str, str], masks: Masks) -> dict[str, Tensor]:
    """``masks`` keyed by first names (:func:`first_names`), in parameter order.

    The names of a tied Parameter must carry equal masks (or only one has one).
    """
    by_first: dict[str, Tensor] = {}
    given: dict[str, str] = {}  # the name under which each Parameter's mask came first
    for name, mask in masks.items():
        first = names[name]
        if first in by_first and not torch.equal(by_first[first], mask):
            raise ValueError(
                f"{fn}: {given[first]!r} and {name!r} are one tied Parameter, but their masks "
                "differ; a tied weight has one set of values: give one mask, under either "
                "name, or equal masks under both"
            )
        by_first[first], given[first] = mask, given.get(first, name)
    return {name: by_first[name] for name in dict.fromkeys(names.values()) if name in by_first}
