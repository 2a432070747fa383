"""prunable's output layers and Conv1D (funcprune._targets._outputs): hand-built models and the transformers matrix.

Issue 23, item 6: ``fp.prunable(model)`` leaves out the output layers and a
weight tied to an input embedding unless ``outputs=True``, and counts
transformers' ``Conv1D`` (GPT-2) as a Linear.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import funcprune as fp
from _models import Conv1D, MiniGPT

# --- hand-built: Conv1D, ties, a model that says which its heads are -----------------


def test_conv1d_is_a_linear_whose_weight_is_selected() -> None:
    model = nn.Sequential(Conv1D(6, 4), nn.ReLU(), Conv1D(4, 6), nn.LayerNorm(4))
    assert fp.prunable(model) == ["0.weight", "2.weight"]


def test_a_module_named_conv1d_that_does_not_fit_is_not_one() -> None:
    class Conv1D(nn.Module):  # named so, but its weight is not (in, nf)
        def __init__(self) -> None:
            super().__init__()
            self.nf = 3
            self.weight = nn.Parameter(torch.randn(3, 4))

    assert fp.prunable(nn.Sequential(Conv1D())) == []
    assert fp.input_dims(nn.Sequential(Conv1D())) == {}


def test_a_head_tied_to_the_token_embedding_is_left_out_unless_asked() -> None:
    model = MiniGPT()
    assert fp.prunable(model) == ["c_fc.weight", "c_proj.weight"]
    assert fp.prunable(model, embeddings=True) == ["c_fc.weight", "c_proj.weight"]  # the embedding is the head
    assert fp.prunable(model, outputs=True) == ["wte.weight", "c_fc.weight", "c_proj.weight"]
    assert fp.prunable(model, embeddings=True, outputs=True) == ["wte.weight", "c_fc.weight", "c_proj.weight"]


def test_in_a_model_of_your_own_nothing_is_guessed() -> None:
    """An untied last Linear is no output layer to funcprune: the model does not say so."""
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.Linear(8, 10))
    assert fp.prunable(model) == fp.prunable(model, outputs=True) == ["1.weight", "2.weight"]
    assert fp.prunable(model, embeddings=True) == ["0.weight", "1.weight", "2.weight"]


def test_embeddings_shared_with_one_another_are_no_output() -> None:
    model = nn.ModuleDict({"enc": nn.Embedding(10, 4), "dec": nn.Embedding(10, 4), "fc": nn.Linear(4, 4)})
    model["dec"].weight = model["enc"].weight
    assert fp.prunable(model, embeddings=True) == ["enc.weight", "fc.weight"]


class Body(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.attn = Conv1D(24, 8)
        self.mlp = nn.Linear(8, 8)
        self.pooler = nn.Sequential(nn.Linear(8, 8), nn.Tanh())


class ForTask(nn.Module):
    """Shaped like a transformers PreTrainedModel (its base model under ``base_model_prefix``), without transformers."""

    base_model_prefix = "body"

    def __init__(self, *, tied: bool) -> None:
        super().__init__()
        self.body = Body()
        self.head = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 3))
        self.lm_head = nn.Linear(8, 10, bias=False)
        if tied:
            self.lm_head.weight = self.body.embed.weight

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head


BODY = ["body.attn.weight", "body.mlp.weight"]


@pytest.mark.parametrize("tied", [False, True])
def test_a_transformers_model_is_read_from_its_base_model_pooler_and_output_embeddings(tied: bool) -> None:
    model = ForTask(tied=tied)
    assert fp.prunable(model) == BODY
    heads = ["head.0.weight", "head.2.weight"] + ([] if tied else ["lm_head.weight"])
    embed = ["body.embed.weight"] if tied else []  # the tied head, under its first name
    assert fp.prunable(model, outputs=True) == embed + BODY + ["body.pooler.0.weight"] + heads
    assert fp.prunable(model, embeddings=True) == BODY if tied else ["body.embed.weight", *BODY]


def test_a_transformers_model_inside_your_module_and_a_base_model_alone() -> None:
    wrapped = nn.ModuleDict({"lm": ForTask(tied=False), "extra": nn.Linear(8, 8)})
    assert fp.prunable(wrapped) == [f"lm.{n}" for n in BODY] + ["extra.weight"]

    class BaseAlone(Body):  # a base model itself (as GPT2Model): its pooler is still an output layer
        base_model_prefix = "transformer"

        def get_output_embeddings(self) -> None:
            return None

    assert fp.prunable(BaseAlone()) == ["attn.weight", "mlp.weight"]
    assert fp.prunable(BaseAlone(), outputs=True) == ["attn.weight", "mlp.weight", "pooler.0.weight"]


def test_outputs_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"^prunable: outputs must be a bool, got 1 of type int$"):
        fp.prunable(nn.Linear(2, 2), outputs=1)  # type: ignore[arg-type]


# --- the transformers matrix --------------------------------------------------------

#: Per family: the weights of layer 0's attention and MLP (suffixes), the output layers.
LAYERS: dict[str, tuple[list[str], list[str]]] = {
    "gpt2": (["transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj", "transformer.h.0.mlp.c_fc",
              "transformer.h.0.mlp.c_proj"], ["lm_head"]),
    "llama": ([f"model.layers.0.self_attn.{p}_proj" for p in "qkvo"]
              + [f"model.layers.0.mlp.{p}_proj" for p in ("gate", "up", "down")], ["lm_head"]),
    "qwen3": ([f"model.layers.0.self_attn.{p}_proj" for p in "qkvo"]
              + [f"model.layers.0.mlp.{p}_proj" for p in ("gate", "up", "down")], ["lm_head"]),
    "mistral": ([f"model.layers.0.self_attn.{p}_proj" for p in "qkvo"]
                + [f"model.layers.0.mlp.{p}_proj" for p in ("gate", "up", "down")], ["lm_head"]),
    "opt": ([f"model.decoder.layers.0.self_attn.{p}" for p in ("k_proj", "v_proj", "q_proj", "out_proj")]
            + ["model.decoder.layers.0.fc1", "model.decoder.layers.0.fc2"], ["lm_head"]),
    "bert": ([f"bert.encoder.layer.0.attention.self.{p}" for p in ("query", "key", "value")]
             + [f"bert.encoder.layer.0.{p}.dense" for p in ("attention.output", "intermediate", "output")],
             ["bert.pooler.dense", "classifier"]),
    "vit": ([f"vit.layers.0.attention.{p}_proj" for p in "qkvo"] + ["vit.layers.0.mlp.fc1", "vit.layers.0.mlp.fc2"],
            ["classifier"]),
    # Mixtral's MLP is its experts, fused 3-D tensors of no Linear-like layer: not selected (issue 23's
    # structure work removes experts as units); its router is no Linear either.
    "mixtral": ([f"model.layers.0.self_attn.{p}_proj" for p in "qkvo"], ["lm_head"]),
}  # fmt: skip


def _tiny(name: str) -> Any:
    hf = pytest.importorskip("_hf", reason="needs transformers (the hf extra)")
    return hf.tiny(name).model


def _matrix() -> tuple[str, ...]:
    return tuple(LAYERS)


def _held(model: nn.Module, module: str) -> set[int]:
    return {id(p) for p in model.get_submodule(module).parameters()}


@pytest.mark.parametrize("family", _matrix())
def test_prunable_on_the_matrix_has_the_layers_and_no_output_layer_nor_tied_embedding(family: str) -> None:
    model = _tiny(family)
    names = fp.prunable(model)
    params = dict(model.named_parameters())
    layers, outputs = LAYERS[family]
    assert [f"{layer}.weight" for layer in layers] == [n for n in names if n.rpartition(".")[0] in layers]
    assert all(n.endswith("weight") and params[n].dim() >= 2 for n in names)
    chosen = {id(params[n]) for n in names}
    for head in outputs:
        assert not chosen & _held(model, head), head  # under whatever name: a tied head is the embedding
    embedding = getattr(model.get_input_embeddings(), "weight", None)  # ViT's is a conv, no token embedding
    assert embedding is None or id(embedding) not in chosen
    if family == "mixtral":
        assert not [n for n in names if ".mlp." in n]  # the experts and router (see LAYERS)


@pytest.mark.parametrize("family", _matrix())
def test_outputs_true_adds_the_output_layers_and_nothing_else(family: str) -> None:
    model = _tiny(family)
    names, every = fp.prunable(model), fp.prunable(model, outputs=True)
    params = dict(model.named_parameters())
    added = [n for n in every if n not in names]
    assert names == [n for n in every if n in names]  # the same order
    _, outputs = LAYERS[family]
    heads = set().union(*(_held(model, head) for head in outputs))
    assert added and all(id(params[n]) in heads for n in added)
    assert {id(p) for n, p in params.items() if n in every} >= {
        id(model.get_submodule(head).weight) for head in outputs
    }


@pytest.mark.parametrize("family", ["gpt2", "opt"])
def test_the_tied_embedding_is_left_out_also_when_embeddings_are_asked(family: str) -> None:
    model = _tiny(family)
    embedding = model.get_input_embeddings()
    assert model.get_output_embeddings().weight is embedding.weight  # tied
    params = dict(model.named_parameters())
    assert not [n for n in fp.prunable(model, embeddings=True) if params[n] is embedding.weight]
    assert [n for n in fp.prunable(model, embeddings=True, outputs=True) if params[n] is embedding.weight]


def test_gpt2_s_conv1d_weights_are_selected_and_the_readme_one_liner_leaves_its_head_alone() -> None:
    model = _tiny("gpt2")
    names = fp.prunable(model)
    assert names == [
        f"transformer.h.{i}.{layer}.weight"
        for i in range(2)
        for layer in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    ]
    params = {n: p.detach() for n, p in model.named_parameters()}
    masks = fp.global_unstructured(fp.prunable(model), fp.L1Unstructured(sparsity=0.5))(params)
    assert list(masks) == names
    assert sum(int(m.sum()) for m in masks.values()) == sum(m.numel() for m in masks.values()) // 2
    pruned = fp.apply_masks(params, masks)
    assert torch.equal(pruned["transformer.wte.weight"], params["transformer.wte.weight"])  # = lm_head.weight
    assert model.lm_head.weight is model.transformer.wte.weight
