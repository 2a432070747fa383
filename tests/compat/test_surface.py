"""The public surface: every name of torch.nn.utils.prune, same signatures."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch.nn.utils.prune as tp

import funcprune.compat as cp

CLASSES = [
    "BasePruningMethod",
    "PruningContainer",
    "Identity",
    "RandomUnstructured",
    "L1Unstructured",
    "RandomStructured",
    "LnStructured",
    "CustomFromMask",
]
FUNCTIONS = [
    "identity",
    "random_unstructured",
    "l1_unstructured",
    "random_structured",
    "ln_structured",
    "global_unstructured",
    "custom_from_mask",
    "remove",
    "is_pruned",
]
HELPERS = [
    "_validate_pruning_amount_init",
    "_validate_pruning_amount",
    "_validate_structured_pruning",
    "_validate_pruning_dim",
    "_compute_nparams_toprune",
    "_compute_norm",
]
METHODS = [
    "__init__",
    "__call__",
    "compute_mask",
    "apply_mask",
    "apply",
    "prune",
    "remove",
]
CONTAINER_METHODS = ["add_pruning_method", "__len__", "__iter__", "__getitem__"]
BRIDGE = ["install_masks_", "masks_from_module", "unprune_"]
#: funcprune's own additions: the bridge, and the adapter of funcprune specs.
ADAPTERS = ["SpecMethod"]


def shape_of(fn: Any) -> list[tuple[str, Any, Any]]:
    """Parameter names, kinds and defaults (annotations aside)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_torch_defines_no_public_name_we_lack() -> None:
    defined = {
        name
        for name, obj in vars(tp).items()
        if getattr(obj, "__module__", None) == tp.__name__ and not name.startswith("__")
    }
    assert defined == set(CLASSES + FUNCTIONS + HELPERS)


def test_all_lists_the_public_names_and_each_imports() -> None:
    assert sorted(cp.__all__) == sorted(CLASSES + FUNCTIONS + BRIDGE + ADAPTERS)
    for name in cp.__all__:
        assert getattr(cp, name) is not None
        assert getattr(cp, name).__doc__


@pytest.mark.parametrize("name", FUNCTIONS + HELPERS)
def test_function_signature(name: str) -> None:
    assert shape_of(getattr(cp, name)) == shape_of(getattr(tp, name))


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("method", METHODS)
def test_method_signature(cls: str, method: str) -> None:
    ours, theirs = getattr(getattr(cp, cls), method), getattr(getattr(tp, cls), method)
    assert shape_of(ours) == shape_of(theirs)
    assert isinstance(inspect.getattr_static(getattr(cp, cls), method), classmethod) == (
        isinstance(inspect.getattr_static(getattr(tp, cls), method), classmethod)
    )


@pytest.mark.parametrize("method", CONTAINER_METHODS)
def test_container_method_signature(method: str) -> None:
    assert shape_of(getattr(cp.PruningContainer, method)) == shape_of(
        getattr(tp.PruningContainer, method)
    )


@pytest.mark.parametrize("cls", CLASSES)
def test_classes_subclass_torch_namesakes(cls: str) -> None:
    ours = getattr(cp, cls)
    assert issubclass(ours, getattr(tp, cls))
    assert issubclass(ours, cp.BasePruningMethod)
    assert ours.__module__ == "funcprune.compat"
    assert getattr(ours, "PRUNING_TYPE", None) == getattr(getattr(tp, cls), "PRUNING_TYPE", None)


def test_base_is_abstract_like_torch() -> None:
    with pytest.raises(TypeError):
        cp.BasePruningMethod()  # type: ignore[abstract]
    with pytest.raises(TypeError):
        tp.BasePruningMethod()  # type: ignore[abstract]


@pytest.mark.parametrize("name", HELPERS)
def test_helpers_are_not_in_all_but_importable(name: str) -> None:
    assert name not in cp.__all__
    assert callable(getattr(cp, name))
