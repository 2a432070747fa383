"""Every architecture, not just the matrix: what ``structure`` lists, ``shrink`` removes (issue 35).

The new architectures (``_hf.ARCHITECTURES``: Gemma 2 under eager attention,
Gemma 3, Phi-3, BLOOM, T5, Falcon, StableLM 2, DeepSeek-V3, GraniteMoE) go
through the documented path as the matrix does: structure -> structured
(global and group scope) -> shrink -> save -> reload, and generate() with a
cache gives what the masked model gives. Every model, old and new, is walked
to check that each unit ``structure`` lists goes when a plan prunes it.
"""

from __future__ import annotations

import functools
import re
import warnings
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from _hf import ARCHITECTURES, MATRIX, Tiny, inputs, logits, shrunk_exactly, tiny

import funcprune as fp
from funcprune._experts import never_routed

Tensor = torch.Tensor

#: Per architecture: the groups of layer 0 (kind, size), by name ("0" is the layer index, also read as "1").
LAYER0: dict[str, dict[str, tuple[str, int]]] = {
    "gemma2": {"model.layers.0.self_attn": ("kv_groups", 2), "model.layers.0.mlp": ("channels", 48)},
    "gemma3": {"model.layers.0.self_attn": ("kv_groups", 2), "model.layers.0.mlp": ("channels", 48)},
    "phi3": {"model.layers.0.self_attn": ("kv_groups", 2), "model.layers.0.mlp": ("channels", 48)},
    "bloom": {"transformer.h.0.mlp": ("channels", 128)},
    "t5": {"encoder.block.0.layer.1.DenseReluDense": ("channels", 48),
           "decoder.block.0.layer.1.EncDecAttention": ("heads", 4)},
    "falcon": {"transformer.h.0.self_attention": ("heads", 4), "transformer.h.0.mlp": ("channels", 128)},
    "stablelm": {"model.layers.0.mlp": ("channels", 48)},
    "deepseek_v3": {"model.layers.0.self_attn": ("heads", 4)},
    "granitemoe": {"model.layers.0.self_attn": ("kv_groups", 2), "model.layers.0.block_sparse_moe": ("experts", 4)},
}  # fmt: skip
#: Groups beyond layer 0's pattern: T5's heads go across a stack (its layers share one position bias),
#: DeepSeek-V3's layer 0 has a dense MLP, its layer 1 routed experts and shared experts.
MORE: dict[str, dict[str, tuple[str, int]]] = {
    "t5": {"encoder.block": ("heads", 4), "decoder.block": ("heads", 4)},
    "deepseek_v3": {
        "model.layers.0.mlp": ("channels", 48), "model.layers.1.mlp": ("experts", 4),
        "model.layers.1.mlp.shared_experts": ("channels", 16),
    },
}  # fmt: skip
#: What structure leaves out, and says why, on the architectures where heads cannot go.
LEFT_OUT: dict[str, str] = {
    # ALiBi: a slope per head computed from the head count, added to the scores (baddbmm)
    "bloom": r"the heads of 'transformer.h.0.self_attention': they go all together or not at all \(node 'baddbmm'",
    # one LayerNorm module per head, over the parts of a split by heads
    "stablelm": r"the heads of 'model.layers.0.self_attn': they go all together or not at all \(node 'split' .* cuts "
    r"them into parts the shrunk model recomputes\)",
}  # fmt: skip


@functools.cache
def model_and_structure(name: str) -> tuple[Tiny, fp.Structure, tuple[str, ...]]:
    """The tiny model, its structure, and the messages of the warnings ``structure`` gave."""
    t = tiny(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", fp.UnitsLeftOutWarning)
        s = fp.structure(t.model, inputs(t))
    return t, s, tuple(str(w.message) for w in caught if issubclass(w.category, fp.UnitsLeftOutWarning))


def shrunk(t: Tiny, masks: fp.Masks, structure: fp.Structure | None = None) -> Any:
    """The shrunk model; every unit the masks prune goes, exactly, and it computes the masked model."""
    return shrunk_exactly(t.model, masks, inputs(t), structure)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_structure_finds_the_units_of_every_layer_and_says_what_it_leaves_out(name: str) -> None:
    t, s, said = model_and_structure(name)
    for group, (kind, size) in LAYER0[name].items():
        assert (s[group].kind, s[group].size) == (kind, size), group
        again = group.replace(".0", ".1", 1)
        assert (s[again].kind, s[again].size) == (kind, size), again
    for group, (kind, size) in MORE.get(name, {}).items():
        assert (s[group].kind, s[group].size) == (kind, size), group
    assert all(g.kind in {"channels", "heads", "kv_groups", "experts", "layers", "hidden"} for g in s.values())
    params = dict(t.model.named_parameters())
    for units in s.values():  # every member fits its parameter
        for m in units.members:
            assert m.end(units.size) <= params[m.name].shape[m.dim]
    if name in LEFT_OUT:
        assert len(said) == 1 and re.search(LEFT_OUT[name], said[0]), said
    else:
        assert said == ()


@pytest.mark.parametrize("name", (*MATRIX, "qwen2_moe", *ARCHITECTURES))
def test_every_unit_structure_lists_goes_when_a_plan_prunes_it(name: str) -> None:
    t, s, _ = model_and_structure(name)
    kinds: tuple[fp.Kind, ...] = ("channels", "heads", "kv_groups", "experts", "layers")  # a block of each stack too
    plans = [fp.structured(s, fp.LnStructured(1, n=2), scope="group", kinds=kinds)]
    if s.of_kinds("hidden"):  # 8 hidden channels: stacked experts need widths in multiples of 16 bytes
        plans.append(fp.structured(s, fp.LnStructured(8, n=2), kinds="hidden"))
    masks = fp.compose(*plans)(dict(t.model.named_parameters()))
    small = shrunk(t, masks, structure=s)  # its analysis, where still valid
    with warnings.catch_warnings():  # unchecked (no masked model run): the same model, bit for bit, and config
        warnings.simplefilter("error", fp.KeptChannelsWarning)
        unchecked: Any = fp.shrink(t.model, masks, inputs(t), structure=s, check=False)
    mine, theirs = unchecked.state_dict(), small.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k].view(torch.uint8), theirs[k].view(torch.uint8)) if mine[k].is_floating_point()
               else torch.equal(mine[k], theirs[k]) for k in mine)  # fmt: skip
    assert unchecked.config.to_dict() == small.config.to_dict()


@pytest.mark.ci
@pytest.mark.parametrize("name", ARCHITECTURES)
@pytest.mark.parametrize("scope", ["global", "group"])
def test_plans_go_save_and_reload(name: str, scope: Literal["global", "group"], tmp_path: Path) -> None:
    t, s, _ = model_and_structure(name)
    plan = fp.structured(s, fp.LnStructured(0.5, n=2), scope=scope, normalize="mean" if scope == "global" else None)
    small = shrunk(t, plan(dict(t.model.named_parameters())))
    small.save_pretrained(tmp_path)
    again = fp.load_shrunk(tmp_path)
    assert type(again) is type(t.model)
    torch.testing.assert_close(logits(again, inputs(t)), logits(small, inputs(t)), atol=0, rtol=0)
    if not hasattr(small.config, "funcprune_shrunk"):  # the config says it all: plain from_pretrained too
        cls: Any = type(t.model)
        plain = cls.from_pretrained(tmp_path)
        torch.testing.assert_close(logits(plain, inputs(t)), logits(small, inputs(t)), atol=0, rtol=0)


@pytest.mark.ci
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_generate_with_a_cache_gives_what_the_masked_model_gives(name: str) -> None:
    t, s, _ = model_and_structure(name)
    masks = fp.structured(s, fp.LnStructured(0.5, n=2), scope="group")(dict(t.model.named_parameters()))
    small = shrunk(t, masks)
    with warnings.catch_warnings():  # the baked copy routes to removed experts: never_routed below stops that
        warnings.filterwarnings("ignore", message="bake: the masks prune router rows entirely")
        baked: Any = fp.bake(t.model, masks)
    ids = t.args[0][:, :5]
    settings = dict(max_new_tokens=4, do_sample=False, use_cache=True, return_dict_in_generate=True, output_scores=True)
    with torch.no_grad():
        got = small.generate(input_ids=ids, **settings)
        with never_routed(baked, masks):  # a removed expert is never routed to, as in the shrunk model
            want = baked.generate(input_ids=ids, **settings)
    assert torch.equal(got.sequences, want.sequences)
    for a, b in zip(got.scores, want.scores, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_eager_attention_gives_the_units_sdpa_gives(name: str) -> None:
    t, s, _ = model_and_structure(name)
    eager = tiny(name)
    model: Any = eager.model
    model.config._attn_implementation = "eager"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fp.UnitsLeftOutWarning)  # BERT's post-norm layers, said as with SDPA
        assert fp.structure(eager.model, inputs(eager)) == s


def test_t5_heads_carry_their_column_of_the_position_bias_its_layers_share() -> None:
    _, s, _ = model_and_structure("t5")
    names = s["encoder.block"].names
    assert "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight" in names
    assert {n.split(".")[2] for n in names} == {"0", "1"}  # both layers' heads: one bias for the stack
    assert not any("relative_attention_bias" in n for g in s.values() if g.kind == "channels" for n in g.names)


def test_a_model_that_builds_a_cache_unless_told_is_analyzed_with_its_ids_alone() -> None:
    t = tiny("granitemoe")
    ids = t.args[0]  # no use_cache=False: GraniteMoE's forward takes it through **kwargs only
    s = fp.structure(t.model, ids)
    assert s["model.layers.0.block_sparse_moe"].kind == "experts"
    masks = fp.structured(s, fp.LnStructured(1, n=2), scope="group")(dict(t.model.named_parameters()))
    small = fp.shrink(t.model, masks, ids)
    torch.testing.assert_close(
        small(ids).logits, fp.functional_call_masked(t.model, dict(t.model.named_parameters()), masks, ids).logits
    )
    params, pruned = fp.oneshot(t.model, [{"input_ids": ids}], method="wanda", spec=fp.L1Unstructured(0.5))
    assert pruned and all(int((~m).sum()) == m.numel() // 2 for m in pruned.values())


def test_a_router_s_score_correction_bias_follows_its_experts_and_never_routes_to_a_removed_one() -> None:
    t = tiny("deepseek_v3")
    gate: Any = t.model.get_submodule("model.layers.1.mlp.gate")
    s = fp.structure(t.model, inputs(t))
    masks = fp.structured(s.of_kinds("experts"), fp.LnStructured(1, n=2))(dict(t.model.named_parameters()))
    (removed,) = [e for e in range(4) if not bool(masks["model.layers.1.mlp.gate.weight"][e].any())]
    with torch.no_grad():  # a trained bias, large at the removed expert: it would be picked, were it not -inf there
        gate.e_score_correction_bias.copy_(torch.linspace(-1.0, 1.0, 4))
        gate.e_score_correction_bias[removed] = 5.0
    small = shrunk(t, masks)
    kept = [e for e in range(4) if e != removed]
    assert torch.equal(small.get_submodule("model.layers.1.mlp.gate").e_score_correction_bias, gate.e_score_correction_bias[kept])


def test_llama_with_24_of_32_heads_keeps_its_config_records_the_widths_and_reloads(tmp_path: Path) -> None:
    # Llama-3.1-8B minus a quarter of its KV groups, narrowed: 32 heads of 4 in 8 KV groups on a hidden size of 128
    config = __import__("transformers").LlamaConfig(
        vocab_size=64, hidden_size=128, intermediate_size=64, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=8, head_dim=4,
    )  # fmt: skip
    torch.manual_seed(0)
    model = __import__("transformers").LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (2, 6))
    s = fp.structure(model, ids)
    masks = fp.structured(s.of_kinds("kv_groups"), fp.LnStructured(2, n=2), scope="group")(dict(model.named_parameters()))
    with pytest.warns(fp.ShrunkConfigWarning, match=r"not a multiple of the number of attention heads \(24\)"):
        small: Any = fp.shrink(model, masks, ids)
    assert small.config.num_attention_heads == 32 and "funcprune_shrunk" in small.config.to_dict()
    assert small.model.layers[0].self_attn.o_proj.in_features == 24 * 4
    small.save_pretrained(tmp_path)
    again = fp.load_shrunk(tmp_path)
    torch.testing.assert_close(again(ids).logits, small(ids).logits, atol=0, rtol=0)


def test_experts_routed_by_groups_that_cannot_lose_one_each_are_left_out() -> None:
    # DeepSeek-V3 with n_group=2 over 4 experts: each group keeps the two its score reads, so none can go
    t = tiny("deepseek_v3")
    model: Any = t.model
    for layer in model.model.layers[1:]:
        layer.mlp.gate.num_group = 2
    s = fp.structure(model, inputs(t))
    assert "model.layers.1.mlp" not in s and s["model.layers.1.mlp.shared_experts"].kind == "channels"
