"""examples/oneshot_llm.py: one-shot Wanda and magnitude pruning of a small LM, block by block.

The example runs once, in its ``--quick`` configuration (a few seconds on
2 cores), in a module-scoped fixture. The tests check facts that hold for
any seed: the mask shapes are exact, the embeddings and the tied head stay
dense, the model learned the language, pruning costs perplexity, and the
block-by-block procedure computes the masks that Wanda's definition gives
when each block is calibrated through the model pruned so far. Which of
Wanda and magnitude wins is not asserted: on this small model it changes
with the seed (the README reports what one run measured).
"""

from __future__ import annotations

import copy
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch
from torch import nn

import funcprune as fp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import oneshot_llm as ol  # noqa: E402

Tensor = torch.Tensor
SHAPES = list(ol.SHAPES)
METHODS = ["magnitude", "wanda"]


@pytest.fixture(scope="module")
def result() -> Iterator[ol.Result]:
    """The quick run, at 1 thread as the command line runs it (small ops, steady under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield ol.run(ol.Config.quick(seed=0))
    finally:
        torch.set_num_threads(threads)


def weights(result: ol.Result) -> dict[str, Tensor]:
    params = dict(result.model.named_parameters())
    return {name: params[name] for name in ol.linear_names(result.model)}


def test_linear_names_are_every_linear_of_the_blocks(result: ol.Result) -> None:
    model = result.model
    names = ol.linear_names(model)
    linears = [f"{n}.weight" for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert names == [n for n in linears if n.startswith("blocks.")]
    assert len(names) == 6 * result.config.blocks  # q, k, v, out, fc1, fc2
    # the head, tied to the token embedding, is left out unless asked (under the embedding's name)
    assert fp.prunable(model, outputs=True) == ["tok.weight", *names]


@pytest.mark.parametrize("method", METHODS)
def test_half_of_every_output_row_is_pruned(result: ol.Result, method: str) -> None:
    masks = result.masks[method, "50% per row"]
    assert list(masks) == ol.linear_names(result.model)
    for name, weight in weights(result).items():
        mask = masks[name]
        assert mask.dtype == torch.bool and mask.shape == weight.shape
        assert ((~mask).sum(dim=1) == weight.shape[1] // 2).all(), name


@pytest.mark.parametrize("method", METHODS)
def test_two_of_every_four_inputs_are_kept(result: ol.Result, method: str) -> None:
    masks = result.masks[method, "2:4"]
    assert list(masks) == ol.linear_names(result.model)
    for name, weight in weights(result).items():
        mask = masks[name]
        assert mask.dtype == torch.bool and mask.shape == weight.shape
        groups = mask.view(weight.shape[0], weight.shape[1] // 4, 4)
        assert (groups.sum(dim=-1) == 2).all(), name


def test_the_criteria_differ(result: ol.Result) -> None:
    for shape in SHAPES:
        magnitude, wanda = result.masks["magnitude", shape], result.masks["wanda", shape]
        assert any(not torch.equal(magnitude[n], wanda[n]) for n in magnitude), shape


def test_embeddings_and_head_stay_dense(result: ol.Result) -> None:
    for masks in result.masks.values():
        assert not any(name.startswith(("tok.", "pos.", "head.", "norm.")) for name in masks)
        assert all(name.endswith(".weight") and ".ln" not in name for name in masks)
    for row in result.rows[1:]:
        assert row.sparsity == 0.5


def test_the_model_learned_the_language(result: ol.Result) -> None:
    dense = result.perplexity("dense")
    floor = math.exp(result.language.entropy_rate())
    # no model beats the source; knowing the spellings but not which word comes next scores
    # about 2.7 here, the uniform guess 64
    assert floor <= dense < 2.2
    assert result.losses[-1] < 0.5 * result.losses[0]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", SHAPES)
def test_pruning_costs_perplexity(result: ol.Result, method: str, shape: str) -> None:
    dense, pruned = result.perplexity("dense"), result.perplexity(method, shape)
    assert math.isfinite(pruned)
    assert pruned > dense
    assert pruned < result.config.vocab / 4  # hurt, not destroyed


def test_two_four_costs_more_than_half_of_each_row(result: ol.Result) -> None:
    for method in METHODS:
        assert result.perplexity(method, "2:4") > result.perplexity(method, "50% per row")


def reference_wanda_masks(model: ol.TinyLM, calibration: Sequence[Tensor], spec: fp.Spec) -> fp.Masks:
    """Wanda, calibrating each block through the whole model pruned so far, copied and
    masked in place: one full forward per block, the way a first draft would do it."""
    params = dict(model.named_parameters())
    masks: fp.Masks = {}
    for i in range(len(model.blocks)):
        pruned = copy.deepcopy(model)
        with torch.no_grad():
            fp.apply_masks_(dict(pruned.named_parameters()), masks)
        names = [n for n in ol.linear_names(model) if n.startswith(f"blocks.{i}.")]
        norms = fp.input_norms(pruned, calibration, names)
        with torch.no_grad():
            masks.update(fp.Plan({n: spec for n in names})(params, scores=fp.wanda(params, norms)))
    return masks


@pytest.mark.parametrize("shape", SHAPES)
def test_block_by_block_equals_calibrating_the_pruned_model(result: ol.Result, shape: str) -> None:
    reference = reference_wanda_masks(result.model, result.splits.calibration, ol.SHAPES[shape])
    masks = result.masks["wanda", shape]
    assert list(masks) == list(reference)
    for name in masks:
        assert torch.equal(masks[name], reference[name]), name


@pytest.mark.parametrize("shape", SHAPES)
def test_later_blocks_are_calibrated_on_the_pruned_model(result: ol.Result, shape: str) -> None:
    """Norms taken through the dense model give the first block's masks, not the later ones'."""
    model, spec = result.model, ol.SHAPES[shape]
    names = ol.linear_names(model)
    params = dict(model.named_parameters())
    with torch.no_grad():
        norms = fp.input_norms(model, result.splits.calibration, names)
        dense = fp.Plan({n: spec for n in names})(params, scores=fp.wanda(params, norms))
    masks = result.masks["wanda", shape]
    first = [n for n in names if n.startswith("blocks.0.")]
    assert all(torch.equal(dense[n], masks[n]) for n in first)
    assert any(not torch.equal(dense[n], masks[n]) for n in names if n not in first)


@pytest.fixture
def forward_calls(result: ol.Result) -> Iterator[dict[str, int]]:
    """How many times the whole model and each block run, while the fixture is active."""
    calls: dict[str, int] = {}

    def counter(name: str) -> Callable[[nn.Module, tuple[object, ...], object], None]:
        def hook(module: nn.Module, args: tuple[object, ...], out: object) -> None:
            calls[name] = calls.get(name, 0) + 1

        return hook

    model = result.model
    handles = [model.register_forward_hook(counter("model"))]
    handles += [b.register_forward_hook(counter(f"block {i}")) for i, b in enumerate(model.blocks)]
    yield calls
    for handle in handles:
        handle.remove()


def test_wanda_runs_block_by_block_and_leaves_the_model_as_it_was(
    result: ol.Result, forward_calls: dict[str, int]
) -> None:
    model = result.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
    masks = ol.wanda_masks(model, result.splits.calibration, fp.NM(2, 4))
    for name, mask in masks.items():
        assert torch.equal(mask, result.masks["wanda", "2:4"][name])
    # each block runs twice per calibration batch (its norms, then the pruned block); the
    # whole model never does, so no more than one block's hidden states are ever needed
    batches = len(result.splits.calibration)
    assert forward_calls == {f"block {i}": 2 * batches for i in range(result.config.blocks)}
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules()) == hooks
    assert model.head.weight is model.tok.weight


def test_the_report_has_a_row_per_method_and_shape(result: ol.Result) -> None:
    text = ol.report(result)
    table = text[text.index("method") :].splitlines()[1:]
    assert len(table) == 5
    assert [line.split()[0] for line in table] == ["dense", "magnitude", "wanda", "magnitude", "wanda"]
    assert all("50.0%" in line for line in table[1:])


def test_the_entropy_rate_of_a_language_computed_by_hand() -> None:
    # four words of 3 letters (+ space: 4 tokens), each followed by one of 2 words, equally likely
    spellings = torch.tensor([[1, 2, 3, 0, -1, -1], [2, 3, 4, 0, -1, -1], [3, 4, 5, 0, -1, -1], [4, 5, 6, 0, -1, -1]])
    successors = torch.tensor([[1, 2], [2, 3], [3, 0], [0, 1]])
    language = ol.Language(spellings, successors, torch.tensor([0.5, 0.5]))
    assert language.entropy_rate() == pytest.approx(math.log(2) / 4)


def test_the_data_are_seeded() -> None:
    config = ol.Config.quick(seed=3)
    language = ol.make_language(config)
    first, second = ol.make_splits(language, config), ol.make_splits(ol.make_language(config), config)
    assert torch.equal(first.train, second.train) and torch.equal(first.heldout, second.heldout)
    assert first.train.shape == (config.train_sequences, config.context)
    assert [b.shape for b in first.calibration] == [(config.calibration_batch, config.context)] * 4
    assert not torch.equal(first.train[: len(first.heldout)], first.heldout)
    assert first.train.min() >= 0 and first.train.max() < config.vocab
