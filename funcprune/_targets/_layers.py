"""The layer types that hold prunable weights, and where each weight's input features run.

Value tables and predicates over a module's type and its own parameter
names, shared by :func:`~funcprune.prunable` (which weights) and
:func:`~funcprune.input_dims` (their layout). Module types only, never
tensor values.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from .._types import is_conv1d

__all__ = ["input_dim", "is_target", "is_weight"]

#: Layers whose parameter named ``weight`` is selected (subclasses included:
#: ``NonDynamicallyQuantizableLinear``, the lazy layers once materialized).
#: transformers' ``Conv1D`` joins them, recognized by :func:`is_conv1d`.
_WEIGHTED: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Bilinear,
    nn.Conv1d, nn.Conv2d, nn.Conv3d,
    nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
)  # fmt: skip
#: Layers whose ``weight`` is selected only with ``embeddings=True``.
EMBEDDINGS: tuple[type[nn.Module], ...] = (nn.Embedding, nn.EmbeddingBag)
#: Layers whose ``weight`` holds the input features along dim 1: ``(out, in)``
#: or ``(out, in / groups, *kernel)``.
_INPUTS_ALONG_1: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
#: Layers whose ``weight`` holds the input features along dim 0:
#: ``(in, out / groups, *kernel)``.
_INPUTS_ALONG_0: tuple[type[nn.Module], ...] = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
#: The input projections of :class:`torch.nn.MultiheadAttention` (its output
#: projection is a Linear of its own, ``out_proj``).
_ATTENTION_WEIGHTS = frozenset(
    {"in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"}
)
#: The weights of :class:`torch.nn.RNNBase` layer by layer (``hr``: LSTM's
#: ``proj_size`` projection), reverse directions included; never the biases.
_RECURRENT_WEIGHT = re.compile(r"weight_(ih|hh|hr)_l[0-9]+(_reverse)?")
#: The weights of the single-step cells (:class:`torch.nn.RNNCellBase`).
_CELL_WEIGHTS = frozenset({"weight_ih", "weight_hh"})


def is_target(
    owner: nn.Module, name: str, *, embeddings: bool, types: tuple[type[nn.Module], ...]
) -> bool:
    """Whether ``owner``'s own parameter ``name`` is one pruning targets."""
    if _is_projection(owner, name):
        return True
    if name != "weight":
        return False
    return (
        isinstance(owner, _WEIGHTED + types)
        or is_conv1d(owner)
        or (embeddings and isinstance(owner, EMBEDDINGS))
    )


def input_dim(owner: nn.Module, name: str) -> int | None:
    """The dim of ``owner``'s own parameter ``name`` along which its input features run.

    1 for the weights of ``Linear``, ``Conv1d/2d/3d``, the attention and
    recurrent projections (``x @ W.T``); 0 for transformers' ``Conv1D``
    (``x @ W``) and ``ConvTranspose1d/2d/3d`` (stored ``(in, out / groups,
    *kernel)``); ``None`` for any other parameter: a bias, an embedding
    (its input is an index), ``Bilinear`` (two inputs), a layer not known.
    """
    if _is_projection(owner, name):
        return 1
    if name != "weight":
        return None
    if is_conv1d(owner) or isinstance(owner, _INPUTS_ALONG_0):
        return 0
    return 1 if isinstance(owner, _INPUTS_ALONG_1) else None


def _is_projection(owner: nn.Module, name: str) -> bool:
    """An attention or recurrent layer's own projection weight (not a parameter named ``weight``)."""
    if isinstance(owner, nn.MultiheadAttention):
        return name in _ATTENTION_WEIGHTS
    if isinstance(owner, nn.RNNBase):
        return _RECURRENT_WEIGHT.fullmatch(name) is not None
    return isinstance(owner, nn.RNNCellBase) and name in _CELL_WEIGHTS


def is_weight(param: torch.Tensor) -> bool:
    """A materialized leaf :class:`~torch.nn.Parameter` (not a swapped-in tensor)."""
    lazy = isinstance(param, nn.parameter.UninitializedParameter)
    return isinstance(param, nn.Parameter) and param.is_leaf and not lazy
