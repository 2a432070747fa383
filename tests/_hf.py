"""The transformers model matrix for the tests: tiny configs, random weights, offline.

Each model is built from a small config of its family (2 layers, hidden size
32, 4 attention heads; 2 KV groups where the family has GQA), seeded, in
eval mode, with inputs it runs on. Nothing is downloaded: configs are built
here and weights are random. Tests that use this module skip when
transformers is not installed (the ``hf`` extra installs it).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never the hub: configs are built here
transformers = pytest.importorskip("transformers")

import funcprune as fp  # noqa: E402
from funcprune._payoff._shrink import _shrunk  # noqa: E402

#: The families of the matrix, and whether each repeats one decoder or encoder layer.
MATRIX = ("gpt2", "llama", "qwen3", "mistral", "opt", "bert", "vit", "mixtral")
#: The architectures added when the analysis stopped being tuned to the matrix (issue 35): Gemma 2 (eager
#: attention, sliding windows), Gemma 3, Phi-3 (fused qkv_proj and gate_up_proj, head counts read from the config),
#: BLOOM (fused query_key_value, ALiBi), T5 (encoder-decoder, one position bias shared by a stack's layers),
#: Falcon (multi-query, x @ W.T), StableLM 2 (a LayerNorm per head), DeepSeek-V3 (MLA, routed and shared
#: experts) and GraniteMoE (a cache unless told otherwise).
ARCHITECTURES = ("gemma2", "gemma3", "phi3", "bloom", "t5", "falcon", "stablelm", "deepseek_v3", "granitemoe")
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
    return _more_config(name, layers, common, llama_like)


def _more_config(name: str, layers: int, common: dict[str, Any], llama_like: dict[str, Any]) -> Any:
    """The tiny configs of :data:`ARCHITECTURES`."""
    t = transformers
    if name == "gemma2":
        return t.Gemma2Config(**llama_like, head_dim=8, sliding_window=4, attn_implementation="eager")
    if name == "gemma3":
        return t.Gemma3TextConfig(**llama_like, head_dim=8, sliding_window=4)
    if name == "phi3":
        return t.Phi3Config(**llama_like, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if name == "bloom":
        return t.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=layers, n_head=4)
    if name == "t5":
        return t.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=layers, num_heads=4,
                          decoder_start_token_id=0)  # fmt: skip
    if name == "falcon":
        return t.FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                              multi_query=True, new_decoder_architecture=False)  # fmt: skip
    if name == "stablelm":
        return t.StableLmConfig(**llama_like, qk_layernorm=True)
    if name == "deepseek_v3":
        return t.DeepseekV3Config(
            **{**common, "max_position_embeddings": 64}, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
            num_hidden_layers=layers, first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4,
            n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1, q_lora_rank=16,
            kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8,
        )  # fmt: skip
    if name == "granitemoe":
        return t.GraniteMoeConfig(**llama_like, num_local_experts=4, num_experts_per_tok=2)
    raise ValueError(
        f"no tiny config for {name!r}; the matrix is {MATRIX}, with {MOE[1:]} beside it, and the architectures "
        f"{ARCHITECTURES}"
    )


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
    "gemma2": lambda c: transformers.Gemma2ForCausalLM(c),
    "gemma3": lambda c: transformers.Gemma3ForCausalLM(c),
    "phi3": lambda c: transformers.Phi3ForCausalLM(c),
    "bloom": lambda c: transformers.BloomForCausalLM(c),
    "t5": lambda c: transformers.T5ForConditionalGeneration(c),
    "falcon": lambda c: transformers.FalconForCausalLM(c),
    "stablelm": lambda c: transformers.StableLmForCausalLM(c),
    "deepseek_v3": lambda c: transformers.DeepseekV3ForCausalLM(c),
    "granitemoe": lambda c: transformers.GraniteMoeForCausalLM(c),
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
    kwargs: dict[str, Any] = {} if name == "bert" else {"use_cache": False}
    if name == "t5":
        kwargs["decoder_input_ids"] = torch.randint(0, VOCAB, (2, SEQUENCE // 2), generator=g)
    return Tiny(name, model, (ids,), kwargs)


def inputs(t: Tiny) -> Any:
    """``t``'s inputs as ``fp.structure`` and ``fp.shrink`` take them: the ids, or a dict with the keyword ones."""
    return t.args[0] if not t.kwargs else {"input_ids": t.args[0], **t.kwargs}


def logits(model: nn.Module, x: Any) -> torch.Tensor:
    """``model``'s logits on ``x`` (as :func:`inputs` gives them), without gradients."""
    with torch.no_grad():
        out = model(**x) if isinstance(x, dict) else model(x)
    result: torch.Tensor = out.logits
    return result


def masked_logits(model: nn.Module, masks: fp.Masks, x: Any) -> torch.Tensor:
    """``model``'s logits on ``x`` masked by ``masks`` (``fp.functional_call_masked``), without gradients."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        out = fp.functional_call_masked(model, params, masks, (), x) if isinstance(x, dict) else (
            fp.functional_call_masked(model, params, masks, x))  # fmt: skip
    result: torch.Tensor = out.logits
    return result


def shrunk_exactly(model: nn.Module, masks: fp.Masks, x: Any, structure: fp.Structure | None = None) -> Any:
    """``fp.shrink``'s model, asserting that exactly what ``masks`` prune goes: no channel kept (no
    ``KeptChannelsWarning``), ``fp.propagate``'s closure (from the same analysis) adds nothing, the parameters
    removed are the pruned entries, and the shrunk model computes the masked one. ``structure``: passed on (its
    analysis taken back where still valid)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", fp.KeptChannelsWarning)
        both = _shrunk("shrink", model, masks, x, structure=structure, closing=True)
    assert both.closure is not None and both.closure.keys() == masks.keys() and all(torch.equal(both.closure[k], masks[k]) for k in masks)
    removed = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in both.model.parameters())
    assert removed == sum(int((~m).sum()) for m in masks.values())
    torch.testing.assert_close(logits(both.model, x), masked_logits(model, masks, x), atol=1e-5, rtol=1e-5)
    return both.model


def greedy_masked(model: nn.Module, masks: fp.Masks, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy decoding of ``model`` masked by ``masks``, without a cache: what a shrunk model must generate."""
    params = dict(model.named_parameters())
    for _ in range(steps):
        with torch.no_grad():
            out = fp.functional_call_masked(model, params, masks, (), {"input_ids": ids, "use_cache": False})
        ids = torch.cat([ids, out.logits[:, -1:].argmax(-1)], dim=1)
    return ids
