"""fp.expert_stats and fp.super_experts against float64 transcriptions of CerebrasResearch/reap.

The reference transcribes, in ``float64``, reap's ``src/reap/pruning_metrics.py``
(``update_pruning_state``: the softmax over the full router logits, the
optional renormalisation over the top-k with its clamp, the per-expert loop
over the tokens whose ``selected_experts`` hold the expert, ``ean_sum``,
``ean_mean``, ``weighted_expert_frequency_sum``, ``reap``, ``max_activations``)
and ``src/reap/metrics.py::OnlineStatsTracker.update`` (Welford's update with
Kahan compensation, weighted by each batch's expert frequency), which is how
reap combines batches. As reap's observer does for fused experts
(``src/reap/observer.py``), every expert runs on every token of the batch
(here the experts module called with one expert index for all tokens) and
the padding is filtered by the flattened ``attention_mask``. The router
logits and the routed experts are read by hooks of the test's own; reap's
``topk`` of the logits is checked to be the model's routing where the
router is a softmax top-k (all but DeepSeek's and PhiMoE's), and the
reference then uses reap's ``topk``.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import transformers
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import funcprune as fp
from funcprune._experts import routers

sys.path.insert(0, str(Path(__file__).parents[1]))
import _hf  # noqa: E402

Tensor = torch.Tensor
#: Two batches of right-padded sequences (each sequence's length).
LENGTHS = ((8, 5), (3, 7, 6))
#: Routers whose choice is not reap's top-k of the logits (a group-limited sigmoid; sparsemixer).
OWN_ROUTING = ("deepseek_v3", "phimoe")


def _more(name: str) -> nn.Module:
    t = transformers
    common: dict[str, Any] = dict(vocab_size=_hf.VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    if name == "qwen3_moe":
        config: Any = t.Qwen3MoeConfig(**common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                       norm_topk_prob=True)  # fmt: skip
        config.head_dim = 8
        return t.Qwen3MoeForCausalLM(config)
    if name == "olmoe":
        return t.OlmoeForCausalLM(t.OlmoeConfig(**common, num_experts=4, num_experts_per_tok=2, eos_token_id=2))
    return t.PhimoeForCausalLM(t.PhimoeConfig(**common, num_local_experts=4, num_experts_per_tok=2))


def model_of(name: str, *, float64: bool = True) -> nn.Module:
    torch.manual_seed(0)
    model = _hf.tiny(name).model if name in ("mixtral", "qwen2_moe", "deepseek_v3", "granitemoe") else _more(name)
    model.eval()
    if float64:
        config: Any = model.config
        config._experts_implementation = "eager"  # torch's grouped matmul takes no float64
        model.double()
    with torch.no_grad():  # routers initialized at zero or tiny would route by ties: spread them
        for r in routers(model):
            model.get_parameter(r.weight).normal_(0, 1.0)
    return model


def batches(seed: int = 1) -> list[dict[str, Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for lengths in LENGTHS:
        ids = torch.randint(0, _hf.VOCAB, (len(lengths), max(lengths)), generator=g)
        mask = torch.tensor([[1] * n + [0] * (max(lengths) - n) for n in lengths])
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


# --------------------------------------------------------------------------- reap, transcribed in float64


class Tracker:
    """reap's ``OnlineStatsTracker`` in float64: Welford's mean update with Kahan compensation."""

    def __init__(self, n: int) -> None:
        self.count = torch.zeros(n, dtype=torch.long)
        self.mean = torch.zeros(n, dtype=torch.float64)
        self.comp = torch.zeros(n, dtype=torch.float64)

    def update(self, new_mean: Tensor, new_count: Tensor) -> None:
        updated = self.count + new_count
        delta = new_mean - self.mean
        y = (delta * new_count / updated).nan_to_num(0)
        y = y - self.comp
        t = self.mean + y
        self.comp = (t - self.mean) - y
        self.mean = t
        self.count = updated


def reap_update(state: dict[str, Any], activations: Tensor, selected: Tensor, logits: Tensor, valid: Tensor,
                renormalize: bool) -> None:  # fmt: skip
    """``update_pruning_state`` with ``_prepare_pruning_batch``, in float64."""
    e = activations.shape[0]
    activations, selected, logits = activations[:, valid, :], selected[valid], logits[valid]
    frequency = torch.bincount(selected.reshape(-1), minlength=e)
    ean_sum, ean_mean, wf, reap = (torch.zeros(e, dtype=torch.float64) for _ in range(4))
    weights = F.softmax(logits, dim=1, dtype=torch.float64)
    if renormalize and selected.numel() > 0:
        weights = weights / torch.gather(weights, 1, selected).sum(dim=-1, keepdim=True)
        weights = torch.clamp(weights, min=torch.finfo(torch.float32).eps)
    for i in range(e):
        active = (selected == i).any(dim=-1)
        if not active.any():
            continue
        a = activations[i, active, :]
        w = weights[active, i]
        norm = torch.linalg.norm(a, dim=-1)
        ean_sum[i], ean_mean[i] = norm.sum(), norm.mean()
        wf[i], reap[i] = w.sum(), (norm * w).mean()
        if a.max() > state["max_activations"][i]:
            state["max_activations"][i] = a.max()
    state["expert_frequency"] += frequency
    state["ean_sum"] += ean_sum
    state["ean_mean"].update(ean_mean, frequency)
    state["weighted_expert_frequency_sum"] += wf
    state["reap"].update(reap, frequency)


def reference(name: str, model: nn.Module, data: list[dict[str, Tensor]], renormalize: bool) -> dict[str, dict[str, Tensor]]:
    layers = routers(model)
    states: dict[str, dict[str, Any]] = {
        r.experts: {"expert_frequency": torch.zeros(r.count, dtype=torch.long), "ean_sum": torch.zeros(r.count, dtype=torch.float64),
                    "ean_mean": Tracker(r.count), "weighted_expert_frequency_sum": torch.zeros(r.count, dtype=torch.float64),
                    "reap": Tracker(r.count), "max_activations": torch.zeros(r.count, dtype=torch.float64)}
        for r in layers
    }  # fmt: skip
    logits: dict[str, Tensor] = {}
    valid: list[Tensor] = []
    hooks = []
    for r in layers:
        def after_router(m: nn.Module, a: Any, out: Any, r: Any = r) -> None:
            logits[r.experts] = (out[0] if isinstance(out, tuple) else out).reshape(-1, r.count)

        def before_experts(m: nn.Module, args: Any, r: Any = r) -> None:
            if getattr(m, "_inside", False):
                return
            hidden, index = args[0], args[1]
            if name not in OWN_ROUTING:  # reap's own choice is the model's
                assert torch.equal(torch.topk(logits[r.experts], r.top_k, dim=-1).indices.sort(-1).values, index.sort(-1).values)
                selected = torch.topk(logits[r.experts], r.top_k, dim=-1).indices
            else:
                selected = index
            setattr(m, "_inside", True)
            try:
                ones = torch.ones(hidden.shape[0], 1, dtype=hidden.dtype)
                acts = torch.stack([m(hidden, torch.full((hidden.shape[0], 1), j), ones) for j in range(r.count)])
            finally:
                setattr(m, "_inside", False)
            reap_update(states[r.experts], acts, selected, logits[r.experts].double(), valid[0], renormalize)

        hooks.append(model.get_submodule(r.module).register_forward_hook(after_router))
        hooks.append(model.get_submodule(r.experts).register_forward_pre_hook(before_experts))
    try:
        with torch.no_grad():
            for batch in data:
                valid[:] = [batch["attention_mask"].reshape(-1).bool()]
                model(**batch, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return {
        r.experts.rpartition(".")[0]: {
            "frequency": states[r.experts]["expert_frequency"].double(),
            "weighted_frequency": states[r.experts]["weighted_expert_frequency_sum"],
            "ean_sum": states[r.experts]["ean_sum"],
            "ean_mean": states[r.experts]["ean_mean"].mean,
            "reap": states[r.experts]["reap"].mean,
            "max_activation": states[r.experts]["max_activations"],
        }
        for r in layers
    }


# --------------------------------------------------------------------------- tests

FAMILIES = ["mixtral", "qwen2_moe", "deepseek_v3", "granitemoe", "qwen3_moe", "olmoe", "phimoe"]


@pytest.mark.parametrize("name", FAMILIES)
def test_the_statistics_equal_reaps(name: str) -> None:
    model = model_of(name)
    got = fp.expert_stats(model, batches())
    want = reference(name, model, batches(), renormalize=False)
    assert list(got) == list(want)
    real = sum(sum(n) for n in LENGTHS)
    for layer, values in want.items():
        assert set(got[layer]) == set(fp.EXPERT_STATISTICS)
        assert got[layer]["frequency"].sum() == real * routers(model)[0].top_k
        for key, value in values.items():
            assert got[layer][key].dtype == torch.float64
            torch.testing.assert_close(got[layer][key], value, rtol=1e-12, atol=1e-15, msg=f"{layer} {key}")
        assert (got[layer]["frequency"] > 0).all()


@pytest.mark.parametrize("name", ["deepseek_v3", pytest.param("olmoe", marks=pytest.mark.ci)])
def test_layers_are_named_as_the_structure_names_their_experts(name: str) -> None:
    model = model_of(name, float64=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fp.UnitsLeftOutWarning)  # OLMoE's heads: not what this test is about
        structure = fp.structure(model, batches()[0]["input_ids"])
    assert list(fp.expert_stats(model, batches())) == [k for k, g in structure.items() if g.kind == "experts"]


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_renormalized_gates_equal_reaps(name: str) -> None:
    model = model_of(name)
    got = fp.expert_stats(model, batches(), renormalize=True)
    want = reference(name, model, batches(), renormalize=True)
    for layer, values in want.items():
        for key, value in values.items():
            torch.testing.assert_close(got[layer][key], value, rtol=1e-12, atol=1e-15, msg=f"{layer} {key}")


def test_batches_combine_as_one_and_padding_counts_for_nothing() -> None:
    model = model_of("mixtral")
    data = batches()
    whole = fp.expert_stats(model, data)
    # the same real tokens, each sequence alone and unpadded
    alone = []
    for batch in data:
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True):
            alone.append(ids[mask.bool()][None])
    parts = fp.expert_stats(model, alone)
    # padding's ids changed: nothing changes
    noisy = [{**b, "input_ids": torch.where(b["attention_mask"].bool(), b["input_ids"], 3)} for b in data]
    for other in (parts, fp.expert_stats(model, noisy)):
        for layer in whole:
            for key in whole[layer]:
                torch.testing.assert_close(other[layer][key], whole[layer][key], rtol=1e-12, atol=0.0)


def test_an_expert_never_routed_scores_zero() -> None:
    model = model_of("mixtral")
    with torch.no_grad():
        model.get_parameter("model.layers.0.mlp.gate.weight")[3] = -1e3 * model.get_parameter("model.layers.0.mlp.gate.weight")[0].abs().sum()
    stats = fp.expert_stats(model, [torch.ones(1, 4, dtype=torch.long)])
    layer = stats["model.layers.0.mlp"]
    assert {k: v[3].item() for k, v in layer.items()} == dict.fromkeys(fp.EXPERT_STATISTICS, 0.0)
    assert layer["frequency"][:3].sum() == 4 * 2


def test_errors_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="no MoE layer"):
        fp.expert_stats(_hf.tiny("llama").model, [torch.ones(1, 4, dtype=torch.long)])
    model = model_of("mixtral")
    with pytest.raises(TypeError, match="renormalize must be a bool"):
        fp.expert_stats(model, batches(), renormalize=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="model must be"):
        fp.expert_stats("model", batches())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one batch"):
        fp.expert_stats(model, [])
    with pytest.raises(ValueError, match="no real tokens"):
        fp.expert_stats(model, [{"input_ids": torch.ones(1, 4, dtype=torch.long), "attention_mask": torch.zeros(1, 4)}])
    # the model untouched: no hook left behind
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


# --------------------------------------------------------------------------- super experts


def reap_super_experts(maxes: list[Tensor], include_last_layers: bool) -> Tensor:
    """reap's ``get_super_expert_indices`` (``src/reap/model_util.py``), float64: (layer, expert) rows."""
    joined = torch.cat(maxes).flatten()
    threshold = max(torch.quantile(joined, 0.995).item(), joined.max().item() / 10)
    flags = joined.reshape(len(maxes), -1) > threshold
    if not include_last_layers:
        flags[int(len(maxes) * 0.75):, :] = False
    return torch.argwhere(flags)


@given(
    st.integers(1, 6), st.integers(2, 8), st.booleans(), st.integers(0, 2**31 - 1),
)
def test_super_experts_are_reaps(layers: int, experts: int, last: bool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    maxes = [torch.rand(experts, generator=g, dtype=torch.float64) ** 8 * 100 for _ in range(layers)]
    got = fp.super_experts({f"l{i}": {"max_activation": m} for i, m in enumerate(maxes)}, last_layers=last)
    rows = [(i, j) for i, name in enumerate(got) for j in got[name].nonzero().flatten().tolist()]
    assert rows == [tuple(r) for r in reap_super_experts(maxes, last).tolist()]


def test_super_experts_refuse_bad_input() -> None:
    with pytest.raises(ValueError, match="quantile"):
        fp.super_experts({"a": {"max_activation": torch.ones(2)}}, quantile=0.0)
    with pytest.raises(ValueError, match="times"):
        fp.super_experts({"a": {"max_activation": torch.ones(2)}}, times=-1)
    with pytest.raises(ValueError, match="'max_activation'"):
        fp.super_experts({"a": {"reap": torch.ones(2)}})
    with pytest.raises(ValueError, match="at least one layer"):
        fp.super_experts({})
