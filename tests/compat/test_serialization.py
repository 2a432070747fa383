"""Saving and loading pruned modules and tensors, as with torch.nn.utils.prune.

compat attaches a ``__deepcopy__`` to the pruned attribute (``module.weight``);
nothing of it may reach what users save: a saved pruned tensor is a plain
tensor (``torch.load`` with ``weights_only=True`` accepts it), byte for byte
what torch saves.
"""

from __future__ import annotations

import copy
import io
import pickle
import types
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as tp
from torch import nn

import funcprune.compat as cp

from ._helpers import LIBS, Small, assert_same_state, assert_same_tensor

Tensor = torch.Tensor
X = torch.randn(2, 2, 4, 4, generator=torch.Generator().manual_seed(3))


def pruned(lib: types.ModuleType) -> Any:
    torch.manual_seed(0)
    model: Any = Small()
    lib.l1_unstructured(model.conv, "weight", 0.5)
    lib.ln_structured(model.conv, "weight", 1, n=2, dim=0)  # a container
    lib.random_unstructured(model.fc, "bias", 2)
    model(X).sum().backward()  # the attributes as a forward leaves them
    return model


def saved(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def loaded(data: bytes, *, weights_only: bool) -> Any:
    return torch.load(io.BytesIO(data), weights_only=weights_only)


@pytest.mark.parametrize("forward", [False, True], ids=["at-prune-time", "after-forward"])
def test_a_saved_pruned_tensor_is_a_plain_tensor(forward: bool) -> None:
    fcs: dict[str, Any] = {}
    for key, lib in LIBS.items():
        torch.manual_seed(0)
        fcs[key] = nn.Linear(3, 2)
        lib.l1_unstructured(fcs[key], "weight", 0.5)
        if forward:
            fcs[key](torch.ones(1, 3))
    ours, theirs = fcs["compat"].weight, fcs["torch"].weight
    assert saved({"w": ours}) == saved({"w": theirs})
    back = loaded(saved({"w": ours}), weights_only=True)["w"]  # the default of torch.load
    assert type(back) is Tensor and vars(back) == {}
    assert_same_tensor(back, theirs.detach())
    assert back.requires_grad == theirs.requires_grad
    pickled = pickle.loads(pickle.dumps(ours))
    assert type(pickled) is Tensor and vars(pickled) == {}
    assert b"funcprune" not in pickle.dumps(ours)


def test_user_attributes_of_the_pruned_tensor_are_saved_like_torch() -> None:
    values = []
    for lib in LIBS.values():
        fc: Any = nn.Linear(3, 2)
        lib.identity(fc, "weight")
        fc.weight.note = "kept"
        values.append(vars(loaded(saved(fc.weight), weights_only=False)))
    assert values[0] == values[1] == {"note": "kept"}


def test_state_dicts_load_with_weights_only() -> None:
    states = {key: loaded(saved(pruned(lib).state_dict()), weights_only=True)
              for key, lib in LIBS.items()}
    assert list(states["compat"]) == list(states["torch"])
    for key, value in states["torch"].items():
        assert_same_tensor(states["compat"][key], value, key)
    fresh = pruned(cp)
    fresh.load_state_dict(states["compat"])
    assert_same_tensor(fresh(X), pruned(tp)(X))


def test_a_saved_module_loads_and_deep_copies() -> None:
    model = pruned(cp)
    back = loaded(saved(model), weights_only=False)
    assert_same_state(model, back)
    assert_same_tensor(back(X), model(X))
    for clone in (copy.deepcopy(back), copy.deepcopy(loaded(saved(back), weights_only=False))):
        assert_same_state(model, clone)
        assert_same_tensor(clone(X), model(X))
        clone(X).sum().backward()
        assert torch.equal(clone.conv.weight_orig.grad != 0, clone.conv.weight_mask != 0)
    with pytest.raises(pickle.UnpicklingError, match="weights_only"):
        loaded(saved(model), weights_only=True)  # hooks are code: torch refuses both alike
    with pytest.raises(pickle.UnpicklingError, match="weights_only"):
        loaded(saved(pruned(tp)), weights_only=True)


def test_deepcopy_still_links_the_copy_to_its_parameter_after_saving() -> None:
    model = pruned(cp)
    saved(model.conv.weight)  # pickling must leave the tensor's deep-copy protocol alone
    clone = copy.deepcopy(model)
    clone.conv.weight.sum().backward()
    assert torch.equal(clone.conv.weight_orig.grad, clone.conv.weight_mask)
