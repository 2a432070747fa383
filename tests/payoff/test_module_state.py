"""shrink and propagate with module state the old fx tracer could not see: hooks, parametrizations, weight_norm.

Each case failed silently before the export-based analysis (issue 24):
a forward pre-hook gave a shrunk model that differs from the masked one,
a forward hook a model that failed on its first call, spectral_norm a
model that kept the old width in its parametrization's state, and the
deprecated weight_norm torch's deepcopy error naming neither.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations

import funcprune as fp

Tensor = torch.Tensor


def two_layers() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3)).eval()


def half_of_layer0(model: nn.Module) -> dict[str, Tensor]:
    """Masks pruning rows 0-3 of every parameter of layer 0 with 8 rows (its weight, bias, originals)."""
    masks = {}
    for name, p in model.named_parameters():
        if name.startswith("0.") and p.shape[0] == 8:
            mask = torch.ones_like(p, dtype=torch.bool)
            mask[:4] = False
            masks[name] = mask
    return masks


def check_against_masked(model: nn.Module, masks: dict[str, Tensor], x: Tensor) -> Any:
    closure = fp.propagate(model, masks, x)
    small = fp.shrink(model, masks, x)
    reference = fp.functional_call_masked(model, dict(model.named_parameters()), closure, x)
    torch.testing.assert_close(small(x), reference, atol=1e-6, rtol=1e-6)
    return small


def test_a_forward_pre_hook_is_followed() -> None:
    model = two_layers()
    model[1].register_forward_pre_hook(lambda mod, args: (args[0].flip(-1),))
    x = torch.randn(5, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fp.KeptChannelsWarning)
        small = check_against_masked(model, half_of_layer0(model), x)
    assert small[0].out_features == 4 and small[1].in_features == 4


def test_a_forward_hook_adding_a_vector_keeps_the_channels_it_reaches() -> None:
    model = two_layers()
    shift = torch.randn(8)
    model[0].register_forward_hook(lambda mod, args, out: out + shift)
    x = torch.randn(5, 4)
    with pytest.warns(fp.KeptChannelsWarning, match="'0' keeps 4 .*meets them with a tensor of its own entries"):
        small = check_against_masked(model, half_of_layer0(model), x)
    assert small[0].out_features == 8  # kept, and the model runs


@pytest.mark.parametrize("norm", ["spectral_norm", "legacy spectral_norm"])
def test_a_parametrized_weight_is_kept_and_said(norm: str) -> None:
    model = two_layers()
    if norm == "spectral_norm":
        parametrizations.spectral_norm(model[0])
    else:
        nn.utils.spectral_norm(model[0])
    model.eval()
    x = torch.randn(5, 4)
    masks = half_of_layer0(model)
    # the weight is the parameter divided by a norm computed from all of it: its rows stay, for that reason
    why = "no channel of it can be followed|reads '0.(parametrizations.)?weight(_)?(.)?orig(inal)?' directly"
    with pytest.warns(fp.KeptChannelsWarning, match=f"'0.*' keeps 4 .*({why})"):
        small = check_against_masked(model, masks, x)
    assert small(x).shape == (5, 3)
    assert {n: p.shape for n, p in small.named_parameters()} == {n: p.shape for n, p in model.named_parameters()}


def test_a_weight_norm_parametrization_keeps_its_shapes_consistent() -> None:
    model = two_layers()
    parametrizations.weight_norm(model[0])
    x = torch.randn(5, 4)
    with pytest.warns(fp.KeptChannelsWarning, match="no channel of it can be followed"):
        small = fp.shrink(model, half_of_layer0(model), x)
    assert small(x).shape == (5, 3)


def test_the_deprecated_weight_norm_is_refused_naming_it() -> None:
    model = two_layers()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        nn.utils.weight_norm(model[0])
    x = torch.randn(5, 4)
    for call in (lambda: fp.shrink(model, {}, x), lambda: fp.propagate(model, {}, x), lambda: fp.bake(model, {})):
        with pytest.raises(ValueError, match=r"'0' is under the deprecated torch.nn.utils.weight_norm.*parametrizations"):
            call()


def test_shrink_propagate_and_bake_refuse_transforms_saying_so() -> None:
    model = two_layers()
    stacked = torch.ones(3, 8, 4, dtype=torch.bool)
    x = torch.randn(2, 4)
    for fn in (fp.propagate, fp.shrink):
        with pytest.raises(ValueError, match=rf"{fn.__name__}: the mask for '0.weight' is inside a torch.func transform"):
            torch.func.vmap(lambda m, fn=fn: fn(model, {"0.weight": m}, x))(stacked)
    with pytest.raises(ValueError, match="bake: the mask for '0.weight' is inside a torch.func transform"):
        torch.func.vmap(lambda m: fp.bake(model, {"0.weight": m}))(stacked)


def test_channels_a_computed_weight_reads_are_kept_not_refused() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), parametrizations.weight_norm(nn.Linear(3, 2))).eval()
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False
    x = torch.randn(2, 4)
    with pytest.warns(fp.KeptChannelsWarning, match="'0' keeps 1 .*a Linear of a computed weight, reads them"):
        small = check_against_masked(model, {"0.weight": mask}, x)
    assert small[0].out_features == 3


def test_a_layer_called_on_the_input_and_again_keeps_its_channels_saying_why() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.s, self.head = nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x: Tensor) -> Tensor:
            out: Tensor = self.head(self.s(torch.relu(self.s(x))))
            return out

    torch.manual_seed(0)
    model = Twice().eval()
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[1] = False
    with pytest.warns(fp.KeptChannelsWarning, match="'s' keeps 1 .*reads them with the columns that read the model's input"):
        small = check_against_masked(model, {"s.weight": mask}, torch.randn(2, 4))
    assert small.s.out_features == 4
