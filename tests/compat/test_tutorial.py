"""The pruning tutorial, end to end, with torch.nn.utils.prune and with compat.

Each library runs every step of the tutorial on its own LeNet under the same
seed and records what the tutorial prints (parameters, buffers, masks,
pruned weights, hooks, the container's history, state-dict keys,
sparsities). The two transcripts must be equal; the only expected
difference is the fix that keeps a re-pruned hook at its place.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
from torch import nn

from ._helpers import LIBS, LeNet, assert_same_state, describe_hook, normalize

Tensor = torch.Tensor
Transcript = list[tuple[str, Any]]


def named(items: Any) -> list[tuple[str, Any]]:
    return [(name, value.detach().clone()) for name, value in items]


def hook_types(module: Any) -> list[tuple[str, str]]:
    return [(type(h).__name__, h._tensor_name) for h in module._forward_pre_hooks.values()]


def foobar_class(lib: types.ModuleType) -> Any:
    class FooBarPruningMethod(lib.BasePruningMethod):  # type: ignore[misc,name-defined]
        """Prune every other entry in a tensor"""

        PRUNING_TYPE = "unstructured"

        def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
            mask = default_mask.clone()
            mask.view(-1)[::2] = 0
            return mask

    return FooBarPruningMethod


def sparsity(tensor: Tensor) -> str:
    return "{:.2f}%".format(100.0 * float(torch.sum(tensor == 0)) / float(tensor.nelement()))


def run_tutorial(prune: types.ModuleType, seed: int) -> tuple[Transcript, list[Any]]:
    """Run the tutorial; the transcript, then the models it built (the first
    one's hooks in their raw order are left for the caller to inspect)."""
    log: Transcript = []
    torch.manual_seed(seed)
    model: Any = LeNet()  # pruning adds attributes at run time
    module = model.conv1
    log.append(("params", named(module.named_parameters())))
    log.append(("buffers", named(module.named_buffers())))

    prune.random_unstructured(module, name="weight", amount=0.3)
    log.append(("params after random", named(module.named_parameters())))
    log.append(("buffers after random", named(module.named_buffers())))
    log.append(("pruned weight", module.weight.detach().clone()))
    log.append(("weight is a plain attribute", "weight" in vars(module)))
    log.append(("hooks after random", hook_types(module)))

    prune.l1_unstructured(module, name="bias", amount=3)
    log.append(("params after l1", named(module.named_parameters())))
    log.append(("buffers after l1", named(module.named_buffers())))
    log.append(("pruned bias", module.bias.detach().clone()))
    log.append(("hooks after l1", hook_types(module)))

    prune.ln_structured(module, name="weight", amount=0.5, n=2, dim=0)
    log.append(("weight after ln", module.weight.detach().clone()))
    for hook in module._forward_pre_hooks.values():
        if hook._tensor_name == "weight":
            break
    log.append(("container", describe_hook(hook)))
    log.append(("history", [type(method).__name__ for method in hook]))
    log.append(("hook types by tensor", sorted(hook_types(module), key=lambda h: h[1])))
    log.append(("state dict keys", list(model.state_dict().keys())))
    log.append(("buffers before remove", named(module.named_buffers())))

    prune.remove(module, "weight")
    log.append(("params after remove", named(module.named_parameters())))
    log.append(("buffers after remove", named(module.named_buffers())))

    new_model = LeNet()
    for _, sub in new_model.named_modules():
        if isinstance(sub, torch.nn.Conv2d):
            prune.l1_unstructured(sub, name="weight", amount=0.2)
        elif isinstance(sub, torch.nn.Linear):
            prune.l1_unstructured(sub, name="weight", amount=0.4)
    log.append(("all masks exist", list(dict(new_model.named_buffers()).keys())))
    log.append(("all masks", named(new_model.named_buffers())))

    global_model = LeNet()
    parameters_to_prune = (
        (global_model.conv1, "weight"),
        (global_model.conv2, "weight"),
        (global_model.fc1, "weight"),
        (global_model.fc2, "weight"),
        (global_model.fc3, "weight"),
    )
    prune.global_unstructured(
        parameters_to_prune, pruning_method=prune.L1Unstructured, amount=0.2
    )
    log.append(("sparsities", [sparsity(m.weight) for m, _ in parameters_to_prune]))
    weights = [m.weight for m, _ in parameters_to_prune]
    log.append(("global sparsity", sparsity(torch.cat([w.flatten() for w in weights]))))
    log.append(("global hooks", [hook_types(m) for m, _ in parameters_to_prune]))

    foobar = foobar_class(prune)
    custom_model: Any = LeNet()
    foobar.apply(custom_model.fc3, "bias")
    log.append(("foobar mask", custom_model.fc3.bias_mask.clone()))
    foobar.apply(custom_model.fc3, "bias")  # again: acts on what is still unpruned
    log.append(("foobar twice", custom_model.fc3.bias_mask.clone()))
    foobar.apply(custom_model.fc3, "bias")
    log.append(("foobar thrice", custom_model.fc3.bias_mask.clone()))
    log.append(("foobar history", describe_hook(next(iter(
        custom_model.fc3._forward_pre_hooks.values())))))
    x = torch.randn(2, 1, 28, 28)
    log.append(("outputs", [m(x).detach() for m in (model, new_model, global_model,
                                                   custom_model)]))
    return log, [model, new_model, global_model, custom_model]


def assert_same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, Tensor):
        assert isinstance(b, Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), (where, a, b)
        for i, (u, v) in enumerate(zip(a, b)):
            assert_same(u, v, f"{where}[{i}]")
    elif isinstance(a, str):
        assert normalize(a) == normalize(b), (where, a, b)
    else:
        assert a == b, (where, a, b)


@pytest.mark.ci  # the default suite's 5 minutes: CI runs it
def test_tutorial_observes_the_same_with_either_library() -> None:
    for seed in (0, 1, 2):
        theirs, their_models = run_tutorial(LIBS["torch"], seed)
        ours, our_models = run_tutorial(LIBS["compat"], seed)
        assert [label for label, _ in theirs] == [label for label, _ in ours]
        for (label, a), (_, b) in zip(theirs, ours):
            assert_same(a, b, f"seed {seed}: {label}")
        for a_model, b_model in zip(their_models, our_models):
            assert_same_state(a_model, b_model)


def test_tutorial_values_as_printed() -> None:
    log, _ = run_tutorial(LIBS["compat"], 0)
    record = dict(log)
    assert [name for name, _ in record["params after random"]] == ["bias", "weight_orig"]
    assert [name for name, _ in record["buffers after l1"]] == ["weight_mask", "bias_mask"]
    assert record["history"] == ["RandomUnstructured", "LnStructured"]
    assert record["state dict keys"][:4] == [
        "conv1.weight_orig", "conv1.bias_orig", "conv1.weight_mask", "conv1.bias_mask"]
    assert [name for name, _ in record["params after remove"]] == ["bias_orig", "weight"]
    assert record["all masks exist"] == [
        "conv1.weight_mask", "conv2.weight_mask", "fc1.weight_mask", "fc2.weight_mask",
        "fc3.weight_mask"]
    assert record["global sparsity"] == "20.00%"
    assert record["foobar mask"].tolist() == [0.0, 1.0] * 5
    assert record["foobar twice"].tolist() == [0.0, 0.0, 0.0, 1.0] * 2 + [0.0, 0.0]
    assert record["hooks after l1"] == [("RandomUnstructured", "weight"),
                                        ("L1Unstructured", "bias")]


def test_tutorial_re_pruned_hook_keeps_its_place() -> None:
    _, models = run_tutorial(LIBS["compat"], 0)
    # the fix: after ln_structured the weight's container is still the first
    # hook (torch.nn.utils.prune moves it after the bias hook)
    assert hook_types(models[0].conv1) == [("L1Unstructured", "bias")]  # weight removed
    model: Any = LeNet()
    prune = LIBS["compat"]
    prune.random_unstructured(model.conv1, name="weight", amount=0.3)
    prune.l1_unstructured(model.conv1, name="bias", amount=3)
    prune.ln_structured(model.conv1, name="weight", amount=0.5, n=2, dim=0)
    assert hook_types(model.conv1) == [("PruningContainer", "weight"),
                                       ("L1Unstructured", "bias")]
