"""The public surface: every exported name imports and is documented."""

from __future__ import annotations

import importlib

import pytest

import funcprune as fp

DESIGN_NAMES = [
    "Identity", "RandomUnstructured", "L1Unstructured", "RandomStructured",
    "LnStructured", "CustomFromMask", "Chain", "chain", "compute_mask", "prune",
]  # fmt: skip


@pytest.mark.parametrize("name", fp.__all__)
def test_every_exported_name_imports(name: str) -> None:
    module = importlib.import_module("funcprune")
    assert getattr(module, name) is not None


@pytest.mark.parametrize("name", DESIGN_NAMES)
def test_design_names_exist_and_are_documented(name: str) -> None:
    assert name in fp.__all__
    assert (getattr(fp, name).__doc__ or "").strip()


def test_all_is_sorted_and_unique() -> None:
    assert len(set(fp.__all__)) == len(fp.__all__)
