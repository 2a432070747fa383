"""Layers: what a Linear, a Conv1D, a Conv, an Embedding, a norm or a MoE router does to the atoms.

A layer reads the atoms of its input as weight columns and makes new atoms,
its output rows; a depthwise convolution passes them on; BatchNorm's
parameters and statistics follow them; LayerNorm and GroupNorm make the
atoms they normalize over all-or-nothing. A MoE router's rows are its
experts: each is related to its index of every stacked expert weight.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from .._types import Tensor
from ._atoms import Slice, pairs
from ._heads import _contracted
from ._pointwise import _relate_follower, _shape, _shape_of
from ._walk import Origin, Walk, describe

__all__: list[str] = []

aten = torch.ops.aten


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
    others = per_column != first
    if bool(others.any()):  # (every row alike, each token's: nothing to join)
        walk.atoms.union_pairs(pairs(first, torch.where(others, per_column, -1)))
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
    atoms = walk.atoms.new(index.numel(), [Slice(origin.name, dim, i) for i in index.tolist()])
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
    shape = walk.peek(node).shape
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
    value = walk.peek(node)
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
    value = walk.peek(node)
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
