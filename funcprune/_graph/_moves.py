"""Ops that move entries without arithmetic, and ops that only read shapes or convert: what each does to the atoms.

- *Views* (view, reshape, transpose, permute, slice, cat, split, expand,
  index..., and ops that only move entries: ``roll``, ``pixel_shuffle``)
  run on the atom ids as on the values (:func:`view_ids`), so every entry
  keeps its atom wherever it goes. Where the shrunk model recomputes sizes
  (a ``chunk(2)``, a ``channel_shuffle``'s reshape), the parts must lose the
  same channels.
- *Conversions* of dtype, device or layout keep the atoms as they are;
  ``copy(dst, src)`` gives ``dst`` the atoms of ``src``; *checks* and ops
  that read only a tensor's shape, dtype or device carry no atoms on.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import fx

from .._types import Tensor
from ._walk import Walk, describe, moved_args
from ._walk import _map_nodes as walk_map

__all__ = ["CHECKS", "CONVERSIONS", "VIEWS", "view_ids"]

aten = torch.ops.aten

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
CONVERSIONS: frozenset[object] = frozenset({aten.to, aten._to_copy, aten.type_as, aten.dropout})


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
    value = walk.peek(source)  # (its rank)
    if not splits or not isinstance(value, Tensor):
        return
    n = value.dim()
    packet = getattr(node.target, "overloadpacket", None)
    args = (source, *walk.value(node.args[1:]))  # (the dims; the tensor's values are not read)
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
    return walk.ids_or_none(node.args[1]).expand(walk.peek(node).shape)


def _nothing(walk: Walk, node: fx.Node) -> Any:
    """Checks that compute nothing (``_assert_tensor_metadata``): they read the atoms, and keep them as they are."""
    return None


#: Ops that only check their input and return nothing of it, or read only its dtype and device (a new
#: tensor of sizes given apart).
CHECKS: frozenset[object] = frozenset({
    aten._assert_tensor_metadata, aten._assert_async, aten._assert_scalar, aten.sym_constrain_range_for_size,
    aten.new_empty, aten.new_zeros, aten.new_ones, aten.new_full, aten.new_empty_strided,
})  # fmt: skip
