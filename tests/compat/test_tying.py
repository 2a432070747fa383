"""Tied weights: one Parameter used by several modules (``lm_head.weight =
embedding.weight``).

* the bridge hooks every user, as the functional API masks every user, and
  reads one key per Parameter;
* compat's pruning functions refuse to prune one user (torch silently unties
  the weight), before changing anything; untied parameters prune as in torch;
* the bridge's functions check their module argument.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
import torch
import torch.nn.utils.prune as tp
from torch import nn

import funcprune as fp
import funcprune.compat as cp
from funcprune.compat import _holders, _tying

from ._helpers import (
    Small,
    TiedLM,
    assert_same_fingerprint,
    assert_same_state,
    assert_same_tensor,
    fingerprint,
    twins,
)

Tensor = torch.Tensor
TOKENS = torch.tensor([[1, 4, 2, 9], [0, 10, 3, 3]])
SHAPES = {"embedding.weight": (11, 6), "linear.weight": (6, 6), "linear.bias": (6,)}


def random_masks(seed: int, names: tuple[str, ...] = ("embedding.weight", "linear.weight")
                 ) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.rand(SHAPES[name], generator=g) > 0.4 for name in names}


def plain_name(name: str) -> str:
    return name.removesuffix("_orig")


Step = tuple[Tensor, dict[str, Tensor]]


def hooked_step(model: nn.Module, opt: torch.optim.Optimizer | None = None) -> Step:
    """Output and gradients (by plain name) of one training step in hook mode."""
    out = model(TOKENS)
    out.square().mean().backward()
    grads = {plain_name(n): p.grad.clone() for n, p in model.named_parameters()
             if p.grad is not None}
    if opt is not None:
        opt.step()
    model.zero_grad()
    return out.detach(), grads


def functional_step(model: nn.Module, masks: dict[str, Tensor],
                    opt: torch.optim.Optimizer | None = None) -> Step:
    """The same with funcprune.functional_call_masked on an unpruned model."""
    params = dict(model.named_parameters())
    out = fp.functional_call_masked(model, params, masks, (TOKENS,))
    out.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in params.items() if p.grad is not None}
    if opt is not None:
        opt.step()
    model.zero_grad()
    return out.detach(), grads


def assert_same_step(a: Step, b: Step) -> None:
    assert torch.allclose(a[0], b[0], atol=1e-6)
    assert sorted(a[1]) == sorted(b[1])
    for name in a[1]:
        assert torch.allclose(a[1][name], b[1][name], atol=1e-6), name


# --- the bridge hooks every user ---------------------------------------------------------


def test_install_hooks_every_user_like_the_functional_api() -> None:
    hooked, functional = twins(TiedLM)
    masks = random_masks(0)
    cp.install_masks_(hooked, masks)
    assert hooked.lm_head.weight_orig is hooked.embedding.weight_orig  # still tied
    assert torch.equal(hooked.lm_head.weight_mask, hooked.embedding.weight_mask)
    assert [n for n, _ in hooked.named_parameters()] == [
        "embedding.weight_orig", "linear.bias", "linear.weight_orig"]
    opt_a = torch.optim.SGD(hooked.parameters(), lr=0.5)
    opt_b = torch.optim.SGD(functional.parameters(), lr=0.5)
    for _ in range(3):  # the tied weight gets both users' gradients, masked
        assert_same_step(hooked_step(hooked, opt_a), functional_step(functional, masks, opt_b))


def test_masks_round_trip_with_one_key_per_parameter() -> None:
    model, functional = twins(TiedLM)
    masks = random_masks(1)
    cp.install_masks_(model, masks)
    expected = hooked_step(model)
    read = cp.masks_from_module(model)
    assert list(read) == list(masks)  # "embedding.weight" only, named_parameters()' name
    back = cp.unprune_(model)
    assert list(back) == list(masks)
    for name in masks:
        assert torch.equal(read[name], masks[name]) and torch.equal(back[name], masks[name])
    assert model.lm_head.weight is model.embedding.weight  # tied again, plain
    assert not cp.is_pruned(model)
    assert_same_step(functional_step(model, back), expected)
    cp.install_masks_(model, back)
    assert_same_step(hooked_step(model), expected)
    assert_same_step(functional_step(functional, masks), expected)


def test_users_hooked_by_torch_read_as_one_key() -> None:
    model: Any = TiedLM()
    mask = random_masks(2)["embedding.weight"]
    tp.custom_from_mask(model.embedding, "weight", mask)
    tp.custom_from_mask(model.lm_head, "weight", mask)
    expected = hooked_step(model)
    assert list(cp.masks_from_module(model)) == ["embedding.weight"]
    back = cp.unprune_(model)
    assert_same_step(functional_step(model, back), expected)


def test_install_accepts_any_users_name_and_one_mask_per_parameter() -> None:
    model: Any = TiedLM()
    mask = random_masks(3)["embedding.weight"]
    cp.install_masks_(model, {"lm_head.weight": mask, "embedding.weight": mask.clone()})
    assert list(cp.masks_from_module(model)) == ["embedding.weight"]
    other: Any = TiedLM()
    before = fingerprint(other)
    with pytest.raises(ValueError, match="'lm_head.weight' and 'embedding.weight'.*tied"):
        cp.install_masks_(other, {"lm_head.weight": mask, "embedding.weight": ~mask})
    assert_same_fingerprint(before, fingerprint(other))


def differently_pruned(how: str) -> Any:
    model: Any = TiedLM()
    mask = random_masks(4)["embedding.weight"]
    if how == "both":
        tp.custom_from_mask(model.embedding, "weight", mask)
        tp.custom_from_mask(model.lm_head, "weight", ~mask)
    elif how == "one":
        tp.custom_from_mask(model.lm_head, "weight", mask)  # torch unties it
    return model


@pytest.mark.parametrize("how, match", [
    ("both", "'embedding.weight' and 'lm_head.weight' are one \\(tied\\) Parameter with "
     "different masks"),
    ("one", "'lm_head.weight' is pruned but 'embedding.weight', the same \\(tied\\) "
     "Parameter, is not"),
])
@pytest.mark.parametrize("fn", ["masks_from_module", "unprune_"])
def test_users_with_different_masks_have_no_mask_dict(how: str, match: str, fn: str) -> None:
    model = differently_pruned(how)
    before = fingerprint(model)
    with pytest.raises(ValueError, match=f"^{fn}: {match}.*one mask per Parameter"):
        getattr(cp, fn)(model)
    assert_same_fingerprint(before, fingerprint(model))


def test_an_unpruned_user_counts_as_a_mask_of_ones() -> None:
    model: Any = TiedLM()
    tp.identity(model.lm_head, "weight")
    assert list(cp.masks_from_module(model)) == ["embedding.weight"]


def test_install_refuses_to_leave_users_with_different_masks() -> None:
    model = differently_pruned("one")
    before = fingerprint(model)
    with pytest.raises(ValueError, match="^install_masks_: 'embedding.weight' and "
                       "'lm_head.weight' .*different masks"):
        cp.install_masks_(model, {"embedding.weight": torch.ones(11, 6, dtype=torch.bool)})
    assert_same_fingerprint(before, fingerprint(model))


# --- compat refuses to prune one user of a tied weight -------------------------------------

Call = Callable[[types.ModuleType, Any], Any]
#: name -> (the message's context, the other user's type, the call)
CALLS: dict[str, tuple[str, str, Call]] = {
    "l1_unstructured": ("L1Unstructured.apply", "Embedding",
                        lambda lib, m: lib.l1_unstructured(m.lm_head, "weight", 0.5)),
    "random_unstructured": ("RandomUnstructured.apply", "Linear",
                            lambda lib, m: lib.random_unstructured(m.embedding, "weight", 3)),
    "ln_structured": ("LnStructured.apply", "Embedding",
                      lambda lib, m: lib.ln_structured(m.lm_head, "weight", 1, n=2, dim=0)),
    "random_structured": ("RandomStructured.apply", "Embedding",
                          lambda lib, m: lib.random_structured(m.lm_head, "weight", 1, dim=1)),
    "identity": ("Identity.apply", "Linear", lambda lib, m: lib.identity(m.embedding, "weight")),
    "custom_from_mask": ("CustomFromMask.apply", "Embedding", lambda lib, m: lib.custom_from_mask(
        m.lm_head, "weight", torch.ones(11, 6))),
    "apply": ("L1Unstructured.apply", "Embedding", lambda lib, m: lib.L1Unstructured.apply(
        m.lm_head, "weight", amount=2)),
    "global_unstructured": ("global_unstructured", "Embedding",
                            lambda lib, m: lib.global_unstructured(
                                [(m.linear, "weight"), (m.lm_head, "weight")],
                                lib.L1Unstructured, amount=4)),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_pruning_one_user_of_a_tied_weight_raises(call: str) -> None:
    context, other, run = CALLS[call]
    model: Any = TiedLM()
    cp.l1_unstructured(model.linear, "bias", 1)  # an unrelated pruned tensor stays as it is
    before = fingerprint(model)
    state = torch.get_rng_state()
    with pytest.raises(ValueError) as info:
        run(cp, model)
    message = str(info.value)
    assert message.startswith(f"{context}: cannot prune 'weight' of ")
    assert f"the Parameter is tied: also held by a module of type {other} (as 'weight')" in message
    assert "funcprune.Plan + funcprune.functional_call_masked" in message
    assert "funcprune.compat.install_masks_(root_module, masks)" in message
    assert_same_fingerprint(before, fingerprint(model))
    assert torch.equal(torch.get_rng_state(), state)
    assert_same_step(hooked_step(model), hooked_step(copy.deepcopy(model)))


def test_torch_unties_where_compat_refuses() -> None:
    model: Any = TiedLM()
    tp.l1_unstructured(model.lm_head, "weight", 0.5)
    model(TOKENS)
    assert not torch.equal(model.lm_head.weight, model.embedding.weight)


def test_re_pruning_a_tied_weight_installed_by_the_bridge_raises() -> None:
    model: Any = TiedLM()
    cp.install_masks_(model, random_masks(5))
    before = fingerprint(model)
    with pytest.raises(ValueError, match="^L1Unstructured.apply: .* Embedding"):
        cp.l1_unstructured(model.lm_head, "weight", 0.5)
    assert_same_fingerprint(before, fingerprint(model))


def test_a_parameter_held_twice_by_one_module_is_tied() -> None:
    fc: Any = nn.Linear(3, 2)
    fc.alias = fc.weight
    with pytest.raises(ValueError, match="of type Linear \\(as 'alias'\\)"):
        cp.l1_unstructured(fc, "weight", 1)


def optimized(model: nn.Module) -> torch.optim.Optimizer:
    """An optimizer (its lists reference every Parameter), after one step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 2, 4, 4)).sum().backward()
    opt.step()
    return opt


@pytest.mark.parametrize("with_optimizer", [False, True])
def test_untied_parameters_prune_like_torch(with_optimizer: bool) -> None:
    ours, theirs = twins(Small)
    keep = [optimized(ours), optimized(theirs)] if with_optimizer else []
    x = torch.randn(2, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    for lib, model in ((cp, ours), (tp, theirs)):
        torch.manual_seed(1)
        lib.l1_unstructured(model.conv, "weight", 0.3)
        model(x).sum().backward()  # the pruned attribute's graph holds weight_orig
        lib.random_unstructured(model.conv, "weight", 0.2)  # re-pruning
        lib.global_unstructured([(model.conv, "weight"), (model.fc, "weight")],
                                lib.L1Unstructured, amount=10)
        lib.ln_structured(model.fc, "weight", 1, n=1, dim=0)
        torch.manual_seed(2)
        lib.random_structured(model.fc, "weight", 3, dim=1)
    assert_same_state(theirs, ours)
    assert_same_tensor(ours(x), theirs(x))
    assert len(keep) == (2 if with_optimizer else 0)


def test_only_parameters_referenced_elsewhere_are_searched() -> None:
    model: Any = Small()
    with mock.patch.object(_tying, "holders", wraps=_holders.holders) as search:
        cp.l1_unstructured(model.conv, "weight", 0.3)
        model(torch.randn(1, 2, 4, 4)).sum().backward()
        cp.l1_unstructured(model.conv, "weight", 0.3)  # re-pruning after a forward
        cp.ln_structured(model.fc, "weight", 1, n=2, dim=0)
        lstm = nn.LSTM(3, 2)  # its _flat_weights list references every Parameter
        cp.l1_unstructured(lstm, "weight_hh_l0", 0.5)
        lstm(torch.ones(1, 3))
        cp.l1_unstructured(lstm, "weight_hh_l0", 0.5)
        assert all(args[0] == [] for args, _ in search.call_args_list)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cp.l1_unstructured(model.fc, "bias", 1)  # the optimizer references it: searched
        assert search.call_args_list[-1].args[0] == [model.fc.bias_orig]
    assert any(p is model.fc.bias_orig for p in opt.param_groups[0]["params"])


def test_the_cheap_check_draws_no_random_numbers() -> None:
    fc = nn.Linear(3, 2)
    _tying._baseline.cache_clear()  # the first call measures the baseline
    state = torch.get_rng_state()
    cp.l1_unstructured(fc, "weight", 2)
    assert torch.equal(torch.get_rng_state(), state)


# --- the bridge checks its module argument ---------------------------------------------------

BRIDGE: dict[str, Callable[[Any], Any]] = {
    "masks_from_module": cp.masks_from_module,
    "install_masks_": lambda module: cp.install_masks_(module, {"weight": torch.ones(1)}),
    "unprune_": cp.unprune_,
}


@pytest.mark.parametrize("fn", list(BRIDGE))
@pytest.mark.parametrize("module", [None, {"weight": torch.ones(1)}])
def test_bridge_functions_need_a_module(fn: str, module: object) -> None:
    expected = f"{fn}: module must be a torch.nn.Module, got {type(module).__name__}"
    with pytest.raises(TypeError, match=f"^{expected}$"):
        BRIDGE[fn](module)
