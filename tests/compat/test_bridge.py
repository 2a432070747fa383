"""The bridge between mask dicts and hook mode: install, read back, unprune."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as tp
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.func import functional_call

import funcprune.compat as cp
from _differential import one_thread

from ._helpers import (
    LIBS,
    Small,
    assert_same_fingerprint,
    assert_same_state,
    assert_same_tensor,
    fingerprint,
    twins,
)

Tensor = torch.Tensor
X = torch.randn(3, 2, 4, 4, generator=torch.Generator().manual_seed(2))
NAMES = ["conv.weight", "conv.bias", "fc.weight", "fc.bias"]


def functional_output(model: nn.Module, masks: dict[str, Tensor]) -> Tensor:
    """The functional mode: plain parameters times their masks."""
    params = {
        name: p * masks[name].to(p.dtype) if name in masks else p
        for name, p in model.named_parameters()
    }
    out: Tensor = functional_call(model, params, (X,))
    return out


@st.composite
def mask_dicts(draw: st.DrawFn) -> dict[str, Tensor]:
    shapes = {name: p.shape for name, p in Small().named_parameters()}
    chosen = draw(st.lists(st.sampled_from(NAMES), unique=True))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    return {name: torch.rand(shapes[name], generator=g) > 0.4 for name in chosen}


@given(mask_dicts())
# Small's tensors (at most 80 entries) take funcprune's one-thread paths at any thread count;
# torch's tiny convs on two threads only wait for each other, for seconds when the other core is busy
@one_thread()
def test_install_read_unprune_round_trip(masks: dict[str, Tensor]) -> None:
    model: Any = Small()
    params = dict(model.named_parameters())
    values = {name: p.detach().clone() for name, p in params.items()}
    expected = functional_output(model, masks)

    assert cp.install_masks_(model, masks) is model
    assert cp.is_pruned(model) == bool(masks)
    read = cp.masks_from_module(model)
    assert sorted(read) == sorted(masks)
    for name, mask in masks.items():
        assert_same_tensor(read[name], mask, name)
        assert read[name] is not mask
    assert_same_tensor(model(X), expected)

    back = cp.unprune_(model)
    assert back.keys() == masks.keys()
    for name in masks:
        assert_same_tensor(back[name], masks[name], name)
    assert not cp.is_pruned(model)
    now = dict(model.named_parameters())
    assert sorted(now) == sorted(params)
    for name, p in params.items():
        assert now[name] is p  # the very same Parameter objects
        assert_same_tensor(p.detach(), values[name], name)  # unpruned values kept
    assert list(model.buffers()) == []
    assert_same_tensor(functional_output(model, back), expected)


@pytest.mark.parametrize("lib", list(LIBS.values()), ids=list(LIBS))
def test_read_and_unprune_hooked_modules_of_either_library(lib: types.ModuleType) -> None:
    model: Any = Small()
    torch.manual_seed(0)
    lib.l1_unstructured(model.conv, "weight", 0.4)
    lib.ln_structured(model.conv, "weight", 1, n=2, dim=0)
    lib.random_unstructured(model.fc, "bias", 2)
    hooked = model(X)
    buffers = {"conv.weight": model.conv.weight_mask.clone(), "fc.bias": model.fc.bias_mask.clone()}
    origs = {"conv.weight": model.conv.weight_orig, "fc.bias": model.fc.bias_orig}
    origs_values = {name: p.detach().clone() for name, p in origs.items()}

    masks = cp.masks_from_module(model)
    assert list(masks) == ["conv.weight", "fc.bias"]
    for name, mask in masks.items():
        assert mask.dtype == torch.bool
        assert torch.equal(mask, buffers[name] != 0)
    assert_same_tensor(model(X), hooked)  # reading changes nothing

    back = cp.unprune_(model)
    for name in masks:
        assert torch.equal(back[name], masks[name])
        assert model.get_parameter(name) is origs[name]
        assert torch.equal(origs[name], origs_values[name])
    assert not tp.is_pruned(model)
    assert_same_tensor(functional_output(model, back), hooked)

    cp.install_masks_(model, back)
    assert_same_tensor(model(X), hooked)
    assert cp.masks_from_module(model).keys() == masks.keys()


def test_switching_modes_during_training_matches_hook_mode_throughout() -> None:
    hook_only, switching = twins(Small)
    g = torch.Generator().manual_seed(0)
    masks = {"conv.weight": torch.rand(4, 2, 3, 3, generator=g) > 0.5,
             "fc.weight": torch.rand(5, 16, generator=g) > 0.5}
    cp.install_masks_(hook_only, masks)
    cp.install_masks_(switching, masks)
    opt_a = torch.optim.SGD(hook_only.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(switching.parameters(), lr=0.1)
    for step in range(6):
        opt_a.zero_grad()
        hook_only(X).square().mean().backward()
        opt_a.step()
        opt_b.zero_grad()
        if step % 2 == 0:  # hook mode
            switching(X).square().mean().backward()
            opt_b.step()
            current = cp.unprune_(switching)  # -> functional mode
        else:  # functional mode
            loss = functional_output(switching, current).square().mean()
            loss.backward()  # type: ignore[no-untyped-call]
            opt_b.step()
            cp.install_masks_(switching, current)  # -> hook mode
    cp.unprune_(switching)  # the last step (odd) went back to hook mode
    cp.unprune_(hook_only)
    for (name, a), (_, b) in zip(sorted(hook_only.named_parameters()),
                                 sorted(switching.named_parameters())):
        assert torch.allclose(a, b), name


def test_install_on_a_pruned_tensor_combines_masks() -> None:
    fc: Any = nn.Linear(4, 2)
    fc.weight.data = torch.arange(1.0, 9.0).reshape(2, 4)
    cp.l1_unstructured(fc, "weight", 2)  # prunes 1.0 and 2.0
    cp.install_masks_(fc, {"weight": torch.tensor([[True, True, True, False], [True] * 4])})
    assert fc.weight_mask.tolist() == [[0.0, 0.0, 1.0, 0.0], [1.0] * 4]
    hook = next(iter(fc._forward_pre_hooks.values()))
    assert [type(m).__name__ for m in hook] == ["L1Unstructured", "CustomFromMask"]


def test_install_matches_custom_from_mask() -> None:
    ours, theirs = twins(Small)
    masks = {"fc.weight": torch.rand(5, 16) > 0.5, "conv.bias": torch.tensor([True, False] * 2)}
    cp.install_masks_(ours, masks)
    for name, mask in masks.items():
        prefix, _, leaf = name.rpartition(".")
        tp.custom_from_mask(theirs.get_submodule(prefix), leaf, mask)
    assert_same_state(theirs, ours)


def test_top_level_parameters_use_plain_names() -> None:
    fc: Any = nn.Linear(3, 2)
    cp.install_masks_(fc, {"bias": torch.tensor([False, True])})
    assert list(cp.masks_from_module(fc)) == ["bias"]
    assert list(cp.unprune_(fc)) == ["bias"]


def test_unpruned_module_gives_an_empty_dict_and_stays_as_is() -> None:
    model: Any = Small()
    before = fingerprint(model)
    assert cp.masks_from_module(model) == {}
    assert cp.unprune_(model) == {}
    assert cp.install_masks_(model, {}) is model
    assert_same_fingerprint(before, fingerprint(model))


def test_unprune_refreshes_rnn_flat_weights() -> None:
    lstm: Any = nn.LSTM(3, 2)
    weight = lstm.weight_hh_l0
    cp.l1_unstructured(lstm, "weight_hh_l0", 0.5)
    masks = cp.unprune_(lstm)
    assert lstm._flat_weights[1] is weight is lstm.weight_hh_l0
    cp.install_masks_(lstm, masks)
    assert lstm._flat_weights[1] is lstm.weight_hh_l0 and not isinstance(lstm.weight_hh_l0,
                                                                         nn.Parameter)


BAD: list[tuple[str, Any, type[Exception], str]] = [
    ("not-a-mapping", [("fc.bias", torch.ones(5, dtype=torch.bool))], TypeError, "must be a dict"),
    ("key-not-str", {0: torch.ones(5, dtype=torch.bool)}, TypeError, "keyed by parameter names"),
    ("unknown-name", {"fc.bias": torch.ones(5, dtype=torch.bool), "fc.nope":
                      torch.ones(5, dtype=torch.bool)}, ValueError, "'fc.nope'"),
    ("unknown-module", {"head.bias": torch.ones(5, dtype=torch.bool)}, ValueError, "'head.bias'"),
    ("orig-name", {"conv.weight_orig": torch.ones(4, 2, 3, 3, dtype=torch.bool)}, ValueError,
     "conv.weight"),
    ("float-mask", {"fc.bias": torch.ones(5)}, TypeError, "torch.bool"),
    ("not-a-tensor", {"fc.bias": [True] * 5}, TypeError, "torch.bool"),
    ("wrong-shape", {"fc.bias": torch.ones(4, dtype=torch.bool)}, ValueError, r"\(4,\).*\(5,\)"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_install_errors_leave_the_module_as_it_was(
    case: tuple[str, Any, type[Exception], str],
) -> None:
    _, masks, error, match = case
    model: Any = Small()
    cp.l1_unstructured(model.conv, "weight", 3)
    before = fingerprint(model)
    with pytest.raises(error, match=match):
        cp.install_masks_(model, masks)
    assert_same_fingerprint(before, fingerprint(model))


def test_install_rolls_back_when_a_later_tensor_fails() -> None:
    model: Any = Small()
    model.fc.bias_mask = torch.ones(5)  # a plain attribute: registering the buffer fails
    before = fingerprint(model)
    with pytest.raises(KeyError, match="already exists"):
        cp.install_masks_(model, {"conv.weight": torch.ones(4, 2, 3, 3, dtype=torch.bool),
                                  "fc.bias": torch.ones(5, dtype=torch.bool)})
    assert_same_fingerprint(before, fingerprint(model))


def test_soft_masks_cannot_be_read_as_bool() -> None:
    fc: Any = nn.Linear(3, 2)
    cp.custom_from_mask(fc, "bias", torch.tensor([0.5, 1.0]))
    before = fingerprint(fc)
    with pytest.raises(ValueError, match="other than 0 and 1"):
        cp.masks_from_module(fc)
    with pytest.raises(ValueError, match="other than 0 and 1"):
        cp.unprune_(fc)
    assert_same_fingerprint(before, fingerprint(fc))


def test_incomplete_pruning_state_is_reported() -> None:
    fc: Any = nn.Linear(3, 2)
    cp.identity(fc, "bias")
    del fc._buffers["bias_mask"]
    with pytest.raises(ValueError, match="no buffer 'bias_mask'"):
        cp.masks_from_module(fc)
