"""The experts example (``examples/experts_moe.py``) on a tiny MoE decoder trained 2 steps.

One run, in a module-scoped fixture at 1 thread: the pipeline (the
corpus and training of ``examples/oneshot_llm.py`` with the routers'
load-balancing loss, weights saved and reloaded, ``fp.expert_stats``, the
``"experts"`` groups' masks per layer and over the model, shrink, save and
reload, ``fp.oneshot`` inside the experts), not the quality of a model
trained 2 steps. What a method removes is checked against its scores
(the lowest go first, each layer keeping its ``top_k``), never against
which method wins. The rows inside the experts run under the ci profile.
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
import experts_moe as em  # noqa: E402
import oneshot_llm as ol  # noqa: E402

pytestmark = pytest.mark.ci  # trains a tiny model: CI runs it (the default suite's 5 minutes)

Tensor = torch.Tensor
CONFIG = em.config_of(0, quick=True, steps=2)


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("weights")


@pytest.fixture(scope="module")
def result(weights: Path) -> Iterator[em.Result]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield em.run(CONFIG, weights=weights, inside=False)
    finally:
        torch.set_num_threads(threads)


def removed_by_order(scores: list[Tensor], count: int, least: int, experts: int) -> list[list[int]]:
    """The reference: the ``count`` lowest scores over the layers (ties to the earlier layer, then expert),
    skipping a layer's experts once it is down to ``least``."""
    order = sorted((float(s), layer, e) for layer, values in enumerate(scores) for e, s in enumerate(values))
    removed: list[list[int]] = [[] for _ in scores]
    for _, layer, e in order:
        if sum(map(len, removed)) == count:
            break
        if len(removed[layer]) < experts - least:
            removed[layer].append(e)
    return [sorted(r) for r in removed]


def expert_norms(result: em.Result) -> list[Tensor]:
    """Each expert's L2 norm over its router row and its slices of the stacked weights, in float64, by layer."""
    params = dict(result.trained.model.named_parameters())
    out = []
    for group in result.groups:
        names = (f"{group}.gate.weight", f"{group}.experts.gate_up_proj", f"{group}.experts.down_proj")
        squares = sum(params[n].detach().double().flatten(1).square().sum(1) for n in names)
        assert isinstance(squares, Tensor)
        out.append(squares.sqrt())
    return out


def test_training_adds_the_router_loss_and_returns_the_next_token_loss() -> None:
    config = em.config_of(0, quick=True, steps=1)
    stream = torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0))
    plain, balanced = em.make_model(config), em.make_model(config)
    losses = ol.train_(plain, stream, config)
    balanced_losses = ol.train_(balanced, stream, config, router_loss=1.0)
    assert losses == balanced_losses  # the first step's next-token loss, from the same weights
    router = "model.layers.0.mlp.gate.weight"
    assert not torch.equal(plain.get_parameter(router), balanced.get_parameter(router))  # the load-balancing term


def test_the_model_is_a_mixture_of_experts(result: em.Result) -> None:
    model = result.trained.model
    assert isinstance(model, transformers.Qwen3MoeForCausalLM)
    assert result.groups == [f"model.layers.{i}.mlp" for i in range(CONFIG.layers)]
    assert em.experts_per_layer(model, CONFIG.layers) == (CONFIG.experts,) * CONFIG.layers
    assert model.get_parameter("model.layers.0.mlp.experts.gate_up_proj").shape == (
        CONFIG.experts, 2 * CONFIG.intermediate, CONFIG.hidden)  # fmt: skip
    assert model.config.num_experts_per_tok == CONFIG.top_k and model.config.norm_topk_prob


def test_weights_are_saved_and_reused(result: em.Result, weights: Path) -> None:
    assert not result.trained.reused and result.trained.path is not None and result.trained.path.parent == weights
    again = em.trained(CONFIG, result.corpus, weights)
    assert again.reused and again.losses == result.trained.losses
    for (name, p), q in zip(result.trained.model.state_dict().items(), again.model.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


def test_expert_stats_cover_every_layer(result: em.Result) -> None:
    tokens = sum(int(b["input_ids"].numel()) for b in result.calibration)
    assert list(result.stats) == [False, True]
    for renormalize, stats in result.stats.items():
        assert list(stats) == result.groups
        for group, values in stats.items():
            for name in ("frequency", "ean_sum", "reap"):
                assert values[name].shape == (CONFIG.experts,) and values[name].dtype == torch.float64, (group, name)
            assert float(values["frequency"].sum()) == tokens * CONFIG.top_k, group  # every token to top_k experts
            assert torch.equal(values["frequency"], result.stats[False][group]["frequency"]), group
            if renormalize:  # each token's two gates sum to 1: larger than the softmax's, not smaller
                assert (values["reap"] >= result.stats[False][group]["reap"]).all(), group


def test_rows_remove_the_fraction_asked_for(result: em.Result) -> None:
    expected = [(m, s, f) for f in em.FRACTIONS for m in em.METHODS for s in em.SCOPES]
    assert [(r.method, r.scope, r.fraction) for r in result.rows] == expected
    params = dict(result.trained.model.named_parameters())
    total = sum(p.numel() for p in params.values())
    per_expert = CONFIG.hidden + 3 * CONFIG.intermediate * CONFIG.hidden  # a router row, gate, up, down
    for row in result.rows:
        counts = [len(r) for r in row.removed]
        if row.scope == "group":
            assert counts == [round(row.fraction * CONFIG.experts)] * CONFIG.layers, row
        else:
            assert sum(counts) == round(row.fraction * CONFIG.experts * CONFIG.layers), row
        assert all(CONFIG.experts - c >= CONFIG.top_k for c in counts), row
        assert row.parameters == total - sum(counts) * per_expert, row
        assert math.isfinite(row.perplexity), row


@pytest.mark.parametrize("method", ["reap", "reap renormalized", "frequency", "ean", "norm"])
@pytest.mark.parametrize("scope", em.SCOPES)
def test_the_lowest_scored_experts_go(result: em.Result, method: str, scope: str) -> None:
    if method == "norm":
        scores = expert_norms(result)
    else:
        statistic, renormalize = em.STATISTICS[method]
        scores = [result.stats[renormalize][g][statistic] for g in result.groups]
    for fraction in em.FRACTIONS:
        row = result.row(method, scope, fraction)
        if scope == "group":
            count = round(fraction * CONFIG.experts)
            expected = [removed_by_order([s], count, CONFIG.top_k, CONFIG.experts)[0] for s in scores]
        else:
            count = round(fraction * CONFIG.experts * CONFIG.layers)
            expected = removed_by_order(scores, count, CONFIG.top_k, CONFIG.experts)
        assert [list(r) for r in row.removed] == expected, (method, scope, fraction)


def test_random_rows_and_draws(result: em.Result) -> None:
    assert list(result.draws) == [f"{s} {f}" for f in em.FRACTIONS for s in em.SCOPES]
    for name, values in result.draws.items():
        assert len(values) == 1 + em.DRAWS and all(math.isfinite(x) for x in values), name
    for fraction in em.FRACTIONS:
        for scope in em.SCOPES:
            assert result.draws[f"{scope} {fraction}"][0] == result.row("random", scope, fraction).perplexity


def test_reap_rows_shrunk_and_reloaded(result: em.Result) -> None:
    assert [(r.method, r.scope, r.fraction) for r in result.reloads] == [
        ("reap", s, f) for f in em.FRACTIONS for s in em.SCOPES]  # fmt: skip
    for r in result.reloads:
        row = result.row("reap", r.scope, r.fraction)
        kept = tuple(CONFIG.experts - len(x) for x in row.removed)
        assert r.experts == kept
        uniform = len(set(kept)) == 1
        assert r.loader == ("Qwen3MoeForCausalLM.from_pretrained" if uniform else "fp.load_shrunk"), r
        assert r.parameters == row.parameters
        assert r.perplexity == pytest.approx(r.masked, rel=1e-5)
    assert any(r.loader == "fp.load_shrunk" for r in result.reloads)  # some global row is non-uniform


def test_report(result: em.Result) -> None:
    text = em.report(result)
    assert "dense: perplexity" in text and "trained by this run" in text and "fp.load_shrunk" in text
    table = text[text.index("method") :].split("\n\n")[0].splitlines()[1:]
    assert len(table) == len(result.rows)


@pytest.mark.ci
def test_inside_the_experts(result: em.Result) -> None:
    structure = fp.structure(result.trained.model, result.calibration[0]["input_ids"][:4])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        em.run_inside(result, structure, lambda line: None)
    finally:
        torch.set_num_threads(threads)
    assert [(i.method, i.setting) for i in result.inside] == [
        (m, s) for s, _ in em.inside_settings() for m in em.INSIDE]  # fmt: skip
    names = em.expert_weights(structure, result.groups)
    assert len(names) == 2 * CONFIG.layers
    for row in result.inside:
        assert sorted(row.names) == sorted(names), row  # the stacked expert weights alone
        assert row.sparsity == pytest.approx(0.5, abs=1e-3), row
        assert math.isfinite(row.perplexity), row
