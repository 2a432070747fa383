"""Cutting a model's tensors to the indices they keep, and the size attributes that describe them.

:func:`resize_modules` slices every parameter and buffer that loses
indices (a parameter stays a :class:`~torch.nn.Parameter`, with its
``requires_grad``), then updates what records the sizes: a Linear's
``in_features``/``out_features``, a Conv's channels and groups, a norm's
``num_features``, transformers' Conv1D ``nf``/``nx``, and an attention
module's head counts (``num_heads``, ``num_key_value_heads``,
``all_head_size``, ``split_size``...), from the heads its attention keeps,
and a MoE layer's expert counts (``num_experts``), from the experts it keeps.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Set
from typing import Any

import torch
from torch import nn

from .._families import CONFIG_HEADS, EXPERT_COUNTS, KV_HEADS, PER_KV_HEAD, QUERY_HEADS, QUERY_WIDTH
from .._graph import Analysis, Experts
from .._torch_private import ConvNd, NormBase

__all__ = ["SIZE_ATTRIBUTES", "get_size", "resize_modules", "set_size_"]

#: The size attributes a resize may change, and so the only ones a shrunk model's record holds: shrink records
#: these when they change, and ``load_shrunk`` sets these and refuses any other. Add an attribute here when
#: the resize learns to change it.
SIZE_ATTRIBUTES = frozenset({
    "in_features", "out_features",  # Linear
    "in_channels", "out_channels", "groups",  # Conv
    "num_features", "normalized_shape", "num_channels",  # BatchNorm, LayerNorm, GroupNorm
    "num_embeddings", "embedding_dim",  # Embedding
    "nf", "nx",  # transformers' Conv1D
    *QUERY_HEADS, *KV_HEADS, *QUERY_WIDTH, *PER_KV_HEAD,  # attention
    *(f"config.{name}" for name in CONFIG_HEADS),  # an attention's own copy of the config's head counts
    *EXPERT_COUNTS,  # a MoE layer's experts
})  # fmt: skip


@torch.no_grad()
def resize_modules(
    model: nn.Module, keep: Mapping[str, Mapping[int, list[int]]], analysis: Analysis, removed: Set[int],
    *, views: bool = False, inplace: bool = False,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Cut ``model``'s tensors to ``keep`` (by first name) and update the size attributes (in place).

    ``removed`` are the groups that go (those ``keep`` follows from).
    ``views``: a dim that keeps one run of indices is cut to a view of the
    tensor (``narrow``: no copy, maybe not contiguous), for a probe that
    only runs; otherwise every cut tensor is a new, contiguous one.
    ``inplace``: each cut tensor goes into the tensor object it is cut
    from (``.data``: a Parameter stays the same object, wherever it is
    held), so that the old values are freed as soon as it is cut.
    Returns the size attributes that changed: new values by module path and name.
    """
    paths = {name.rpartition(".")[0] for name in keep} | {a.module for a in analysis.attention}
    paths |= {path for layer in analysis.experts for path in _moe_paths(layer)}
    before = {path: _sizes(model, path) for path in paths}
    touched: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, dims in keep.items():
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        old = getattr(module, attr)
        new = old
        for dim, kept in sorted(dims.items()):
            if views and kept and kept[-1] - kept[0] == len(kept) - 1:  # one run (kept is ascending)
                new = new.narrow(dim, kept[0], len(kept))
            else:
                new = new.index_select(dim, torch.tensor(kept, dtype=torch.long, device=new.device))
        touched.setdefault(owner, {})[attr] = tuple(old.shape)
        new = new if views else new.contiguous()
        if inplace:  # (the old values freed here, unless something else holds them)
            old.data = new
        elif isinstance(old, nn.Parameter):
            setattr(module, attr, nn.Parameter(new, old.requires_grad))
        else:
            setattr(module, attr, new)
    for owner, old_shapes in touched.items():
        _resize(model.get_submodule(owner), old_shapes)
    for attention in analysis.attention:
        _resize_attention(model, attention.module, attention.heads, attention.kv_heads, removed)
    for layer in analysis.experts:
        _resize_experts(model, layer, removed)
    changed: dict[str, dict[str, Any]] = {}
    for path, sizes in before.items():
        after = _sizes(model, path)
        diff = {attr: value for attr, value in after.items() if sizes.get(attr) != value}
        if diff:
            changed[path] = diff
    return changed


def _sizes(model: nn.Module, path: str) -> dict[str, Any]:
    """A module's int and int-tuple size attributes (:data:`SIZE_ATTRIBUTES`), ``{}`` if there is no such module."""
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return {}
    sizes = {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in vars(module).items()
        if k in SIZE_ATTRIBUTES and (_is_int(v) or isinstance(v, tuple) and all(map(_is_int, v)))
    }
    for attr in (f"config.{name}" for name in CONFIG_HEADS):  # an attention's config's head counts, where it has one
        if _is_int(value := get_size(module, attr)):
            sizes[attr] = value
    return sizes


def get_size(module: nn.Module, attr: str) -> Any:
    """A size attribute of ``module`` as a record names it (``config.num_attention_heads``: its config's), or ``None``."""
    owner, dot, name = attr.rpartition(".")
    holder = getattr(module, owner, None) if dot else module
    return getattr(holder, name, None)


def set_size_(module: nn.Module, attr: str, value: Any) -> None:
    """Set a size attribute of ``module`` as a record names it; a config's, on the module's own copy of its config."""
    owner, dot, name = attr.rpartition(".")
    if dot:
        own = copy.copy(getattr(module, owner))
        setattr(own, name, value)
        setattr(module, owner, own)
        return
    current = getattr(module, name, None)
    setattr(module, name, tuple(value) if isinstance(current, tuple) and isinstance(value, list) else value)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _resize(module: nn.Module, old: Mapping[str, tuple[int, ...]]) -> None:
    """Update one module's size attributes from its new tensors."""
    weight = getattr(module, "weight", None)
    if isinstance(module, nn.Linear) and weight is not None:
        module.out_features, module.in_features = weight.shape
    elif isinstance(module, ConvNd) and weight is not None:
        _resize_conv(module, old.get("weight", tuple(weight.shape)))
    elif isinstance(module, (NormBase,)):
        tensor = weight if weight is not None else getattr(module, "running_mean", None)
        if tensor is not None:
            module.num_features = tensor.shape[0]
    elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)) and weight is not None:
        module.normalized_shape = tuple(weight.shape)
    elif isinstance(module, nn.GroupNorm) and weight is not None:
        module.num_channels = weight.shape[0]
    elif isinstance(module, nn.Embedding) and weight is not None:
        module.num_embeddings, module.embedding_dim = weight.shape
    elif type(module).__name__ == "Conv1D" and weight is not None and hasattr(module, "nf"):
        module.nx, module.nf = weight.shape


def _resize_conv(module: ConvNd, old_shape: tuple[int, ...]) -> None:
    weight = module.weight
    old_in = module.in_channels
    depthwise = module.groups == old_in and module.groups > 1 and not module.transposed
    if module.transposed:
        module.in_channels = weight.shape[0]
        module.out_channels = weight.shape[1] * module.groups
        return
    module.out_channels = weight.shape[0]
    if depthwise:
        per_channel = old_shape[0] // old_in
        module.in_channels = module.groups = weight.shape[0] // per_channel
    else:
        module.in_channels = weight.shape[1] * module.groups


def _resize_attention(model: nn.Module, path: str, heads: tuple[int, ...], kv_heads: int, removed: Set[int]) -> None:
    """An attention module's head counts, from the query heads (and KV heads) its attention keeps."""
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return
    kept = [g for g in heads if g not in removed]
    if len(kept) == len(heads):
        return
    per_group = len(heads) // max(kv_heads, 1)
    kept_kv = len(kept) // max(per_group, 1)
    old_width = {attr: getattr(module, attr) for attr in QUERY_WIDTH if isinstance(getattr(module, attr, None), int)}
    old_kv = next((getattr(module, a) for a in KV_HEADS if _is_int(getattr(module, a, None))), None)
    for attr in QUERY_HEADS:
        if getattr(module, attr, None) == len(heads):
            setattr(module, attr, len(kept))
    for attr in KV_HEADS:
        if getattr(module, attr, None) == kv_heads:
            setattr(module, attr, kept_kv)
    for attr, width in old_width.items():
        if width % len(heads) == 0:
            setattr(module, attr, width // len(heads) * len(kept))
    _own_config_heads(module, len(heads), kv_heads, len(kept), kept_kv)
    new_kv = next((getattr(module, a) for a in KV_HEADS if _is_int(getattr(module, a, None))), None)
    if old_kv and new_kv and len(heads) % old_kv == 0:  # shared key/value heads (multi-query): more heads per one
        for attr in PER_KV_HEAD:
            if getattr(module, attr, None) == len(heads) // old_kv:
                setattr(module, attr, len(kept) // new_kv)


def _own_config_heads(module: nn.Module, heads: int, kv_heads: int, kept: int, kept_kv: int) -> None:
    """Give an attention that reads its head counts from a config its own copy of it, with the counts it keeps.

    The config is shared by every layer (and the model); a copy for this
    module alone lets layers keep different counts. Only counts equal to the
    module's old ones change.
    """
    if getattr(module, "config", None) is None:
        return
    query, kv = CONFIG_HEADS
    for attr, old, new in ((query, heads, kept), (kv, kv_heads, kept_kv)):
        if get_size(module, f"config.{attr}") == old and old != new:
            set_size_(module, f"config.{attr}", new)


def _moe_paths(layer: Experts) -> tuple[str, ...]:
    """The modules of a MoE layer that may count its experts: the router, the experts, the block holding them."""
    return (layer.router.module, layer.router.experts, layer.router.experts.rpartition(".")[0])


def _resize_experts(model: nn.Module, layer: Experts, removed: Set[int]) -> None:
    """A MoE layer's expert counts (``num_experts``...), from the experts it keeps."""
    kept = sum(1 for g in layer.groups if g not in removed)
    if kept == layer.router.count:
        return
    for path in _moe_paths(layer):
        module = model.get_submodule(path)
        for attr in EXPERT_COUNTS:
            if getattr(module, attr, None) == layer.router.count:
                setattr(module, attr, kept)
