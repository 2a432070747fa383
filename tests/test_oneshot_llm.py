"""The one-shot example (``examples/oneshot_llm.py``) in its quick configuration.

The quick run (a tiny Llama trained a few seconds on the standard library's
docstrings, pruned 12 ways by :func:`funcprune.oneshot`, one of them saved
and reloaded) runs once, in a module-scoped fixture, at 1 thread. The tests
check what holds for any seed: the corpus and its splits, the model's
shape, that it learned, the exact sparsity of every mask, the dense
embeddings and head, what SparseGPT changes, that pruning costs perplexity
and that the saved model reloads to the masked one's perplexity. Which
method wins is not asserted: at this scale it changes with the seed (the
docs report two full runs).
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
import oneshot_llm as ol  # noqa: E402

pytestmark = pytest.mark.ci  # trains a tiny model: CI runs it (the default suite's 5 minutes)

Tensor = torch.Tensor
CONFIG = ol.Config.quick(seed=0)
SETTINGS = [s.label for s in ol.settings(CONFIG)]  # 50%, 2:4, 70%, 70% OWL
RUNS = [(method, setting) for setting in SETTINGS for method in ol.METHODS]
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # fmt: skip


@pytest.fixture(scope="module")
def result() -> Iterator[ol.Result]:
    """The quick run, at 1 thread as the command line runs it (small ops, steady under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield ol.run(CONFIG)
    finally:
        torch.set_num_threads(threads)


def dense(result: ol.Result) -> dict[str, Tensor]:
    return {name: p.detach() for name, p in result.model.named_parameters()}


def block_weights() -> list[str]:
    """Every Linear weight of the decoder blocks, in the model's order."""
    return [f"model.layers.{i}.{p}.weight" for i in range(CONFIG.layers) for p in PROJECTIONS]


def pruned(mask: Tensor) -> int:
    return int((~mask).sum())


# --------------------------------------------------------------------------- corpus and model


def test_the_corpus_is_split_by_document(result: ol.Result) -> None:
    corpus = result.corpus
    names = corpus.names
    assert list(corpus.documents) == sorted(corpus.documents)
    assert sorted(n for split in names.values() for n in split) == list(corpus.documents)  # each once
    assert len(set(corpus.documents.values())) == len(corpus.documents)  # no text under two names
    assert all(name.split(".")[0] in {m.split(".")[0] for m in ol.MODULES} for name in corpus.documents)
    for split in ("train", "calibration", "heldout"):
        stream = getattr(corpus, split)
        assert torch.equal(stream, ol.encode([corpus.documents[n] for n in names[split]])), split
    assert corpus.characters > 500_000
    assert len(names["heldout"]) == len(names["calibration"]) == round(0.05 * len(corpus.documents))
    assert result.heldout.max() < 256 and result.heldout.min() >= 0


def test_the_corpus_is_the_same_every_time_and_the_split_follows_the_seed(result: ol.Result) -> None:
    documents = ol.stdlib_documents()
    assert documents == result.corpus.documents
    again = ol.make_corpus(CONFIG, documents)
    assert again.names == result.corpus.names
    other = ol.make_corpus(ol.Config.quick(seed=1), documents)
    assert other.names["heldout"] != result.corpus.names["heldout"]


def test_heldout_windows_predict_every_token_once() -> None:
    stream = torch.arange(10)
    assert ol.windows(stream, 4, 100).tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    assert ol.windows(stream, 4, 2).tolist() == [[0, 1, 2, 3], [3, 4, 5, 6]]


def test_the_model_is_a_llama_with_grouped_query_attention(result: ol.Result) -> None:
    model = result.model
    assert isinstance(model, transformers.LlamaForCausalLM)
    config = model.config
    assert config.num_key_value_heads * 2 == config.num_attention_heads
    attention = model.model.layers[0].self_attn
    assert attention.k_proj.out_features * 2 == attention.q_proj.out_features
    assert model.lm_head.weight is not model.model.embed_tokens.weight  # not tied
    assert model.lm_head.weight.shape == (256, CONFIG.hidden)
    assert not model.training


def test_the_model_learned(result: ol.Result) -> None:
    # the uniform guess over bytes scores 256; the untrained model about that
    assert result.losses[0] == pytest.approx(math.log(256), abs=0.1)
    assert result.perplexity("dense") < 32
    assert sum(result.losses[-10:]) / 10 < 0.6 * result.losses[0]


# --------------------------------------------------------------------------- masks


@pytest.mark.parametrize("run", RUNS, ids="/".join)
def test_every_linear_of_the_blocks_is_pruned_and_nothing_else(result: ol.Result, run: tuple[str, str]) -> None:
    masks, params = result.masks[run], result.params[run]
    weights = dense(result)
    assert sorted(masks) == sorted(block_weights())
    assert set(params) == set(weights)  # every parameter of the model
    for name, mask in masks.items():
        assert mask.dtype == torch.bool and mask.shape == weights[name].shape, name
    for name in weights.keys() - masks.keys():  # embeddings, norms, lm_head: dense and as trained
        assert torch.equal(params[name], weights[name]), name
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= params.keys() - masks.keys()


@pytest.mark.parametrize("method", ol.METHODS)
@pytest.mark.parametrize("setting", ["50%", "70%"])
def test_the_fraction_of_every_weight_is_pruned(result: ol.Result, method: str, setting: str) -> None:
    fraction = {"50%": 0.5, "70%": 0.7}[setting]
    for name, mask in result.masks[method, setting].items():
        if method == "sparsegpt":  # chooses per block of 128 columns, each pruned exactly
            blocks = torch.split(mask, 128, dim=1)
            assert [pruned(b) for b in blocks] == [round(fraction * b.numel()) for b in blocks], name
        else:
            assert pruned(mask) == round(fraction * mask.numel()), name
    row = next(r for r in result.rows if (r.method, r.setting) == (method, setting))
    assert row.sparsity == pytest.approx(fraction, abs=1e-3)


@pytest.mark.parametrize("method", ol.METHODS)
def test_two_of_every_four_inputs_are_kept(result: ol.Result, method: str) -> None:
    for name, mask in result.masks[method, "2:4"].items():
        groups = mask.view(mask.shape[0], mask.shape[1] // 4, 4)
        assert (groups.sum(dim=-1) == 2).all(), name


@pytest.mark.parametrize("method", ol.METHODS)
def test_owl_spreads_70_percent_over_the_blocks(result: ol.Result, method: str) -> None:
    masks = result.masks[method, "70% OWL"]
    per_block = ol.block_sparsities(masks, CONFIG.layers)
    for name, mask in masks.items():  # every weight of a block at the block's sparsity
        target = per_block[int(name.split(".")[2])]
        assert abs(pruned(mask) / mask.numel() - target) < 2e-3, name
    # OWL's targets span 2 * lam = 0.16 and average to 70% (rounded to whole entries per weight)
    assert sum(per_block) / len(per_block) == pytest.approx(0.7, abs=1e-3), per_block
    assert max(per_block) - min(per_block) == pytest.approx(0.16, abs=2e-3), per_block
    assert all(0.54 < s < 0.86 for s in per_block), per_block  # within 2 * lam of 70%
    # shifted by their mean, not centred on 70%: with two blocks, they are 62% and 78%
    assert sorted(per_block) == pytest.approx([0.62, 0.78], abs=1e-3), per_block
    others = [ol.block_sparsities(result.masks[m, "70% OWL"], CONFIG.layers) for m in ol.METHODS]
    assert all(o == pytest.approx(per_block, abs=1e-3) for o in others)  # from the dense model's Wanda scores


# --------------------------------------------------------------------------- weights and perplexity


@pytest.mark.parametrize("run", RUNS, ids="/".join)
def test_what_each_method_changes(result: ol.Result, run: tuple[str, str]) -> None:
    masks, params = result.masks[run], result.params[run]
    weights = dense(result)
    for name, mask in masks.items():
        if run[0] == "sparsegpt":  # the kept weights updated, the pruned ones zero
            assert (params[name][~mask] == 0).all(), name
            assert not torch.equal(params[name][mask], weights[name][mask]), name
        else:  # the kept weights as they were
            assert torch.equal(params[name][mask], weights[name][mask]), name


def test_pruning_costs_perplexity(result: ol.Result) -> None:
    dense_perplexity = result.perplexity("dense")
    for method, setting in RUNS:
        perplexity = result.perplexity(method, setting)
        assert math.isfinite(perplexity)
        assert perplexity > dense_perplexity, (method, setting)
    for method in ol.METHODS:
        assert result.perplexity(method, "70%") > result.perplexity(method, "50%"), method


def test_the_baked_model_saves_and_reloads(result: ol.Result) -> None:
    reloaded = result.reloaded
    assert isinstance(reloaded, transformers.LlamaForCausalLM)
    params, masks = result.params[result.saved], result.masks[result.saved]
    state = dict(reloaded.named_parameters())
    assert set(state) == set(params)
    for name, value in params.items():
        expected = value * masks[name] if name in masks else value
        assert torch.equal(state[name], expected), name
    assert reloaded.config.num_key_value_heads == CONFIG.kv_heads
    assert result.reloaded_perplexity == pytest.approx(result.perplexity(*result.saved), rel=1e-5)


def test_oneshot_leaves_the_model_as_it_was(result: ol.Result) -> None:
    model = result.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
    _, masks = fp.oneshot(model, result.calibration, method="wanda", spec=fp.NM(2, 4))
    for name, mask in masks.items():
        assert torch.equal(mask, result.masks["wanda", "2:4"][name]), name
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules()) == hooks
    assert not model.training


def test_the_report_has_a_row_per_run(result: ol.Result) -> None:
    text = ol.report(result)
    table = text[text.index("method") :].split("\n\n")[0].splitlines()[1:]
    assert [tuple(line.split()[:2]) for line in table] == [("dense", "-"), *[(m, s.split()[0]) for m, s in RUNS]]
    assert "Python" in text and "characters" in text and "reloaded" in text
