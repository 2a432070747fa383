"""What channel-wise ops and arithmetic do to the channels they read.

Each handler takes the :class:`~funcprune._graph_walk.Walk` and a
``call_function`` or ``call_method`` node; :data:`HANDLERS` maps targets
(functions, and method names) to them:

- channel-wise ops pass the channels on: activations, dropout, casts
  (:func:`unary`), pooling and interpolation over the dims after the
  channels (:func:`spatial`), reductions and softmax over other dims;
- reductions and softmax over the channel axis (or over every dim, as
  ``dim=()`` does), and norms whose statistics span the channels
  (``F.layer_norm``...), *block* them;
- arithmetic of two channel tensors couples their channels pairwise;
  with a scalar, or a tensor that is 1 along the channel axis, it passes
  them on; with a tensor of its own entries per channel, it blocks them;
- a division (``/``, ``//``, ``%``, ``torch.fmod``...) *by* channels blocks
  the divisor's channels (and so the numerator's, which pair with them):
  a removed channel is a zero, and ``0 / 0`` is no zero but NaN, so the
  quotient's channel cannot go with them. Dividing channels by a scalar,
  or by a tensor that is 1 along the channel axis, passes them on;
- anything else these handlers cannot follow is *unknown*
  (:meth:`~funcprune._graph_walk.Walk.unknown_op`).

>>> import torch
>>> from torch import nn
>>> from funcprune._graph import trace_channels
>>> class Residual(nn.Module):
...     def __init__(self) -> None:
...         super().__init__()
...         self.a, self.b, self.head = nn.Linear(4, 3), nn.Linear(4, 3), nn.Linear(3, 1)
...     def forward(self, x: torch.Tensor) -> torch.Tensor:
...         return self.head(torch.relu(self.a(x)) + self.b(x))
>>> graph = trace_channels("example", Residual(), torch.randn(2, 4))
>>> graph.roots  # b's channels (atoms 3, 4, 5) join a's (0, 1, 2)
(0, 1, 2, 0, 1, 2, 6)
"""

from __future__ import annotations

import operator
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import fx

from ._graph_types import Layout, Value
from ._graph_walk import Handler, Walk, as_dim, call_arg, shape_of

__all__ = ["HANDLERS", "softmax_over", "spanning", "spatial", "unary"]

_UNARY_FUNCTIONS: frozenset[object] = frozenset({
    torch.relu, F.relu, F.relu6, F.gelu, F.silu, torch.sigmoid, F.sigmoid, torch.tanh, F.tanh,
    F.leaky_relu, F.elu, F.selu, F.celu, F.hardswish, F.hardsigmoid, F.hardtanh, F.mish,
    F.softplus, F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout,
    torch.abs, torch.neg, torch.square,
})  # fmt: skip
_UNARY_METHODS = frozenset({
    "relu", "relu_", "sigmoid", "tanh", "abs", "neg", "square", "contiguous", "clone",
    "detach", "float", "double", "half", "bfloat16", "to", "type_as",
})  # fmt: skip
_BINARY = frozenset({
    operator.add, operator.sub, operator.mul, operator.iadd, operator.isub, operator.imul,
    torch.add, torch.sub, torch.mul, "add", "sub", "mul", "add_", "sub_", "mul_",
})  # fmt: skip
_DIVIDE = frozenset({
    operator.truediv, operator.itruediv, operator.floordiv, operator.ifloordiv, operator.mod,
    operator.imod, torch.div, torch.divide, torch.true_divide, torch.floor_divide,
    torch.remainder, torch.fmod, "div", "div_", "divide", "divide_", "true_divide",
    "true_divide_", "floor_divide", "floor_divide_", "remainder", "remainder_", "fmod", "fmod_",
})  # fmt: skip
_SPANNING_FUNCTIONS = frozenset({F.layer_norm, F.group_norm, F.rms_norm, F.normalize})
_POOL_FUNCTIONS: Mapping[object, int] = {
    getattr(F, f"{kind}{k}d"): k
    for kind in ("max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool", "lp_pool")
    for k in (1, 2, 3)
}
_REDUCTIONS = frozenset({torch.mean, torch.sum, torch.amax, torch.amin,
                         "mean", "sum", "amax", "amin"})  # fmt: skip
_SOFTMAX = frozenset({F.softmax, F.log_softmax, torch.softmax, torch.log_softmax,
                      "softmax", "log_softmax"})  # fmt: skip


# --- channel-wise ops ------------------------------------------------------------


def unary(walk: Walk, node: fx.Node) -> Value:
    """An op on each entry alone (an activation, dropout, a cast): the channels pass on."""
    x = walk.first(node)
    if x is None or shape_of(node) != x[1]:
        return walk.unknown_op(node)
    return x[0]


def spatial(walk: Walk, node: fx.Node, k: int | None) -> Value:
    """Pooling or interpolation over the last ``k`` dims (``None``: all but two)."""
    x, out = walk.first(node), shape_of(node)
    if x is None or out is None or len(out) != len(x[1]):
        return walk.unknown_op(node)
    (lay, shape), pooled = x, len(x[1]) - 2 if k is None else k
    if lay.axis >= len(shape) - pooled or out[lay.axis] != shape[lay.axis]:
        return walk.block_node(node, "pools across the channels")
    return lay


def _spatial_handler(k: int | None) -> Handler:
    """The handler of a pooling (or interpolating) function over ``k`` dims."""
    return lambda walk, node: spatial(walk, node, k)


def reduction(walk: Walk, node: fx.Node) -> Value:
    """``mean``, ``sum``, ``amax``, ``amin``: blocks the channels if it reduces over them.

    No ``dim``, ``dim=None`` and ``dim=()`` all reduce over every dim. Whether
    the reduced dims stay (``keepdim``) is read off the result's shape.
    """
    x, dim, out = walk.first(node), call_arg(node, 1, "dim"), shape_of(node)
    if x is None or out is None:
        return walk.unknown_op(node)
    lay, shape = x
    dims = {as_dim(d, len(shape)) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
    if not dims or None in dims or lay.axis in dims:
        return walk.block_node(node, "reduces over the channels")
    kept = len(out) == len(shape)  # keepdim
    dropped = 0 if kept else sum(1 for d in dims if d is not None and d < lay.axis)
    return Layout(lay.axis - dropped, lay.atoms)


def softmax(walk: Walk, node: fx.Node) -> Value:
    """``softmax``, ``log_softmax`` as a function or a method, over its ``dim`` argument."""
    return softmax_over(walk, node, call_arg(node, 1, "dim"))


def softmax_over(walk: Walk, node: fx.Node, dim: object) -> Value:
    """A softmax over ``dim``: blocks the channels if it normalizes across them."""
    x = walk.first(node)
    if x is None or shape_of(node) != x[1]:
        return walk.unknown_op(node)
    if as_dim(dim, len(x[1])) in (None, x[0].axis):
        return walk.block_node(node, "normalizes across the channels")
    return x[0]


def spanning(walk: Walk, node: fx.Node) -> Value:
    """A norm whose statistics span the channels: blocks them."""
    return walk.block_node(node, "computes statistics across the channels")


# --- arithmetic --------------------------------------------------------------------


def binary(walk: Walk, node: fx.Node) -> Value:
    """``add``, ``sub``, ``mul``, ``div``... of a channel tensor and another operand.

    A division by channels blocks them: see the module docstring.
    """
    a, b = call_arg(node, 0, "input"), call_arg(node, 1, "other")
    value = _combine(walk, node, a, b)
    divisor = walk.layout(b)
    if divisor is not None and node.target in _DIVIDE:
        reason = "divides by the channels, which a removed channel would turn into 0 / 0"
        walk.block(divisor.atoms, f"{walk.describe(node)} {reason}")
    return value


def _combine(walk: Walk, node: fx.Node, a: object, b: object) -> Value:
    """Operands ``a`` and ``b`` combined entry by entry, with broadcasting."""
    la, lb, out = walk.layout(a), walk.layout(b), shape_of(node)
    if out is None or walk.reads_more(node, (a, b)):
        return walk.unknown_op(node)
    if la is not None and lb is not None:
        return _couple(walk, node, (la, shape_of(a)), (lb, shape_of(b)), out)
    if la is not None:
        return _broadcast(walk, node, la, shape_of(a), b, out)
    if lb is not None:
        return _broadcast(walk, node, lb, shape_of(b), a, out)
    return walk.unknown_op(node)


def _couple(
    walk: Walk,
    node: fx.Node,
    left: tuple[Layout, tuple[int, ...] | None],
    right: tuple[Layout, tuple[int, ...] | None],
    out: tuple[int, ...],
) -> Value:
    """Two channel tensors combined entry by entry: their channels pair up."""
    axis = _out_axis(*left, out)
    if axis is None or axis != _out_axis(*right, out):
        return walk.block_node(node, "combines tensors whose channels do not line up")
    walk.pair(left[0].atoms, right[0].atoms)
    return Layout(axis, left[0].atoms)


def _broadcast(
    walk: Walk, node: fx.Node, x: Layout, shape: tuple[int, ...] | None, other: object,
    out: tuple[int, ...],
) -> Value:  # fmt: skip
    """A channel tensor combined with a scalar, or with a tensor without channels."""
    axis = _out_axis(x, shape, out)
    if axis is None:
        return walk.unknown_op(node)
    theirs = shape_of(other)
    offset = len(out) - len(theirs) if theirs is not None else 0
    if theirs is not None and axis >= offset and theirs[axis - offset] != 1:
        return walk.block_node(node, "combines the channels with a tensor of its own")
    return Layout(axis, x.atoms)


def _out_axis(x: Layout, shape: tuple[int, ...] | None, out: tuple[int, ...]) -> int | None:
    """The channel axis of ``x`` in a broadcast result of shape ``out``."""
    if shape is None:
        return None
    axis = x.axis + len(out) - len(shape)
    return axis if 0 <= axis < len(out) and out[axis] == len(x.atoms) else None


#: call_function targets and call_method names of these ops, and their handlers.
HANDLERS: Mapping[object, Handler] = {
    **{t: unary for t in _UNARY_FUNCTIONS | _UNARY_METHODS},
    **{t: binary for t in _BINARY | _DIVIDE},
    **{t: reduction for t in _REDUCTIONS},
    **{t: softmax for t in _SOFTMAX},
    **{t: spanning for t in _SPANNING_FUNCTIONS},
    **{t: _spatial_handler(k) for t, k in _POOL_FUNCTIONS.items()},
    F.interpolate: _spatial_handler(None),
}
