"""A layer under the deprecated spectral_norm (a ``weight_orig`` Parameter, no pruning hook) is not hook mode."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import funcprune as fp
import funcprune.compat as prune


def model() -> nn.Sequential:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    nn.utils.spectral_norm(net[0])
    return net


def test_prunable_and_input_dims_take_a_spectral_norm_model() -> None:
    net = model()
    assert fp.prunable(net) == ["2.weight"]  # 0.weight is computed, not a Parameter: left out
    assert fp.input_dims(net) == {"2.weight": 1}


def test_a_plan_over_a_spectral_norm_model_says_what_to_do() -> None:
    params = dict(model().named_parameters())
    with pytest.raises(ValueError, match=r"'0.weight_orig' but no '0.weight'.*spectral_norm.*parametrizations"):
        fp.Plan({"2.weight": fp.L1Unstructured(0.5)})(params)


def test_hook_mode_is_still_refused_by_its_hooks() -> None:
    net = model()
    prune.l1_unstructured(net[2], "weight", amount=0.5)
    with pytest.raises(ValueError, match=r"prunable: '2.weight_orig' belongs to a module pruned in hook mode"):
        fp.prunable(net)
