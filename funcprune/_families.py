"""What funcprune knows of model families it did not write: the names their modules and configs use.

Knowledge of how one kind of model spells things lives here, not in the
rooms that use it, so that a new family is one edit in one place:

- mixture-of-experts layers: the attributes that count the experts
  (:data:`EXPERT_COUNTS`) and say how many each token goes to
  (:data:`TOP_K`), read by ``_experts.py``;
- attention modules: the attributes that count query heads, key/value heads,
  query widths and query heads per key/value head (:data:`QUERY_HEADS`,
  :data:`KV_HEADS`, :data:`QUERY_WIDTH`, :data:`PER_KV_HEAD`), and the head
  counts a config holds that an attention may read as it runs
  (:data:`CONFIG_HEADS`), updated by the payoff's resize;
- configs: the width attributes a shrink may change (:data:`CONFIG_WIDTHS`)
  and those whose ``None`` means a multiple of another
  (:data:`CONFIG_DEFAULTS`), solved for by the payoff's config;
- depth: the config's thresholds counted in layers (:data:`DEPTH_THRESHOLDS`),
  its lists of layer indices (:data:`DEPTH_INDEX_LISTS`) and the attribute
  a layer's modules keep their index in (:data:`LAYER_INDEX`), updated by
  the payoff's removal of whole blocks;
- ``forward``: whether it takes ``use_cache`` (:func:`takes_use_cache`).

Each table was grown from models tried (the transformers matrix and the
architectures of ``tests/structure``); what no table names is still
handled where the analysis can see it (shapes, the graph), and checked.
"""

from __future__ import annotations

import inspect

from torch import nn

__all__ = [
    "CONFIG_DEFAULTS", "CONFIG_HEADS", "CONFIG_WIDTHS", "DEPTH_INDEX_LISTS", "DEPTH_THRESHOLDS", "EXPERT_COUNTS",
    "EXPERT_GROUPS", "KV_HEADS", "LAYER_INDEX", "NORM_EPS", "PER_KV_HEAD", "QUERY_HEADS", "QUERY_WIDTH", "TOPK_GROUPS", "TOP_K", "takes_use_cache",
]  # fmt: skip

#: Attributes that count a MoE layer's experts (on its experts module, its router, the block holding them).
EXPERT_COUNTS = ("num_experts", "num_local_experts")
#: Attributes that say how many experts each token goes to (on the router, or the block holding it).
TOP_K = ("top_k", "num_experts_per_tok")
#: Attributes that count a router's expert groups (DeepSeek's group-limited routing: ``n_group``), and how many
#: groups each token may use (``topk_group``): on the router, or the block holding it.
EXPERT_GROUPS = ("num_group", "n_group")
TOPK_GROUPS = ("topk_group",)

#: Attributes of an attention module that count its query heads.
QUERY_HEADS = ("num_heads", "num_attention_heads", "n_head", "n_heads", "num_q_heads")
#: Attributes of an attention module that count its key/value heads.
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads")
#: Attributes of an attention module that hold its query width (heads times head size).
QUERY_WIDTH = ("all_head_size", "split_size", "inner_dim")
#: Attributes that count the query heads that read one key/value head (1 under multi-head attention).
PER_KV_HEAD = ("num_key_value_groups", "num_queries_per_kv", "n_rep")
#: Head counts of a config that an attention module may read as it runs (Phi-3: ``self.config.num_attention_heads``).
CONFIG_HEADS = ("num_attention_heads", "num_key_value_heads")

#: Config attributes that count widths a shrink may change.
CONFIG_WIDTHS = (
    "intermediate_size", "n_inner", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "ffn_hidden_size",
    "moe_intermediate_size", "shared_expert_intermediate_size", "num_attention_heads", "n_head", "num_heads",
    "num_key_value_heads", "num_local_experts", "num_experts", "n_routed_experts",
)  # fmt: skip
#: Width attributes whose ``None`` means a multiple of another attribute (GPT-2's ``n_inner``: ``4 * n_embd``).
CONFIG_DEFAULTS = {"n_inner": ("n_embd", 4)}

#: Config ints that count the first layers of a kind (Qwen2's sliding-window layers, DeepSeek's dense ones): each
#: becomes the number of kept layers below it.
DEPTH_THRESHOLDS = ("max_window_layers", "first_k_dense_replace")
#: Config lists of layer indices (Qwen2-MoE's dense layers): renumbered, removed layers dropped.
DEPTH_INDEX_LISTS = ("mlp_only_layers",)
#: Attributes in which a norm keeps its epsilon.
NORM_EPS = ("variance_epsilon", "eps", "epsilon")
#: Attributes in which a layer's modules keep its index (the key-value cache's slot of an attention).
LAYER_INDEX = ("layer_idx", "layer_id")


def takes_use_cache(module: nn.Module) -> bool:
    """Whether ``module.forward`` takes ``use_cache``: by name, or in ``**kwargs`` where its config has one.

    A transformers model given ``use_cache=False`` builds no key-value cache;
    GraniteMoE's ``forward`` takes it through ``**kwargs`` and, without it,
    reads ``config.use_cache`` and returns a cache (which ``torch.export``
    cannot return).

    >>> import torch
    >>> takes_use_cache(torch.nn.Linear(2, 2))
    False
    """
    try:
        parameters = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False
    if "use_cache" in parameters:
        return True
    config = getattr(module, "config", None)
    many = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return many and isinstance(getattr(config, "use_cache", None), bool)
