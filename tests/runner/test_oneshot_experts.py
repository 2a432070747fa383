"""fp.oneshot inside every expert: each slice W[e] of a stacked expert weight pruned as a Linear on e's tokens.

The reference is the definition, computed the slow way with the public
functions on an ``nn.Linear`` holding ``W[e]``: block by block, on a float64
copy of the model whose earlier blocks are pruned (baked), the experts
module's inputs are captured by a forward pre-hook; expert ``e``'s tokens
are the real (not padding) rows that ``top_k_index`` routes to it; its
``gate_up_proj`` slice is calibrated on them, its ``down_proj`` slice on
``act(gate) * up`` of the block's dense ``gate_up_proj`` slice (all the
weights of one block are calibrated on the same inputs). The dense Linears
of the block (attention, shared experts) are calibrated on the whole
model's forward, as ``test_oneshot.py``'s definition does.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import funcprune as fp
from funcprune._experts import routers

sys.path.insert(0, str(Path(__file__).parents[1]))
import _hf  # noqa: E402

Tensor = torch.Tensor
transformers = _hf.transformers
SPECS: dict[str, fp.Spec] = {
    "unstructured": fp.L1Unstructured(0.5),
    "per_row": fp.PerSlice(fp.L1Unstructured(0.5), dim=0),
    "2:4": fp.NM(2, 4),
}


def moe(name: str, seed: int = 0) -> Any:
    """A tiny float64 MoE model: the matrix's (Mixtral, Qwen2-MoE, DeepSeek-V3), or Qwen3-MoE / OLMoE built here."""
    if name in ("mixtral", "qwen2_moe", "deepseek_v3"):
        model: Any = _hf.tiny(name, seed=seed).model
    else:
        common: dict[str, Any] = {"vocab_size": _hf.VOCAB, "max_position_embeddings": 64, "hidden_size": 32,
                                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip
        torch.manual_seed(seed)
        if name == "qwen3_moe":
            config = transformers.Qwen3MoeConfig(**common, intermediate_size=48, moe_intermediate_size=16,
                                                 num_experts=4, num_experts_per_tok=2, head_dim=8)  # fmt: skip
            model = transformers.Qwen3MoeForCausalLM(config).eval()
        else:
            config = transformers.OlmoeConfig(**common, intermediate_size=16, num_experts=4, num_experts_per_tok=2)
            model = transformers.OlmoeForCausalLM(config).eval()
    model.config._experts_implementation = "eager"  # grouped_mm takes no float64
    return model.double()


def batches(count: int = 2) -> list[dict[str, Any]]:
    """Calibration batches of 2 sequences of 8 tokens; the second sequence of each padded (its last 3 tokens)."""
    g = torch.Generator().manual_seed(5)
    mask = torch.ones(2, _hf.SEQUENCE, dtype=torch.long)
    mask[1, -3:] = 0
    return [{"input_ids": torch.randint(0, _hf.VOCAB, (2, _hf.SEQUENCE), generator=g), "attention_mask": mask,
             "use_cache": False} for _ in range(count)]  # fmt: skip


def block_of(name: str) -> int:
    return int(name.split(".layers.")[1].split(".")[0])


def linear_of(weight: Tensor) -> nn.Linear:
    """An ``nn.Linear`` holding ``weight`` (out, in), without bias."""
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(weight)
    return layer


def prune_linear(weight: Tensor, rows: Tensor, method: str, spec: fp.Spec) -> tuple[Tensor, Tensor]:
    """``(new weight, mask)``: the public functions on a Linear holding ``weight``, fed ``rows`` (magnitude if none)."""
    layer, here = linear_of(weight), {"weight": weight}
    if rows.shape[0] == 0:
        return weight, fp.Plan({"weight": spec})(here)["weight"]
    if method == "wanda":
        norms = fp.input_norms(layer, [rows], ["weight"])
        return weight, fp.Plan({"weight": spec})(here, scores=fp.wanda(here, norms))["weight"]
    new, masks = fp.sparsegpt(here, fp.hessians(layer, [rows], ["weight"]), spec)
    return new["weight"], masks["weight"]


def definition(
    model: Any, calibration: list[dict[str, Any]], method: str, spec: fp.Spec
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Every block pruned on what the blocks before it, pruned, compute; each expert's slices on its tokens."""
    model = copy.deepcopy(model)
    layers = {block_of(r.experts): r for r in routers(model)}
    dense = [n for n in fp.prunable(model) if ".layers." in n and n not in {r.weight for r in layers.values()}]
    weights: dict[str, Tensor] = {}
    masks: dict[str, Tensor] = {}
    for i in range(len(model.model.layers)):
        params = dict(model.named_parameters())
        group = [n for n in dense if block_of(n) == i]
        here = {n: params[n].detach().clone() for n in group}
        if method == "wanda":
            got = fp.Plan(dict.fromkeys(group, spec))(here, scores=fp.wanda(here, fp.input_norms(model, calibration, group)))
            new = here
        else:
            new, got = fp.sparsegpt(here, fp.hessians(model, calibration, group), spec)
        weights.update(new)
        masks.update(got)
        if i in layers:
            experts: Any = model.get_submodule(layers[i].experts)
            seen: list[tuple[Tensor, Tensor]] = []
            handle = experts.register_forward_pre_hook(lambda m, args: seen.append((args[0], args[1])))
            with torch.no_grad():
                for batch in calibration:
                    model(**batch)
            handle.remove()
            real = [b["attention_mask"].flatten().bool() for b in calibration]
            gate_up, down = (f"{layers[i].experts}.{a}" for a in ("gate_up_proj", "down_proj"))
            stacks: dict[str, list[tuple[Tensor, Tensor]]] = {gate_up: [], down: []}
            for e in range(layers[i].count):
                rows = torch.cat([h[r & (idx == e).any(-1)] for (h, idx), r in zip(seen, real, strict=True)])
                w_gu, w_d = params[gate_up][e].detach(), params[down][e].detach()
                g, u = nn.functional.linear(rows, w_gu).chunk(2, dim=-1)
                stacks[gate_up].append(prune_linear(w_gu, rows, method, spec))
                stacks[down].append(prune_linear(w_d, experts.act_fn(g) * u, method, spec))
            for n, pairs in stacks.items():
                weights[n], masks[n] = torch.stack([w for w, _ in pairs]), torch.stack([m for _, m in pairs])
                group.append(n)
        with torch.no_grad():
            for n in group:
                params[n].copy_(weights[n] * masks[n])
    return weights, masks


def check_counts(masks: Mapping[str, Tensor], spec: fp.Spec) -> None:
    """Exact counts on every (out, in) matrix: each expert's slice counted apart."""
    for mask in masks.values():
        for view in mask if mask.dim() == 3 else [mask]:
            if isinstance(spec, fp.NM):
                assert torch.all(view.reshape(view.shape[0], -1, 4).sum(dim=-1) == 2)
            elif isinstance(spec, fp.PerSlice):
                assert torch.all((~view).sum(dim=1) == round(0.5 * view.shape[1]))
            else:
                assert int((~view).sum()) == round(0.5 * view.numel())


@pytest.mark.parametrize(
    ("name", "method", "shape"),
    [("mixtral", "wanda", "per_row"), ("qwen3_moe", "sparsegpt", "unstructured"), ("qwen2_moe", "wanda", "2:4"),
     *(pytest.param(*case, marks=pytest.mark.ci) for case in [  # the default suite is at its time limit
         ("mixtral", "sparsegpt", "2:4"), ("qwen3_moe", "wanda", "2:4"), ("olmoe", "sparsegpt", "per_row"),
         ("deepseek_v3", "wanda", "unstructured")])],
)  # fmt: skip
def test_each_expert_is_pruned_as_a_linear_on_the_tokens_routed_to_it(name: str, method: str, shape: str) -> None:
    spec = SPECS[shape]
    model = moe(name)
    calibration = batches()
    params, masks = fp.oneshot(model, calibration, method=method, spec=spec)
    layers = routers(model)
    stacked = [n for r in layers for n in r.parameters]
    assert set(stacked) <= set(masks)  # every expert weight by default
    assert not {r.weight for r in layers} & set(masks)  # routers stay dense
    if name in ("qwen2_moe", "deepseek_v3"):  # the shared expert: an ordinary MLP of Linears
        assert any("shared_expert" in n and masks[n].dim() == 2 for n in masks)
    weights, expected = definition(model, calibration, method, spec)
    assert list(masks) == [n for n in fp.prunable(model, experts=True) if n in expected]
    assert masks.keys() == expected.keys()
    for n in masks:
        assert torch.equal(masks[n], expected[n]), n
        torch.testing.assert_close(params[n], weights[n], rtol=0, atol=1e-9)
    check_counts(masks, spec)


def test_an_expert_no_token_reaches_is_pruned_by_magnitude_with_a_warning() -> None:
    model = moe("deepseek_v3")
    gate = model.model.layers[1].mlp.gate
    with torch.no_grad():
        gate.e_score_correction_bias[3] = -1e4  # expert 3 is never among the top 2
    with pytest.warns(fp.UnroutedExpertsWarning, match=r"experts \[3\] of 4 of 'model\.layers\.1\.mlp\.experts'"):
        params, masks = fp.oneshot(model, batches(), method="sparsegpt", spec=fp.NM(2, 4))
    for attr in ("gate_up_proj", "down_proj"):
        n = f"model.layers.1.mlp.experts.{attr}"
        w = dict(model.named_parameters())[n]
        assert torch.equal(masks[n][3], fp.Plan({"w": fp.NM(2, 4)})({"w": w[3]})["w"])
        assert torch.equal(params[n][3], w[3])  # not updated
        assert not torch.equal(params[n][0], w[0])  # a routed expert's are (SparseGPT)
    weights, expected = definition(model, batches(), "sparsegpt", fp.NM(2, 4))
    assert all(torch.equal(masks[n], expected[n]) for n in masks)
    check_counts(masks, fp.NM(2, 4))


def test_prunable_lists_the_stacked_expert_weights_read_as_linear_weights() -> None:
    model = moe("mixtral")
    plain, with_experts = fp.prunable(model), fp.prunable(model, experts=True)
    stacked = [f"model.layers.{i}.mlp.experts.{a}" for i in range(2) for a in ("gate_up_proj", "down_proj")]
    assert [n for n in with_experts if n not in plain] == stacked
    assert set(plain) <= set(with_experts)
    with pytest.raises(TypeError, match="experts must be a bool"):
        fp.prunable(model, experts=1)  # type: ignore[arg-type]


def gpt_oss() -> Any:
    config = transformers.GptOssConfig(vocab_size=_hf.VOCAB, hidden_size=32, intermediate_size=16,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       head_dim=8, num_local_experts=4, num_experts_per_tok=2)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(config).eval()
    model.config._experts_implementation = "eager"  # grouped_mm takes no float64
    return model.double()


def test_slices_stored_in_out_are_read_along_dim_0_and_biases_are_refused_by_name() -> None:
    model = gpt_oss()  # x @ W[e]: gate_up_proj (E, H, 2I), down_proj (E, I, H), with biases
    listed = [n for n in fp.prunable(model, experts=True) if ".experts." in n]
    assert listed == [f"model.layers.{i}.mlp.experts.{a}" for i in range(2) for a in ("gate_up_proj", "down_proj")]
    params, masks = fp.oneshot(model, batches(1), method="wanda", spec=fp.NM(2, 4), names=listed)
    for n in listed:  # 2 of every 4 along each slice's inputs: dim 0 of the (in, out) slice
        view = masks[n].transpose(1, 2)
        assert torch.all(view.reshape(*view.shape[:2], -1, 4).sum(dim=-1) == 2)
    bias = "model.layers.0.mlp.experts.gate_up_proj_bias"
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.mlp\.experts\.gate_up_proj_bias' is a stacked"):
        fp.oneshot(model, batches(1), method="wanda", spec=fp.NM(2, 4), names=[bias])


@dataclasses.dataclass(frozen=True)
class PlainWanda(fp.Method):
    """Wanda's prune, without an override of prune_experts: the base class's loop over the experts."""

    statistic = "input_norms"

    def prune(
        self,
        weights: Mapping[str, Tensor],
        statistics: Mapping[str, Tensor],
        specs: Mapping[str, fp.Spec],
        input_dims: Mapping[str, int],
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        return fp.Wanda().prune(weights, statistics, specs, input_dims)


def test_a_method_of_ones_own_prunes_each_expert_as_the_builtin_does() -> None:
    model, spec = moe("mixtral"), fp.PerSlice(fp.L1Unstructured(0.25), dim=0)
    _, looped = fp.oneshot(model, batches(1), method=PlainWanda(), spec=spec)
    _, vmapped = fp.oneshot(model, batches(1), method="wanda", spec=spec)
    assert "model.layers.0.mlp.experts.gate_up_proj" in looped  # the experts pruned, each on its own tokens
    assert looped.keys() == vmapped.keys() and all(torch.equal(looped[n], vmapped[n]) for n in looped)


def test_owl_and_magnitude_take_the_experts_slice_by_slice() -> None:
    model = moe("mixtral")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, owl = fp.oneshot(model, batches(), method="wanda", spec=fp.L1Unstructured(0.5), allocation="owl")
    _, magnitude = fp.oneshot(model, batches(), method="magnitude", spec=fp.L1Unstructured(0.5))
    n = "model.layers.0.mlp.experts.gate_up_proj"
    w = dict(model.named_parameters())[n]
    assert torch.equal(magnitude[n], torch.stack([fp.Plan({"w": fp.L1Unstructured(0.5)})({"w": s})["w"] for s in w]))
    pruned = (~owl[n]).flatten(1).sum(dim=1)
    assert torch.all(pruned == pruned[0])  # one sparsity for the block, the same count in every expert


def test_a_router_that_is_a_linear_stays_dense_unless_named() -> None:
    config = transformers.PhimoeConfig(vocab_size=_hf.VOCAB, hidden_size=32, intermediate_size=16,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       num_local_experts=4, num_experts_per_tok=2)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.PhimoeForCausalLM(config).eval()  # its router: a Linear subclass, in fp.prunable
    router = "model.layers.0.mlp.router.weight"
    assert router in fp.prunable(model)
    _, masks = fp.oneshot(model, [], method="magnitude", spec=fp.NM(2, 4))
    assert router not in masks and "model.layers.0.mlp.experts.gate_up_proj" in masks
    _, named = fp.oneshot(model, [], method="magnitude", spec=fp.NM(2, 4), names=[router])
    assert list(named) == [router]
