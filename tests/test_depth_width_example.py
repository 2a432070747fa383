"""The depth and width example (``examples/depth_width_llm.py``) on a tiny model trained 2 steps.

One run, in a module-scoped fixture at 1 thread: the pipeline (the
corpus and training of ``examples/oneshot_llm.py``, weights saved and
reloaded, layer scores, the ``"layers"`` group's masks from
``unit_scores``, shrink, save and reload), not the quality of a model
trained 2 steps. What a metric picks is checked against its scores, never
against which method wins.
"""

from __future__ import annotations

import math
import os
import sys
import types
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="needs transformers (the hf extra)")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import depth_width_llm as dw  # noqa: E402

pytestmark = pytest.mark.ci  # trains a tiny model: CI runs it (the default suite's 5 minutes)

CONFIG = dw.config_of(0, quick=True, steps=2)


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("weights")


@pytest.fixture(scope="module")
def result(weights: Path) -> Iterator[dw.Result]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield dw.run(CONFIG, weights=weights)
    finally:
        torch.set_num_threads(threads)


class Table(torch.nn.Module):
    """Logits looked up by the current token: a model whose perplexity is known in closed form."""

    def __init__(self, weights: torch.Tensor) -> None:
        super().__init__()
        self.weights = torch.nn.Parameter(weights)

    def forward(self, input_ids: torch.Tensor) -> Any:
        return types.SimpleNamespace(logits=self.weights[input_ids])


def test_perplexity_is_token_weighted() -> None:
    """Uniform logits give the vocabulary's size; otherwise exp of the mean over every token, whatever the batch."""
    tokens = torch.randint(0, 256, (5, 9), generator=torch.Generator().manual_seed(0))
    assert dw.perplexity(Table(torch.zeros(256, 256)).eval(), tokens) == pytest.approx(256.0)
    weights = torch.randn(256, 256, generator=torch.Generator().manual_seed(1))
    logits = weights[tokens[:, :-1]]
    expected = math.exp(float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())))
    for batch in (1, 2, 5):
        assert dw.perplexity(Table(weights).eval(), tokens, batch=batch) == pytest.approx(expected, rel=1e-6)


def test_weights_are_saved_and_reused(result: dw.Result, weights: Path) -> None:
    assert not result.trained.reused and result.trained.path is not None and result.trained.path.parent == weights
    again = dw.trained(CONFIG, result.corpus, weights)
    assert again.reused and again.losses == result.trained.losses
    for (name, p), q in zip(result.trained.model.state_dict().items(), again.model.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


def test_depth_rows(result: dw.Result) -> None:
    layers = CONFIG.layers
    assert [(r.method, r.amount) for r in result.depth] == [(m, k) for k in dw.DEPTHS for m in dw.DEPTH_METHODS]
    per_block = (sum(p.numel() for p in result.trained.model.parameters()) - result.depth[0].parameters)
    for row in result.depth:
        assert len(row.units) == row.amount and all(0 <= b < layers for b in row.units)
        assert row.parameters == sum(p.numel() for p in result.trained.model.parameters()) - row.amount * per_block
        assert math.isfinite(row.perplexity)
        if row.method == "last":
            assert row.units == tuple(range(layers - row.amount, layers))
        elif row.method in ("bi", "cosine"):
            order = torch.sort(result.layer_scores[row.method], stable=True).indices[: row.amount]
            assert row.units == tuple(sorted(order.tolist()))
        elif row.method == "angular":  # a contiguous run
            assert row.units == tuple(range(row.units[0], row.units[0] + row.amount))


def test_each_block_alone_and_random_draws(result: dw.Result) -> None:
    depth = {(r.method, r.amount): r for r in result.depth}
    assert len(result.alone) == CONFIG.layers
    for method in ("bi", "cosine", "angular", "last", "random"):  # one block dropped: one of the rows alone
        assert depth[method, 1].perplexity == result.alone[depth[method, 1].units[0]]
    assert list(result.draws) == [f"depth {k}" for k in dw.DEPTHS] + (["width"] if result.width else [])
    for name, values in result.draws.items():
        assert len(values) == 1 + dw.DRAWS and all(math.isfinite(x) for x in values), name
    assert [result.draws[f"depth {k}"][0] for k in dw.DEPTHS] == [depth["random", k].perplexity for k in dw.DEPTHS]


def test_depth_shrunk_and_reloaded(result: dw.Result) -> None:
    depth = {(r.method, r.amount): r for r in result.depth}
    reloads = [r for r in result.reloads if r.method == "bi"]
    assert [r.amount for r in reloads] == list(dw.DEPTHS)
    for r in reloads:
        assert r.loader == "LlamaForCausalLM.from_pretrained"
        assert r.detail.startswith(f"{CONFIG.layers - r.amount} layers")
        assert r.parameters == depth["bi", r.amount].parameters
        assert r.perplexity == pytest.approx(r.masked, rel=1e-5)


def test_width_rows(result: dw.Result) -> None:
    if not result.width:
        assert "no 'hidden' group" in result.width_note
        pytest.skip("the structure has no 'hidden' group yet")
    removed = round(dw.WIDTH * CONFIG.hidden)
    assert [(r.method, r.amount) for r in result.width] == [(m, removed) for m in dw.WIDTH_METHODS]
    for r in result.reloads:
        if r.method.startswith("hidden"):
            assert r.perplexity == pytest.approx(r.masked, rel=1e-4)


def test_report(result: dw.Result) -> None:
    text = dw.report(result)
    assert "dense: perplexity" in text and "trained by this run" in text
