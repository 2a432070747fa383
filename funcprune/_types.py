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


def is_conv1d(module: object) -> bool:
    """Whether ``module`` is transformers' ``Conv1D``: a Linear whose weight is stored ``(in, out)``.

    GPT-2's layers compute ``x @ weight + bias`` with ``weight`` of shape
    ``(in_features, out_features)`` and ``nf`` the out features. Read
    without importing transformers (funcprune works without it): a module
    whose class, or a base class, is named ``Conv1D``, with an ``int``
    attribute ``nf`` and a 2-D ``weight`` of ``nf`` columns (and ``nx`` rows
    where it has ``nx``). A module named so that does not fit is not one.
    ``torch.nn.Conv1d`` (lower-case ``d``) is a convolution, not this.
    """
    if not isinstance(module, torch.nn.Module):
        return False
    if not any(cls.__name__ == "Conv1D" for cls in type(module).__mro__):
        return False
    nf, nx = getattr(module, "nf", None), getattr(module, "nx", None)
    weight = getattr(module, "weight", None)
    if not _is_size(nf) or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return False
    return weight.shape[1] == nf and (nx is None or (_is_size(nx) and weight.shape[0] == nx))


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
