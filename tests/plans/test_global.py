"""Global groups: joint pruning of several tensors (funcprune._plans._global), parity with torch."""

from __future__ import annotations

import copy

import hypothesis.strategies as st
import pytest
import torch
import torch.nn.utils.prune as tprune
from _models import WEIGHTS, lenet, params_of, same_masks, targets, torch_masks
from hypothesis import given
from torch import nn

import funcprune as fp


def test_global_rounds_match_torch_global_unstructured() -> None:
    model = lenet(4)
    reference = copy.deepcopy(model)
    params = params_of(model)
    first = fp.global_unstructured(["conv*.weight", "fc*.weight"], fp.L1Unstructured(0.2))(params)
    tprune.global_unstructured(targets(reference, WEIGHTS), tprune.L1Unstructured, amount=0.2)
    assert same_masks(first, torch_masks(reference))
    # a second global round on top of the existing masks, then a random one
    second = fp.global_unstructured(WEIGHTS, fp.L1Unstructured(0.3))(params, first)
    tprune.global_unstructured(targets(reference, WEIGHTS), tprune.L1Unstructured, amount=0.3)
    assert same_masks(second, torch_masks(reference))
    torch.manual_seed(7)
    third = fp.global_unstructured(WEIGHTS, fp.RandomUnstructured(1000))(params, second)
    torch.manual_seed(7)
    tprune.global_unstructured(targets(reference, WEIGHTS), tprune.RandomUnstructured, amount=1000)
    assert same_masks(third, torch_masks(reference))


def test_global_with_importance_scores_matches_torch() -> None:
    model = lenet(5)
    reference = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    scores = {n: torch.rand(p.shape, generator=g) for n, p in model.named_parameters()}
    names = ["conv2.weight", "fc1.weight", "fc2.bias"]
    plan = fp.global_unstructured(names, fp.L1Unstructured(0.25))
    ours = plan(params_of(model), scores=scores)
    by_target = {
        (m, a): scores[n] for n, (m, a) in zip(names, targets(reference, names), strict=True)
    }
    tprune.global_unstructured(
        targets(reference, names), tprune.L1Unstructured, by_target, amount=0.25
    )
    assert same_masks(ours, torch_masks(reference))
    assert not same_masks(ours, plan(params_of(model)))  # the scores were used


def test_global_on_top_of_per_layer_and_a_later_per_layer_round_match_torch() -> None:
    model = lenet(6)
    reference = copy.deepcopy(model)
    plan = fp.compose(
        fp.Plan({"conv*.weight": fp.L1Unstructured(0.2), "fc*.weight": fp.L1Unstructured(0.4)}),
        fp.global_unstructured(["*.weight"], fp.L1Unstructured(0.5)),
        fp.Plan({"fc1.weight": fp.LnStructured(0.25, n=1, dim=0)}),
    )
    ours = plan(params_of(model))
    for name in WEIGHTS:
        module = reference.get_submodule(name.split(".")[0])
        tprune.l1_unstructured(module, name="weight", amount=0.2 if "conv" in name else 0.4)
    tprune.global_unstructured(targets(reference, WEIGHTS), tprune.L1Unstructured, amount=0.5)
    tprune.ln_structured(reference.fc1, name="weight", amount=0.25, n=1, dim=0)
    assert same_masks(ours, torch_masks(reference))


@pytest.mark.parametrize(
    "spec", [fp.LnStructured(0.2, n=1), fp.RandomStructured(0.2), fp.CustomFromMask(torch.ones(3))]
)
def test_global_refuses_a_non_unstructured_spec_like_torch(spec: fp.Spec) -> None:
    with pytest.raises(TypeError, match="global_unstructured: spec must have pruning_type 'unstructured'"):
        fp.global_unstructured(["w"], spec)
    with pytest.raises(TypeError, match="global_unstructured: spec must have pruning_type 'unstructured'"):
        fp.global_unstructured(["w"], fp.chain(fp.L1Unstructured(1), spec))


def test_global_accepts_a_chain_of_unstructured_specs() -> None:
    params = {"a": torch.tensor([1.0, 5.0, 3.0]), "b": torch.tensor([4.0, 2.0, 6.0])}
    masks = fp.global_unstructured(["a", "b"], [fp.L1Unstructured(1), fp.L1Unstructured(2)])(params)
    assert masks["a"].tolist() == [False, True, False] and masks["b"].tolist() == [
        True,
        False,
        True,
    ]


def test_global_lists_names_in_order_once() -> None:
    params = {"x": torch.tensor([3.0]), "y": torch.tensor([1.0]), "z": torch.tensor([2.0])}
    plan = fp.global_unstructured(["z", "*"], fp.L1Unstructured(2))
    assert plan.names == ("z", "*")
    assert {n: m.item() for n, m in plan(params).items()} == {"x": True, "y": False, "z": False}


@given(
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
    amount=st.one_of(st.integers(0, 48), st.floats(0.0, 1.0)),
)
def test_global_prunes_exactly_the_amount_and_never_revives(
    sizes: list[int], seed: int, amount: float
) -> None:
    g = torch.Generator().manual_seed(seed)
    params = {f"p{i}": torch.randn(n, generator=g) for i, n in enumerate(sizes)}
    earlier = {n: torch.rand(p.shape, generator=g) > 0.3 for n, p in params.items()}
    left = sum(int(m.sum()) for m in earlier.values())
    expected = amount if isinstance(amount, int) else round(amount * left)
    plan = fp.global_unstructured(list(params), fp.L1Unstructured(amount))
    if isinstance(amount, int) and amount > left:
        with pytest.raises(ValueError, match="global_unstructured: cannot prune"):
            plan(params, earlier)
        return
    masks = plan(params, earlier)
    assert left - sum(int(m.sum()) for m in masks.values()) == expected
    assert all(not bool((masks[n] & ~earlier[n]).any()) for n in params)
