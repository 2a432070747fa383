"""What each aten op does to the atoms of its inputs: :data:`HANDLERS`, gathered from the modules that say it.

``_moves.py`` (views, conversions, checks), ``_pointwise.py`` (elementwise
ops, reductions, normalizations), ``_layers.py`` (Linear, Conv1D, Conv,
Embedding, norms, MoE routers and experts) and ``_heads.py`` (attention)
hold the handlers; this module maps ops to them (:data:`HANDLERS`), says
which ops make atoms from nothing (:data:`PRODUCERS`) and where layers take
their parameters (:data:`LAYER_SLOTS`), and how an op the tables do not
name stands for one they do (:func:`stands_for`: an in-place op for its
functional form, a view its schema declares for ``aten.alias``).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from typing import Any

import torch

from ._heads import _attention, _baddbmm
from ._layers import (
    _addmm,
    _batch_norm,
    _convolution,
    _embedding,
    _group_norm,
    _grouped_mm,
    _layer_norm,
    _linear,
    _matmul,
    _per_channel_op,
)
from ._moves import CHECKS, CONVERSIONS, VIEWS, _conversion, _copy, _nothing, _view, view_ids
from ._pointwise import ELEMENTWISE, _along_last, _elementwise, _reduction, functional_form
from ._walk import Handler, Ops

__all__ = ["ELEMENTWISE", "HANDLERS", "LAYER_SLOTS", "OPS", "PRODUCERS", "VIEWS", "is_alias", "stands_for", "view_ids"]

aten = torch.ops.aten

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
    if schema is None or getattr(target, "overloadpacket", None) is None or not schema.arguments or not schema.returns:
        return target, False
    first = schema.arguments[0].alias_info
    if first is not None and first.is_write and schema.is_mutable:
        functional = functional_form(target)
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
    for op in CONVERSIONS:
        table[op] = _conversion
    for op in CHECKS:
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
OPS = Ops(HANDLERS, PRODUCERS, ELEMENTWISE, VIEWS, LAYER_SLOTS, view_ids, stands_for, is_alias, CONVERSIONS, CHECKS)
