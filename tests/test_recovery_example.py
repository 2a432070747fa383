"""The recovery example (``examples/recovery_llm.py``) on a tiny Llama trained 2 steps.

The pipeline, not the quality of a model trained 2 steps: the global
ranking reaches the parameter fraction asked for with the fewest units, the
recovery trains one copy through the masks while the module's own tensors
(the teacher) stay as they were, and every route gives a finite perplexity.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import funcprune as fp

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="needs transformers (the hf extra)")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import depth_width_llm as dw  # noqa: E402
import recovery_llm as rl  # noqa: E402

CONFIG = dw.config_of(0, quick=True, steps=2)


@pytest.fixture(scope="module")
def s() -> Iterator[rl.Setup]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield rl.setup(CONFIG, None)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("criterion", rl.CRITERIA)
def test_masks_reach_the_fraction_with_the_fewest_units(s: rl.Setup, criterion: str) -> None:
    total = sum(p.numel() for p in s.params.values())
    scores, n = rl.scores_of(s, criterion)
    masks = rl.masks_at(s, 0.25, scores, n)
    assert dw.kept_parameters(s.params, masks) <= 0.75 * total
    groups = s.structure.of_kinds(*rl.KINDS).groups.values()
    count = sum(len(dw.pruned_units(g, masks)) for g in groups)
    fewer = fp.structured(s.structure, fp.LnStructured(count - 1, n=n), kinds=rl.KINDS, normalize="mean")
    one_less = fewer(s.params) if scores is None else fewer(s.params, scores=scores)
    assert dw.kept_parameters(s.params, one_less) > 0.75 * total


def test_recovery_trains_one_copy_through_the_masks(s: rl.Setup) -> None:
    masks = rl.masks_at(s, 0.25, None, 2)
    before = {n: p.clone() for n, p in s.model.named_parameters()}
    data = rl.batches(s, 3)
    for route in ("ce", "kd", "ce+kd"):
        student = rl.recover(s, masks, route, data)
        for name, mask in masks.items():
            assert torch.equal(student[name][~mask], s.params[name][~mask]), (route, name)  # zero gradient
            assert not torch.equal(student[name][mask], s.params[name][mask]), (route, name)  # it trained
    for name, p in s.model.named_parameters():
        assert torch.equal(p, before[name]) and p.data_ptr() == s.params[name].data_ptr(), name


def test_every_route_and_baseline_runs(s: rl.Setup) -> None:
    s.rows.clear()
    rl.structured_rows(s, 0.25, "fluctuation", lambda line: None)
    rl.oneshot_rows(s, 0.25, lambda line: None)
    rl.small_row(s, 0.25, None, lambda line: None)
    assert [(r.kind, r.route) for r in s.rows] == (
        [("structured", route) for route in rl.ROUTES] + [("oneshot", "none")] * 3 + [("small", "32 steps")]
    )
    assert all(math.isfinite(r.perplexity) and r.perplexity > 1 for r in s.rows)
    total = sum(p.numel() for p in s.params.values())
    assert all(r.parameters <= 0.75 * total for r in s.rows[:5])
    assert all(abs(r.parameters - 0.75 * total) < 1e-3 * total for r in s.rows[5:8])  # as many nonzeros
    assert abs(s.rows[-1].parameters - 0.75 * total) < 0.05 * total  # the train-small model is of the pruned size
    assert "fluctuation" in rl.report(s)
