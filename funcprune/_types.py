"""Type aliases shared by every layer of funcprune."""

from __future__ import annotations

from typing import Literal, Mapping, Union

import torch

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
