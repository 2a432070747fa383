"""Architectures the suite names nowhere else, walked as a user outside the team would (issue 35).

Tiny configs of 22 more transformers families (decoders with fused or
interleaved projections, encoders, encoder-decoders, MoE, vision), random
weights: every unit ``fp.structure`` lists goes when a plan prunes one of
each group (the closure adds nothing, no channel is kept), and the shrunk
model computes the masked model. What structure leaves out, it says (MPT's
ALiBi heads, OLMoE's heads under a norm across all of them). Under the ci
profile only: a minute on 2 cores.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _hf import shrunk_exactly

import funcprune as fp

transformers = pytest.importorskip("transformers")
t = transformers
V = 64
def L(**kw: Any) -> dict[str, Any]:
    return dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64, **kw)
CASES: dict[str, Callable[[], Any]] = {
    "qwen2": lambda: t.Qwen2ForCausalLM(t.Qwen2Config(**L(num_key_value_heads=2))),
    "gpt_neox": lambda: t.GPTNeoXForCausalLM(t.GPTNeoXConfig(**L())),
    "gptj": lambda: t.GPTJForCausalLM(t.GPTJConfig(vocab_size=V, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64)),
    "codegen": lambda: t.CodeGenForCausalLM(t.CodeGenConfig(vocab_size=V, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64)),
    "mpt": lambda: t.MptForCausalLM(t.MptConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=4, max_seq_len=64)),
    "roberta": lambda: t.RobertaForSequenceClassification(t.RobertaConfig(**L(), num_labels=3)),
    "distilbert": lambda: t.DistilBertForSequenceClassification(t.DistilBertConfig(vocab_size=V, dim=32, hidden_dim=48, n_layers=2, n_heads=4, max_position_embeddings=64, num_labels=3)),
    "albert": lambda: t.AlbertForSequenceClassification(t.AlbertConfig(vocab_size=V, embedding_size=16, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_labels=3)),
    "electra": lambda: t.ElectraForSequenceClassification(t.ElectraConfig(vocab_size=V, embedding_size=16, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_labels=3)),
    "deberta_v2": lambda: t.DebertaV2ForSequenceClassification(t.DebertaV2Config(**L(), num_labels=3)),
    "bart": lambda: t.BartForConditionalGeneration(t.BartConfig(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64)),
    "whisper": lambda: t.WhisperForConditionalGeneration(t.WhisperConfig(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, num_mel_bins=8, max_source_positions=16, max_target_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)),
    "cohere": lambda: t.CohereForCausalLM(t.CohereConfig(**L(num_key_value_heads=2))),
    "starcoder2": lambda: t.Starcoder2ForCausalLM(t.Starcoder2Config(**L(num_key_value_heads=2))),
    "olmoe": lambda: t.OlmoeForCausalLM(t.OlmoeConfig(**L(num_key_value_heads=2), num_experts=4, num_experts_per_tok=2)),
    "qwen3_moe": lambda: t.Qwen3MoeForCausalLM(t.Qwen3MoeConfig(**L(num_key_value_heads=2), head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)),
    "phimoe": lambda: t.PhimoeForCausalLM(t.PhimoeConfig(**L(num_key_value_heads=2), num_local_experts=4, num_experts_per_tok=2)),
    "granite": lambda: t.GraniteForCausalLM(t.GraniteConfig(**L(num_key_value_heads=2))),
    "deit": lambda: t.DeiTForImageClassification(t.DeiTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_labels=3)),
    "convnext": lambda: t.ConvNextForImageClassification(t.ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=3)),
    "mobilevit": lambda: t.MobileViTForImageClassification(t.MobileViTConfig(image_size=32, patch_size=2, num_channels=3, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_labels=3)),
}
IMAGES = {"deit": 16, "convnext": 32, "mobilevit": 32}
#: What structure must leave out, and say (a pattern of its warning).
#: Post-norm encoders (``LayerNorm(x + f(x))``): a zeroed block is no identity, so no block is a unit, said so.
POST_NORM = "(layers): removing the block changes what the model computes (a zeroed post-norm block is no identity)"
LEFT_OUT = {
    "mpt": "the heads of 'transformer.blocks.0.attn'", "olmoe": "the heads of 'model.layers.0.self_attn'",
    **{name: POST_NORM for name in ("roberta", "distilbert", "electra", "deberta_v2", "bart")},
    "mobilevit": "the blocks of 'mobilevit.encoder.layer.1.layer' (layers): the config cannot say the depth",
}  # fmt: skip


def inputs(name: str) -> Any:
    g = torch.Generator().manual_seed(1)
    if name in IMAGES:
        return torch.randn(2, 3, IMAGES[name], IMAGES[name], generator=g)
    if name == "whisper":
        return {"input_features": torch.randn(2, 8, 32, generator=g), "decoder_input_ids": torch.randint(1, V, (2, 5), generator=g)}
    if name == "bart":
        ids = torch.randint(3, V, (2, 8), generator=g)
        return {"input_ids": ids, "decoder_input_ids": ids[:, :5]}
    return torch.randint(1, V, (2, 8), generator=g)


@pytest.mark.ci
@pytest.mark.parametrize("name", list(CASES))
def test_every_unit_listed_goes_and_the_shrunk_model_is_the_masked_one(name: str) -> None:
    torch.manual_seed(0)
    model, x = CASES[name]().eval(), inputs(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = fp.structure(model, x)
    said = [str(w.message) for w in caught if issubclass(w.category, (fp.UnitsLeftOutWarning, fp.UnreachedWarning))]
    assert said == [] if name not in LEFT_OUT else (len(said) == 1 and LEFT_OUT[name] in said[0]), said
    assert s and all(g.kind in {"channels", "heads", "kv_groups", "experts", "layers", "hidden"} for g in s.values())
    kinds: tuple[fp.Kind, ...] = ("channels", "heads", "kv_groups", "experts", "layers")  # a block of each stack too
    plans = [fp.structured(s, fp.LnStructured(1, n=2), scope="group", kinds=kinds)]
    if s.of_kinds("hidden"):  # 8 hidden channels: stacked experts need widths in multiples of 16 bytes
        plans.append(fp.structured(s, fp.LnStructured(8, n=2), kinds="hidden"))
    shrunk_exactly(model, fp.compose(*plans)(dict(model.named_parameters())), x, structure=s)
