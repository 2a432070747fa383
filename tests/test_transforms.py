"""compute_mask under torch.func.vmap, grad and torch.compile."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.func import grad, vmap

import funcprune as fp

DETERMINISTIC: list[fp.Spec] = [
    fp.Identity(),
    fp.L1Unstructured(0.3),
    fp.L1Unstructured(4),
    fp.L1Unstructured(1.0),
    fp.LnStructured(0.5, n=2, dim=0),
    fp.LnStructured(1, n=1, dim=-1),
    fp.LnStructured(0.4, n="fro", dim=1),
    fp.LnStructured(0.6, n=float("inf"), dim=2),
    fp.CustomFromMask(torch.arange(60).reshape(5, 4, 3) % 4 != 1),
    fp.chain(fp.L1Unstructured(0.2), fp.LnStructured(1, n=2, dim=0), fp.L1Unstructured(3)),
]
RANDOM: list[fp.Spec] = [
    fp.RandomUnstructured(0.4),
    fp.RandomUnstructured(3),
    fp.RandomStructured(0.5, dim=0),
    fp.chain(fp.RandomUnstructured(0.2), fp.RandomStructured(1, dim=-1)),
]


def _batch(seed: int, ties: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked scores and stacked default masks with different kept counts."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(-2, 3, (6, 5, 4, 3), generator=g).float() if ties else torch.randn(6, 5, 4, 3, generator=g)
    keep = torch.tensor([1.0, 0.9, 0.7, 0.5, 0.3, 0.05]).reshape(6, 1, 1, 1)
    masks = torch.rand(6, 5, 4, 3, generator=g) < keep
    masks[2, 1] = False  # a fully pruned channel in one element only
    return scores, masks


def _loop(spec: fp.Spec, scores: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    return torch.stack([fp.compute_mask(spec, s, m) for s, m in zip(scores, masks)])


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("spec", DETERMINISTIC, ids=repr)
def test_vmap_equals_a_loop_with_different_default_masks(spec: fp.Spec, ties: bool) -> None:
    scores, masks = _batch(0, ties)
    if isinstance(spec, fp.Chain) or getattr(spec, "amount", 0) == 4:
        masks |= torch.rand(masks.shape) < 0.5  # leave enough units for the int amounts
    batched = vmap(lambda s, m: fp.compute_mask(spec, s, m))(scores, masks)
    assert torch.equal(batched, _loop(spec, scores, masks))
    first = vmap(lambda s: fp.compute_mask(spec, s))(scores)
    assert torch.equal(first, torch.stack([fp.compute_mask(spec, s) for s in scores]))


@given(seed=st.integers(0, 10_000), amount=st.one_of(st.floats(0, 1), st.integers(0, 6)))
def test_vmap_equals_a_loop_property(seed: int, amount: float | int) -> None:
    scores, masks = _batch(seed, ties=seed % 2 == 0)
    masks[:, :, :, 0] = True  # at least 20 entries and 5 channels along dim 0 left
    for spec in (fp.L1Unstructured(amount), fp.LnStructured(min(amount, 5), n=2, dim=0)):
        batched = vmap(lambda s, m: fp.compute_mask(spec, s, m))(scores, masks)
        assert torch.equal(batched, _loop(spec, scores, masks))


def test_vmap_caps_an_int_amount_at_what_is_left() -> None:
    scores, masks = _batch(1)
    batched = vmap(lambda s, m: fp.compute_mask(fp.L1Unstructured(30), s, m))(scores, masks)
    left = masks.flatten(1).sum(1)
    assert batched.flatten(1).sum(1).tolist() == (left - left.clamp(max=30)).tolist()


@pytest.mark.parametrize("spec", RANDOM, ids=repr)
def test_random_specs_follow_vmap_randomness(spec: fp.Spec) -> None:
    scores, masks = _batch(2)
    masks |= torch.rand(masks.shape) < 0.5
    with pytest.raises(RuntimeError, match="randomness"):
        vmap(lambda s, m: fp.compute_mask(spec, s, m))(scores, masks)
    different = vmap(lambda s, m: fp.compute_mask(spec, s, m), randomness="different")(scores, masks)
    assert not (different & ~masks).any()
    same_masks = masks[:1].expand_as(masks)
    same = vmap(lambda s, m: fp.compute_mask(spec, s, m), randomness="same")(scores, same_masks)
    assert all(torch.equal(same[0], x) for x in same)
    if not isinstance(spec, fp.Chain):  # exact count per element
        for got, m in zip(different, masks):
            reference = fp.compute_mask(spec, torch.randn(m.shape), m)
            units = (lambda x: x.flatten(1).any(1)) if spec.pruning_type == "structured" else torch.flatten
            assert int(units(got).sum()) == int(units(reference).sum())


@pytest.mark.parametrize("spec", DETERMINISTIC, ids=repr)
def test_deterministic_specs_compile_fullgraph(spec: fp.Spec) -> None:
    torch._dynamo.reset()
    scores, masks = _batch(3)
    masks |= torch.rand(masks.shape) < 0.5
    compiled = torch.compile(lambda s, m: fp.compute_mask(spec, s, m), fullgraph=True)
    for s, m in zip(scores[:2], masks[:2]):
        assert torch.equal(compiled(s, m), fp.compute_mask(spec, s, m))
    compiled_first = torch.compile(lambda s: fp.compute_mask(spec, s), fullgraph=True)
    assert torch.equal(compiled_first(scores[0]), fp.compute_mask(spec, scores[0]))


@pytest.mark.parametrize("spec", [fp.L1Unstructured(0.5), fp.LnStructured(0.5, n=1, dim=0)], ids=repr)
def test_grad_through_prune_is_zero_where_pruned(spec: fp.Spec) -> None:
    w = torch.randn(6, 4, generator=torch.Generator().manual_seed(4))

    def loss(w: torch.Tensor) -> torch.Tensor:
        return (fp.prune(spec, w) ** 2).sum()

    g = grad(loss)(w)
    mask = fp.compute_mask(spec, w)
    assert torch.equal(g, 2 * w * mask)
    assert (g[~mask] == 0).all()


@pytest.fixture(params=["op", "traced"])
def vmap_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways selection runs under vmap: the custom op's eager rule, and traced."""
    from funcprune._select import _choose

    if request.param == "traced":
        monkeypatch.setattr(_choose, "_keep_lowest", None)
    elif _choose._keep_lowest is None:  # pragma: no cover (torch < 2.4)
        pytest.skip("torch.library cannot register the op here")
    return str(request.param)


@pytest.mark.parametrize("n", [7, 1000, 70_000])
def test_vmap_rows_long_and_short_equal_a_loop_on_both_paths(vmap_path: str, n: int) -> None:
    g = torch.Generator().manual_seed(n)
    scores = torch.randn(3, n, generator=g)
    scores[1] = torch.randint(0, 4, (n,), generator=g).float()  # heavy ties
    scores[2, ::5] = float("nan")
    for spec in (fp.L1Unstructured(0.5), fp.L1Unstructured(n // 3), fp.RandomUnstructured(0.0)):
        batched = vmap(lambda s: fp.compute_mask(spec, s))(scores)
        assert torch.equal(batched, torch.stack([fp.compute_mask(spec, s) for s in scores]))


def test_nested_vmap_equals_a_loop_on_both_paths(vmap_path: str) -> None:
    scores = torch.randn(2, 3, 70_000, generator=torch.Generator().manual_seed(0))
    spec = fp.L1Unstructured(0.3)
    nested = vmap(vmap(lambda s: fp.compute_mask(spec, s)))(scores)
    assert torch.equal(nested, torch.stack([torch.stack([fp.compute_mask(spec, s) for s in row]) for row in scores]))


def test_a_vmapped_plan_takes_the_op_and_compile_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    from funcprune._select import _choose

    if _choose._keep_lowest is None:  # pragma: no cover (torch < 2.4)
        pytest.skip("torch.library cannot register the op here")
    calls = []
    op = _choose._keep_lowest

    def spy(values: torch.Tensor, k: int, magnitude: bool) -> torch.Tensor:
        calls.append(k)
        return op(values, k, magnitude)

    monkeypatch.setattr(_choose, "_keep_lowest", spy)
    stacked = {"w": torch.randn(4, 30, 20), "v": torch.randn(4, 10)}
    plan = fp.Plan({"w": fp.L1Unstructured(0.5), "v": fp.L1Unstructured(3)})
    batched = vmap(plan)(stacked)
    assert sorted(calls) == [3, 300]
    for i in range(4):
        single = plan({n: t[i] for n, t in stacked.items()})
        assert all(torch.equal(batched[n][i], single[n]) for n in single)
    calls.clear()
    compiled = torch.compile(lambda s: fp.compute_mask(fp.L1Unstructured(0.5), s), fullgraph=True)
    assert torch.equal(compiled(stacked["w"][3]), single["w"])
    assert calls == []
