"""``sparsity=``: a cumulative target, counting what was pruned before."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.func import vmap

import funcprune as fp


def pruned(mask: torch.Tensor) -> int:
    return int((~mask).sum())


@given(n=st.integers(1, 300), before=st.floats(0, 1), target=st.floats(0, 1), seed=st.integers(0, 999))
def test_a_target_prunes_up_to_it_never_revives_and_never_undershoots(n: int, before: float, target: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(n, generator=g)
    default = torch.rand(n, generator=g) >= before
    for spec in (fp.L1Unstructured(sparsity=target), fp.RandomUnstructured(sparsity=target)):
        mask = fp.compute_mask(spec, scores, default, generator=g)
        assert not (mask & ~default).any()  # never revives
        assert pruned(mask) == max(pruned(default), round(target * n))


def test_the_issue_example_prunes_round_of_the_target_minus_what_is_pruned() -> None:
    t = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    half = fp.compute_mask(fp.L1Unstructured(0.5), t)
    mask = fp.compute_mask(fp.L1Unstructured(sparsity=0.9), t, half)
    assert pruned(mask) - pruned(half) == round(0.9 * 1000) - 500
    kept = t.abs()[mask]
    assert bool((t.abs()[half & ~mask] <= kept.min()).all())  # the smallest of what was left went
    assert torch.equal(fp.compute_mask(fp.L1Unstructured(sparsity=0.3), t, half), half)  # already past it


@pytest.mark.parametrize("value", [0.0, 0.25, 0.5, 1.0])
def test_on_a_fresh_tensor_a_target_equals_the_same_fraction_as_amount(value: float) -> None:
    t = torch.randn(8, 6, 5, generator=torch.Generator().manual_seed(1))
    pairs = [
        (fp.L1Unstructured(value), fp.L1Unstructured(sparsity=value)),
        (fp.LnStructured(value, n=2, dim=1), fp.LnStructured(sparsity=value, n=2, dim=1)),
        (fp.RandomUnstructured(value), fp.RandomUnstructured(sparsity=value)),
        (fp.RandomStructured(value, dim=0), fp.RandomStructured(sparsity=value, dim=0)),
    ]
    for by_amount, by_target in pairs:
        a = fp.compute_mask(by_amount, t, generator=torch.Generator().manual_seed(2))
        b = fp.compute_mask(by_target, t, generator=torch.Generator().manual_seed(2))
        assert torch.equal(a, b)


def test_a_structured_target_counts_channels_pruned_before() -> None:
    t = torch.randn(10, 4, generator=torch.Generator().manual_seed(3))
    default = torch.ones(10, 4, dtype=torch.bool)
    default[[0, 5]] = False  # 2 of 10 channels gone
    mask = fp.compute_mask(fp.LnStructured(sparsity=0.6, n=1, dim=0), t, default)
    gone = (~mask).all(dim=1)
    assert int(gone.sum()) == 6 and bool(gone[[0, 5]].all())


def test_a_global_target_is_a_fraction_of_the_whole_group() -> None:
    g = torch.Generator().manual_seed(4)
    params = {"a": torch.randn(40, 10, generator=g), "b": torch.randn(100, generator=g) * 3}
    first = fp.Plan({"a": fp.L1Unstructured(0.8)})(params)  # 320 of 500 pruned, all in "a"
    plan = fp.global_unstructured(["a", "b"], fp.L1Unstructured(sparsity=0.7))
    masks = plan(params, first)
    assert sum(pruned(m) for m in masks.values()) == 350
    again = plan(params, masks)
    assert all(torch.equal(again[n], masks[n]) for n in masks)  # already there: nothing more
    assert not (masks["a"] & ~first["a"]).any()


def test_targets_compose_in_chains_and_plans_round_after_round() -> None:
    t = torch.randn(200, generator=torch.Generator().manual_seed(5))
    mask = fp.compute_mask(fp.chain(fp.L1Unstructured(0.5), fp.L1Unstructured(sparsity=0.8)), t)
    assert pruned(mask) == 160
    plan = fp.Plan({"w": fp.L1Unstructured(sparsity=0.6)})
    masks = plan({"w": t})
    assert pruned(masks["w"]) == 120
    again = plan({"w": t}, masks)
    assert torch.equal(again["w"], masks["w"])  # already at the target: nothing more


def test_under_vmap_each_element_counts_its_own_pruned() -> None:
    g = torch.Generator().manual_seed(6)
    scores = torch.randn(5, 50, generator=g)
    defaults = torch.rand(5, 50, generator=g) >= torch.tensor([0.0, 0.2, 0.4, 0.6, 0.9])[:, None]
    spec = fp.L1Unstructured(sparsity=0.5)
    batched = vmap(lambda s, m: fp.compute_mask(spec, s, m))(scores, defaults)
    looped = torch.stack([fp.compute_mask(spec, s, m) for s, m in zip(scores, defaults, strict=True)])
    assert torch.equal(batched, looped)
    assert [pruned(m) for m in batched] == [max(pruned(d), 25) for d in defaults]


def test_a_target_compiles_whole() -> None:
    t = torch.randn(30, 7, generator=torch.Generator().manual_seed(7))
    default = torch.rand(30, 7, generator=torch.Generator().manual_seed(8)) > 0.3
    spec = fp.L1Unstructured(sparsity=0.75)
    compiled = torch.compile(lambda s, m: fp.compute_mask(spec, s, m), fullgraph=True)
    assert torch.equal(compiled(t, default), fp.compute_mask(spec, t, default))


def test_targets_are_checked_named_and_distinct_from_amounts() -> None:
    with pytest.raises(TypeError, match="L1Unstructured: give either amount .* or sparsity= .*, not both"):
        fp.L1Unstructured(0.5, sparsity=0.5)
    with pytest.raises(TypeError, match="Invalid type for amount: None.*or give sparsity="):
        fp.RandomStructured(dim=0)
    with pytest.raises(ValueError, match=r"LnStructured: sparsity must be a float in \[0, 1\], got 1.5"):
        fp.LnStructured(sparsity=1.5, n=2)
    with pytest.raises(TypeError, match=r"L1Unstructured: sparsity must be a float in \[0, 1\], got the bool True"):
        fp.L1Unstructured(sparsity=True)
    with pytest.raises(TypeError, match="LnStructured: n .* is required"):
        fp.LnStructured(sparsity=0.5)
    assert fp.L1Unstructured(0.5) != fp.L1Unstructured(sparsity=0.5)
    spec = fp.LnStructured(sparsity=0.5, n=2, dim=0)
    assert repr(spec) == "LnStructured(sparsity=0.5, n=2, dim=0)"
    assert eval(repr(spec), {"LnStructured": fp.LnStructured}) == spec
