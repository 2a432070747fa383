"""Plans over weights stored (in, out) (funcprune._plans._input_dims): issue 23, item 6.

With ``input_dims``, a weight whose input dim is 0 (a Conv1D's) is seen by the
specs as a Linear weight (out, in): every mask equals the mask of the same
plan on the Linear weight (the transpose), transposed back.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings

import funcprune as fp
from _models import MiniGPT

Tensor = torch.Tensor

#: Specs whose masks depend on the layout (per row, per group of inputs, per output channel).
SPECS: list[fp.Spec | list[fp.Spec]] = [
    fp.NM(2, 4),
    fp.NM(1, 2, dim=0),
    fp.LnStructured(0.5, n=1, dim=0),
    fp.LnStructured(1, n=2, dim=-1),
    fp.PerSlice(fp.L1Unstructured(0.5), dim=0),
    fp.Block(0.5, (2, 2)),
    [fp.L1Unstructured(0.25), fp.NM(2, 4)],
    [fp.LnStructured(0.25, n=2, dim=0), fp.PerSlice(fp.L1Unstructured(0.5), dim=0)],
]


def randn(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@settings(max_examples=30, deadline=None)
@given(spec=st.sampled_from(SPECS), seed=st.integers(0, 2**16), out=st.sampled_from([4, 8]),
       inputs=st.sampled_from([4, 8]), earlier=st.booleans(), given_scores=st.booleans())  # fmt: skip
def test_a_conv1d_weight_gets_the_transposed_mask_of_its_linear_twin(
    spec: fp.Spec | list[fp.Spec], seed: int, out: int, inputs: int, earlier: bool, given_scores: bool
) -> None:
    linear = randn(out, inputs, seed=seed)  # (out, in)
    before = torch.rand(out, inputs, generator=torch.Generator().manual_seed(seed + 1)) < 0.8
    scores = randn(out, inputs, seed=seed + 2).abs()
    conv1d = linear.T.contiguous()  # the same layer as a Conv1D stores it: (in, out)
    plan = fp.Plan({"c.weight": spec}, input_dims={"c.weight": 0})
    masks = {"c.weight": before.T.contiguous()} if earlier else None
    expected = fp.Plan({"c.weight": spec})(
        {"c.weight": linear}, {"c.weight": before} if earlier else None, {"c.weight": scores} if given_scores else None
    )["c.weight"]
    mask = plan({"c.weight": conv1d}, masks, {"c.weight": scores.T} if given_scores else None)["c.weight"]
    assert mask.shape == conv1d.shape and mask.dtype == torch.bool and mask.is_contiguous()
    assert torch.equal(mask, expected.T)
    if masks is not None:
        assert not (mask & ~masks["c.weight"]).any()  # never revives


def test_nm_2_4_groups_along_the_inputs_of_a_conv1d_weight() -> None:
    conv1d = randn(8, 3)  # 8 inputs, 3 outputs
    plain = fp.Plan({"w": fp.NM(2, 4)})({"w": conv1d.T.contiguous()})["w"]
    mask = fp.Plan({"w": fp.NM(2, 4)}, input_dims={"w": 0})({"w": conv1d})["w"]
    assert torch.equal(mask.T, plain)
    assert (mask.T.reshape(3, 2, 4).sum(-1) == 2).all()  # 2 of every 4 consecutive inputs of each output
    with pytest.raises(ValueError, match=r"'w'"):  # as stored: groups of 4 along 3 outputs do not fit
        fp.Plan({"w": fp.NM(2, 4)})({"w": conv1d})


def test_the_caller_s_tensors_are_left_alone_and_other_names_keep_their_masks() -> None:
    params = {"c.weight": randn(4, 8), "fc.weight": randn(8, 4, seed=1), "b": randn(8)}
    given = {"c.weight": torch.rand(4, 8) < 0.9, "b": torch.rand(8) < 0.5}
    before = {n: t.clone() for n, t in {**params, **given}.items()}
    masks = fp.Plan({"*.weight": fp.NM(2, 4)}, input_dims={"c.weight": 0, "fc.weight": 1})(params, given)
    assert list(masks) == ["c.weight", "fc.weight", "b"]
    assert all(torch.equal(t, before[n]) for n, t in {**params, **given}.items())
    assert all(m.data_ptr() not in {t.data_ptr() for t in {**params, **given}.values()} for m in masks.values())
    assert torch.equal(masks["b"], given["b"])


def test_global_structured_ranks_the_output_channels_of_linear_and_conv1d_weights_together() -> None:
    linear = {"fc.weight": randn(6, 4), "c.weight": randn(5, 4, seed=1), "d.weight": randn(3, 5, seed=2)}
    stored = {"fc.weight": linear["fc.weight"], "c.weight": linear["c.weight"].T, "d.weight": linear["d.weight"].T}
    dims = {"fc.weight": 1, "c.weight": 0, "d.weight": 0}
    for normalize in (None, "mean", "max"):
        spec = fp.LnStructured(0.4, n=2, dim=0)
        expected = fp.global_structured(["*"], spec, normalize=normalize)(linear)
        masks = fp.global_structured(["*"], spec, normalize=normalize, input_dims=dims)(stored)
        for name, mask in masks.items():
            assert torch.equal(mask, expected[name] if dims[name] else expected[name].T), (normalize, name)
    pruned = masks["c.weight"].T  # whole output channels: columns as stored
    assert (pruned.all(1) | ~pruned.any(1)).all() and not pruned.all()


def test_plans_show_their_input_dims_in_repr_and_equality_and_survive_copies() -> None:
    rules = {"h.*.weight": fp.NM(2, 4)}
    plan = fp.Plan(rules, input_dims={"h.1.weight": 0, "h.0.weight": 0, "fc.weight": 1})
    assert repr(plan) == "Plan({'h.*.weight': NM(n=2, m=4, dim=-1)}, input_dims={'h.0.weight': 0, 'h.1.weight': 0})"
    assert plan.input_dims == {"h.0.weight": 0, "h.1.weight": 0}
    assert eval(repr(plan), vars(fp)) == plan
    assert plan == fp.Plan(rules, input_dims={"h.0.weight": 0, "h.1.weight": 0})  # 1 changes nothing
    assert plan != fp.Plan(rules) and hash(plan) != hash(fp.Plan(rules))
    assert fp.Plan(rules, input_dims={"fc.weight": 1}) == fp.Plan(rules) == fp.Plan(rules, input_dims=None)
    spec = fp.LnStructured(0.5, n=2, dim=0)
    glob = fp.global_structured(["h.*"], spec, normalize="mean", input_dims={"h.0.weight": 0})
    assert repr(glob) == (
        "global_structured(['h.*'], LnStructured(amount=0.5, n=2, dim=0), normalize='mean', "
        "input_dims={'h.0.weight': 0})"
    )
    assert eval(repr(glob), vars(fp)) == glob and glob.input_dims == {"h.0.weight": 0}
    assert glob != fp.global_structured(["h.*"], spec, normalize="mean")
    round_trips: list[Callable[[object], Any]] = [copy.copy, copy.deepcopy, lambda p: pickle.loads(pickle.dumps(p))]
    for round_trip in round_trips:
        for original in (plan, glob):
            again = round_trip(original)
            assert again == original and hash(again) == hash(original) and repr(again) == repr(original)


def test_input_dims_errors() -> None:
    with pytest.raises(TypeError, match=r"^Plan: input_dims must be a mapping of parameter names to input dims "
                       r"\(0 or 1\) or None, got list; fp.input_dims\(model\) makes one"):  # fmt: skip
        fp.Plan({"w": fp.NM(2, 4)}, input_dims=["w"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^global_structured: input_dims\['w'\] must be an int \(0 or 1\), got "
                       r"False"):  # fmt: skip
        fp.global_structured(["w"], fp.LnStructured(1, n=1, dim=0), input_dims={"w": False})
    with pytest.raises(ValueError, match=r"^Plan: input_dims\['experts'\] must be 0 or 1, got 2: plans show the "
                       r"specs every weight as \(out, in, \.\.\.\)"):  # fmt: skip
        fp.Plan({"w": fp.NM(2, 4)}, input_dims={"experts": 2})
    with pytest.raises(TypeError, match=r"^Plan: input_dims keys must be non-empty parameter names, got ''"):
        fp.Plan({"w": fp.NM(2, 4)}, input_dims={"": 0})
    plan = fp.Plan({"*": fp.L1Unstructured(0.5)}, input_dims={"b": 0})
    with pytest.raises(ValueError, match=r"^Plan: input_dims\['b'\] is 0 but the parameter 'b' has shape \(4,\): "
                       r"a weight whose input features run along dim 0 has 2 dims or more"):  # fmt: skip
        plan({"w": randn(4, 4), "b": randn(4)})
    assert set(plan({"w": randn(4, 4)})) == {"w"}  # names that are no parameter are ignored
    with pytest.raises(ValueError, match=r"^global_structured: input_dims\['b'\] is 0 but the parameter 'b'"):
        fp.global_structured(["*"], fp.LnStructured(1, n=1, dim=0), input_dims={"b": 0})({"b": randn(4)})


@pytest.mark.parametrize("spec", SPECS[:6], ids=repr)
def test_under_vmap_over_stacked_params_a_plan_with_input_dims_equals_the_loop(spec: fp.Spec) -> None:
    stacked = {"c.weight": randn(3, 8, 4), "fc.weight": randn(3, 4, 8, seed=1)}
    plan = fp.Plan({"*.weight": spec}, input_dims={"c.weight": 0, "fc.weight": 1})
    batched = torch.func.vmap(plan)(stacked)
    for i in range(3):
        one = plan({n: t[i] for n, t in stacked.items()})
        assert all(torch.equal(batched[n][i], one[n]) for n in one)
    glob = fp.global_structured(["*"], fp.LnStructured(0.5, n=2, dim=0), input_dims={"c.weight": 0})
    batched = torch.func.vmap(glob)(stacked)
    for i in range(3):
        one = glob({n: t[i] for n, t in stacked.items()})
        assert all(torch.equal(batched[n][i], one[n]) for n in one)


needs_gloo = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed with gloo"
)


@needs_gloo
@pytest.mark.parametrize("shard", [0, 1, None])
def test_dtensor_weights_stored_in_out_get_the_masks_of_plain_ones(mesh: Any, shard: int | None) -> None:
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    w = randn(8, 6)
    dw = distribute_tensor(w, mesh, [Replicate() if shard is None else Shard(shard)])
    dims = {"w": 0}
    plans: list[fp.AbstractPlan] = [fp.Plan({"w": spec}, input_dims=dims) for spec in SPECS[:5]]
    plans.append(fp.global_structured(["w"], fp.LnStructured(2, n=1, dim=0), input_dims=dims))
    for plan in plans:
        mask = plan({"w": dw})["w"]
        assert isinstance(mask, DTensor) and mask.placements == dw.placements, plan
        assert torch.equal(mask.full_tensor(), plan({"w": w})["w"]), plan


# --- on models ----------------------------------------------------------------------


def test_a_plan_with_the_model_s_input_dims_prunes_a_conv1d_model_as_its_linear_twin() -> None:
    model = MiniGPT()
    params = {n: p.detach() for n, p in model.named_parameters()}
    names = fp.prunable(model)
    twin = {n: (p.T if n in names else p) for n, p in params.items()}
    for spec in SPECS:
        plan = fp.Plan(dict.fromkeys(names, spec), input_dims=fp.input_dims(model))
        expected = fp.Plan(dict.fromkeys(names, spec))(twin)
        masks = plan(params)
        assert list(masks) == list(expected) == names
        assert all(torch.equal(m.T, expected[n]) for n, m in masks.items())


def test_gpt2_2_4_by_wanda_through_a_plan_groups_along_the_inputs() -> None:
    gpt2 = pytest.importorskip("_hf", reason="needs transformers (the hf extra)").tiny("gpt2")
    model = gpt2.model
    names = [f"{path}.weight" for path, m in model.named_modules() if type(m).__name__ == "Conv1D"]
    params = {n: p.detach() for n, p in model.named_parameters()}
    calibration = [{"input_ids": gpt2.args[0], "use_cache": False}]
    scores = fp.wanda(params, fp.input_norms(model, calibration, names))
    masks = fp.Plan(dict.fromkeys(names, fp.NM(2, 4)), input_dims=fp.input_dims(model))(params, scores=scores)
    assert list(masks) == names
    for name, mask in masks.items():
        inputs, outputs = mask.shape
        assert (mask.T.reshape(outputs, inputs // 4, 4).sum(-1) == 2).all(), name
        linear = fp.Plan({name: fp.NM(2, 4)})({name: params[name].T}, scores={name: scores[name].T})[name]
        assert torch.equal(mask, linear.T)
    masked = fp.functional_call_masked(model, params, masks, gpt2.args, gpt2.kwargs)
    assert masked.logits.shape == gpt2().shape and torch.isfinite(masked.logits).all()
