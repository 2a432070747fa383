"""What each aten op does to the atoms of its inputs: :data:`HANDLERS`.

- *Views* (view, reshape, transpose, permute, slice, cat, split, expand,
  index...) move entries without arithmetic: the op itself runs on the
  atom ids (:func:`view_ids`), so every entry keeps its atom wherever it
  goes; dtype and device conversions keep them as they are. The shrunk
  model recomputes the sizes of reshapes and chunks from its own shapes:
  a chunk into equal parts couples the atoms at one position of every
  part, and a reshape that merges dims of varying atoms (or a split's dims
  in another order: ``channel_shuffle``) couples those along the inner
  merged dims (:func:`_reshaped`).
- *Elementwise* ops couple the atoms that meet at one position (a residual
  ``add``, ``silu(gate) * up``). A parameter operand (a norm's weight, a
  bias) follows the atoms it meets: its entries go with them. A computed
  operand with entries of its own along an axis (``+ torch.arange(6)``,
  ``cos`` of a rotary embedding along the head dim) makes the atoms along
  that axis all-or-nothing. An op that is infinite or undefined at zero
  (``log``, ``rsqrt``, a divisor) blocks the atoms a removed channel's zero
  would reach there.
- *Reductions* and *normalizations* (``sum``, ``mean``, ``softmax``,
  LayerNorm...) make the atoms they reduce over all-or-nothing.
- *Layers*: a Linear, a Conv1D (``addmm``), a Conv or an Embedding reads
  the atoms of its input as weight columns and makes new atoms, its
  output rows; a depthwise convolution passes them on; BatchNorm's
  parameters and statistics follow them; attention (``sdpa``, or two
  matmuls) makes all the atoms of one head position all-or-nothing: a head
  (a KV group under GQA) goes whole.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import fx

from .._types import Tensor
from ._atoms import Slice, broadcast, pairs
from ._walk import Handler, Ops, Origin, Walk, describe, moved_args
from ._walk import _map_nodes as walk_map

__all__ = ["ELEMENTWISE", "HANDLERS", "LAYER_SLOTS", "OPS", "PRODUCERS", "VIEWS", "stands_for", "view_ids"]

aten = torch.ops.aten

# --- views -----------------------------------------------------------------------------

#: Ops that move entries without arithmetic: they run on the atom ids as they run on values.
VIEWS: frozenset[object] = frozenset({
    aten.view, aten.reshape, aten._unsafe_view, aten.transpose, aten.permute, aten.t, aten.unsqueeze,
    aten.squeeze, aten.expand, aten.slice, aten.select, aten.narrow, aten.cat, aten.concat, aten.concatenate,
    aten.stack, aten.split, aten.split_with_sizes, aten.chunk, aten.unbind, aten.clone, aten.contiguous,
    aten.alias, aten.detach, aten.lift_fresh_copy, aten.flatten, aten.unflatten, aten.repeat, aten.movedim,
    aten.index_select, aten.index, aten.gather, aten.flip, aten.expand_as, aten.view_as, aten.reshape_as,
    aten.repeat_interleave, aten.tile, aten.broadcast_to, aten.swapaxes, aten.mT, aten.squeeze_copy,
    aten.unsqueeze_copy, aten.view_copy, aten.transpose_copy, aten.permute_copy, aten.slice_copy,
    aten.select_copy, aten.expand_copy, aten.constant_pad_nd, aten.pad, aten.roll, aten.rot90,
    aten.pixel_shuffle, aten.pixel_unshuffle, aten.channel_shuffle, aten.native_channel_shuffle,
    operator.getitem,
})  # fmt: skip
#: Conversions of dtype, device or layout: the atoms stay as they are.
_CONVERSIONS: frozenset[object] = frozenset({aten.to, aten._to_copy, aten.type_as, aten.dropout})


def view_ids(walk: Walk, node: fx.Node, ids: Mapping[fx.Node, Tensor] | None = None) -> Any:
    """The view op ``node`` run on atom ids (``ids``: the ids to put in place of those nodes).

    Tensor arguments that carry no atoms (or are not in ``ids``) become
    ``-1`` of their shape where they are moved (``cat``), and stay as their
    values where they index (``index_select``'s index).
    """
    target: Any = node.target
    if target is operator.getitem:
        source, key = node.args
        held = walk.ids.get(source) if isinstance(source, fx.Node) else None
        return held[key] if held is not None else None
    moved = set(moved_args(node))

    def substitute(arg: fx.Node) -> Any:
        if ids is not None and arg in ids:
            return ids[arg]
        if arg in moved:
            return walk.ids_or_none(arg)
        return walk.values[arg]

    args: Any = walk_map(node.args, substitute)
    kwargs: Any = walk_map(node.kwargs, substitute)
    packet = getattr(target, "overloadpacket", None)
    if packet is aten.constant_pad_nd:
        return aten.constant_pad_nd.default(args[0], args[1], -1)
    if packet is aten.pad:  # reflect or replicate: each padded entry is a copy of one of the channel's entries
        mode = args[2] if len(args) > 2 else kwargs.get("mode", "constant")
        if mode == "constant":
            return aten.constant_pad_nd.default(args[0], args[1], -1)
        return aten.pad.default(args[0].double(), args[1], mode).long()
    if packet in (aten.view, aten._unsafe_view, aten.view_copy):  # ids may be expanded: reshape them
        return aten.reshape.default(args[0], args[1])
    return target(*args, **kwargs)


def _view(walk: Walk, node: fx.Node) -> Any:
    out = view_ids(walk, node)
    packet = getattr(node.target, "overloadpacket", None)
    source = node.args[0] if node.args else None
    if isinstance(out, Tensor) and isinstance(source, fx.Node):
        if packet in _RESHAPES:
            _reshaped(walk, node, walk.ids_or_none(source), out)
        else:
            _carry_splits(walk, node, source)
    elif packet in _SPLITS and isinstance(out, (list, tuple)):
        _parts_alike(walk, node, [p for p in out if isinstance(p, Tensor)])
    return out


#: Reshapes: the shrunk model recomputes their sizes from its shapes (``x.view(b, groups, -1, h, w)``).
_RESHAPES: frozenset[object] = frozenset({aten.view, aten.reshape, aten._unsafe_view, aten.view_copy, aten.flatten})
#: Splits into parts: ``chunk(k)`` recomputes the parts' sizes from the shrunk shape.
_SPLITS: frozenset[object] = frozenset({aten.split, aten.chunk, aten.unbind})
#: ``node.meta`` key: the dims of a node's value that a reshape split from one dim carrying atoms, in order.
_SPLIT_DIMS = "funcprune_split_dims"


def _reshaped(walk: Walk, node: fx.Node, ids: Tensor, out: Tensor) -> None:
    """A reshape that merges dims carrying atoms: what goes must be whole slices of the outermost one.

    ShuffleNet's ``channel_shuffle`` splits the channels into ``(groups, n)``,
    transposes and merges them back: the shrunk model splits its own count
    into ``groups`` again, so each group must lose the same channels, and
    the merge keeps the order only if what goes is whole slices of the outer
    merged dim. Where a merge is of dims along which the atoms vary, or of a
    split's dims in another order, the atoms along the inner merged dims are
    coupled (those in a slice with entries of no atom, which stay, blocked).
    Heads merged back after attention are coupled within each head already.
    """
    source = node.args[0]
    splits = source.meta.get(_SPLIT_DIMS, ()) if isinstance(source, fx.Node) else ()
    born: list[tuple[int, ...]] = []
    for before, after in _runs(tuple(ids.shape), tuple(out.shape)):
        if len(before) == 1 and len(after) > 1 and _varies(ids, before[0]):
            born.append(tuple(after))
        if len(before) < 2:
            continue
        varying = [d for d in before if _varies(ids, d)]
        permuted = any(set(g) <= set(before) and list(g) != sorted(g) for g in splits)
        inner = before[1:] if permuted else varying[1:]
        if inner:
            _couple_whole(walk, ids, inner, f"{describe(node)} merges them with a size the shrunk model recomputes")
    node.meta[_SPLIT_DIMS] = tuple(born)


def _varies(ids: Tensor, dim: int) -> bool:
    n = ids.shape[dim]
    return n > 1 and bool((ids.narrow(dim, 1, n - 1) != ids.narrow(dim, 0, n - 1)).any())


def _runs(before: tuple[int, ...], after: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """The dims (of size > 1) of ``before`` and of ``after`` that hold the same entries, run by run, in a reshape."""
    if 0 in before:
        return []
    a = [(d, n) for d, n in enumerate(before) if n > 1]
    b = [(d, n) for d, n in enumerate(after) if n > 1]
    runs: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        dims, size, outs, target = [a[i][0]], a[i][1], [b[j][0]], b[j][1]
        while size != target:
            if size < target and i + 1 < len(a):
                i += 1
                dims.append(a[i][0])
                size *= a[i][1]
            elif size > target and j + 1 < len(b):
                j += 1
                outs.append(b[j][0])
                target *= b[j][1]
            else:
                return runs  # the sizes do not match: no reshape
        runs.append((dims, outs))
        i, j = i + 1, j + 1
    return runs


def _carry_splits(walk: Walk, node: fx.Node, source: fx.Node) -> None:
    """Where a transpose, a permute or a copy puts the dims a reshape split (for :func:`_reshaped`)."""
    splits = source.meta.get(_SPLIT_DIMS)
    value = walk.values.get(source)
    if not splits or not isinstance(value, Tensor):
        return
    n = value.dim()
    packet = getattr(node.target, "overloadpacket", None)
    args = walk.value(node.args)
    order = list(range(n))
    if packet in (aten.transpose, aten.swapaxes) and len(args) == 3:
        a, b = args[1] % n, args[2] % n
        order[a], order[b] = order[b], order[a]
    elif packet is aten.permute and len(args) == 2:
        order = [d % n for d in args[1]]
    elif packet is aten.t and n == 2:
        order = [1, 0]
    elif packet not in (aten.contiguous, aten.clone, aten.alias, aten.detach, aten.lift_fresh_copy):
        return
    where = {old: new for new, old in enumerate(order)}
    node.meta[_SPLIT_DIMS] = tuple(tuple(where[d] for d in g) for g in splits)


def _parts_alike(walk: Walk, node: fx.Node, parts: Sequence[Tensor]) -> None:
    """``chunk``/``split`` into equal parts along dims that carry atoms: the shrunk model cuts its own
    shape into as many equal parts, so each part must lose the same: the atoms at one position of every
    part are coupled (and blocked beside entries of no atom, which stay)."""
    if len(parts) < 2 or any(p.shape != parts[0].shape for p in parts):
        return
    stacked = torch.stack(list(parts), 0)
    if bool((stacked >= 0).any()):
        _couple_whole(walk, stacked, [0], f"{describe(node)} cuts them into parts the shrunk model recomputes")


def _couple_whole(walk: Walk, ids: Tensor, dims: Sequence[int], why: str) -> None:
    """Couple the atoms of ``ids`` that differ only along ``dims``; block those that share such a line with no atom."""
    moved = ids.movedim(list(dims), list(range(ids.dim() - len(dims), ids.dim())))
    rows = moved.reshape(-1, math.prod(moved.shape[moved.dim() - len(dims):]))
    mixed = rows[(rows < 0).any(1) & (rows >= 0).any(1)]
    if mixed.numel():
        walk.atoms.block(mixed, f"{why}, beside entries that stay")
    walk.atoms.couple_along(ids, dims, why)


def _conversion(walk: Walk, node: fx.Node) -> Any:
    return walk.ids_or_none(node.args[0])


def _copy(walk: Walk, node: fx.Node) -> Any:
    """``copy(dst, src)`` (and ``dst.copy_(src)``): ``dst`` takes ``src``'s entries, its own are gone."""
    return walk.ids_or_none(node.args[1]).expand(_shape(walk, node))


def _nothing(walk: Walk, node: fx.Node) -> Any:
    """Checks that compute nothing (``_assert_tensor_metadata``): they read the atoms, and keep them as they are."""
    return None


#: Ops that only check their input and return nothing of it, or read only its dtype and device (a new
#: tensor of sizes given apart).
_CHECKS: frozenset[object] = frozenset({
    aten._assert_tensor_metadata, aten._assert_async, aten._assert_scalar, aten.sym_constrain_range_for_size,
    aten.new_empty, aten.new_zeros, aten.new_ones, aten.new_full, aten.new_empty_strided,
})  # fmt: skip


# --- elementwise -----------------------------------------------------------------------

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
    shape = tuple(walk.values[node].shape)
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


def _functional_packet(target: Any) -> Any:
    """The packet of ``target``'s functional form (``hardswish_``: ``hardswish``), as the tables name it."""
    key, _ = stands_for(target)
    return getattr(key, "overloadpacket", key)


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
    args = walk.value(node.args)
    kwargs = walk.value(node.kwargs)
    dims: Any = kwargs.get("dim", args[1] if len(args) > 1 else None)
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
    value = walk.values[node]

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


# --- layers ----------------------------------------------------------------------------


def _shape(walk: Walk, node: fx.Node) -> tuple[int, ...]:
    value = walk.values[node]
    return tuple(value.shape) if isinstance(value, Tensor) else ()


def _shape_of(walk: Walk, arg: object) -> tuple[int, ...] | None:
    value = walk.values.get(arg) if isinstance(arg, fx.Node) else None
    return tuple(value.shape) if isinstance(value, Tensor) else None


def _weight(walk: Walk, node: fx.Node, arg: object, kind: str) -> Origin | None:
    """The origin of a layer's weight, or ``None`` (then the channels it reads stay, and why is recorded).

    A computed weight (a parametrization's, spectral_norm's) is no slice of
    a parameter: its columns cannot be cut, so the channels it reads stay.
    """
    origin = walk.origin(arg)
    if origin is None:
        walk.atoms.block(walk.ids_or_none(_first_input(node)), f"{describe(node)}, a {kind} of a computed weight, reads them")
    return origin


def _first_input(node: fx.Node) -> object:
    return node.args[0]


def _axis_dim(origin: Origin, axis: int) -> tuple[int, Tensor] | None:
    """The source dim that axis ``axis`` of the weight runs along, and the index along it of each position."""
    fast = origin.axis_dim(axis)
    if fast is not None:
        return fast
    coords = origin.coords()
    size = origin.size[axis]
    for dim, index in enumerate(coords):
        line = index.movedim(axis, -1).reshape(-1, size)
        if bool((line == line[:1]).all()) and (size == 1 or bool((line[0, 1:] != line[0, :1]).any())):
            return dim, line[0]
    return None


def _read_columns(walk: Walk, node: fx.Node, x: object, origin: Origin, axis: int, x_axis: int) -> None:
    """The input's atoms along ``x_axis`` are read by the weight's positions along ``axis``: related, coupled."""
    ids = walk.ids_or_none(x)
    found = _axis_dim(origin, axis)
    if found is None:
        if bool((ids >= 0).any()):
            walk.atoms.refuse(ids, f"{describe(node)}, whose weight is no slice of a parameter,")
        return
    dim, index = found
    walk.atoms.mark_read(ids)
    per_column = ids.movedim(x_axis, -1).reshape(-1, ids.shape[x_axis])
    first = per_column.amax(0)  # an atom of each column (or -1): the others of the column join it
    for a, b in pairs(first, torch.where(per_column != first, per_column, -1)):
        walk.atoms.union(a, b)
    if bool((first < 0).any()):  # columns reading no channel (the model's input): they stay, whoever else reads them
        held = walk.atoms.new(1)
        walk.atoms.block(held, f"{describe(node)} reads them with the columns that read the model's input")
        first = torch.where(first >= 0, first, held)
    walk.atoms.relate(origin.name, dim, index, first, couple=True)


def _new_rows(walk: Walk, node: fx.Node, origin: Origin, axis: int, biases: Sequence[object] = ()) -> Tensor | None:
    """New atoms for the weight's positions along ``axis`` (its output rows), with the biases related."""
    found = _axis_dim(origin, axis)
    if found is None:
        return None
    dim, index = found
    atoms = walk.atoms.new(index.numel(), [Slice(origin.name, dim, int(i)) for i in index.tolist()])
    walk.atoms.relate(origin.name, dim, index, atoms, couple=True)
    for bias in biases:
        bias_origin = walk.origin(bias)
        if bias_origin is not None and len(bias_origin.size) == 1:
            walk.atoms.relate(bias_origin.name, 0, bias_origin.coords()[0], atoms)
    return atoms


def _linear(walk: Walk, node: fx.Node) -> Any:
    """``linear(x, W, b)``: W's columns read x's last dim, its rows are new atoms."""
    x, w = node.args[0], node.args[1]
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    origin = _weight(walk, node, w, "Linear")
    shape = walk.values[node].shape
    if origin is None:
        return None
    _read_columns(walk, node, x, origin, 1, -1)
    if origin.name in walk.routers:
        return _router(walk, node, origin, bias)
    rows = _new_rows(walk, node, origin, 0, [bias] if bias is not None else [])
    return None if rows is None else rows.expand(shape)


def _router(walk: Walk, node: fx.Node, origin: Origin, bias: object) -> None:
    """A MoE router's linear: its rows are the experts (new atoms), each with its index of every expert weight.

    The logits carry no atoms on: which experts a token goes to is a value
    (top-k of the logits), not a channel, and a removed expert is never
    routed to (its logit is ``-inf`` in the masked model's reference).
    """
    router = walk.routers[origin.name]
    experts = _new_rows(walk, node, origin, 0, [bias] if bias is not None else [])
    if experts is None:
        return None
    for name in router.parameters:
        walk.atoms.relate(name, 0, torch.arange(router.count), experts, couple=True)
    for name in router.extras:
        walk.atoms.relate(name, 0, torch.arange(router.count), experts)
    return None


def _grouped_mm(walk: Walk, node: fx.Node) -> Any:
    """MoE experts' matmul ``(tokens, in) x (experts, in, out)``: each expert's columns read, its outputs new atoms.

    Output channel ``j`` is made by column ``j`` of every expert: the
    channels of all experts' position ``j`` go together.
    """
    x, w = node.args[0], node.args[1]
    origin = _weight(walk, node, w, "grouped matmul")
    if origin is None or len(origin.size) != 3:
        walk.atoms.refuse(walk.ids_or_none(x), f"{describe(node)}, whose weight is no stack of expert weights,")
        return None
    _read_columns(walk, node, x, origin, 1, -1)
    rows = _new_rows(walk, node, origin, 2)
    return None if rows is None else rows.expand(_shape(walk, node))


def _addmm(walk: Walk, node: fx.Node) -> Any:
    """``addmm(b, x, W)``: ``b + x @ W`` (transformers' Conv1D): W's rows read x, its columns are new atoms."""
    bias, x, w = node.args[0], node.args[1], node.args[2]
    origin = _weight(walk, node, w, "Conv1D")
    if origin is None:
        return None
    _read_columns(walk, node, x, origin, 0, -1)
    rows = _new_rows(walk, node, origin, 1, [bias])
    return None if rows is None else rows.expand(_shape(walk, node))


def _matmul(walk: Walk, node: fx.Node) -> Any:
    """``a @ b``: with a parameter as ``b``, a layer (``x @ W``); else two activations contracted."""
    a, b = node.args[0], node.args[1]
    origin = walk.origin(b)
    if origin is not None and _shape_of(walk, b) is not None and len(_shape_of(walk, b) or ()) == 2:
        _read_columns(walk, node, a, origin, 0, -1)
        rows = _new_rows(walk, node, origin, 1)
        return None if rows is None else rows.expand(_shape(walk, node))
    return _contracted(walk, node, a, b)


def _contracted(walk: Walk, node: fx.Node, a: object, b: object) -> Tensor:
    """Two activations multiplied as matrices (``a @ b`` over their last two dims, the others batched).

    Where the atoms differ from one batch position to another (the heads of an attention: ``q @ k^T``,
    ``probs @ v``, in any layout), each batch position is a *head*: its atoms go together
    (:func:`_per_head`). Otherwise each output entry couples its row of ``a`` and its column of ``b``.
    """
    ia, ib = walk.ids_or_none(a), walk.ids_or_none(b)
    out_shape = _shape(walk, node)
    if ia.dim() == 1:
        ia = ia[None]
    if ib.dim() == 1:
        ib = ib[:, None]
    batch = out_shape[:-2] if len(out_shape) == max(ia.dim(), ib.dim()) > 2 else ()  # no vector operand
    heads = _per_head(walk, node, batch, [ia, ib]) if batch else None
    if heads is not None:
        return heads.reshape(*batch, 1, 1).expand(out_shape) if len(out_shape) >= 2 else heads.reshape(out_shape)
    why = f"{describe(node)} multiplies them as matrices"
    walk.atoms.couple_along(ia, [-1], why)
    walk.atoms.couple_along(ib, [-2], why)
    rows = ia.amax(-1, keepdim=True)  # (..., n, 1): each row's group
    cols = ib.amax(-2, keepdim=True)  # (..., 1, p): each column's group
    rows, cols = broadcast(rows, cols)
    walk.atoms.couple(rows, cols)
    out = torch.where(rows >= 0, rows, cols)
    return out.reshape(out_shape) if out.numel() == math.prod(out_shape) else torch.full(out_shape, -1, dtype=torch.long)


def _per_head(walk: Walk, node: fx.Node, batch: Sequence[int], operands: Sequence[Tensor]) -> Tensor | None:
    """The atom of each batch position of an attention-like op, or ``None`` if its atoms are the same at every one.

    ``operands``: atom ids whose last two dims are one batch position's matrix (broadcast over
    ``batch``). At each position (a head), its atoms go together: a head goes whole, and heads that
    read one key/value head (grouped-query attention) go together. An atom found at *every* position
    (the key and value of multi-query attention, MLA's rotary key shared by all heads) couples no
    heads: it stays, since every head reads it. The walk records the head atoms of the op
    (``walk.heads``).
    """
    positions = math.prod(batch)
    if positions < 2:
        return None
    slabs = [ids.expand(*batch, *ids.shape[-2:]).reshape(positions, -1) for ids in operands]
    slab = torch.cat(slabs, 1)
    present = slab >= 0
    if not bool(present.any()):
        return None
    atoms = torch.unique(slab[present])
    where = torch.zeros(positions, atoms.numel(), dtype=torch.bool)
    rows = torch.arange(positions).unsqueeze(1).expand_as(slab)[present]
    where[rows, torch.searchsorted(atoms, slab[present])] = True
    shared = where.all(0)
    if bool(shared.all()):
        return None  # the same atoms at every position: no heads
    walk.atoms.block(atoms[shared], f"{describe(node)} reads them in every head (shared by all heads)")
    own = where & ~shared
    group = torch.full((positions,), -1, dtype=torch.long)  # each position's smallest atom of its own
    for position in range(positions):
        found = atoms[own[position]].tolist()
        for other in found[1:]:
            walk.atoms.union(found[0], other)
        if found:
            group[position] = found[0]
    walk.heads[node] = group.reshape(tuple(batch))  # where the heads lie (their groups: the roots, in the end)
    return group.reshape(tuple(batch))


def _baddbmm(walk: Walk, node: fx.Node) -> Any:
    """``baddbmm(base, a, b)``: ``base + a @ b`` (BLOOM's scores, ALiBi as the base)."""
    inner = _contracted(walk, node, node.args[1], node.args[2])
    base = node.args[0]
    if isinstance(base, fx.Node) and isinstance(walk.ids.get(base), Tensor):
        ids = walk.ids[base].expand(inner.shape)
        walk.atoms.couple(inner, ids)
        return torch.where(inner >= 0, inner, ids)
    _meet(walk, node, inner, base)
    return inner


def _embedding(walk: Walk, node: fx.Node) -> Any:
    """``embedding(W, idx)``: W's columns are new atoms (the embedding's channels)."""
    origin = _weight(walk, node, node.args[0], "embedding")
    if origin is None:
        return None
    rows = _new_rows(walk, node, origin, 1)
    return None if rows is None else rows.expand(_shape(walk, node))


def _convolution(walk: Walk, node: fx.Node) -> Any:
    """A convolution over dim 1 (channels): dense, depthwise, grouped or transposed."""
    args = walk.value(node.args)
    x, w, bias = node.args[0], node.args[1], node.args[2] if len(node.args) > 2 else None
    transposed = bool(args[6]) if node.target is aten.convolution.default and len(args) > 6 else False
    groups = int(args[-1]) if isinstance(args[-1], int) else 1
    origin = _weight(walk, node, w, "convolution")
    shape = torch.Size(_shape(walk, node))
    if origin is None:
        return None
    ids = walk.ids_or_none(x)
    in_channels = (_shape_of(walk, x) or (0, 0))[1]
    out_channels = shape[1]
    channel_ids = _per_channel(ids)
    if 1 < groups == in_channels and not transposed and out_channels % in_channels == 0:  # depthwise
        walk.atoms.mark_read(channel_ids)
        repeated = channel_ids.repeat_interleave(out_channels // in_channels)
        walk.atoms.relate(origin.name, 0, torch.arange(out_channels), repeated)
        if bias is not None and walk.origin(bias) is not None:
            walk.atoms.relate(walk.origin(bias).name, 0, torch.arange(out_channels), repeated)  # type: ignore[union-attr]
        return _broadcast_channels(repeated, shape)
    read_axis, row_axis = (0, 1) if transposed else (1, 0)
    if groups != 1:
        why = f"{describe(node)} is a grouped convolution (groups={groups}), whose channels stay"
        walk.atoms.block(ids, why)
        rows = _new_rows(walk, node, origin, row_axis, [bias] if bias is not None else [])
        if rows is not None:
            walk.atoms.block(rows, why)
        return None if rows is None else _broadcast_channels(rows, shape)
    _read_conv_input(walk, node, origin, read_axis, channel_ids)
    rows = _new_rows(walk, node, origin, row_axis, [bias] if bias is not None else [])
    return None if rows is None else _broadcast_channels(rows, shape)


def _per_channel(ids: Tensor) -> Tensor:
    """The atom of each channel (dim 1) of an activation, its other entries coupled to it beforehand."""
    if ids.dim() < 2:
        return ids
    return ids.movedim(1, -1).reshape(-1, ids.shape[1]).amax(0)


def _broadcast_channels(atoms: Tensor, shape: torch.Size) -> Tensor:
    view = [1] * len(shape)
    view[1] = shape[1]
    return atoms.reshape(view).expand(shape)


def _read_conv_input(walk: Walk, node: fx.Node, origin: Origin, axis: int, channel_ids: Tensor) -> None:
    found = _axis_dim(origin, axis)
    if found is None:
        walk.atoms.refuse(channel_ids, f"{describe(node)}, whose weight is no slice of a parameter,")
        return
    dim, index = found
    walk.atoms.mark_read(channel_ids)
    walk.atoms.relate(origin.name, dim, index, channel_ids, couple=True)


def _per_channel_op(walk: Walk, node: fx.Node) -> Any:
    """Pooling, interpolation and the like: dim 1's channels pass on, each channel's entries computed alone."""
    ids = walk.ids_or_none(node.args[0])
    walk.atoms.couple_along(ids, range(2, ids.dim()), f"{describe(node)} mixes the entries of a channel")
    channels = _per_channel(ids)
    value = walk.values[node]
    out = value[0] if isinstance(value, (list, tuple)) else value
    ids_out = _broadcast_channels(channels, out.shape)
    return type(value)([ids_out, *(None for _ in value[1:])]) if isinstance(value, (list, tuple)) else ids_out


def _batch_norm(walk: Walk, node: fx.Node) -> Any:
    """BatchNorm (eval) and InstanceNorm: each channel alone; weight, bias and statistics follow it."""
    ids = walk.ids_or_none(node.args[0])
    _relate_channels(walk, node.args[1:5], _per_channel(ids))
    return _first_output(walk, node, ids)


def _relate_channels(walk: Walk, args: Sequence[object], channels: Tensor) -> None:
    """Per-channel parameters and statistics (1-D) follow the channels' atoms."""
    for arg in args:
        origin = walk.origin(arg)
        if origin is not None and len(origin.size) == 1:
            walk.atoms.relate(origin.name, 0, origin.coords()[0], channels)


def _first_output(walk: Walk, node: fx.Node, ids: Tensor) -> Any:
    """``ids`` for the node's value, or for its first output where it returns several (the statistics carry none)."""
    value = walk.values[node]
    if isinstance(value, (list, tuple)):
        return type(value)([ids, *(None for _ in value[1:])])
    return ids


def _layer_norm(walk: Walk, node: fx.Node) -> Any:
    """LayerNorm over the last dims: all-or-nothing along them; weight and bias follow the atoms."""
    ids = walk.ids_or_none(node.args[0])
    normalized = walk.value(node.args[1])
    dims = list(range(ids.dim() - len(normalized), ids.dim()))
    walk.atoms.couple_along(ids, dims, f"{describe(node)} normalizes over them")
    for arg in node.args[2:4]:
        origin = walk.origin(arg)
        if origin is not None:
            _relate_follower(walk, origin, ids, tuple(ids.shape))
    return _first_output(walk, node, ids)


def _group_norm(walk: Walk, node: fx.Node) -> Any:
    """GroupNorm: all-or-nothing within each group of channels; weight and bias follow them."""
    ids = walk.ids_or_none(node.args[0])
    args = walk.value(node.args)
    groups = args[1] if node.target is aten.group_norm.default else args[6]
    n = ids.shape[0]
    grouped = ids.reshape(n, groups, -1)
    walk.atoms.couple_along(grouped, [2], f"{describe(node)} normalizes over groups of them")
    _relate_channels(walk, node.args[1:3] if node.target is not aten.group_norm.default else node.args[2:4], _per_channel(ids))
    return _first_output(walk, node, ids)


def _attention(walk: Walk, node: fx.Node) -> Any:
    """``scaled_dot_product_attention(q, k, v, attn_mask, ...)``: a head goes whole (:func:`_per_head`).

    Under ``enable_gqa`` each key/value head serves ``heads // kv_heads`` query heads. The mask meets
    the scores: one that carries atoms (T5's position bias, an embedding's columns per head) goes with
    its heads; a computed one with values of its own per head (ALiBi) makes the heads all-or-nothing.
    """
    q, k, v = (walk.ids_or_none(a) for a in node.args[:3])
    value = walk.values[node]
    heads = q.shape[-3] if q.dim() >= 3 else 1
    if k.dim() >= 3 and k.shape[-3] not in (heads, 1):  # enable_gqa: each KV head serves heads // kv_heads query heads
        k = k.repeat_interleave(heads // k.shape[-3], dim=-3)
        v = v.repeat_interleave(heads // v.shape[-3], dim=-3)
    batch = tuple(value.shape[:-2])
    group = _per_head(walk, node, batch, [q, k, v])
    if group is None:  # one head, or the same atoms in every one: all of them go together
        stacked = torch.cat([t.expand(*batch, *t.shape[-2:]).reshape(-1) for t in (q, k, v)])
        walk.atoms.couple_along(stacked, [0], f"{describe(node)} attends with whole heads")
        group = stacked.amax().reshape(1).expand(math.prod(batch)).reshape(batch)
    scores = group.reshape(*batch, 1, 1).expand(*batch, q.shape[-2], k.shape[-2])
    mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
    if isinstance(mask, fx.Node):
        if isinstance(walk.ids.get(mask), Tensor):
            walk.atoms.couple(scores, walk.ids[mask].expand(scores.shape))
        else:
            _meet(walk, node, scores, mask)
    return group.reshape(*batch, 1, 1).expand(value.shape)


# --- what the walk asks of this module --------------------------------------------------------

#: Views by their schema that cannot run on atom ids as they run on values (another element size, strides
#: that only fit the input's memory): they are no views to the analysis, and whatever reads atoms through them
#: is refused.
_NO_ID_VIEWS: frozenset[object] = frozenset({aten.as_strided, aten.view_as_real, aten.view_as_complex})


@functools.cache
def stands_for(target: Any) -> tuple[object, bool]:
    """The op the tables know ``target`` by, and whether ``target`` writes its first argument in place.

    - an op in the tables: itself;
    - an in-place op (``hardswish_``, ``dropout_``, ``add_``...) whose functional form the tables know:
      that form, written in place (the walk gives the argument the result's atoms);
    - any other op whose schema says it returns a view of its first argument (``numpy_T``, ``mH``,
      ``diagonal``...): ``aten.alias``, a view (it runs on the atom ids as on the values).
    """
    if any(key in HANDLERS for key in _keys_of(target)):
        return target, False
    schema = getattr(target, "_schema", None)
    packet = getattr(target, "overloadpacket", None)
    if schema is None or packet is None or not schema.arguments or not schema.returns:
        return target, False
    first, result = schema.arguments[0].alias_info, schema.returns[0].alias_info
    if first is not None and first.is_write and schema.is_mutable:
        name = packet.__name__
        functional = getattr(aten, name[:-1], None) if name.endswith("_") else None
        if functional is not None and functional in HANDLERS and functional not in VIEWS:
            return functional, True
        return target, False
    if is_alias(target):
        return aten.alias, False
    return target, False


@functools.cache
def is_alias(target: Any) -> bool:
    """Whether ``target`` returns a view sharing its first argument's memory (its schema says so)."""
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.arguments or not schema.returns or schema.is_mutable:
        return target is operator.getitem
    first, result = schema.arguments[0].alias_info, schema.returns[0].alias_info
    return first is not None and result is not None and getattr(target, "overloadpacket", None) not in _NO_ID_VIEWS


def _keys_of(target: Any) -> tuple[object, ...]:
    packet = getattr(target, "overloadpacket", None)
    name = getattr(packet, "_qualified_op_name", None)
    return tuple(k for k in (target, packet, name) if k is not None)



def _handler_table() -> dict[object, Handler]:
    table: dict[object, Handler] = {}
    for op in VIEWS:
        table[op] = _view
    for op in ELEMENTWISE:
        table[op] = _elementwise
    for op in _CONVERSIONS:
        table[op] = _conversion
    for op in _CHECKS:
        table[op] = _nothing
    table[aten.copy] = _copy
    for op in (aten.sum, aten.mean, aten.amax, aten.amin, aten.max, aten.min, aten.var, aten.std, aten.var_mean,
               aten.std_mean, aten.linalg_vector_norm, aten.norm, aten.logsumexp, aten.prod, aten.any, aten.all,
               aten.argmax, aten.argmin, aten.count_nonzero):  # fmt: skip
        table[op] = _reduction
    for op in (aten.softmax, aten._softmax, aten.log_softmax, aten._log_softmax, aten.cumsum, aten.cumprod,
               aten.sort, aten.topk, aten.cummax, aten.cummin):  # fmt: skip
        table[op] = _along_last
    table.update({
        aten.linear: _linear, aten.addmm: _addmm, aten.mm: _matmul, aten.matmul: _matmul, aten.bmm: _matmul,
        aten.baddbmm: _baddbmm, aten.embedding: _embedding, aten.conv1d: _convolution,
        aten.conv2d: _convolution, aten.conv3d: _convolution, aten.convolution: _convolution,
        aten.conv_transpose1d: _convolution, aten.conv_transpose2d: _convolution,
        aten.max_pool1d: _per_channel_op, aten.max_pool2d: _per_channel_op, aten.max_pool3d: _per_channel_op,
        aten.max_pool2d_with_indices: _per_channel_op, aten.avg_pool1d: _per_channel_op,
        aten.avg_pool2d: _per_channel_op, aten.avg_pool3d: _per_channel_op,
        aten.adaptive_avg_pool1d: _per_channel_op, aten.adaptive_avg_pool2d: _per_channel_op,
        aten.adaptive_avg_pool3d: _per_channel_op, aten.adaptive_max_pool2d: _per_channel_op,
        aten.upsample_nearest2d: _per_channel_op, aten.upsample_bilinear2d: _per_channel_op,
        aten.upsample_nearest1d: _per_channel_op, aten.upsample_linear1d: _per_channel_op,
        aten._native_batch_norm_legit_no_training: _batch_norm, aten.batch_norm: _batch_norm,
        aten.native_batch_norm: _batch_norm, aten._native_batch_norm_legit: _batch_norm,
        aten.instance_norm: _batch_norm, aten.layer_norm: _layer_norm, aten.native_layer_norm: _layer_norm,
        aten.group_norm: _group_norm, aten.native_group_norm: _group_norm, aten.rms_norm: _layer_norm,
        aten.scaled_dot_product_attention: _attention,
    })  # fmt: skip
    for name in _GROUPED_MM:
        table[name] = _grouped_mm
    return table


#: The grouped matmuls of MoE experts, by name (transformers registers its op when it loads): torch's, and
#: the fallback transformers uses where torch's does not run.
_GROUPED_MM = ("aten::_grouped_mm", "transformers::grouped_mm_fallback")


HANDLERS: Mapping[object, Handler] = _handler_table()
#: Ops that make new atoms even when their input carries none (the first layer of a model).
PRODUCERS: frozenset[object] = frozenset({
    aten.linear, aten.addmm, aten.mm, aten.matmul, aten.embedding, aten.conv1d, aten.conv2d, aten.conv3d,
    aten.convolution, aten.conv_transpose1d, aten.conv_transpose2d, *_GROUPED_MM,
})  # fmt: skip
#: For each layer op, the argument positions (and names) that hold its parameters.
LAYER_SLOTS: Mapping[object, frozenset[object]] = {
    aten.linear: frozenset({1, 2, "weight", "bias"}),
    aten.addmm: frozenset({0, 2}),
    aten.mm: frozenset({1}),
    aten.matmul: frozenset({1}),
    aten.embedding: frozenset({0, "weight"}),
    **{op: frozenset({1, 2, "weight", "bias"}) for op in (aten.conv1d, aten.conv2d, aten.conv3d, aten.convolution,
                                                          aten.conv_transpose1d, aten.conv_transpose2d)},
    **{op: frozenset({1, 2, 3, 4}) for op in (aten._native_batch_norm_legit_no_training, aten.batch_norm,
                                              aten.native_batch_norm, aten._native_batch_norm_legit,
                                              aten.instance_norm)},
    **{op: frozenset({2, 3, "weight", "bias"}) for op in (aten.layer_norm, aten.native_layer_norm, aten.rms_norm)},
    aten.group_norm: frozenset({2, 3}),
    aten.scaled_dot_product_attention: frozenset({3, "attn_mask"}),  # a mask follows the heads it meets
    aten.baddbmm: frozenset({0}),
    aten.native_group_norm: frozenset({1, 2}),
    **{name: frozenset({1}) for name in _GROUPED_MM},
}  # fmt: skip

#: All the analysis knows about ops.
OPS = Ops(HANDLERS, PRODUCERS, ELEMENTWISE, VIEWS, LAYER_SLOTS, view_ids, stands_for, is_alias, _CONVERSIONS, _CHECKS)
