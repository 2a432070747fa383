"""Elementwise ops, reductions and normalizations: what each does to the atoms.

- *Elementwise* ops couple the atoms that meet at one position (a residual
  ``add``, ``silu(gate) * up``). A parameter operand (a norm's weight, a
  bias) follows the atoms it meets: its entries go with them. A computed
  operand with values of its own along an axis (``+ torch.arange(6)``,
  ``cos`` of a rotary embedding along the head dim, ALiBi's slope per head)
  makes the atoms along that axis all-or-nothing (:func:`_meet`). An op that
  is infinite or undefined at zero (``log``, ``rsqrt``, a divisor) blocks
  the atoms a removed channel's zero would reach there. In-place ops are
  their functional form.
- *Reductions* and *normalizations* (``sum``, ``mean``, ``softmax``,
  LayerNorm...) make the atoms they reduce over all-or-nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from .._types import Tensor
from ._walk import Origin, Walk, describe

__all__ = ["ELEMENTWISE", "functional_form"]

aten = torch.ops.aten

#: Elementwise ops: the atoms that meet at a position are coupled; parameters follow them.
ELEMENTWISE: frozenset[object] = frozenset({
    aten.add, aten.sub, aten.mul, aten.div, aten.neg, aten.abs, aten.exp, aten.expm1, aten.sqrt, aten.square,
    aten.pow, aten.sigmoid, aten.tanh, aten.relu, aten.relu6, aten.gelu, aten.silu, aten.mish, aten.elu,
    aten.leaky_relu, aten.hardtanh, aten.hardswish, aten.hardsigmoid, aten.softplus, aten.clamp, aten.clamp_min,
    aten.clamp_max, aten.clip, aten.where, aten.maximum, aten.minimum, aten.sin, aten.cos, aten.erf,
    aten.masked_fill, aten.sign, aten.floor, aten.ceil, aten.round, aten.trunc, aten.eq, aten.ne, aten.lt,
    aten.le, aten.gt, aten.ge, aten.logical_and, aten.logical_or, aten.logical_not, aten.bitwise_and,
    aten.bitwise_or, aten.bitwise_not, aten.__and__, aten.__or__, aten.log1p, aten.log_sigmoid, aten.rsub,
    aten.add_, aten.mul_, aten.sub_, aten.div_,
    aten.nan_to_num, aten.lerp, aten.addcmul, aten.addcdiv, aten.fmod, aten.remainder, aten.floor_divide,
    aten.log, aten.log2, aten.log10, aten.rsqrt, aten.reciprocal, aten.atan2, aten.true_divide,
    aten.logit, aten.xlogy, aten.selu, aten.celu, aten.softshrink, aten.hardshrink, aten.threshold,
    aten.prelu, aten._prelu_kernel, aten.rrelu, aten.erfc, aten.exp2, aten.sinh, aten.cosh, aten.asinh,
    aten.atan, aten.tan, aten.relu_, aten.silu_, aten.gelu_, aten.hardtanh_, aten.leaky_relu_, aten.sigmoid_,
    aten.tanh_, aten.clamp_, aten.clamp_min_, aten.clamp_max_, aten.elu_, aten.masked_fill_, aten.fill_,
    aten.zeros_like, aten.ones_like, aten.full_like, aten.empty_like, aten.rand_like, aten.randn_like,
})  # fmt: skip
#: Ops infinite or undefined at zero in the first operand: a removed channel's zero would be NaN there.
_INFINITE_AT_ZERO: frozenset[object] = frozenset({aten.log, aten.log2, aten.log10, aten.rsqrt, aten.reciprocal, aten.logit})
#: Ops whose second operand divides: a removed channel's zero there is a division by zero.
_DIVIDES: frozenset[object] = frozenset({aten.div, aten.div_, aten.true_divide, aten.fmod, aten.remainder, aten.floor_divide})


def _elementwise(walk: Walk, node: fx.Node) -> Tensor:
    """Couple the atoms that meet at each position; relate parameter operands; refuse what zero breaks."""
    packet = _functional_packet(node.target)
    operands = _tensor_operands(node)
    shape = tuple(walk.peek(node).shape)
    carried = [(a, walk.ids[a]) for a in operands if isinstance(walk.ids.get(a), Tensor)]
    if packet in _INFINITE_AT_ZERO or (packet is aten.pow and _negative_exponent(walk, node)):
        for arg, ids in carried[:1]:
            if not _never_zero(walk, arg):
                walk.atoms.block(ids, f"{describe(node)} is infinite at zero, the value of a removed channel")
    if packet in _DIVIDES and len(operands) > 1 and isinstance(walk.ids.get(operands[1]), Tensor):
        if not _never_zero(walk, operands[1]):
            walk.atoms.block(walk.ids[operands[1]], f"{describe(node)} divides by the channels (0 / 0 is NaN)")
    out = torch.full(shape, -1, dtype=torch.long)
    for _, ids in carried:
        ids = ids.expand(shape)
        walk.atoms.couple(out, ids)
        out = torch.where(out >= 0, out, ids)
    for arg in operands:
        if not (arg in walk.ids and isinstance(walk.ids[arg], Tensor)):
            _meet(walk, node, out, arg)
    return out


def _meet(walk: Walk, node: fx.Node, out: Tensor, arg: object) -> None:
    """An operand that carries no atoms meets the atoms ``out`` at each position of the op's output.

    A parameter (a norm's weight, a bias) follows the atoms it meets; a computed tensor with values of
    its own along an axis (rotary ``cos``/``sin`` along the head dim, ALiBi's slope per head, ``+
    torch.arange(6)``) makes the atoms along that axis all-or-nothing. One constant along an axis (a mask
    broadcast over the heads, zeros of the heads' shape) leaves them free.
    """
    origin = walk.origin(arg)
    value = walk.values[arg] if isinstance(arg, fx.Node) else arg
    shape = tuple(out.shape)
    if origin is not None:
        _relate_follower(walk, origin, out, shape)
    elif isinstance(value, Tensor) and value.dim():
        varying = _varying_axes(value, shape)
        if varying:
            walk.atoms.couple_along(out, varying, f"{describe(node)} meets them with a tensor of its own entries along them")


def functional_form(target: Any) -> Any:
    """The packet of the functional form of an in-place op (``hardswish_``: ``aten.hardswish``), or ``None``."""
    name = getattr(getattr(target, "overloadpacket", target), "__name__", "")
    return getattr(aten, name[:-1], None) if name.endswith("_") else None


def _functional_packet(target: Any) -> Any:
    """The packet of ``target``'s functional form (``hardswish_``: ``hardswish``), as the tables name it."""
    return functional_form(target) or getattr(target, "overloadpacket", target)


def _tensor_operands(node: fx.Node) -> list[fx.Node]:
    return [a for a in [*node.args, *node.kwargs.values()] if isinstance(a, fx.Node)]


def _never_zero(walk: Walk, arg: fx.Node) -> bool:
    """Whether a removed channel's zero cannot reach ``arg``: it is shifted by a nonzero constant (``x + eps``).

    As in RMSNorm's ``rsqrt(mean(x ** 2) + eps)``: a removed channel's zero
    there is ``rsqrt(eps)``, finite, and multiplies the channel's own zero.
    """
    if arg.op != "call_function":
        return False
    packet = getattr(arg.target, "overloadpacket", arg.target)
    constants = [a for a in arg.args[1:] if isinstance(a, (int, float)) and not isinstance(a, bool)]
    if packet in (aten.add, aten.sub, aten.rsub) and constants and all(c != 0 for c in constants):
        return True
    if packet in (aten.clamp, aten.clamp_min) and len(arg.args) > 1 and isinstance(arg.args[1], (int, float)):
        return arg.args[1] > 0
    return packet in (aten.exp,)


def _negative_exponent(walk: Walk, node: fx.Node) -> bool:
    exponent = walk.value(node.args[1]) if len(node.args) > 1 else None
    return isinstance(exponent, (int, float)) and exponent < 0


def _varying_axes(value: Tensor, shape: tuple[int, ...]) -> list[int]:
    """The output axes along which a broadcast operand has values of its own (not one value repeated)."""
    offset = len(shape) - value.dim()
    return [
        offset + d
        for d, n in enumerate(value.shape)
        if n > 1 and offset + d >= 0 and not _constant_along(value, d)
    ]


def _constant_along(value: Tensor, dim: int) -> bool:
    """Whether ``value`` holds the same entries at every index of ``dim`` (NaN equal to NaN)."""
    first = value.narrow(dim, 0, 1).expand_as(value)
    if value.dtype == torch.bool or not (value.is_floating_point() or value.is_complex()):
        return bool(torch.equal(value, first))
    return bool(torch.equal(value.isnan(), first.isnan()) and ((value == first) | value.isnan()).all())


def _relate_follower(walk: Walk, origin: Origin, out: Tensor, shape: tuple[int, ...]) -> None:
    """A parameter meeting atoms elementwise: each of its entries goes when every atom it meets goes."""
    flat = origin.flat
    flat = flat.expand(shape) if flat.dim() <= len(shape) else flat
    coords = torch.unravel_index(flat, origin.shape) if origin.shape else ()
    for dim, index in enumerate(coords):
        walk.atoms.relate(origin.name, dim, index, out)


# --- reductions ------------------------------------------------------------------------


def _reduced_dims(walk: Walk, node: fx.Node, ndim: int, default_all: bool = True) -> list[int]:
    after = walk.value(node.args[1:])  # (the reduced tensor's values are not read)
    kwargs = walk.value(node.kwargs)
    dims: Any = kwargs.get("dim", after[0] if after else None)
    if isinstance(dims, int):
        return [dims % max(ndim, 1)]
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return list(range(ndim)) if default_all else []
    if isinstance(dims, (list, tuple)) and all(isinstance(d, int) for d in dims):
        return [d % max(ndim, 1) for d in dims]
    return list(range(ndim))


def _reduction(walk: Walk, node: fx.Node) -> Any:
    """All-or-nothing along the reduced dims; the result carries what is left."""
    ids = walk.ids_or_none(node.args[0])
    dims = _reduced_dims(walk, node, ids.dim())
    walk.atoms.couple_along(ids, dims, f"{describe(node)} reduces over them")
    return _shaped_like(walk, node, ids, dims)


def _along_last(walk: Walk, node: fx.Node) -> Any:
    """Softmax, cumsum, sort, topk and the like along one dim: all-or-nothing along it."""
    ids = walk.ids_or_none(node.args[0])
    target: Any = node.target
    packet = getattr(target, "overloadpacket", target)
    default = -1
    position = 2 if packet is aten.topk else 1
    dim = walk.value(node.args[position]) if len(node.args) > position else walk.value(node.kwargs.get("dim", default))
    dim = dim % max(ids.dim(), 1) if ids.dim() else 0
    walk.atoms.couple_along(ids, [dim], f"{describe(node)} reduces over them")
    return _shaped_like(walk, node, ids, [dim] if ids.dim() else [])


def _shaped_like(walk: Walk, node: fx.Node, ids: Tensor, dims: Sequence[int]) -> Any:
    """Ids for the node's value (or each tensor of it): the input's, reduced over ``dims`` where the shape asks."""
    value = walk.peek(node)

    def one(v: Any) -> Any:
        if not isinstance(v, Tensor):
            return None
        reduced = ids
        for d in sorted(dims, reverse=True):
            if reduced.dim() > d and reduced.shape[d] != (v.shape[d] if v.dim() == reduced.dim() else -1):
                reduced = reduced.amax(dim=d, keepdim=v.dim() == reduced.dim())
            elif v.dim() < reduced.dim():
                reduced = reduced.amax(dim=d)
        return reduced.expand(v.shape) if reduced.dim() == v.dim() else torch.full(v.shape, -1, dtype=torch.long)

    if isinstance(value, (list, tuple)):
        return type(value)(one(v) for v in value)
    return one(value)


def _shape(walk: Walk, node: fx.Node) -> tuple[int, ...]:
    value = walk.peek(node)
    return tuple(value.shape) if isinstance(value, Tensor) else ()


def _shape_of(walk: Walk, arg: object) -> tuple[int, ...] | None:
    value = walk.peek(arg) if isinstance(arg, fx.Node) else None
    return tuple(value.shape) if isinstance(value, Tensor) else None
