"""fp.perplexity against transformers' own ``labels=`` loss, token-weighted over batches, masked and shrunk.

The reference is the model's causal-LM loss (``model(ids, labels=labels).loss``:
logits shifted by one, ``-100`` ignored, the mean over counted tokens), turned
back into a sum per batch (times its count) and divided once by the count of
every batch: the token-weighted mean ``fp.perplexity`` promises.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import funcprune as fp

sys.path.insert(0, str(Path(__file__).parents[1]))
import _hf  # noqa: E402

Tensor = torch.Tensor


def llama() -> nn.Module:
    return _hf.tiny("llama").model


def ids(batch: int, tokens: int, seed: int) -> Tensor:
    return torch.randint(0, _hf.VOCAB, (batch, tokens), generator=torch.Generator().manual_seed(seed))


def hf_sum_and_count(model: nn.Module, x: Tensor, labels: Tensor, mask: Tensor | None = None) -> tuple[float, int]:
    """transformers' loss on one batch as (sum, count): its mean times the labels it counts."""
    with torch.no_grad():
        loss = float(model(input_ids=x, attention_mask=mask, labels=labels, use_cache=False).loss)
    count = int((labels[:, 1:] != -100).sum())
    return loss * count, count


def test_equals_transformers_loss_on_unpadded_batches_token_weighted() -> None:
    model = llama()
    batches = [ids(2, 8, 0), ids(3, 5, 1), ids(1, 12, 2)]
    sums, counts = zip(*(hf_sum_and_count(model, b, b) for b in batches))
    got = fp.perplexity(model, batches)
    assert got.tokens == sum(counts) == 2 * 7 + 3 * 4 + 11
    assert got.nll == pytest.approx(sum(sums) / sum(counts), rel=1e-6)
    assert got.perplexity == pytest.approx(math.exp(got.nll), rel=1e-12)
    per_batch = sum(s / c for s, c in zip(sums, counts)) / len(batches)  # the mean of means it is not
    assert abs(got.nll - per_batch) > 1e-4


def test_right_padding_counts_what_transformers_counts() -> None:
    model = llama()
    x = ids(3, 8, 3)
    mask = torch.ones_like(x)
    mask[0, 5:] = 0
    mask[1, 2:] = 0
    labels = x.masked_fill(mask == 0, -100)
    total, count = hf_sum_and_count(model, x, labels, mask)
    got = fp.perplexity(model, [{"input_ids": x, "attention_mask": mask, "use_cache": False}])
    assert got.tokens == count == 4 + 1 + 7
    assert got.nll == pytest.approx(total / count, rel=1e-6)


def test_left_padding_leaves_out_the_prediction_from_padding() -> None:
    model = llama()
    x = ids(2, 8, 4)
    mask = torch.ones_like(x)
    mask[0, :3] = 0
    got = fp.perplexity(model, [{"input_ids": x, "attention_mask": mask}])
    assert got.tokens == 4 + 7  # row 0: 5 real tokens, 4 predictions among them; the first is from padding
    with torch.no_grad():
        logits = model(input_ids=x, attention_mask=mask).logits.double()
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten(), reduction="none")
    counted = (mask[:, 1:] * mask[:, :-1]).flatten().bool()
    assert got.nll == pytest.approx(float(nll[counted].mean()), rel=1e-9)


def test_labels_are_the_targets_and_are_not_passed_to_the_model() -> None:
    model = llama()
    x = ids(2, 8, 5)
    labels = x.clone()
    labels[:, :4] = -100  # a prompt left out
    total, count = hf_sum_and_count(model, x, labels)
    got = fp.perplexity(model, [{"input_ids": x, "labels": labels}])
    assert got.tokens == count == 2 * 4
    assert got.nll == pytest.approx(total / count, rel=1e-6)


def test_the_forms_oneshot_takes_give_one_value() -> None:
    model = llama()
    x = ids(2, 8, 6)
    values = {fp.perplexity(model, [b]).nll for b in (x, (x,), [x], {"input_ids": x})}
    assert len(values) == 1
    assert fp.perplexity(model, iter([x])).nll in values  # a generator, read once


@pytest.mark.ci  # a shrink and a reload: CI runs it (the default suite's 5 minutes)
def test_masked_equals_baked_and_shrunk_and_the_model_is_untouched() -> None:
    t = _hf.tiny("llama")
    model = t.model
    before = {n: p.clone() for n, p in model.named_parameters()}
    structure = fp.structure(model, t.args[0])
    params = dict(model.named_parameters())
    masks = fp.structured(structure, fp.LnStructured(0.5, n=2), kinds=("channels", "heads"), scope="group")(params)
    batches = [ids(2, 8, 7), ids(2, 8, 8)]
    masked = fp.perplexity(model, batches, params=params, masks=masks)
    assert fp.perplexity(model, batches, masks=masks) == masked  # params default to the module's own
    baked = fp.perplexity(fp.bake(model, masks), batches)
    shrunk = fp.perplexity(fp.shrink(model, masks, t.args[0]), batches)
    dense = fp.perplexity(model, batches)
    assert baked.tokens == shrunk.tokens == masked.tokens == dense.tokens == 2 * 2 * 7
    assert baked.nll == pytest.approx(masked.nll, rel=1e-6)
    assert shrunk.nll == pytest.approx(masked.nll, rel=1e-5)
    assert abs(dense.nll - masked.nll) > 1e-3
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())


class Bigram(nn.Module):
    """Logits from a table by the current token: exact and fast, for properties."""

    def __init__(self, vocab: int, seed: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed)))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.table[input_ids]


@given(
    lengths=st.lists(st.integers(0, 6), min_size=2, max_size=8),
    split=st.integers(1, 8),
    seed=st.integers(0, 2**16),
)
def test_the_value_does_not_depend_on_how_sequences_are_batched(lengths: list[int], split: int, seed: int) -> None:
    """Right-padded sequences of any lengths, batched one way or another: one token-weighted value."""
    vocab, width = 5, max(lengths) + 1
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (len(lengths), width), generator=g)
    mask = (torch.arange(width) < torch.tensor(lengths)[:, None] + 1).long()
    model = Bigram(vocab, seed).eval()
    counted = sum(lengths)
    if counted == 0:
        with pytest.raises(ValueError, match="no token was counted"):
            fp.perplexity(model, [{"input_ids": x, "attention_mask": mask}])
        return
    whole = fp.perplexity(model, [{"input_ids": x, "attention_mask": mask}])
    parts = fp.perplexity(
        model, [{"input_ids": a, "attention_mask": m} for a, m in zip(torch.split(x, split), torch.split(mask, split))]
    )
    log_p = torch.log_softmax(model.table.detach().double(), -1)
    expected = -sum(float(log_p[x[i, j], x[i, j + 1]]) for i, n in enumerate(lengths) for j in range(n)) / counted
    assert whole.tokens == parts.tokens == counted
    assert whole.nll == pytest.approx(expected, rel=1e-12)
    assert parts.nll == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("batches", "error", "match"),
    [
        (torch.zeros(2, 4, dtype=torch.long), TypeError, "batches must be an iterable"),
        ([torch.zeros(2, 4)], TypeError, "token ids .* must be a \\(batch, tokens\\) tensor of integers"),
        ([torch.zeros(4, dtype=torch.long)], TypeError, "must be a \\(batch, tokens\\) tensor"),
        ([{"inputs_embeds": torch.zeros(1, 4, 3)}], TypeError, "input_ids"),
        ([{"input_ids": torch.zeros(1, 4, dtype=torch.long), "labels": torch.zeros(1, 3, dtype=torch.long)}],
         TypeError, "labels must be integers of the ids' shape \\(1, 4\\)"),
        ([{"input_ids": torch.zeros(1, 4, dtype=torch.long), "attention_mask": torch.ones(1, 3)}], ValueError,
         "attention_mask has shape \\(1, 3\\)"),
        ([{"input_ids": torch.zeros(1, 4, dtype=torch.long), "decoder_input_ids": torch.zeros(1, 2)}], ValueError,
         "encoder-decoder"),
        ([torch.zeros(3, 1, dtype=torch.long)], ValueError, "no token was counted"),
        ([3], TypeError, "batch 0 must be a tensor"),
    ],
)  # fmt: skip
def test_bad_batches_are_refused_by_name(batches: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=f"^perplexity: .*{match}"):
        fp.perplexity(Bigram(4, 0).eval(), batches)


def test_a_model_in_training_mode_or_of_other_output_is_refused() -> None:
    x = [torch.zeros(1, 4, dtype=torch.long)]
    with pytest.raises(ValueError, match="^perplexity: model is in training mode"):
        fp.perplexity(Bigram(4, 0), x)
    with pytest.raises(TypeError, match="^perplexity: model must be a torch.nn.Module"):
        fp.perplexity(lambda ids: ids, x)  # type: ignore[arg-type]

    class Pooled(nn.Module):
        def forward(self, ids: Tensor) -> Tensor:
            return torch.zeros(ids.shape[0], 4)

    class Dict(nn.Module):
        def forward(self, ids: Tensor) -> dict[str, Tensor]:
            return {"scores": torch.zeros(*ids.shape, 4)}

    with pytest.raises(ValueError, match="^perplexity: the model's logits on batch 0 must be \\(batch, tokens, voc"):
        fp.perplexity(Pooled().eval(), x)
    with pytest.raises(TypeError, match="^perplexity: the model's output on batch 0 must be its logits"):
        fp.perplexity(Dict().eval(), x)


def test_shift_labels_score_every_token_after_the_first() -> None:
    """``shift_labels`` (already shifted) let the last fed position predict a token that is not fed."""
    model = llama()
    sequences = ids(3, 9, 9)
    x, targets = sequences[:, :-1], sequences[:, 1:]
    with torch.no_grad():
        logits = model(input_ids=x).logits
    expected = float(torch.nn.functional.cross_entropy(logits.flatten(0, 1).double(), targets.flatten()))
    got = fp.perplexity(model, [{"input_ids": x, "shift_labels": targets}])
    assert got.tokens == 3 * 8
    assert got.nll == pytest.approx(expected, rel=1e-12)
    mask = torch.ones_like(x)
    mask[0, 5:] = 0  # right padding: positions 5.. of row 0 predict nothing
    padded = fp.perplexity(model, [{"input_ids": x, "attention_mask": mask, "shift_labels": targets}])
    assert padded.tokens == 3 * 8 - 3
    with pytest.raises(ValueError, match="^perplexity: batch 0 has both labels and shift_labels"):
        fp.perplexity(model, [{"input_ids": x, "shift_labels": targets, "labels": x}])
    with pytest.raises(TypeError, match="^perplexity: batch 0's shift_labels must be integers of the ids' shape"):
        fp.perplexity(model, [{"input_ids": x, "shift_labels": sequences}])
