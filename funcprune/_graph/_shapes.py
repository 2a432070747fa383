"""What ops that reshape, index or concatenate tensors do to their channels.

:data:`HANDLERS` maps ``flatten``, ``view``/``reshape``, ``cat``, indexing,
``squeeze``/``unsqueeze``, ``chunk``/``split`` and ``x.shape`` reads to
their handlers (``README.md`` says what each does).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping

import torch
from torch import fx

from ._values import ChannelLayout, Pieces, Sizes, Value
from ._walk import Handler, Walk, as_dim, call_arg, shape_of

__all__ = ["HANDLERS", "flatten_dims"]

_FLATTEN = frozenset({torch.flatten, "flatten"})
_RESHAPE = frozenset({torch.reshape, "view", "reshape"})
_CAT = frozenset({torch.cat, torch.concat, torch.concatenate})
_SPLIT = frozenset({torch.chunk, torch.split, "chunk", "split"})
_HARMLESS_ATTRIBUTES = frozenset({"dtype", "device", "ndim", "is_cuda", "requires_grad"})


# --- shapes and indexing -------------------------------------------------------------


def getitem(walk: Walk, node: fx.Node) -> Value:
    """``x[index]`` of a tensor with channels, ``x.shape[index]``, or a piece of a chunk."""
    container, index = node.args[0], node.args[1]
    value = walk.value(container)
    if isinstance(value, Sizes):
        return _shape_item(walk, node, value, index)
    if isinstance(value, Pieces):
        return value.layout if _is_int(index) else walk.unknown_op(node)
    x = walk.first(node)
    return walk.unknown_op(node) if x is None else _index(walk, node, x, index)


def _shape_item(walk: Walk, node: fx.Node, sizes: Sizes, index: object) -> Value:
    """``x.shape[i]``: harmless unless it reads the channel count (or may: ``i`` computed)."""
    if isinstance(index, int) and as_dim(index, sizes.ndim) != sizes.layout.axis:
        return None
    if isinstance(index, slice) and _is_constant_index(index):
        if sizes.layout.axis not in range(sizes.ndim)[index]:
            return None
    walk.block(sizes.layout.atoms, f"{walk.describe(node)} reads the channel count")
    return None


def _index(walk: Walk, node: fx.Node, x: tuple[ChannelLayout, tuple[int, ...]], index: object) -> Value:
    """``x[...]`` with constant ints, slices, ``None`` and ``...``."""
    (lay, shape), out = x, shape_of(node)
    items = index if isinstance(index, tuple) else (index,)
    if out is None or items.count(Ellipsis) > 1 or not all(
        _is_constant_index(i) or i is None or i is Ellipsis for i in items
    ):
        return walk.unknown_op(node)
    axis = _indexed_axis(_without_ellipsis(items, len(shape)), lay.axis)
    if axis is None:
        return walk.block_node(node, "selects some of the channels")
    return ChannelLayout(axis, lay.atoms) if out[axis] == len(lay.atoms) else walk.unknown_op(node)


def _without_ellipsis(items: tuple[object, ...], ndim: int) -> tuple[object, ...]:
    """Index ``items`` with a ``...`` spelled out as the full slices it stands for."""
    if Ellipsis not in items:
        return items
    at = items.index(Ellipsis)
    spanned = ndim - sum(1 for i in items if i is not None and i is not Ellipsis)
    return items[:at] + (slice(None),) * spanned + items[at + 1 :]


def _indexed_axis(items: tuple[object, ...], axis: int) -> int | None:
    """Where indexing with ``items`` puts dim ``axis``; ``None`` if it selects in it."""
    out, dim = 0, 0
    for item in items:
        if item is None:  # a new dim of size 1
            out += 1
            continue
        if dim == axis:
            return out if item == slice(None) else None
        out, dim = out + (not _is_int(item)), dim + 1
    return out + axis - dim


def _is_constant_index(item: object) -> bool:
    """Whether ``item`` is an int, or a slice of ints and ``None``, known before running."""
    if isinstance(item, slice):
        return all(p is None or _is_int(p) for p in (item.start, item.stop, item.step))
    return _is_int(item)


def _is_int(item: object) -> bool:
    return isinstance(item, int) and not isinstance(item, bool)


def attribute(walk: Walk, node: fx.Node) -> Value:
    """``x.shape`` carries sizes; ``x.dtype`` and the like are harmless; others unknown."""
    x, attr = walk.first(node), node.args[1]
    if x is not None and attr == "shape":
        return Sizes(x[0], len(x[1]))
    return None if attr in _HARMLESS_ATTRIBUTES else walk.unknown_op(node)


def size(walk: Walk, node: fx.Node) -> Value:
    """``x.size()`` carries sizes; ``x.size(d)`` blocks the channels if ``d`` is their dim.

    A ``d`` computed at run time may be their dim: it blocks them too.
    """
    x, dim = walk.first(node), call_arg(node, 1, "dim")
    if x is None:
        return walk.unknown_op(node)
    if dim is None:
        return Sizes(x[0], len(x[1]))
    d = as_dim(dim, len(x[1]))
    if d is not None and d != x[0].axis:
        return None
    walk.block(x[0].atoms, f"{walk.describe(node)} reads the channel count")
    return None


def unsqueeze(walk: Walk, node: fx.Node) -> Value:
    """``unsqueeze(dim)``: a new dim of size 1; the channel axis moves if it is after."""
    x, out = walk.first(node), shape_of(node)
    d = as_dim(call_arg(node, 1, "dim"), len(out) if out is not None else 0)
    if x is None or out is None or d is None or len(out) != len(x[1]) + 1:
        return walk.unknown_op(node)
    return ChannelLayout(x[0].axis + (d <= x[0].axis), x[0].atoms)


def squeeze(walk: Walk, node: fx.Node) -> Value:
    """``squeeze(dim)`` of other dims: the channel axis moves left past the dims dropped.

    A squeeze that may drop the channel axis (no ``dim``, or theirs) blocks
    them: shrunk to one channel, the axis would go.
    """
    x, dim, out = walk.first(node), call_arg(node, 1, "dim"), shape_of(node)
    if x is None or out is None:
        return walk.unknown_op(node)
    (lay, shape), dims = x, dim if isinstance(dim, (tuple, list)) else (dim,)
    squeezed = set(range(len(shape))) if dim is None else {as_dim(d, len(shape)) for d in dims}
    if None in squeezed:
        return walk.unknown_op(node)
    if lay.axis in squeezed:
        walk.block(lay.atoms, f"{walk.describe(node)} may squeeze the channel axis away")
    dropped = [d for d in squeezed if d is not None and shape[d] == 1]
    if len(out) != len(shape) - len(dropped):
        return walk.unknown_op(node)
    if lay.axis in dropped:  # blocked above: its one channel stays
        return None
    return ChannelLayout(lay.axis - sum(1 for d in dropped if d < lay.axis), lay.atoms)


def split(walk: Walk, node: fx.Node) -> Value:
    """``chunk``, ``split`` (``dim`` the third argument): pieces along another dim."""
    x = walk.first(node)
    d = as_dim(call_arg(node, 2, "dim", 0), len(x[1])) if x is not None else None
    if x is None or d is None:
        return walk.unknown_op(node)
    if d == x[0].axis:
        return walk.block_node(node, "splits the channels into pieces")
    return Pieces(x[0])


# --- flatten and reshape ---------------------------------------------------------------


def flatten(walk: Walk, node: fx.Node) -> Value:
    """``torch.flatten(x, start_dim, end_dim)`` or ``x.flatten(...)``."""
    start, end = call_arg(node, 1, "start_dim", 0), call_arg(node, 2, "end_dim", -1)
    return flatten_dims(walk, node, start, end)


def flatten_dims(walk: Walk, node: fx.Node, start: object, end: object) -> Value:
    """A flatten of dims ``start`` to ``end``: each channel repeats over its entries."""
    x = walk.first(node)
    if x is None:
        return walk.unknown_op(node)
    (lay, shape), ndim = x, len(x[1])
    first, last = as_dim(start, ndim), as_dim(end, ndim)
    if first is None or last is None:
        return walk.unknown_op(node)
    if lay.axis < first:
        return lay
    if lay.axis > last:
        return ChannelLayout(lay.axis - (last - first), lay.atoms)
    outer = math.prod(shape[first : lay.axis])
    inner = math.prod(shape[lay.axis + 1 : last + 1])
    atoms = tuple(a for _ in range(outer) for a in lay.atoms for _ in range(inner))
    return ChannelLayout(first, atoms)


def reshape(walk: Walk, node: fx.Node) -> Value:
    """``view``/``reshape`` to ``(d0, ..., dk, -1)``: a flatten from ``dk + 1`` on.

    Any other view spells out sizes that shrinking would break: it blocks.
    """
    x, out, sizes = walk.first(node), shape_of(node), _view_sizes(node)
    if x is None or out is None or not sizes:
        return walk.unknown_op(node)
    (lay, shape), start = x, len(sizes) - 1
    merged = shape[:start] + (math.prod(shape[start:]),)
    if sizes[-1] == -1 and start <= lay.axis and out == merged:
        return flatten_dims(walk, node, start, -1)
    return walk.block_node(node, "reshapes the channels to sizes it spells out")


def _view_sizes(node: fx.Node) -> tuple[object, ...]:
    """The sizes of ``x.view(*sizes)``, ``x.view(sizes)`` or ``torch.reshape(x, sizes)``."""
    if len(node.args) == 2 and isinstance(node.args[1], (tuple, list)):
        return tuple(node.args[1])
    return node.args[1:]


# --- cat ---------------------------------------------------------------------------------


def cat(walk: Walk, node: fx.Node) -> Value:
    """``torch.cat``: along the channel axis, the parts' channels follow each other."""
    parts, out = call_arg(node, 0, "tensors"), shape_of(node)
    if not isinstance(parts, (tuple, list)) or out is None or walk.reads_more(node, parts):
        return walk.unknown_op(node)
    dim, layouts = as_dim(_cat_dim(node), len(out)), [walk.layout(p) for p in parts]
    if dim is None:
        return walk.unknown_op(node)
    if any(lay is not None and lay.axis != dim for lay in layouts):
        return _cat_across(walk, node, layouts)
    atoms: list[int] = []
    for part, lay in zip(parts, layouts):
        atoms += lay.atoms if lay is not None else _foreign_atoms(walk, node, part, dim)
    return ChannelLayout(dim, tuple(atoms))


def _cat_dim(node: fx.Node) -> object:
    """The dim of ``torch.cat``: ``dim`` (or ``axis``), by position or by keyword; 0 if none."""
    if len(node.args) > 1:
        return node.args[1]
    return node.kwargs.get("dim", node.kwargs.get("axis", 0))


def _cat_across(walk: Walk, node: fx.Node, layouts: list[ChannelLayout | None]) -> Value:
    """``cat`` along another dim than the channels: the parts' channels pair up."""
    tracked = [lay for lay in layouts if lay is not None]
    first = tracked[0]
    if len(tracked) < len(layouts) or any(lay.axis != first.axis for lay in tracked):
        return walk.block_node(node, "concatenates tensors whose channels do not line up")
    for lay in tracked[1:]:
        walk.pair(first.atoms, lay.atoms)
    return first


def _foreign_atoms(walk: Walk, node: fx.Node, part: object, dim: int) -> tuple[int, ...]:
    """Blocked atoms for a concatenated part that carries no channels of ours.

    An empty 1-d part, which ``torch.cat`` skips whatever the dim, brings none.
    """
    shape = shape_of(part)
    atoms = walk.new_atoms(shape[dim] if shape is not None and dim < len(shape) else 0)
    walk.block(atoms, f"{walk.describe(node)} concatenates channels from elsewhere")
    return atoms


#: call_function targets and call_method names of these ops, and their handlers.
HANDLERS: Mapping[object, Handler] = {
    **{t: flatten for t in _FLATTEN},
    **{t: reshape for t in _RESHAPE},
    **{t: cat for t in _CAT},
    **{t: split for t in _SPLIT},
    torch.unsqueeze: unsqueeze,
    "unsqueeze": unsqueeze,
    torch.squeeze: squeeze,
    "squeeze": squeeze,
    operator.getitem: getitem,
    getattr: attribute,
    "size": size,
}
