"""What channel-wise ops and arithmetic do to the channels they read.

:data:`HANDLERS` maps ``call_function`` targets and ``call_method`` names to
handlers: which ops pass channels on, couple, block them or are unknown is
listed in ``README.md``.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import fx

from ._values import ChannelLayout, Value
from ._walk import Handler, Walk, as_dim, call_arg, shape_of

__all__ = ["HANDLERS", "softmax_over", "spanning", "spatial", "unary"]

_UNARY_FUNCTIONS: frozenset[object] = frozenset({
    torch.relu, F.relu, F.relu6, F.gelu, F.silu, torch.sigmoid, F.sigmoid, torch.tanh, F.tanh,
    F.leaky_relu, F.elu, F.selu, F.celu, F.hardswish, F.hardsigmoid, F.hardtanh, F.mish,
    F.softplus, F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout,
    torch.abs, torch.neg, torch.square, torch.exp, torch.expm1, torch.log1p, torch.sqrt,
    torch.sin, torch.cos, F.logsigmoid, F.softsign, F.tanhshrink,
})  # fmt: skip
_UNARY_METHODS = frozenset({
    "relu", "relu_", "sigmoid", "sigmoid_", "tanh", "tanh_", "abs", "abs_", "neg", "neg_",
    "square", "exp", "exp_", "expm1", "log1p", "sqrt", "sqrt_", "sin", "cos", "contiguous",
    "clone", "detach", "float", "double", "half", "bfloat16", "to", "type_as",
})  # fmt: skip
#: Finite everywhere but at zero, the value of a removed channel (``0 * inf`` is NaN).
_INFINITE_AT_ZERO = frozenset({
    torch.log, torch.log2, torch.log10, torch.rsqrt, torch.reciprocal, "log", "log_", "log2",
    "log10", "rsqrt", "rsqrt_", "reciprocal", "reciprocal_",
})  # fmt: skip
_CLAMP = frozenset({torch.clamp, torch.clip, torch.clamp_min, torch.clamp_max, "clamp",
                    "clamp_", "clip", "clip_", "clamp_min", "clamp_max"})  # fmt: skip
_POW = frozenset({operator.pow, operator.ipow, torch.pow, "pow", "pow_"})
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
_INFINITE = "maps zero, a removed channel's value, to an infinity (and 0 * inf is NaN)"


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


def pad(walk: Walk, node: fx.Node) -> Value:
    """``F.pad``: pads the last ``len(pad) // 2`` dims; blocks the channels if theirs is one."""
    x, widths, out = walk.first(node), call_arg(node, 1, "pad"), shape_of(node)
    if x is None or out is None or not isinstance(widths, (tuple, list)):
        return walk.unknown_op(node)
    if not all(isinstance(w, int) and not isinstance(w, bool) for w in widths):
        return walk.unknown_op(node)
    (lay, shape), padded = x, (len(widths) + 1) // 2
    if lay.axis >= len(shape) - padded or out[lay.axis] != shape[lay.axis]:
        return walk.block_node(node, "pads the channel axis")
    return lay


def infinite_at_zero(walk: Walk, node: fx.Node) -> Value:
    """``log``, ``rsqrt``...: entry by entry, but infinite at zero; blocks the channels.

    A removed channel is zero in the closure's masked model, and its
    infinity times a pruned weight is NaN there, not the shrunk model's 0.
    """
    x = walk.first(node)
    if x is None or shape_of(node) != x[1]:
        return walk.unknown_op(node)
    walk.block(x[0].atoms, f"{walk.describe(node)} {_INFINITE}")
    return x[0]


def clamp(walk: Walk, node: fx.Node) -> Value:
    """``clamp``, ``clip``, ``clamp_min``, ``clamp_max``: the channels pass on.

    A tensor bound with entries of its own per channel blocks them.
    """
    x, out = walk.first(node), shape_of(node)
    if x is None or out != x[1]:
        return walk.unknown_op(node)
    lay, bounds = x[0], [n for n in node.all_input_nodes if n is not node.args[0]]
    if any(_own_entries(lay.axis, bound, out) for bound in bounds):
        return walk.block_node(node, "clamps the channels to bounds of their own")
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
    return ChannelLayout(lay.axis - dropped, lay.atoms)


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


def power(walk: Walk, node: fx.Node) -> Value:
    """``x ** e``, ``torch.pow``: entry by entry; channels raised to ``e < 0`` block.

    An exponent that is a tensor without channels may be negative: it blocks too.
    """
    base, exponent = call_arg(node, 0, "input"), call_arg(node, 1, "exponent")
    value = _combine(walk, node, base, exponent)
    x = walk.layout(base)
    if x is not None and walk.layout(exponent) is None and not _is_non_negative(exponent):
        walk.block(x.atoms, f"{walk.describe(node)} {_INFINITE}")
    return value


def _is_non_negative(exponent: object) -> bool:
    """Whether ``exponent`` is a number ``>= 0`` (a tensor may hold negative ones)."""
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)):
        return False
    return exponent >= 0


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
    left: tuple[ChannelLayout, tuple[int, ...] | None],
    right: tuple[ChannelLayout, tuple[int, ...] | None],
    out: tuple[int, ...],
) -> Value:
    """Two channel tensors combined entry by entry: their channels pair up."""
    axis = _out_axis(*left, out)
    if axis is None or axis != _out_axis(*right, out):
        return walk.block_node(node, "combines tensors whose channels do not line up")
    walk.pair(left[0].atoms, right[0].atoms)
    return ChannelLayout(axis, left[0].atoms)


def _broadcast(
    walk: Walk, node: fx.Node, x: ChannelLayout, shape: tuple[int, ...] | None, other: object,
    out: tuple[int, ...],
) -> Value:  # fmt: skip
    """A channel tensor combined with a scalar, or with a tensor without channels."""
    axis = _out_axis(x, shape, out)
    if axis is None:
        return walk.unknown_op(node)
    if _own_entries(axis, other, out):
        return walk.block_node(node, "combines the channels with a tensor of its own")
    return ChannelLayout(axis, x.atoms)


def _own_entries(axis: int, other: object, out: tuple[int, ...]) -> bool:
    """Whether ``other``, broadcast to ``out``, has entries of its own along ``axis``."""
    theirs = shape_of(other)
    offset = len(out) - len(theirs) if theirs is not None else 0
    return theirs is not None and axis >= offset and theirs[axis - offset] != 1


def _out_axis(x: ChannelLayout, shape: tuple[int, ...] | None, out: tuple[int, ...]) -> int | None:
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
    **{t: infinite_at_zero for t in _INFINITE_AT_ZERO},
    **{t: clamp for t in _CLAMP},
    **{t: power for t in _POW},
    F.interpolate: _spatial_handler(None),
    F.pad: pad,
}
