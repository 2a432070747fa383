"""The recovery example (``examples/recovery_llm.py``) on a tiny Llama trained 2 steps.

The pipeline, not the quality of a model trained 2 steps: the global
ranking reaches the parameter fraction asked for with the fewest units, the
recovery trains one copy through the masks while the module's own tensors
(the teacher) stay as they were, and every route gives a finite perplexity;
the depth, hidden-size and expert rows (the last on the experts example's
tiny mixture of experts) likewise. The whole module runs under the ci
profile (about 40 s on 2 cores): the library's own tests cover what it calls.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import funcprune as fp

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="needs transformers (the hf extra)")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import depth_width_llm as dw  # noqa: E402
import experts_moe as em  # noqa: E402
import recovery_llm as rl  # noqa: E402

pytestmark = pytest.mark.ci
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


@pytest.mark.parametrize("part", ["depth", "hidden"])
def test_depth_and_hidden_rows_reach_the_fraction(s: rl.Setup, part: str) -> None:
    total = sum(p.numel() for p in s.params.values())
    criterion, masks = rl.unit_masks(s, part, 0.25)
    kept = dw.kept_parameters(s.params, masks)
    kind: fp.Kind = "layers" if part == "depth" else "hidden"
    (group,) = s.structure.of_kinds(kind).groups.values()
    removed = len(dw.pruned_units(group, masks))
    per_unit = (total - kept) / removed
    if part == "depth":  # the nearest count of whole blocks (4 blocks: one of them is the nearest to 25%)
        assert criterion == "bi" and removed == 1 and abs(kept - 0.75 * total) <= per_unit / 2
    else:  # the fewest channels reaching the fraction
        assert criterion == "activation" and kept <= 0.75 * total < kept + 1.5 * per_unit
    s.rows.clear()
    rl.unit_rows(s, part, 0.25, lambda line: None)
    assert [(r.kind, r.method, r.route, r.parameters) for r in s.rows] == [
        (part, criterion, route, kept) for route in rl.TRAINED_ROUTES
    ]
    assert all(math.isfinite(r.perplexity) and r.perplexity > 1 for r in s.rows)


def test_expert_rows_and_their_train_small_baseline() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        config = replace(em.config_of(0, quick=True), steps=2)
        m = rl.moe_setup(config, None)
        total = sum(p.numel() for p in m.params.values())
        criterion, masks = rl.unit_masks(m, "experts", 0.25)
        groups = list(m.structure.of_kinds("experts").groups.values())
        removed = [len(dw.pruned_units(g, masks)) for g in groups]
        assert criterion == "reap" and sum(removed) > 0
        assert all(g.size - r >= config.top_k for g, r in zip(groups, removed))  # each layer keeps its top k
        assert dw.kept_parameters(m.params, masks) <= 0.75 * total
        rl.unit_rows(m, "experts", 0.25, lambda line: None)
        rl.moe_small_row(m, 0.25, None, lambda line: None)
    finally:
        torch.set_num_threads(threads)
    assert [(r.kind, r.route) for r in m.rows] == [("experts", route) for route in rl.TRAINED_ROUTES] + [
        ("small", f"{2 + rl.STEPS} steps")
    ]
    assert all(math.isfinite(r.perplexity) and r.perplexity > 1 for r in m.rows)
    assert abs(m.rows[-1].parameters - 0.75 * total) < 0.1 * total  # the small MoE is of about the pruned size
