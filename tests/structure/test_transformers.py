"""The transformers matrix: structure -> structured -> shrink -> save -> reload, outputs equal throughout."""

from __future__ import annotations

import functools
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from _hf import MATRIX, Tiny, inputs, logits, shrunk_exactly, tiny

import funcprune as fp

Tensor = torch.Tensor

#: Per model: the groups of layer 0 (kind, size), by the group's name with "0" for the layer index.
LAYER0: dict[str, dict[str, tuple[str, int]]] = {
    "gpt2": {"transformer.h.0.attn": ("heads", 4), "transformer.h.0.mlp": ("channels", 128)},
    "llama": {"model.layers.0.self_attn": ("kv_groups", 2), "model.layers.0.mlp": ("channels", 48)},
    "qwen3": {"model.layers.0.self_attn": ("kv_groups", 2), "model.layers.0.mlp": ("channels", 48)},
    "mistral": {"model.layers.0.self_attn": ("kv_groups", 2), "model.layers.0.mlp": ("channels", 48)},
    "opt": {"model.decoder.layers.0.self_attn": ("heads", 4), "model.decoder.layers.0": ("channels", 48)},
    "bert": {"bert.encoder.layer.0.attention": ("heads", 4), "bert.encoder.layer.0": ("channels", 48)},
    "vit": {"vit.layers.0.attention": ("heads", 4), "vit.layers.0.mlp": ("channels", 48)},
    "mixtral": {"model.layers.0.self_attn": ("kv_groups", 2), "model.layers.0.mlp": ("experts", 4)},
}
#: Where each model's stack of layers is, where it is no ``model.layers``.
STACKS = {"gpt2": "transformer.h", "opt": "model.decoder.layers", "vit": "vit.layers"}
#: The kinds each model's config can count when every layer keeps the same number (GPT-2, OPT, BERT and
#: ViT derive the head size from the hidden size: fewer heads need the record).
CONFIG_KINDS: dict[str, Any] = {name: ("channels",) for name in MATRIX} | {
    name: ("channels", "kv_groups") for name in ("llama", "qwen3", "mistral")
} | {"mixtral": ("kv_groups", "experts")}


#: BERT's layers are post-norm (``LayerNorm(x + f(x))``): a zeroed block is no identity, and structure says so.
POST_NORM = "the blocks of 'bert.encoder.layer' (layers): removing the block changes what the model computes"


@functools.cache
def model_and_structure(name: str) -> tuple[Tiny, fp.Structure]:
    t = tiny(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", fp.UnitsLeftOutWarning)
        s = fp.structure(t.model, inputs(t))
    said = [str(w.message) for w in caught if issubclass(w.category, fp.UnitsLeftOutWarning)]
    assert said == ([] if name != "bert" else [said[0]]) and (name != "bert" or POST_NORM in said[0]), said
    return t, s


def shrunk(t: Tiny, masks: fp.Masks) -> Any:
    """``fp.shrink``'s model: exactly what the masks prune goes (:func:`_hf.shrunk_exactly`)."""
    return shrunk_exactly(t.model, masks, inputs(t))


@pytest.mark.parametrize("name", MATRIX)
def test_structure_finds_the_units_of_every_layer(name: str) -> None:
    t, s = model_and_structure(name)
    for group, (kind, size) in LAYER0[name].items():
        assert (s[group].kind, s[group].size) == (kind, size), group
        again = group.replace(".0", ".1", 1)
        assert (s[again].kind, s[again].size) == (kind, size), again
    widths = {g for g, units in s.items() if units.kind not in ("layers", "hidden")}
    assert all(".0" in g or ".1" in g for g in widths)  # the output layers (BERT's pooler) are left out
    layers = {g: units.size for g, units in s.items() if units.kind == "layers"}
    assert layers == ({} if name == "bert" else {STACKS.get(name, "model.layers"): 2})  # pre-norm: blocks can go
    hidden = {g: units.size for g, units in s.items() if units.kind == "hidden"}  # RMS norms: the hidden size goes
    assert hidden == ({"hidden": 32} if name in ("llama", "qwen3", "mistral", "mixtral") else {})
    assert ("hidden" in s.left_out) == (not hidden)
    params = dict(t.model.named_parameters())
    for units in s.values():  # every member fits its parameter
        for m in units.members:
            assert m.end(units.size) <= params[m.name].shape[m.dim]


@pytest.mark.parametrize("name", MATRIX)
def test_non_uniform_units_go_and_reload_with_load_shrunk(name: str, tmp_path: Path) -> None:
    t, s = model_and_structure(name)
    plan = fp.structured(s, fp.LnStructured(0.4, n=2), scope="global", normalize="mean")
    masks = plan(dict(t.model.named_parameters()))
    small = shrunk(t, masks)
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in t.model.parameters())
    small.save_pretrained(tmp_path)
    again = fp.load_shrunk(tmp_path)
    assert type(again) is type(t.model)
    torch.testing.assert_close(logits(again, inputs(t)), logits(small, inputs(t)), atol=0, rtol=0)


@pytest.mark.parametrize("name", MATRIX)
def test_uniform_widths_are_in_the_config_and_reload_with_plain_from_pretrained(name: str, tmp_path: Path) -> None:
    t, s = model_and_structure(name)
    plan = fp.structured(s, fp.LnStructured(0.5, n=2), kinds=CONFIG_KINDS[name], scope="group")
    small = shrunk(t, plan(dict(t.model.named_parameters())))
    config, before = small.config, getattr(t.model, "config")
    assert not hasattr(config, "funcprune_shrunk")
    if "kv_groups" in CONFIG_KINDS[name]:
        assert (config.num_attention_heads, config.num_key_value_heads) == (2, 1)
        assert config.head_dim == before.hidden_size // before.num_attention_heads
    width = {"gpt2": "n_inner", "opt": "ffn_dim"}.get(name, "intermediate_size")
    if name == "mixtral":  # its MLP is experts
        assert config.num_local_experts == 2
    else:
        assert getattr(config, width) == (64 if name == "gpt2" else 24)
    small.save_pretrained(tmp_path)
    cls: Any = type(t.model)
    again = cls.from_pretrained(tmp_path)
    torch.testing.assert_close(logits(again, inputs(t)), logits(small, inputs(t)), atol=0, rtol=0)


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_heads_the_config_cannot_count_are_recorded(name: str, tmp_path: Path) -> None:
    t, s = model_and_structure(name)
    masks = fp.structured(s, fp.LnStructured(1, n=2), kinds="heads", scope="group")(dict(t.model.named_parameters()))
    small = shrunk(t, masks)
    record = small.config.funcprune_shrunk
    assert small.config.to_dict()["funcprune_shrunk"] == record
    attention = "transformer.h.0.attn" if name == "gpt2" else "bert.encoder.layer.0.attention.self"
    heads = "num_heads" if name == "gpt2" else "num_attention_heads"
    assert record["attributes"][attention][heads] == 3
    small.save_pretrained(tmp_path)
    torch.testing.assert_close(logits(fp.load_shrunk(tmp_path), inputs(t)), logits(small, inputs(t)), atol=0, rtol=0)


def test_output_layers_are_units_only_when_asked() -> None:
    t, s = model_and_structure("bert")
    with pytest.warns(fp.UnitsLeftOutWarning, match=re.escape(POST_NORM)):
        with_outputs = fp.structure(t.model, inputs(t), outputs=True)
    assert set(with_outputs) - set(s) == {"bert.pooler.dense"}
    assert with_outputs["bert.pooler.dense"].names == ("bert.pooler.dense.weight", "bert.pooler.dense.bias", "classifier.weight")


def test_load_shrunk_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="load_shrunk: path must be a directory"):
        fp.load_shrunk(tmp_path / "missing")
    t, _ = model_and_structure("llama")
    model: Any = t.model
    model.config.funcprune_shrunk = {"shapes": {"lm_head.weight": "big"}}
    try:
        model.save_pretrained(tmp_path)
    finally:
        del model.config.funcprune_shrunk
    with pytest.raises(ValueError, match=r"record in '.*config\.json' gives 'lm_head.weight' the shape 'big'; expected a list"):
        fp.load_shrunk(tmp_path)
