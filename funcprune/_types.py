"""Type aliases shared by every layer of funcprune."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Literal, Mapping, TypeGuard, Union

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

Tensor = torch.Tensor
#: A mask where there may be none (``None``: nothing pruned yet).
Mask = Union[Tensor, None]
#: How many units to prune: a Python ``int``, or an integer tensor under a
#: transform (under ``vmap`` each batch element may prune a different count).
Count = Union[int, Tensor]

#: Parameters keyed like ``named_parameters()``.
Params = Mapping[str, Tensor]
#: Masks keyed like ``named_parameters()``; a missing key means "not pruned".
Masks = dict[str, Tensor]
#: Importance scores keyed like ``named_parameters()``.
Scores = Mapping[str, Tensor]

#: How many units to prune: an ``int`` is a count, a ``float`` a fraction.
Amount = Union[int, float]
#: A norm order accepted by :func:`torch.norm` for structured pruning.
NormOrder = Union[int, float, str]
#: Which part of a tensor a spec acts on when folded on an earlier mask.
PruningType = Literal["unstructured", "structured", "global"]


def is_dtensor(t: object) -> TypeGuard[DTensor]:
    """Whether ``t`` is a DTensor; free (no import) while none can exist."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)
