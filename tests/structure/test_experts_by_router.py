"""Experts ranked by what the router does: router statistics as unit scores, global budgets, expert groups, protection.

- Global expert budgets (``scope="global"`` on ``fp.expert_stats``'s ``reap``)
  give layers different expert counts; shrink removes them, and the record
  plus ``fp.load_shrunk`` reloads them exactly.
- DeepSeek-V3 routing by expert groups (``n_group=2``): the structure lists
  the experts with ``parts=2``, plans remove as many experts from each group
  (runs of one expert per group, keyed by their mean), shrink removes them
  and plain ``from_pretrained`` reloads; masks that prune unevenly keep the
  first experts of the fuller groups, the same in the masked model
  (``never_routed``) as in the shrunk one.
- ``protect=`` keeps named units (reap's super experts) whatever the scores.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from _hf import tiny
from hypothesis import given
from hypothesis import strategies as st

import funcprune as fp
from funcprune._experts import removed_experts, routers

Tensor = torch.Tensor


def logits(model: torch.nn.Module, x: dict[str, Any], masks: fp.Masks | None = None) -> Tensor:
    with torch.no_grad():
        if masks is None:
            out: Any = model(**x)
        else:
            out = fp.functional_call_masked(model, dict(model.named_parameters()), masks, (), x)
    result: Tensor = out.logits
    return result


def grouped(layers: int = 3, seed: int = 0) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A tiny DeepSeek-V3 routing by 2 groups of 4 experts, each token to 2 experts in 1 group."""
    config = transformers.DeepseekV3Config(
        vocab_size=64, max_position_embeddings=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        num_hidden_layers=layers, first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1, q_lora_rank=16,
        kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8,
    )  # fmt: skip
    torch.manual_seed(seed)
    model: Any = transformers.DeepseekV3ForCausalLM(config)
    model.eval()
    with torch.no_grad():
        for r in routers(model):
            model.get_parameter(r.weight).normal_()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(seed + 1))
    return model, {"input_ids": ids, "use_cache": False}


def router_rows(masks: fp.Masks, model: torch.nn.Module) -> dict[str, list[int]]:
    return {r.module: masks[r.weight].any(-1).int().tolist() for r in routers(model)}


@pytest.mark.parametrize("name", ["mixtral", pytest.param("qwen2_moe", marks=pytest.mark.ci)])
def test_global_budgets_on_reap_shrink_and_reload_exactly(name: str, tmp_path: Path) -> None:
    t = tiny(name, layers=3)
    x = {"input_ids": t.args[0], "use_cache": False}
    with torch.no_grad():
        for r in routers(t.model):
            t.model.get_parameter(r.weight).normal_()
        for p in routers(t.model)[0].parameters:  # the first layer's experts matter most
            t.model.get_parameter(p).mul_(4.0)
    stats = fp.expert_stats(t.model, [x["input_ids"], t.args[0].flip(0)])
    s = fp.structure(t.model, x)
    plan = fp.structured(s, fp.LnStructured(0.25, n=2), kinds="experts", scope="global")
    masks = plan(dict(t.model.named_parameters()), unit_scores={k: v["reap"] for k, v in stats.items()})
    kept = [sum(rows) for rows in router_rows(masks, t.model).values()]
    assert sum(kept) == 9 and kept[0] == 4 and len(set(kept)) > 1  # 3 of 12 go, unevenly: a budget across layers
    # the lowest reap scores went: every removed expert scores below every kept one, but for the floors
    for r in routers(t.model):
        group = r.module.rpartition(".")[0]
        gone = ~masks[r.weight].any(-1)
        if gone.any() and (~gone).sum() > r.top_k:
            assert stats[group]["reap"][gone].max() <= stats[group]["reap"][~gone].min()
    with warnings.catch_warnings():
        warnings.simplefilter("error", fp.KeptChannelsWarning)
        small: Any = fp.shrink(t.model, masks, x)
    torch.testing.assert_close(logits(small, x), logits(t.model, x, masks), atol=1e-5, rtol=1e-5)
    small.save_pretrained(tmp_path)
    again = fp.load_shrunk(tmp_path)
    torch.testing.assert_close(logits(again, x), logits(small, x), atol=0, rtol=0)


@pytest.mark.ci  # the default suite's 5 minutes: CI runs it
def test_experts_routed_by_groups_lose_as_many_from_each(tmp_path: Path) -> None:
    model, x = grouped()
    s = fp.structure(model, x)
    experts = {name: g for name, g in s.items() if g.kind == "experts"}
    assert [(g.size, g.parts, g.least) for g in experts.values()] == [(8, 2, 4)] * 2
    stats = fp.expert_stats(model, [x["input_ids"]])
    for scope in ("group", "global"):
        plan = fp.structured(s, fp.LnStructured(0.5, n=2), kinds="experts", scope=scope)
        masks = plan(dict(model.named_parameters()), unit_scores={k: v["reap"] for k, v in stats.items()})
        for rows in router_rows(masks, model).values():
            assert sum(rows[:4]) == sum(rows[4:]) == 2
        with warnings.catch_warnings():
            warnings.simplefilter("error", fp.KeptChannelsWarning)
            small: Any = fp.shrink(model, masks, x)
        assert small.config.n_routed_experts == 4 and small.config.n_group == 2
        torch.testing.assert_close(logits(small, x), logits(model, x, masks), atol=1e-5, rtol=1e-5)
    small.save_pretrained(tmp_path)
    again: Any = transformers.DeepseekV3ForCausalLM.from_pretrained(tmp_path)
    again.eval()
    torch.testing.assert_close(logits(again, x), logits(small, x), atol=0, rtol=0)


def test_runs_of_one_expert_per_group_go_by_their_mean_score() -> None:
    model, x = grouped(layers=2)
    s = fp.structure(model, x)
    name = next(n for n, g in s.items() if g.kind == "experts")
    scores = torch.tensor([5.0, 1.0, 7.0, 3.0, 0.5, 9.0, 8.0, 2.0])
    # part 0 sorted: 1 (e1), 3 (e3), 5 (e0), 7 (e2); part 1: 0.5 (e4), 2 (e7), 8 (e6), 9 (e5)
    # runs: (e1, e4) 0.75, (e3, e7) 2.5, ... : 2 units go per run
    masks = fp.structured(s, fp.LnStructured(4, n=2), kinds="experts", scope="group")(
        dict(model.named_parameters()), unit_scores={name: scores}
    )
    r = next(r for r in routers(model) if r.module.startswith(name))
    assert masks[r.weight].any(-1).int().tolist() == [1, 0, 1, 0, 0, 1, 1, 0]
    with pytest.raises(ValueError, match="multiple of 2"):
        fp.structured(s, fp.LnStructured(3, n=2), kinds="experts", scope="group")(dict(model.named_parameters()))
    with pytest.raises(ValueError, match=r"in runs of one unit from each of 2 parts.*at most 2 can go"):  # each keeps 2
        fp.structured(s, fp.LnStructured(6, n=2), kinds="experts", scope="group")(dict(model.named_parameters()))
    with pytest.raises(ValueError, match="different numbers of parts"):  # MLP channels beside grouped experts
        fp.structured(s, fp.LnStructured(0.25, n=2), kinds=("experts", "channels"))(dict(model.named_parameters()))


def test_uneven_masks_keep_the_first_experts_of_the_fuller_groups_in_both_models() -> None:
    model, x = grouped(layers=2)
    s = fp.structure(model, x)
    r = routers(model)[0]
    masks = {r.weight: torch.ones(8, 32, dtype=torch.bool)}
    masks[r.weight][[0, 2, 5]] = False  # two from the first group, one from the second
    for p in r.parameters:
        masks[p] = torch.ones_like(model.get_parameter(p), dtype=torch.bool)
        masks[p][[0, 2, 5]] = False
    assert removed_experts(masks[r.weight], r.least, r.groups).nonzero().flatten().tolist() == [2, 5]
    with pytest.warns(fp.KeptChannelsWarning, match="2 expert groups, which lose experts evenly"):
        small: Any = fp.shrink(model, masks, x)
    assert small.config.n_routed_experts == 6
    torch.testing.assert_close(logits(small, x), logits(model, x, masks), atol=1e-5, rtol=1e-5)
    assert s  # the structure lists what can go; these masks are a user's own


@given(st.lists(st.booleans(), min_size=8, max_size=8), st.sampled_from([(1, 2), (2, 4), (2, 2), (4, 4)]))
def test_removed_experts_lose_evenly_and_keep_the_floor(pruned: list[bool], shape: tuple[int, int]) -> None:
    groups, least = shape
    mask = torch.tensor([[not p] for p in pruned])
    got = removed_experts(mask, least, groups).tolist()
    each = 8 // groups
    runs = [[i for i in range(g * each, (g + 1) * each) if pruned[i]] for g in range(groups)]
    allowed = min(min(len(r) for r in runs), each - least // groups)
    want = [False] * 8
    for run in runs:
        for i in run[len(run) - allowed :]:
            want[i] = True
    assert got == want
    assert torch.equal(torch.vmap(lambda m: removed_experts(m, least, groups))(mask[None])[0], torch.tensor(want))


def test_protected_experts_never_go() -> None:
    t = tiny("mixtral", layers=2)
    x = {"input_ids": t.args[0], "use_cache": False}
    s = fp.structure(t.model, x)
    params = dict(t.model.named_parameters())
    names = [n for n, g in s.items() if g.kind == "experts"]
    low = {n: torch.arange(4, dtype=torch.float64) for n in names}  # expert 0 lowest everywhere
    for scope in ("group", "global"):
        plain = fp.structured(s, fp.LnStructured(0.5, n=2), kinds="experts", scope=scope)(params, unit_scores=low)
        kept = fp.structured(s, fp.LnStructured(0.5, n=2), kinds="experts", scope=scope,
                             protect={names[0]: [0], names[1]: torch.tensor([True, True, False, False])})(
            params, unit_scores=low)  # fmt: skip
        rows = [kept[r.weight].any(-1).tolist() for r in routers(t.model)]
        assert [plain[r.weight].any(-1).tolist() for r in routers(t.model)] == [[False, False, True, True]] * 2
        assert rows == [[True, False, False, True], [True, True, False, False]]
    with pytest.raises(ValueError, match="the protected units stay: at most 1 can go"):
        fp.structured(s, fp.LnStructured(2, n=2), kinds="experts", scope="group", protect={names[0]: [0, 1, 2]})(params)
    with pytest.raises(ValueError, match="no group this plan prunes"):
        fp.structured(s, fp.LnStructured(0.5, n=2), kinds="experts", protect={"model.layers.0.self_attn": [0]})
    with pytest.raises(ValueError, match=r"unit indices from 0 to 3, got 4"):
        fp.structured(s, fp.LnStructured(0.5, n=2), kinds="experts", protect={names[0]: [4]})
    with pytest.raises(ValueError, match="bool tensor of 4"):
        fp.structured(s, fp.LnStructured(0.5, n=2), kinds="experts", protect={names[0]: torch.ones(3, dtype=torch.bool)})
    with pytest.raises(TypeError, match="protect must be a mapping"):
        fp.structured(s, fp.LnStructured(0.5, n=2), kinds="experts", protect=[0])  # type: ignore[arg-type]


def test_super_experts_protected_end_to_end() -> None:
    t = tiny("mixtral", layers=2)
    model: Any = t.model
    x = {"input_ids": t.args[0], "use_cache": False}
    with torch.no_grad():  # expert 1 of layer 0 makes outputs 1000 times larger
        model.model.layers[0].mlp.experts.down_proj[1] *= 1000
    stats = fp.expert_stats(t.model, [x["input_ids"]])
    supers = fp.super_experts(stats, last_layers=True)
    assert supers["model.layers.0.mlp"].tolist() == [False, True, False, False]
    s = fp.structure(t.model, x)
    scores = {k: -v["reap"] for k, v in stats.items()}  # the highest reap would go first: only protection keeps it
    masks = fp.structured(s, fp.LnStructured(0.5, n=2), kinds="experts", scope="group", protect=supers)(
        dict(t.model.named_parameters()), unit_scores=scores
    )
    assert masks["model.layers.0.mlp.gate.weight"][1].all()
