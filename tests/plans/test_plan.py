"""Plans (funcprune._plans): rules, composition, parity with torch, copies, transforms."""

from __future__ import annotations

import copy
import multiprocessing
import pickle
from collections.abc import Callable

import hypothesis.strategies as st
import pytest
import torch
import torch.nn.utils.prune as tprune
from hypothesis import given, settings
from torch import nn

import funcprune as fp
from _models import WEIGHTS, lenet, params_of, same_masks, torch_masks

PLAN_NAMES = [
    "AbstractPlan", "Plan", "GlobalPlan", "ComposedPlan", "compose", "global_unstructured",
    "UnknownNameError", "apply_masks", "apply_masks_", "functional_call_masked",
    "mask_gradients", "mask_gradients_", "sparsity_report", "SparsityReport", "SparsityRow",
]  # fmt: skip


# --- the public surface ------------------------------------------------------


@pytest.mark.parametrize("name", PLAN_NAMES)
def test_plan_layer_names_are_exported_and_documented(name: str) -> None:
    assert name in fp.__all__
    assert (getattr(fp, name).__doc__ or "").strip()


# --- parity with torch's module-level pruning: the tutorial's steps ----------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tutorial_conv1_steps_match_torch(seed: int) -> None:
    model = lenet(seed)
    reference = copy.deepcopy(model)
    params = params_of(model)
    torch.manual_seed(seed + 10)
    masks = fp.Plan(
        {"conv1.weight": fp.RandomUnstructured(0.3), "conv1.bias": fp.L1Unstructured(3)}
    )(params)
    masks = fp.Plan({"conv1.weight": fp.LnStructured(0.5, n=2, dim=0)})(params, masks)
    torch.manual_seed(seed + 10)
    tprune.random_unstructured(reference.conv1, name="weight", amount=0.3)
    tprune.l1_unstructured(reference.conv1, name="bias", amount=3)
    tprune.ln_structured(reference.conv1, name="weight", amount=0.5, n=2, dim=0)
    assert same_masks(masks, torch_masks(reference))
    assert masks["conv1.weight"].dtype == torch.bool
    assert int(masks["conv1.weight"].flatten(1).any(1).sum()) == 3


def test_per_layer_amounts_match_torch() -> None:
    model = lenet(3)
    reference = copy.deepcopy(model)
    masks = fp.Plan({"conv*.weight": fp.L1Unstructured(0.2), "fc*.weight": fp.L1Unstructured(0.4)})(
        params_of(model)
    )
    for module in reference.modules():
        if isinstance(module, nn.Conv2d):
            tprune.l1_unstructured(module, name="weight", amount=0.2)
        elif isinstance(module, nn.Linear):
            tprune.l1_unstructured(module, name="weight", amount=0.4)
    assert list(masks) == WEIGHTS
    assert same_masks(masks, torch_masks(reference))


def test_custom_every_other_entry_like_the_tutorials_foobar() -> None:
    every_other = torch.ones(10, dtype=torch.bool)
    every_other[::2] = False
    masks = fp.Plan({"fc3.bias": fp.CustomFromMask(every_other)})(params_of(lenet()))
    assert masks["fc3.bias"].tolist() == [False, True] * 5


# Channel 0 has the largest L1 norm as given (3.05 > 3.02) but the smallest
# once its entry 0.05, the smallest of all, is pruned (3.0 < 3.02).
NEAR_TIE = torch.tensor([[1.0, 1.0, 1.0, 0.05], [1.0, 1.0, 0.96, 0.06], [5.0, 5.0, 5.0, 5.0]])


def test_default_scores_are_the_currently_pruned_tensor_like_torch() -> None:
    module = nn.Linear(4, 3, bias=False)
    with torch.no_grad():
        module.weight.copy_(NEAR_TIE)
    params = params_of(module)
    masks = fp.Plan({"weight": fp.L1Unstructured(1)})(params)
    masks = fp.Plan({"weight": fp.LnStructured(1, n=1, dim=0)})(params, masks)
    tprune.l1_unstructured(module, "weight", amount=1)
    tprune.ln_structured(module, "weight", amount=1, n=1, dim=0)
    assert same_masks(masks, torch_masks(module))
    assert masks["weight"].any(1).tolist() == [False, True, True]


def test_explicit_scores_are_used_as_given_like_torch() -> None:
    module = nn.Linear(4, 3, bias=False)
    params = params_of(module)
    scores = {"weight": NEAR_TIE}
    masks = fp.Plan({"weight": fp.L1Unstructured(1)})(params, scores=scores)
    masks = fp.Plan({"weight": fp.LnStructured(1, n=1, dim=0)})(params, masks, scores)
    tprune.l1_unstructured(module, "weight", amount=1, importance_scores=NEAR_TIE)
    tprune.ln_structured(module, "weight", amount=1, n=1, dim=0, importance_scores=NEAR_TIE)
    assert same_masks(masks, torch_masks(module))
    assert masks["weight"].any(1).tolist() == [True, False, True]
    steps = [fp.L1Unstructured(1), fp.LnStructured(1, n=1, dim=0)]
    assert same_masks(fp.Plan({"weight": steps})(params, scores=scores), masks)  # a list too


# --- rules, patterns and composition -------------------------------------------


def test_a_list_is_a_chain() -> None:
    w = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    steps = [fp.L1Unstructured(0.3), fp.LnStructured(2, n=2, dim=0)]
    plan = fp.Plan({"w": steps})
    assert plan["w"] == fp.chain(*steps)
    assert torch.equal(plan({"w": w})["w"], fp.compute_mask(fp.chain(*steps), w))
    assert bool(fp.Plan({"w": []})({"w": w})["w"].all())  # an empty chain prunes nothing


def test_rules_matching_one_name_chain_in_insertion_order() -> None:
    w = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    a, b = fp.L1Unstructured(0.5), fp.LnStructured(1, n=1, dim=1)
    both = fp.Plan({"*": a, "w": b})({"w": w})["w"]
    assert torch.equal(both, fp.compute_mask(fp.chain(a, b), w))
    assert torch.equal(both, fp.compose(fp.Plan({"*": a}), fp.Plan({"w": b}))({"w": w})["w"])
    assert not torch.equal(both, fp.Plan({"w": b, "*": a})({"w": w})["w"])  # order matters


def test_rules_apply_in_insertion_order_so_random_draws_follow_it() -> None:
    params = {"a": torch.randn(20), "b": torch.randn(20)}
    spec = fp.RandomUnstructured(0.5)
    torch.manual_seed(0)
    both = fp.Plan({"b": spec, "a": spec})(params)
    torch.manual_seed(0)
    b_first = fp.Plan({"b": spec})(params)["b"], fp.Plan({"a": spec})(params)["a"]
    assert list(both) == ["a", "b"]  # keys follow params
    assert torch.equal(both["b"], b_first[0]) and torch.equal(both["a"], b_first[1])
    assert not torch.equal(both["a"], both["b"])


def test_uncovered_names_keep_their_earlier_masks_and_order_follows_params() -> None:
    params = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0, 1.0]), "c": torch.ones(1)}
    earlier = {"b": torch.tensor([1.0, 0.0]), "a": torch.tensor([True, True])}
    masks = fp.Plan({"a": fp.L1Unstructured(1)})(params, earlier)
    assert list(masks) == ["a", "b"]
    assert masks["a"].tolist() == [False, True]
    assert masks["b"].dtype == torch.bool and masks["b"].tolist() == [True, False]
    assert earlier["b"].dtype == torch.float32  # inputs untouched


@pytest.mark.parametrize(
    "plan",
    [fp.Plan({"w": fp.Identity()}), fp.Plan({"w": fp.L1Unstructured(1)}),
     fp.global_unstructured(["w"], fp.L1Unstructured(0)), fp.global_unstructured(["w"], fp.L1Unstructured(0.5))],
    ids=["identity", "l1", "global-0", "global"],
)  # fmt: skip
def test_every_mask_a_plan_returns_is_a_new_tensor(plan: fp.AbstractPlan) -> None:
    """Masks the plan does not touch come back as copies, never the caller's objects."""
    params = {"w": torch.arange(1.0, 5.0), "v": torch.ones(2)}
    earlier = {"w": torch.tensor([True, True, False, True]), "v": torch.tensor([True, False])}
    masks = plan(params, earlier)
    assert masks["v"] is not earlier["v"] and masks["w"] is not earlier["w"]
    assert torch.equal(masks["v"], earlier["v"])
    masks["v"][0] = False
    assert bool(earlier["v"][0])


def test_a_float_amount_is_a_fraction_of_what_is_left() -> None:
    params = {"w": torch.arange(1.0, 11.0)}
    earlier = {"w": torch.tensor([True] * 6 + [False] * 4)}
    masks = fp.Plan({"w": fp.L1Unstructured(0.5)})(params, earlier)
    assert masks["w"].tolist() == [False] * 3 + [True] * 3 + [False] * 4


def test_plan_is_an_immutable_mapping_with_a_readable_repr() -> None:
    plan = fp.Plan(
        {
            "conv1.weight": fp.L1Unstructured(0.3),
            "fc*.weight": [fp.Identity(), fp.L1Unstructured(2)],
        }
    )
    assert list(plan) == ["conv1.weight", "fc*.weight"] and len(plan) == 2
    assert plan["conv1.weight"] == fp.L1Unstructured(0.3)
    assert repr(plan) == (
        "Plan({'conv1.weight': L1Unstructured(amount=0.3), "
        "'fc*.weight': [Identity(), L1Unstructured(amount=2)]})"
    )
    assert eval(repr(plan), vars(fp)) == plan
    assert hash(plan) == hash(fp.Plan(dict(plan)))
    assert plan != fp.Plan({"fc*.weight": plan["fc*.weight"], "conv1.weight": plan["conv1.weight"]})
    with pytest.raises(AttributeError):
        plan._rules = ()
    with pytest.raises(TypeError):
        plan["x"] = fp.Identity()  # type: ignore[index]


def _every_kind_of_plan() -> fp.ComposedPlan:
    rules = fp.Plan({"conv1.weight": fp.L1Unstructured(0.3), "fc*.weight": [fp.Identity(), fp.L1Unstructured(2)],
                     "fc3.bias": fp.CustomFromMask(torch.arange(10) % 2)})  # fmt: skip
    return fp.compose(rules, fp.global_unstructured(["conv*.weight"], fp.L1Unstructured(0.2)))


@pytest.mark.parametrize(
    "round_trip",
    [copy.copy, copy.deepcopy, lambda p: pickle.loads(pickle.dumps(p))],
    ids=["copy", "deepcopy", "pickle"],
)
def test_plans_survive_copy_deepcopy_and_pickle(round_trip: Callable[[object], object]) -> None:
    composed = _every_kind_of_plan()
    for plan in (composed, *composed.plans):
        again = round_trip(plan)
        assert again == plan and hash(again) == hash(plan) and repr(again) == repr(plan)
    params = params_of(lenet())
    again = round_trip(composed)
    assert isinstance(again, fp.ComposedPlan)
    for name, mask in again(params).items():
        assert torch.equal(mask, composed(params)[name])


@pytest.mark.ci  # the default suite's 5 minutes: CI runs it
def test_a_plan_runs_in_a_spawned_process() -> None:
    plan = _every_kind_of_plan()
    params = params_of(lenet())
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        masks = pool.apply_async(plan, (params,)).get(timeout=60)  # a failed pickle never answers
    expected = plan(params)
    assert masks.keys() == expected.keys()
    assert all(torch.equal(masks[n], expected[n]) for n in expected)


def test_composition_is_flat_and_reads_like_code() -> None:
    a = fp.Plan({"conv*.weight": fp.L1Unstructured(0.2)})
    b = fp.global_unstructured(["conv*.weight", "fc*.weight"], fp.L1Unstructured(0.2))
    assert fp.compose(fp.compose(a, b), a) == fp.compose(a, b, a)
    assert repr(fp.compose(a, b)) == (
        "compose(Plan({'conv*.weight': L1Unstructured(amount=0.2)}), "
        "global_unstructured(['conv*.weight', 'fc*.weight'], L1Unstructured(amount=0.2)))"
    )
    params = params_of(lenet())
    assert same_masks(fp.compose(a, b)(params), b(params, a(params)))


def test_generator_makes_random_plans_reproducible() -> None:
    params = params_of(lenet())
    plan = fp.compose(
        fp.Plan(
            {
                "fc1.weight": fp.RandomUnstructured(0.5),
                "conv2.weight": fp.RandomStructured(0.5, dim=0),
            }
        ),
        fp.global_unstructured(WEIGHTS, fp.RandomUnstructured(0.5)),
    )
    one = plan(params, generator=torch.Generator().manual_seed(3))
    two = plan(params, generator=torch.Generator().manual_seed(3))
    three = plan(params, generator=torch.Generator().manual_seed(4))
    assert same_masks(one, two) and not same_masks(one, three)


# --- global groups ----------------------------------------------------------


SPECS = st.sampled_from(
    [fp.L1Unstructured(0.4), fp.RandomUnstructured(2), fp.LnStructured(0.5, n=2, dim=0),
     fp.RandomStructured(1, dim=1), fp.chain(fp.L1Unstructured(1), fp.LnStructured(1, n=1, dim=1))]
)  # fmt: skip


@given(spec=SPECS, seed=st.integers(0, 2**16), rows=st.integers(2, 5), cols=st.integers(2, 5))
def test_a_plan_never_revives_an_earlier_pruned_entry(
    spec: fp.Spec, seed: int, rows: int, cols: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    params = {"w": torch.randn(rows, cols, generator=g), "v": torch.randn(rows, cols, generator=g)}
    earlier = {"w": torch.rand(rows, cols, generator=g) > 0.2}
    earlier["w"][0, :2] = True  # enough left for the integer amounts above
    masks = fp.Plan({"*": spec})(params, earlier, generator=g)
    assert not bool((masks["w"] & ~earlier["w"]).any())
    assert masks.keys() == {"w", "v"}


# --- errors --------------------------------------------------------------------


def test_bad_arguments_are_refused_with_a_message() -> None:
    with pytest.raises(TypeError, match="funcprune.compose"):
        fp.Plan([fp.Plan({})])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rule 'w' must map to a funcprune spec"):
        fp.Plan({"w": 0.3})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="item 1 of the list"):
        fp.Plan({"w": [fp.Identity(), "L1"]})  # type: ignore[list-item]
    with pytest.raises(TypeError, match="non-empty strings"):
        fp.Plan({"": fp.Identity()})
    with pytest.raises(TypeError, match=r"dict\(module.named_parameters\(\)\)"):
        fp.Plan({})(nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wrap a single name in a list"):
        fp.global_unstructured("fc1.weight", fp.L1Unstructured(1))
    with pytest.raises(TypeError, match="non-empty list"):
        fp.global_unstructured([], fp.L1Unstructured(1))
    with pytest.raises(TypeError, match="compose: argument 1 must be a plan"):
        fp.compose(fp.Plan({}), fp.L1Unstructured(1))  # type: ignore[arg-type]


def test_spec_errors_name_the_parameter() -> None:
    params = {"fc.bias": torch.randn(3), "fc.weight": torch.randn(3, 2)}
    with pytest.raises(
        ValueError, match=r"Plan: cannot prune 'fc.bias' with L1Unstructured\(amount=4\)"
    ):
        fp.Plan({"fc.bias": fp.L1Unstructured(4)})(params)
    with pytest.raises(ValueError, match="cannot prune 'fc.bias'.*multidimensional"):
        fp.Plan({"fc.bias": fp.LnStructured(1, n=2)})(params)
    with pytest.raises(IndexError, match="cannot prune 'fc.weight'"):
        fp.Plan({"fc.weight": fp.LnStructured(1, n=2, dim=2)})(params)
    with pytest.raises(TypeError, match="cannot prune 'i'.*floating-point"):
        fp.Plan({"i": fp.L1Unstructured(1)})({"i": torch.arange(3)})


# --- transforms ------------------------------------------------------------------


def stacked(n: int = 4) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Conv2d(1, 3, 3), nn.Flatten(), nn.Linear(12, 4)) for _ in range(n)]
    params, _ = torch.func.stack_module_state(models)
    return {k: v.detach() for k, v in params.items()}


def model(params: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    return {name: p[i] for name, p in params.items()}


def test_vmap_over_stacked_models_equals_a_loop_in_two_rounds() -> None:
    params = stacked()
    first = fp.Plan(
        {"0.weight": fp.LnStructured(1, n=2, dim=0), "2.weight": fp.L1Unstructured(0.5)}
    )
    second = fp.compose(
        fp.global_unstructured(["*.weight"], fp.L1Unstructured(0.3)),
        fp.Plan({"2.weight": fp.LnStructured(0.5, n=1, dim=1)}),
    )
    masks = torch.func.vmap(lambda p: first(p))(params)
    again = torch.func.vmap(lambda p, m: second(p, m))(params, masks)  # per-model earlier masks
    for i in range(4):
        loop = first(model(params, i))
        assert same_masks(model(masks, i), loop)
        assert same_masks(model(again, i), second(model(params, i), loop))
    assert not torch.equal(again["2.weight"][0], again["2.weight"][1])


def test_vmap_random_plans_follow_the_randomness_flag() -> None:
    params = stacked()
    plan = fp.compose(
        fp.Plan({"2.weight": fp.RandomUnstructured(0.5)}),
        fp.global_unstructured(["*"], fp.RandomUnstructured(5)),
    )
    different = torch.func.vmap(lambda p: plan(p), randomness="different")(params)
    same = torch.func.vmap(lambda p: plan(p), randomness="same")(params)
    total = sum(p[0].numel() for p in params.values())
    for masks in (different, same):
        kept = torch.stack([m.flatten(1).sum(1) for m in masks.values()]).sum(0)
        assert kept.tolist() == [total - 24 - 5] * 4
    assert not torch.equal(different["2.weight"][0], different["2.weight"][1])
    assert all(torch.equal(m[0], m[i]) for m in same.values() for i in range(4))


def test_a_deterministic_plan_compiles_with_fullgraph() -> None:
    params = model(stacked(1), 0)
    plan = fp.compose(
        fp.Plan({"0.weight": fp.LnStructured(1, n=2, dim=0)}),
        fp.global_unstructured(["*.weight"], fp.L1Unstructured(0.3)),
    )
    earlier = {"2.weight": torch.rand(4, 12, generator=torch.Generator().manual_seed(0)) > 0.5}
    compiled = torch.compile(lambda p, m: plan(p, m), fullgraph=True, backend="aot_eager")
    assert same_masks(compiled(params, earlier), plan(params, earlier))


def test_a_plan_runs_inside_grad_and_pruned_entries_get_zero_gradient() -> None:
    net = nn.Linear(6, 4)
    params = params_of(net)
    earlier = {"bias": torch.tensor([1.0, 0.0, 1.0, 1.0])}  # torch-style float mask
    plan = fp.compose(
        fp.Plan({"weight": fp.L1Unstructured(0.5)}),
        fp.global_unstructured(["*"], fp.L1Unstructured(3)),
    )

    def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        out: torch.Tensor = fp.functional_call_masked(net, p, plan(p, earlier), torch.ones(2, 6))
        return out.sum()

    grads = torch.func.grad(loss)(params)
    masks = plan(params, earlier)
    assert int((~masks["weight"]).sum()) + int((~masks["bias"]).sum()) == 12 + 1 + 3
    for name, mask in masks.items():
        assert bool((grads[name][~mask] == 0).all()) and bool((grads[name][mask] != 0).all())


DETERMINISTIC = st.sampled_from(
    [fp.L1Unstructured(0.4), fp.L1Unstructured(3), fp.LnStructured(0.5, n=2, dim=0),
     fp.LnStructured(1, n=1, dim=-1),
     fp.chain(fp.L1Unstructured(2), fp.LnStructured(0.5, n=2, dim=1))]
)  # fmt: skip


@settings(max_examples=15)
@given(spec=DETERMINISTIC, seed=st.integers(0, 2**16), batch=st.integers(1, 3))
def test_vmap_equals_a_loop_with_batched_earlier_masks(
    spec: fp.Spec, seed: int, batch: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    params = {
        "w": torch.randn(batch, 4, 5, generator=g),
        "v": torch.randn(batch, 3, 4, generator=g),
    }
    earlier = {"w": torch.rand(batch, 4, 5, generator=g) > 0.2}
    plan = fp.compose(
        fp.Plan({"*": spec}), fp.global_unstructured(["v", "w"], fp.L1Unstructured(0.3))
    )
    batched = torch.func.vmap(lambda p, m: plan(p, m))(params, earlier)
    for i in range(batch):
        assert same_masks(model(batched, i), plan(model(params, i), model(earlier, i)))
