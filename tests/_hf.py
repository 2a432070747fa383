"""The transformers model matrix for the tests: tiny configs, random weights, offline.

Each model is built from a small config of its family (2 layers, hidden size
32, 4 attention heads; 2 KV groups where the family has GQA), seeded, in
eval mode, with inputs it runs on. Nothing is downloaded: configs are built
here and weights are random. Tests that use this module skip when
transformers is not installed (the ``hf`` extra installs it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never the hub: configs are built here
transformers = pytest.importorskip("transformers")

#: The families of the matrix, and whether each repeats one decoder or encoder layer.
MATRIX = ("gpt2", "llama", "qwen3", "mistral", "opt", "bert", "vit", "mixtral")
#: The mixture-of-experts models (4 experts, top 2): Mixtral (top-k renormalized) and, beside the matrix,
#: Qwen2-MoE (top-k not renormalized, a shared expert beside the routed ones).
MOE = ("mixtral", "qwen2_moe")
VOCAB = 64
SEQUENCE = 8


@dataclass(frozen=True)
class Tiny:
    """One model of the matrix, with the inputs it runs on."""

    name: str
    model: nn.Module
    args: tuple[torch.Tensor, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> torch.Tensor:
        """The model's main output on its inputs (logits)."""
        out = self.model(*self.args, **self.kwargs)
        logits: torch.Tensor = out.logits
        return logits


def _config(name: str, layers: int) -> Any:
    t = transformers
    common: dict[str, Any] = {"vocab_size": VOCAB, "max_position_embeddings": 64}
    llama_like = {
        **common, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": layers,
        "num_attention_heads": 4, "num_key_value_heads": 2,
    }  # fmt: skip
    if name == "gpt2":
        return t.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=layers, n_head=4,
                            bos_token_id=0, eos_token_id=0)  # fmt: skip
    if name == "llama":
        return t.LlamaConfig(**llama_like)
    if name == "qwen3":
        return t.Qwen3Config(**llama_like, head_dim=8)
    if name == "mistral":
        return t.MistralConfig(**llama_like, sliding_window=None)
    if name == "opt":
        return t.OPTConfig(**common, hidden_size=32, ffn_dim=48, num_hidden_layers=layers, num_attention_heads=4,
                           word_embed_proj_dim=32)  # fmt: skip
    if name == "bert":
        return t.BertConfig(**common, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                            num_attention_heads=4, num_labels=3)  # fmt: skip
    if name == "vit":
        return t.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, intermediate_size=48,
                           num_hidden_layers=layers, num_attention_heads=4, num_labels=3)  # fmt: skip
    if name == "mixtral":
        return t.MixtralConfig(**llama_like, num_local_experts=4, num_experts_per_tok=2)
    if name == "qwen2_moe":
        return t.Qwen2MoeConfig(**llama_like, moe_intermediate_size=24, shared_expert_intermediate_size=40,
                                num_experts=4, num_experts_per_tok=2, norm_topk_prob=False)  # fmt: skip
    raise ValueError(f"no tiny config for {name!r}; the matrix is {MATRIX}, with {MOE[1:]} beside it")


_CLASSES: dict[str, Callable[[Any], nn.Module]] = {
    "gpt2": lambda c: transformers.GPT2LMHeadModel(c),
    "llama": lambda c: transformers.LlamaForCausalLM(c),
    "qwen3": lambda c: transformers.Qwen3ForCausalLM(c),
    "mistral": lambda c: transformers.MistralForCausalLM(c),
    "opt": lambda c: transformers.OPTForCausalLM(c),
    "bert": lambda c: transformers.BertForSequenceClassification(c),
    "vit": lambda c: transformers.ViTForImageClassification(c),
    "mixtral": lambda c: transformers.MixtralForCausalLM(c),
    "qwen2_moe": lambda c: transformers.Qwen2MoeForCausalLM(c),
}


def tiny(name: str, *, layers: int = 2, seed: int = 0) -> Tiny:
    """The tiny model ``name`` of :data:`MATRIX`, seeded, in eval mode, and its inputs."""
    config = _config(name, layers)
    torch.manual_seed(seed)
    model = _CLASSES[name](config).eval()
    g = torch.Generator().manual_seed(seed + 1)
    if name == "vit":
        return Tiny(name, model, (torch.randn(2, 3, 16, 16, generator=g),))
    ids = torch.randint(0, VOCAB, (2, SEQUENCE), generator=g)
    kwargs = {} if name == "bert" else {"use_cache": False}
    return Tiny(name, model, (ids,), kwargs)
