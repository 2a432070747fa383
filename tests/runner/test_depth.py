"""fp.layer_scores and fp.hidden_scores against float64 transcriptions of their references, with padded batches.

The references, transcribed below in ``float64`` and run on each sequence
alone (no padding, batches of one) through the model's own forward with
hooks on its blocks (an independent path from the runner's block by block):

- sramshetty/ShortGPT ``short_gpt/metrics.py::block_influence`` (``1 - cos``,
  ``arccos(cos) / pi`` for ``angular=True``; ``nan_to_num(nan=0.5)``) and
  ``short_gpt/short_hf.py::ShortHFModel.compute_bi`` (adds
  ``block_influence(...).sum()`` per forward; ``angular``: the last token of
  ``hiddens[i]`` against that of ``hiddens[i + n]``);
- NVIDIA/Model-Optimizer ``modelopt/torch/prune/plugins/mcore_minitron.py``:
  ``_register_depth_cosine_importance`` (``1 - F.cosine_similarity(h_in,
  h_out, dim=2).mean()`` per forward, summed) and
  ``_register_hidden_size_importance`` (per norm, ``a.abs().mean(dim=0)
  .pow(2).sum(dim=0)`` on ``(tokens, batch, hidden)`` added up over
  forwards, then ``pow(0.5)`` per norm, summed over norms).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import funcprune as fp

sys.path.insert(0, str(Path(__file__).parents[1]))
import _hf  # noqa: E402

Tensor = torch.Tensor
#: Two batches of right-padded sequences of different lengths (the sequences' lengths per batch).
LENGTHS = ((8, 5), (3, 7, 6))
#: The norms reading the residual stream, as the references are told them by name.
NORMS = {
    "llama": ["model.layers.{i}.input_layernorm", "model.layers.{i}.post_attention_layernorm"],
    "gpt2": ["transformer.h.{i}.ln_1", "transformer.h.{i}.ln_2"],
    "bert": ["bert.encoder.layer.{i}.attention.output.LayerNorm", "bert.encoder.layer.{i}.output.LayerNorm"],
}
FINAL = {"llama": ["model.norm"], "gpt2": ["transformer.ln_f"], "bert": [], "olmo2": ["model.norm"]}


# the references, in float64 ------------------------------------------------------------------------------------------


def block_influence(input_hidden_state: Tensor, output_hidden_state: Tensor, angular: bool = False) -> Tensor:
    """ShortGPT's ``short_gpt/metrics.py::block_influence``, as written there (on (B, S, D) tensors)."""
    _, _, d = input_hidden_state.shape
    input_hidden_state = input_hidden_state.reshape(-1, d)
    output_hidden_state = output_hidden_state.reshape(-1, d)
    norm_input = input_hidden_state.norm(dim=-1, keepdim=True)
    norm_output = output_hidden_state.norm(dim=-1, keepdim=True)
    sim = (input_hidden_state @ output_hidden_state.T) / (norm_input * norm_output)
    sim = sim.diagonal().nan_to_num(nan=0.5)
    result: Tensor = torch.arccos(sim) / torch.pi if angular else 1 - sim
    return result


def shortgpt(hiddens: list[list[Tensor]], count: int, *, angular: bool = False, n: int = 1) -> Tensor:
    """ShortGPT's ``compute_bi`` over forwards (``hiddens[f]``: forward ``f``'s states at each block boundary)."""
    importances = torch.zeros(count, dtype=torch.float64)
    for states in hiddens:
        for i in range(len(states) - n):
            in_hidden, out_hidden = states[i], states[i + n]
            if angular:
                in_hidden, out_hidden = in_hidden[:, -1:], out_hidden[:, -1:]
            importances[i] += block_influence(in_hidden, out_hidden, angular=angular).sum()
    return importances


def minitron_depth(batches: list[list[list[Tensor]]], count: int) -> Tensor:
    """ModelOpt's ``_register_depth_cosine_importance``: ``batches[b][s]`` sequence ``s``'s states at each boundary."""
    scores = torch.zeros(count, dtype=torch.float64)
    for sequences in batches:
        for i in range(count):
            # one forward: its real tokens, as Megatron's [seq_len, batch, hidden] (the sequences end to end)
            hidden_states = torch.cat([s[i][0] for s in sequences])[:, None]
            output = torch.cat([s[i + 1][0] for s in sequences])[:, None]
            scores[i] += 1 - F.cosine_similarity(hidden_states, output, dim=2).mean()
    return scores


def minitron_hidden(outputs: dict[str, list[Tensor]]) -> Tensor:
    """ModelOpt's ``_register_hidden_size_importance``: ``outputs[norm]``: its (1, S, D) output per forward."""
    activations: dict[str, Tensor] = {}
    for name, forwards in outputs.items():
        for output in forwards:
            output = output.transpose(0, 1)  # [seq_len, batch_size, hidden_size]
            part = output.abs().mean(dim=0).pow(2).sum(dim=0)
            activations[name] = activations[name] + part if name in activations else part
    return torch.stack([act.pow(0.5) for act in activations.values()]).sum(dim=0)


# the models and their batches -----------------------------------------------------------------------------------------


def model_of(name: str, layers: int = 3) -> nn.Module:
    if name != "olmo2":
        return _hf.tiny(name, layers=layers).model
    config = _hf.transformers.Olmo2Config(
        vocab_size=_hf.VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip  # its q_norm has the hidden size (32), its k_norm 16
    torch.manual_seed(0)
    model: nn.Module = _hf.transformers.Olmo2ForCausalLM(config).eval()
    return model


def sequences(lengths: tuple[tuple[int, ...], ...] = LENGTHS, seed: int = 0) -> list[list[Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [[torch.randint(3, _hf.VOCAB, (k,), generator=g) for k in batch] for batch in lengths]


def padded(seqs: list[list[Tensor]], extra: int = 0) -> list[dict[str, Tensor]]:
    """Each batch right-padded (with ``extra`` more columns of padding), with its attention_mask."""
    out = []
    for batch in seqs:
        width = max(len(s) for s in batch) + extra
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for k, s in enumerate(batch):
            ids[k, : len(s)], mask[k, : len(s)] = s, 1
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def alone(seqs: list[list[Tensor]]) -> list[dict[str, Tensor]]:
    """Each sequence its own batch, without padding or attention_mask."""
    return [{"input_ids": s[None]} for batch in seqs for s in batch]


def boundaries(model: nn.Module, ids: Tensor) -> list[Tensor]:
    """The (1, S, D) float64 hidden states entering block 0 and leaving each block, from the model's forward."""
    blocks = next(m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m))
    states: list[Tensor] = []

    def before(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not states:
            states.append((args[0] if args else kwargs["hidden_states"]).detach().double().clone())

    def after(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        states.append((out[0] if isinstance(out, tuple) else out).detach().double().clone())

    handles = [blocks[0].register_forward_pre_hook(before, with_kwargs=True)]
    handles += [block.register_forward_hook(after) for block in blocks]
    try:
        with torch.no_grad():
            model(input_ids=ids[None])
    finally:
        for h in handles:
            h.remove()
    return states


def norm_outputs(model: nn.Module, seqs: list[list[Tensor]], names: list[str]) -> dict[str, list[Tensor]]:
    """Each named module's (1, S, D) float64 output on each sequence alone, from the model's forward."""
    modules = dict(model.named_modules())
    outputs: dict[str, list[Tensor]] = {n: [] for n in names}
    handles = [modules[n].register_forward_hook(lambda m, a, out, n=n: outputs[n].append(out.detach().double()))
               for n in names]  # fmt: skip
    try:
        with torch.no_grad():
            for batch in seqs:
                for s in batch:
                    model(input_ids=s[None])
    finally:
        for h in handles:
            h.remove()
    return outputs


def state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def untouched(model: nn.Module, before: dict[str, Tensor]) -> bool:
    after = model.state_dict()
    same = before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    return same and not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


CLOSE: dict[str, Any] = {"rtol": 1e-5, "atol": 1e-7}


# layer_scores ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_each_metric_is_its_reference_on_padded_batches(name: str) -> None:
    model, seqs = model_of(name), sequences()
    before = state(model)
    states = [[boundaries(model, s) for s in batch] for batch in seqs]
    flat = [st for batch in states for st in batch]
    count = 3
    want = {
        "bi": shortgpt(flat, count),
        "angular": shortgpt(flat, count, angular=True) / len(flat),  # averaged over the sequences
        "cosine": minitron_depth(states, count),
    }
    for metric, expected in want.items():
        got = fp.layer_scores(model, padded(seqs), metric=metric)
        assert got.dtype == torch.float64 and got.shape == (count,)
        torch.testing.assert_close(got, expected, **CLOSE)
        # padding changes nothing: more of it, or none (each sequence alone: the same for a token- or
        # sequence-weighted metric; Minitron's is a mean per forward)
        torch.testing.assert_close(fp.layer_scores(model, padded(seqs, extra=3), metric=metric), got, **CLOSE)
        if metric != "cosine":
            torch.testing.assert_close(fp.layer_scores(model, alone(seqs), metric=metric), got, **CLOSE)
    assert untouched(model, before)


@pytest.mark.parametrize("n", [2, 3])
def test_angular_runs_score_each_block_by_the_best_run_holding_it(n: int) -> None:
    model, seqs = model_of("llama", layers=4), sequences(seed=1)
    flat = [boundaries(model, s) for batch in seqs for s in batch]
    runs = shortgpt(flat, 4, angular=True, n=n)[: 4 - n + 1] / len(flat)  # ShortGPT's, per first block
    k = n
    want = torch.stack([runs[max(0, b - k + 1) : min(b, 4 - k) + 1].min() for b in range(4)])
    got = fp.layer_scores(model, padded(seqs), metric="angular", n=k)
    torch.testing.assert_close(got, want, **CLOSE)
    # pruning the n lowest (ties to the lower index) removes ShortGPT's chosen run
    start = int(torch.argsort(runs, stable=True)[0])
    assert sorted(torch.argsort(got, stable=True)[:k].tolist()) == list(range(start, start + k))


def test_runs_of_equal_distance_are_pruned_whole() -> None:
    from funcprune._runner._depth import _runs

    ends = [torch.tensor([[1.0, 0.0]], dtype=torch.float64)] * 6  # five blocks, every run of distance 0
    got = _runs(ends, 2)
    assert torch.argsort(got, stable=True)[:2].tolist() == [0, 1]


# hidden_scores --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert", "olmo2"])
def test_hidden_scores_are_minitrons_on_the_norms_reading_the_stream(name: str) -> None:
    model, seqs = model_of(name), sequences()
    before = state(model)
    inside = [n.format(i=i) for i in range(3) for n in NORMS.get(name, [])]  # OLMo-2's norms read no stream
    got = fp.hidden_scores(model, padded(seqs))
    assert got.dtype == torch.float64 and got.shape == (32,)
    torch.testing.assert_close(got, minitron_hidden(norm_outputs(model, seqs, inside + FINAL[name])), **CLOSE)
    torch.testing.assert_close(fp.hidden_scores(model, alone(seqs)), got, **CLOSE)
    torch.testing.assert_close(fp.hidden_scores(model, padded(seqs, extra=2)), got, **CLOSE)
    if inside:  # ModelOpt's own set: the blocks' norms only
        exact = fp.hidden_scores(model, padded(seqs), final_norm=False)
        torch.testing.assert_close(exact, minitron_hidden(norm_outputs(model, seqs, inside)), **CLOSE)
    else:
        with pytest.raises(ValueError, match="found no norm reading the residual stream"):
            fp.hidden_scores(model, padded(seqs), final_norm=False)
    assert untouched(model, before)


# errors ---------------------------------------------------------------------------------------------------------------


def test_bad_arguments_are_refused_naming_them() -> None:
    model = model_of("llama")
    batches = padded(sequences())
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"metric": "cka"}, ValueError, r"metric must be one of 'bi', 'angular', 'cosine', got 'cka'"),
        ({"metric": 1}, TypeError, r"metric must be a string.*got int"),
        ({"metric": "bi", "n": 2}, ValueError, r"n applies to metric='angular' only.*got n=2"),
        ({"metric": "angular", "n": 3}, ValueError, r"n must be between 1 and .* \(2: the model has 3 blocks.*got 3"),
        ({"metric": "angular", "n": 0}, ValueError, r"n must be between 1 and"),
        ({"metric": "angular", "n": 1.0}, TypeError, r"n must be an int.*got float"),
        ({"metric": "angular", "n": True}, TypeError, r"n must be an int.*got bool"),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            fp.layer_scores(model, batches, **kwargs)
    for fn in (fp.layer_scores, fp.hidden_scores):
        with pytest.raises(ValueError, match=r"no batches: batches was empty"):
            fn(model, [])
        with pytest.raises(TypeError, match=r"model must be a torch.nn.Module, got str"):
            fn("model", batches)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"batches must be an iterable of batches"):
            fn(model, batches[0])
    with pytest.raises(TypeError, match=r"final_norm must be a bool, got str"):
        fp.hidden_scores(model, batches, final_norm="no")  # type: ignore[arg-type]
    nothing = [{"input_ids": batches[0]["input_ids"], "attention_mask": torch.zeros_like(batches[0]["input_ids"])}]
    for metric in ("bi", "angular", "cosine"):
        with pytest.raises(ValueError, match="no real tokens"):
            fp.layer_scores(model, nothing, metric=metric)
    with pytest.raises(ValueError, match="no real tokens"):
        fp.hidden_scores(model, nothing)
    assert math.isfinite(float(fp.layer_scores(model, batches[:1]).sum()))
