"""Experts of transformers MoE layers: units, never routed once removed, shrunk, reloaded; bake warns.

The reference for a removed expert is a model built by hand without it
(its router row and its slice of every expert weight cut, the expert count
set): the masked model must compute what that model computes.
"""

from __future__ import annotations

import copy
import functools
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from _hf import MOE, Tiny, tiny
from hypothesis import given
from hypothesis import strategies as st

import funcprune as fp
from funcprune._experts import never_routed, removed_experts, routers

Tensor = torch.Tensor


@functools.cache
def model_and_structure(name: str) -> tuple[Tiny, fp.Structure]:
    t = tiny(name)
    return t, fp.structure(t.model, inputs(t))


def inputs(t: Tiny) -> dict[str, Any]:
    return {"input_ids": t.args[0], **t.kwargs}


def logits(model: torch.nn.Module, x: dict[str, Any]) -> Tensor:
    with torch.no_grad():
        out: Tensor = model(**x).logits
    return out


def expert_masks(t: Tiny, s: fp.Structure, drop: dict[int, list[int]]) -> dict[str, Tensor]:
    """Masks pruning whole experts: ``drop[layer]`` of each layer's experts group."""
    params = dict(t.model.named_parameters())
    masks = {}
    for layer, experts in drop.items():
        group = s[f"model.layers.{layer}.mlp"]
        for m in group.members:
            mask = torch.ones_like(params[m.name], dtype=torch.bool)
            for e in experts:
                mask.index_fill_(m.dim, torch.tensor(list(m.indices(e))), False)
            masks[m.name] = mask
    return masks


def without(t: Tiny, drop: dict[int, list[int]]) -> Any:
    """The reference: the model with the dropped experts cut out by hand."""
    model: Any = copy.deepcopy(t.model)
    for layer, experts in drop.items():
        block = model.model.layers[layer].mlp
        kept = torch.tensor([e for e in range(block.experts.num_experts) if e not in experts])
        for module in (block.gate, block.experts):
            for name, p in list(module.named_parameters(recurse=False)):
                if p.shape[0] == len(kept) + len(experts):
                    setattr(module, name, torch.nn.Parameter(p[kept]))
            module.num_experts = len(kept)
    return model


@pytest.mark.parametrize("name", MOE)
def test_each_expert_is_a_unit_with_its_router_row(name: str) -> None:
    t, s = model_and_structure(name)
    for layer in (0, 1):
        group = s[f"model.layers.{layer}.mlp"]
        prefix = f"model.layers.{layer}.mlp"
        assert (group.kind, group.size) == ("experts", 4)
        assert group.members == (
            fp.Member(f"{prefix}.gate.weight", 0, 1),
            fp.Member(f"{prefix}.experts.gate_up_proj", 0, 1),
            fp.Member(f"{prefix}.experts.down_proj", 0, 1),
        )
    stacked = {p for r in routers(t.model) for p in r.parameters}
    hidden = [g for g in s.values() if g.kind == "channels" and any(m.name in stacked for m in g.members)]
    assert not hidden  # the experts' hidden channels are no units
    if name == "qwen2_moe":
        assert s["model.layers.0.mlp.shared_expert"].kind == "channels"


@pytest.mark.parametrize("name", MOE)
def test_a_removed_expert_is_never_routed_to(name: str) -> None:
    t, s = model_and_structure(name)
    drop = {0: [1], 1: [0, 3]}
    masks = expert_masks(t, s, drop)
    params = dict(t.model.named_parameters())
    with torch.no_grad():
        masked = fp.functional_call_masked(t.model, params, masks, (), inputs(t)).logits
        routed = torch.func.functional_call(t.model, fp.apply_masks(params, masks), (), inputs(t)).logits
    reference = logits(without(t, drop), inputs(t))
    torch.testing.assert_close(masked, reference, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(routed, reference, atol=1e-3)  # routing to zeroed experts is something else


@pytest.mark.parametrize("name", MOE)
def test_shrink_removes_non_uniform_experts_and_load_shrunk_reloads(name: str, tmp_path: Path) -> None:
    t, s = model_and_structure(name)
    drop = {0: [2], 1: [0, 1]}
    masks = expert_masks(t, s, drop)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fp.KeptChannelsWarning)
        small: Any = fp.shrink(t.model, masks, inputs(t))
    assert [layer.mlp.experts.num_experts for layer in small.model.layers] == [3, 2]
    assert [layer.mlp.gate.weight.shape[0] for layer in small.model.layers] == [3, 2]
    torch.testing.assert_close(logits(small, inputs(t)), logits(without(t, drop), inputs(t)), atol=1e-5, rtol=1e-5)
    small.save_pretrained(tmp_path)
    again = fp.load_shrunk(tmp_path)
    torch.testing.assert_close(logits(again, inputs(t)), logits(small, inputs(t)), atol=0, rtol=0)


def test_uniform_experts_are_in_the_config(tmp_path: Path) -> None:
    t, s = model_and_structure("qwen2_moe")
    plan = fp.structured(s, fp.LnStructured(2, n=2), kinds="experts", scope="group")
    small: Any = fp.shrink(t.model, plan(dict(t.model.named_parameters())), inputs(t))
    assert small.config.num_experts == 2 and not hasattr(small.config, "funcprune_shrunk")
    small.save_pretrained(tmp_path)
    again = type(small).from_pretrained(tmp_path)
    torch.testing.assert_close(logits(again, inputs(t)), logits(small, inputs(t)), atol=0, rtol=0)


def test_top_k_experts_stay() -> None:
    t, s = model_and_structure("mixtral")
    masks = expert_masks(t, s, {0: [0, 1, 3]})
    with pytest.warns(fp.KeptChannelsWarning, match="keeps 2 indices along dim 0 .top_k experts"):
        closure = fp.propagate(t.model, masks, inputs(t))
    assert closure.keys() == masks.keys()  # the kept expert 0 keeps its masks: zero weights, routed
    with pytest.warns(fp.KeptChannelsWarning):
        small: Any = fp.shrink(t.model, masks, inputs(t))
    experts = small.model.layers[0].mlp.experts
    assert experts.num_experts == 2 and not experts.down_proj[0].any() and experts.down_proj[1].any()
    reference: Any = without(t, {0: [1, 3]})
    with torch.no_grad():
        reference.model.layers[0].mlp.gate.weight[0] = 0.0  # expert 0 stays, its weights zero
        reference.model.layers[0].mlp.experts.gate_up_proj[0] = 0.0
        reference.model.layers[0].mlp.experts.down_proj[0] = 0.0
    torch.testing.assert_close(logits(small, inputs(t)), logits(reference, inputs(t)), atol=1e-5, rtol=1e-5)
    params = dict(t.model.named_parameters())
    with torch.no_grad():
        masked = fp.functional_call_masked(t.model, params, closure, (), inputs(t)).logits
    torch.testing.assert_close(masked, logits(small, inputs(t)), atol=1e-5, rtol=1e-5)


@given(st.lists(st.booleans(), min_size=1, max_size=8), st.integers(1, 8))
def test_removed_experts_are_pruned_rows_with_top_k_kept(pruned: list[bool], top_k: int) -> None:
    mask = torch.tensor([[not p, not p] for p in pruned])
    removed = removed_experts(mask, top_k).tolist()
    rows = len(pruned)
    assert all(p for p, r in zip(pruned, removed, strict=True) if r)  # only pruned rows go
    assert rows - sum(removed) >= min(top_k, rows)
    restored = [i for i in range(rows) if pruned[i] and not removed[i]]
    going = [i for i in range(rows) if removed[i]]
    assert not restored or not going or max(restored) < min(going)  # the first pruned ones stay
    assert rows - sum(removed) == max(min(top_k, rows), rows - sum(pruned))


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # torch has no vmap rule for histc
def test_never_routed_under_grad_and_vmap() -> None:
    t, s = model_and_structure("mixtral")
    params = {k: v.detach() for k, v in t.model.named_parameters()}
    one, two = expert_masks(t, s, {0: [1]}), expert_masks(t, s, {0: [2, 3]})

    def loss(p: dict[str, Tensor], masks: dict[str, Tensor]) -> Tensor:
        out: Tensor = fp.functional_call_masked(t.model, p, masks, (), inputs(t)).logits
        return out.square().mean()

    grads = torch.func.grad(loss)(params, one)
    router = "model.layers.0.mlp.gate.weight"
    assert bool(grads[router][1].eq(0).all()) and bool(grads[router][0].ne(0).any())
    stacked = {k: torch.stack([one[k], two[k]]) for k in one}
    batched = torch.func.vmap(loss, in_dims=(None, 0))(params, stacked)
    each = torch.stack([loss(params, one), loss(params, two)])
    torch.testing.assert_close(batched, each)
    reference = logits(without(t, {0: [2, 3]}), inputs(t)).square().mean()
    torch.testing.assert_close(each[1], reference, atol=1e-6, rtol=1e-5)


def test_never_routed_changes_nothing_without_routers_or_removed_experts() -> None:
    t, _ = model_and_structure("mixtral")
    with never_routed(t.model, {}):
        plain = logits(t.model, inputs(t))
    torch.testing.assert_close(plain, logits(t.model, inputs(t)), atol=0, rtol=0)
    assert routers(tiny("llama").model) == ()
    model: Any = t.model
    assert not model.model.layers[0].mlp.gate._forward_hooks  # the hooks are gone afterwards


def test_bake_warns_that_it_still_routes_to_removed_experts() -> None:
    t, s = model_and_structure("mixtral")
    with pytest.warns(UserWarning, match=r"'model.layers.1.mlp.gate' experts \[0\].*shrink removes them"):
        fp.bake(t.model, expert_masks(t, s, {1: [0]}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fp.bake(t.model, {})


@pytest.mark.parametrize("scope", ["global", "group"])
def test_a_units_plan_leaves_each_router_its_top_k_experts(scope: str) -> None:
    # 3 of 4 experts due, but each token goes to 2: the plan prunes 2 per layer (the next units in the order go
    # instead, where there are), and shrink removes exactly what it prunes
    t, s = model_and_structure("mixtral")
    experts = s.of_kinds("experts")
    assert {g.least for g in experts.values()} == {2}
    params = dict(t.model.named_parameters())
    with pytest.raises(ValueError, match=r"each group keeps one of its units at least .* top_k experts\): at most [24] can go"):
        fp.structured(experts, fp.LnStructured(0.75, n=2), scope=scope)(params)  # type: ignore[arg-type]
    masks = fp.structured(s, fp.LnStructured(0.5, n=2), scope=scope, normalize="mean")(params)  # type: ignore[arg-type]
    for name in experts:
        assert int(masks[f"{name}.gate.weight"].any(1).sum()) >= 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", fp.KeptChannelsWarning)
        closure = fp.propagate(t.model, masks, inputs(t))
    assert closure.keys() == masks.keys() and all(torch.equal(closure[k], masks[k]) for k in masks)


def test_a_unit_group_keeps_at_most_its_size() -> None:
    member = fp.Member("gate.weight", 0, 1)
    assert fp.UnitGroup("experts", 4, (member,), least=2).least == 2
    with pytest.raises(ValueError, match=r"UnitGroup: least must be at most size \(4\), got 5"):
        fp.UnitGroup("experts", 4, (member,), least=5)
    with pytest.raises(ValueError, match="UnitGroup: least must be at least 1, got 0"):
        fp.UnitGroup("experts", 4, (member,), least=0)
