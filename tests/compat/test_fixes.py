"""What compat fixes over torch.nn.utils.prune, one test (or more) per fix.

* ``copy.deepcopy`` of a pruned module works;
* re-pruning keeps the hook at its place among the forward pre-hooks;
* ``is_pruned``, ``remove`` (and re-pruning) recognise torch-pruned modules,
  and torch's recognise compat-pruned ones;
* state dicts load across torch-pruned and compat-pruned models.

(All-or-nothing calls are tested in test_functions.py.)
"""

from __future__ import annotations

import copy
import types
from typing import Any

import pytest
import torch
import torch._dynamo
import torch.nn.utils.prune as tp
from torch import nn

import funcprune.compat as cp

from ._helpers import LeNet, Small, assert_same_state, assert_same_tensor, twins

Tensor = torch.Tensor
X = torch.randn(2, 2, 4, 4, generator=torch.Generator().manual_seed(1))


def pruned(lib: types.ModuleType, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    model: Any = Small()
    lib.random_unstructured(model.conv, "weight", 0.3)
    lib.ln_structured(model.conv, "weight", 1, n=2, dim=0)
    lib.l1_unstructured(model.fc, "bias", 2)
    lib.identity(model.fc, "weight")
    return model


# --- deepcopy ----------------------------------------------------------------------------


def test_deepcopy_of_a_pruned_module() -> None:
    model = pruned(cp)
    clone = copy.deepcopy(model)
    assert_same_state(model, clone)
    assert_same_tensor(model(X), clone(X))
    assert clone.conv.weight_orig is not model.conv.weight_orig
    assert clone.conv.weight_mask is not model.conv.weight_mask
    hook = next(iter(clone.conv._forward_pre_hooks.values()))
    assert isinstance(hook, cp.PruningContainer) and len(hook) == 2
    assert hook is not next(iter(model.conv._forward_pre_hooks.values()))


def test_deepcopy_links_the_copy_attribute_to_the_copy_parameter() -> None:
    model = pruned(cp)
    clone = copy.deepcopy(model)  # before any forward: weight is mask * orig, not a leaf
    clone.conv.weight.sum().backward()
    assert model.conv.weight_orig.grad is None
    assert torch.equal(clone.conv.weight_orig.grad, clone.conv.weight_mask)


def test_deepcopy_is_independent_of_the_original() -> None:
    model = pruned(cp)
    clone = copy.deepcopy(model)
    with torch.no_grad():
        clone.conv.weight_orig.add_(1.0)
        clone.conv.weight_mask.fill_(1.0)
    clone(X)
    model(X)
    assert not torch.equal(clone.conv.weight, model.conv.weight)
    assert bool((model.conv.weight_mask == 0).any())


@pytest.mark.parametrize("forward_first", [False, True])
def test_deepcopy_twice_and_after_training_steps(forward_first: bool) -> None:
    model = pruned(cp)
    if forward_first:
        model(X).sum().backward()
    twice = copy.deepcopy(copy.deepcopy(model))
    assert_same_tensor(model(X), twice(X))
    with torch.no_grad():
        nested = copy.deepcopy(model)
    assert_same_tensor(model.conv.weight, nested.conv.weight)


def test_deepcopy_of_the_pruned_tensor_alone() -> None:
    model = pruned(cp)
    weight = copy.deepcopy(model.fc.bias)
    assert_same_tensor(weight, model.fc.bias)


def test_deepcopy_with_a_custom_method() -> None:
    class Halve(cp.BasePruningMethod):
        PRUNING_TYPE = "unstructured"

        def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
            return default_mask * 0.5

    fc: Any = nn.Linear(3, 2)
    Halve.apply(fc, "weight")
    clone = copy.deepcopy(fc)
    assert_same_tensor(clone.weight, fc.weight)


# --- hook position -------------------------------------------------------------------------


def order(module: Any) -> list[Any]:
    return [getattr(hook, "_tensor_name", hook) for hook in module._forward_pre_hooks.values()]


def user_hook(module: nn.Module, inputs: Any) -> None:
    return None


@pytest.mark.parametrize("again", ["l1_unstructured", "identity", "custom_from_mask"])
def test_re_pruning_keeps_the_hook_in_place(again: str) -> None:
    fc: Any = nn.Linear(4, 3)
    fc.register_forward_pre_hook(user_hook)
    cp.random_unstructured(fc, "weight", 0.3)
    cp.l1_unstructured(fc, "bias", 1)
    fc.register_forward_pre_hook(user_hook, prepend=True)
    keys = list(fc._forward_pre_hooks)
    assert order(fc) == [user_hook, user_hook, "weight", "bias"]
    if again == "l1_unstructured":
        cp.l1_unstructured(fc, "weight", 2)
    elif again == "identity":
        cp.identity(fc, "weight")
    else:
        cp.custom_from_mask(fc, "weight", torch.ones(3, 4))
    assert list(fc._forward_pre_hooks) == keys
    assert order(fc) == [user_hook, user_hook, "weight", "bias"]
    container = fc._forward_pre_hooks[keys[2]]
    assert isinstance(container, cp.PruningContainer) and len(container) == 2
    cp.l1_unstructured(fc, "weight", 1)
    assert fc._forward_pre_hooks[keys[2]] is container and len(container) == 3


def test_hook_order_decides_what_other_hooks_see() -> None:
    seen: list[Tensor] = []
    fc: Any = nn.Linear(2, 2)
    cp.identity(fc, "weight")
    fc.register_forward_pre_hook(lambda module, inputs: seen.append(module.weight))
    cp.l1_unstructured(fc, "weight", 2)  # the pruning hook still runs before the user's
    with torch.no_grad():
        fc.weight_orig.mul_(3)
    fc(torch.ones(1, 2))
    assert seen[-1] is fc.weight


# --- interplay with torch.nn.utils.prune ---------------------------------------------------


@pytest.mark.parametrize("first, second", [(tp, cp), (cp, tp)])
def test_each_library_recognises_the_other(first: types.ModuleType,
                                           second: types.ModuleType) -> None:
    model = pruned(first)
    assert second.is_pruned(model)
    for module, name in ((model.conv, "weight"), (model.fc, "bias"), (model.fc, "weight")):
        expected = getattr(module, name).detach().clone()
        original = module.weight_orig if name == "weight" else module.bias_orig
        assert second.remove(module, name) is module
        assert getattr(module, name) is original
        assert torch.equal(getattr(module, name), expected)
    assert not second.is_pruned(model)


@pytest.mark.parametrize("steps", [1, 2])
def test_re_pruning_a_torch_pruned_module_gives_torch_masks(steps: int) -> None:
    ours, theirs = twins(Small)
    for model in (ours, theirs):
        torch.manual_seed(0)
        tp.l1_unstructured(model.conv, "weight", 0.3)
        if steps == 2:
            tp.random_structured(model.conv, "weight", 1, dim=1)
    torch.manual_seed(1)
    cp.ln_structured(ours.conv, "weight", 1, n=2, dim=0)
    cp.random_unstructured(ours.conv, "weight", 0.2)
    torch.manual_seed(1)
    tp.ln_structured(theirs.conv, "weight", 1, n=2, dim=0)
    tp.random_unstructured(theirs.conv, "weight", 0.2)
    assert_same_tensor(ours.conv.weight_mask, theirs.conv.weight_mask)
    assert_same_tensor(ours(X), theirs(X))
    hook = next(iter(ours.conv._forward_pre_hooks.values()))
    assert [type(m).__name__ for m in hook] == [type(m).__name__ for m in next(
        iter(theirs.conv._forward_pre_hooks.values()))]


def test_torch_re_pruning_a_compat_pruned_module_appends_to_our_container() -> None:
    fc: Any = nn.Linear(4, 3)
    cp.l1_unstructured(fc, "weight", 2)
    cp.l1_unstructured(fc, "weight", 2)
    container = next(iter(fc._forward_pre_hooks.values()))
    tp.l1_unstructured(fc, "weight", 2)
    assert len(container) == 3 and next(iter(fc._forward_pre_hooks.values())) is container
    assert int((fc.weight_mask == 0).sum()) == 6


# --- state dicts across the two libraries ----------------------------------------------------


@pytest.mark.parametrize("source, target", [(tp, cp), (cp, tp)])
def test_state_dicts_load_across_libraries(source: types.ModuleType,
                                           target: types.ModuleType) -> None:
    trained = pruned(source, seed=0)
    fresh = pruned(target, seed=1)  # same pruning structure, other values and masks
    assert list(trained.state_dict()) == list(fresh.state_dict())
    for key, value in trained.state_dict().items():
        assert value.dtype == fresh.state_dict()[key].dtype, key
    result = fresh.load_state_dict(trained.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert_same_tensor(fresh(X), trained(X))
    for key, value in trained.state_dict().items():
        assert_same_tensor(fresh.state_dict()[key], value, key)


def test_lenet_checkpoint_round_trip_across_libraries() -> None:
    theirs, ours = twins(LeNet)
    for lib, model in ((tp, theirs), (cp, ours)):
        parameters = [(model.conv1, "weight"), (model.fc1, "weight"), (model.fc3, "bias")]
        lib.global_unstructured(parameters, pruning_method=lib.L1Unstructured, amount=0.2)
    ours.load_state_dict(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 1, 28, 28)
    # torch's hooks were installed first in both: same state, same outputs
    assert_same_state(theirs, ours)
    assert_same_tensor(theirs(x), ours(x))


def test_deepcopy_after_a_compiled_forward_and_no_graph_break() -> None:
    counts = []
    for lib in (tp, cp):
        torch.manual_seed(0)
        fc: Any = nn.Linear(3, 2)
        lib.l1_unstructured(fc, "weight", 2)
        torch._dynamo.reset()
        counts.append(torch._dynamo.explain(fc)(torch.ones(1, 3)).graph_break_count)
    assert counts[0] == counts[1] == 0
    torch._dynamo.reset()
    compiled: Any = torch.compile(fc, backend="eager")
    y = compiled(torch.ones(1, 3))
    clone = copy.deepcopy(fc)
    assert_same_tensor(clone(torch.ones(1, 3)), y)
    torch._dynamo.reset()
