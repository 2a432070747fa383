"""Names and name-keyed dicts (funcprune._names): patterns, suggestions, fit checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.prune as tprune
from _models import lenet, params_of
from torch import nn

import funcprune as fp


def test_patterns_match_dotted_names() -> None:
    net = nn.ModuleDict(
        {
            "layer1": nn.ModuleDict({"conv1": nn.Conv2d(1, 2, 1), "conv2": nn.Conv2d(2, 2, 1)}),
            "layer2": nn.ModuleDict({"conv1": nn.Conv2d(2, 2, 1), "bn1": nn.BatchNorm2d(2)}),
            "fc": nn.Linear(2, 2),
        }
    )
    params = params_of(net)
    masks = fp.Plan({"layer*.conv*.weight": fp.Identity(), "fc.bias": fp.Identity()})(params)
    assert list(masks) == [
        "layer1.conv1.weight",
        "layer1.conv2.weight",
        "layer2.conv1.weight",
        "fc.bias",
    ]
    assert list(fp.Plan({"layer?.*1.weight": fp.Identity()})(params)) == [
        "layer1.conv1.weight", "layer2.conv1.weight", "layer2.bn1.weight"
    ]  # fmt: skip
    assert list(fp.Plan({"layer[2].*.bias": fp.Identity()})(params)) == [
        "layer2.conv1.bias",
        "layer2.bn1.bias",
    ]


def test_a_name_without_glob_characters_matches_exactly() -> None:
    params = {
        "fc1.weight": torch.ones(2),
        "fc1.weight2": torch.ones(2),
        "xfc1.weight": torch.ones(2),
    }
    assert list(fp.Plan({"fc1.weight": fp.Identity()})(params)) == ["fc1.weight"]
    with pytest.raises(fp.UnknownNameError):
        fp.Plan({"fc1": fp.Identity()})(params)


def test_unknown_names_and_empty_patterns_name_it_and_suggest() -> None:
    params = params_of(lenet())
    with pytest.raises(
        fp.UnknownNameError, match=r"rule 'conv1\.wieght' .*did you mean 'conv1\.weight'"
    ):
        fp.Plan({"conv1.wieght": fp.Identity()})(params)
    with pytest.raises(KeyError, match=r"'fc\*\.wieght' matches no parameter.*'fc1\.weight'"):
        fp.Plan({"fc*.wieght": fp.Identity()})(params)
    with pytest.raises(
        ValueError, match="global_unstructured: name 'conv3.weight' matches no parameter"
    ):
        fp.global_unstructured(["conv1.weight", "conv3.weight"], fp.L1Unstructured(1))(params)
    with pytest.raises(fp.UnknownNameError, match="mask for 'fc4.weight' is not a parameter name"):
        fp.Plan({})(params, {"fc4.weight": torch.ones(1)})
    with pytest.raises(fp.UnknownNameError, match="scores for 'conv1.weigh' is not a parameter"):
        fp.Plan({})(params, scores={"conv1.weigh": torch.ones(1)})


def test_masks_and_scores_that_do_not_fit_their_parameter_are_refused() -> None:
    params = {"fc.weight": torch.randn(3, 4)}
    plan = fp.Plan({"fc.weight": fp.L1Unstructured(1)})
    with pytest.raises(ValueError, match=r"mask for 'fc.weight' has shape \(4, 3\).*\(3, 4\)"):
        plan(params, {"fc.weight": torch.ones(4, 3, dtype=torch.bool)})
    with pytest.raises(ValueError, match="mask for 'fc.weight' is on meta"):
        plan(params, {"fc.weight": torch.ones(3, 4, dtype=torch.bool, device="meta")})
    with pytest.raises(ValueError, match="scores for 'fc.weight' has shape"):
        plan(params, scores={"fc.weight": torch.ones(12)})
    with pytest.raises(ValueError, match=r"mask for 'fc.weight' must hold only 0 and 1.*\[0.5, "):
        plan(params, {"fc.weight": torch.full((3, 4), 0.5)})


def test_float_earlier_masks_are_converted() -> None:
    params = {"w": torch.tensor([1.0, 2.0, 3.0])}
    masks = fp.Plan({"w": fp.L1Unstructured(1)})(params, {"w": torch.tensor([0.0, 1.0, 1.0])})
    assert masks["w"].tolist() == [False, False, True]


def test_a_plan_refuses_the_parameters_of_a_hook_mode_module() -> None:
    """``fc1.weight_orig`` is not ``fc1.weight``: the rule would silently prune nothing."""
    model = lenet()
    tprune.l1_unstructured(model.fc1, "weight", amount=0.5)
    params = dict(model.named_parameters())
    for plan in (fp.Plan({"fc*.weight": fp.L1Unstructured(0.5)}),
                 fp.global_unstructured(["*.weight"], fp.L1Unstructured(0.5))):  # fmt: skip
        with pytest.raises(ValueError, match=r"params holds 'fc1.weight_orig' but no 'fc1.weight'.*compat.unprune_"):
            plan(params)
