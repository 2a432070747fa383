"""The one registry of the specs computed on DTensors, and the lists read from it (funcprune._dtensor._dispatch)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest
import torch

import funcprune as fp
from funcprune import _dtensor
from funcprune._dtensor import _dispatch

ROOT = Path(__file__).resolve().parents[2]
#: Every built-in spec type but Chain, which the fold runs step by step.
BUILT_IN = {fp.L1Unstructured, fp.RandomUnstructured, fp.LnStructured, fp.RandomStructured, fp.Identity,
            fp.CustomFromMask, fp.NM, fp.Block, fp.PerSlice}  # fmt: skip


def test_every_built_in_spec_is_registered_and_only_the_random_ones_draw() -> None:
    assert set(_dispatch.ON_BLOCKS) == BUILT_IN
    drawing = {kind for kind, on in _dispatch.ON_BLOCKS.items() if on.draws}
    assert drawing == {fp.RandomUnstructured, fp.RandomStructured}
    assert _dtensor.supported() == [kind.__name__ for kind in _dispatch.ON_BLOCKS]
    assert set(_dtensor.supported(draws=False)) == {kind.__name__ for kind in BUILT_IN - drawing}


def test_the_registry_cannot_be_changed_at_run_time() -> None:
    with pytest.raises(TypeError):
        _dispatch.ON_BLOCKS[fp.Identity] = _dispatch.ON_BLOCKS[fp.NM]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        _dispatch.ON_BLOCKS[fp.NM].draws = True  # type: ignore[misc]


def test_compute_masks_docstring_lists_the_registry() -> None:
    doc = " ".join((fp.compute_mask.__doc__ or "").split())
    assert "{dtensor_specs}" not in doc
    listed = re.search(r"imported\): (.*?) and chains of them", doc)
    assert listed is not None
    assert re.findall(r"``(\w+)``", listed.group(1)) == _dtensor.supported()


def test_the_refusal_lists_what_the_registry_holds() -> None:
    @dataclasses.dataclass(frozen=True)
    class Mine(fp.Spec):
        pruning_type = "unstructured"

        def compute_mask(
            self, scores: torch.Tensor, default_mask: torch.Tensor | None = None, *,
            generator: torch.Generator | None = None,
        ) -> torch.Tensor:
            return torch.ones_like(scores, dtype=torch.bool)

    with pytest.raises(NotImplementedError) as refused:
        _dispatch.check_supported("compute_mask", "scores", Mine())
    assert ", ".join(_dtensor.supported()) + " and chains of them" in str(refused.value)
    with pytest.raises(NotImplementedError) as inside:
        _dispatch.check_supported("compute_mask", "scores", fp.PerSlice(fp.RandomUnstructured(0.5)))
    assert ", ".join(_dtensor.supported(draws=False)) + " and chains of them" in str(inside.value)


def test_the_docs_hook_writes_the_registry_into_the_guide() -> None:
    spec = importlib.util.spec_from_file_location("dtensor_specs_hook", ROOT / "docs" / "_hooks" / "dtensor_specs.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (ROOT / "docs" / "guide" / "distributed.md").read_text(encoding="utf-8")
    built = hook.on_page_markdown(page)
    region = built[built.index("<!-- dtensor-specs -->") : built.index("<!-- /dtensor-specs -->")]
    assert re.findall(r"`(\w+)`", region.split(". Where")[0]) == _dtensor.supported()
    assert built.replace(region, "") == page.replace(
        page[page.index("<!-- dtensor-specs -->") : page.index("<!-- /dtensor-specs -->")], ""
    )
    assert hook.on_page_markdown("no markers here") == "no markers here"
