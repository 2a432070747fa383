"""compute_mask and prune: parity with torch.nn.utils.prune and invariants."""

from __future__ import annotations

import itertools

import pytest
import torch
from _reference import torch_mask
from hypothesis import given
from hypothesis import strategies as st

import funcprune as fp
from funcprune._validate import count_to_prune

SHAPES = [(7,), (6, 5), (4, 3, 5), (3, 4, 2, 3)]
UNSTRUCTURED: list[fp.Spec] = [
    fp.Identity(),
    fp.L1Unstructured(0.0),
    fp.L1Unstructured(0.3),
    fp.L1Unstructured(0.5),
    fp.L1Unstructured(1.0),
    fp.L1Unstructured(3),
    fp.RandomUnstructured(0.4),
    fp.RandomUnstructured(2),
    fp.RandomUnstructured(1.0),
]
STRUCTURED: list[fp.Spec] = [
    fp.LnStructured(0.5, n=2, dim=0),
    fp.LnStructured(1, n=1, dim=-1),
    fp.LnStructured(0.34, n=float("inf"), dim=1),
    fp.LnStructured(0.6, n=float("-inf"), dim=0),
    fp.LnStructured(2, n=0.5, dim=-2),
    fp.LnStructured(1.0, n=3.5, dim=0),
    fp.LnStructured(0.5, n="fro", dim=0),
    fp.RandomStructured(0.5, dim=0),
    fp.RandomStructured(1, dim=-1),
    fp.RandomStructured(0.7, dim=1),
]


def _scores(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=dtype)


def _default_mask(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """A random earlier mask, with the first channel along dim 0 fully pruned."""
    g = torch.Generator().manual_seed(seed + 1)
    mask = torch.rand(shape, generator=g) > 0.35
    if len(shape) > 1:
        mask[0] = False
    return mask


def _cases() -> list[tuple[fp.Spec, tuple[int, ...]]]:
    cases = [(s, shape) for s, shape in itertools.product(UNSTRUCTURED, SHAPES)]
    cases += [(s, shape) for s, shape in itertools.product(STRUCTURED, SHAPES[1:])]
    cases += [
        (fp.CustomFromMask(_default_mask(shape, 7)), shape) for shape in SHAPES
    ]
    return [
        (s, shape)
        for s, shape in cases
        if not (isinstance(s, fp.LnStructured) and s.n == "fro" and len(shape) > 3)
    ]


CASES = _cases()


@pytest.mark.parametrize("with_default", [False, True], ids=["first", "folded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("spec", "shape"), CASES, ids=[f"{s}-{sh}" for s, sh in CASES])
def test_parity_with_torch(
    spec: fp.Spec, shape: tuple[int, ...], dtype: torch.dtype, with_default: bool
) -> None:
    scores = _scores(shape, 0, dtype)
    default = _default_mask(shape, 3) if with_default else None
    if with_default and isinstance(spec, (fp.L1Unstructured, fp.RandomUnstructured)):
        if isinstance(spec.amount, int) and spec.amount > int(default.sum()):  # type: ignore[union-attr]
            pytest.skip("more units asked than left: the error is tested separately")
    torch.manual_seed(42)
    expected = torch_mask(spec, scores, default)
    after_torch = torch.rand(3)
    torch.manual_seed(42)
    got = fp.compute_mask(spec, scores, default)
    after_ours = torch.rand(3)
    assert got.dtype == torch.bool
    assert torch.equal(got, expected.bool())
    assert torch.equal(after_torch, after_ours), "the global RNG must advance exactly as torch's"


@pytest.mark.parametrize("spec", [fp.RandomUnstructured(0.5), fp.RandomStructured(0.5, dim=0)])
def test_generator_draws_like_a_seeded_global_rng(spec: fp.Spec) -> None:
    scores = _scores((6, 4), 0)
    default = _default_mask((6, 4), 1)
    torch.manual_seed(5)
    expected = fp.compute_mask(spec, scores, default)
    g = torch.Generator().manual_seed(5)
    torch.manual_seed(99)
    state = torch.get_rng_state()
    got = fp.compute_mask(spec, scores, default, generator=g)
    assert torch.equal(got, expected)
    assert torch.equal(torch.get_rng_state(), state), "the global RNG must stay untouched"
    other = torch.Generator().manual_seed(6)
    masks = {tuple(fp.compute_mask(spec, scores, generator=other).flatten().tolist()) for _ in range(4)}
    assert len(masks) > 1, "successive draws from one generator must differ"


def test_prune_multiplies_like_torch() -> None:
    import torch.nn.utils.prune as tprune

    t = _scores((5, 4), 0)
    importance = _scores((5, 4), 1)
    default = _default_mask((5, 4), 2)
    got = fp.prune(fp.L1Unstructured(0.5), t, default, importance)
    method = tprune.PruningContainer()
    method._tensor_name = "t"
    inner = tprune.L1Unstructured(0.5)
    inner._tensor_name = "t"
    method.add_pruning_method(inner)
    expected = method.prune(t, default.float(), importance)
    assert torch.equal(got, expected)
    assert torch.equal(fp.prune(fp.Identity(), t), t)


def test_nan_scores_are_pruned_last() -> None:
    scores = torch.tensor([float("nan"), 0.1, -5.0, float("nan"), 0.2])
    assert fp.compute_mask(fp.L1Unstructured(2), scores).tolist() == [True, False, True, True, False]
    assert fp.compute_mask(fp.L1Unstructured(4), scores).tolist() == [False, False, False, True, False]
    channels = torch.tensor([[1.0, float("nan")], [0.5, 0.5], [3.0, 3.0]])
    mask = fp.compute_mask(fp.LnStructured(1, n=2, dim=0), channels)
    assert mask.tolist() == [[True, True], [False, False], [True, True]]


def test_ties_prune_lower_indices_first() -> None:
    scores = torch.tensor([1.0, -1.0, 1.0, 0.5, 1.0])
    assert fp.compute_mask(fp.L1Unstructured(3), scores).tolist() == [False, False, True, False, True]
    zeros = torch.zeros(4, 3)
    mask = fp.compute_mask(fp.LnStructured(2, n=1, dim=0), zeros)
    assert mask.any(dim=1).tolist() == [False, False, True, True]


# --- properties ---------------------------------------------------------------

shapes = st.lists(st.integers(1, 5), min_size=2, max_size=4).map(tuple)
amounts = st.one_of(st.floats(0.0, 1.0), st.integers(0, 4))


@st.composite
def problems(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor | None]:
    shape = draw(shapes)
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    if draw(st.booleans()):  # heavy ties
        scores = torch.randint(-2, 3, shape, generator=g).float()
    else:
        scores = torch.randn(shape, generator=g)
    default = None
    if draw(st.booleans()):
        default = torch.rand(shape, generator=g) < draw(st.floats(0.0, 1.0))
    return scores, default


def _fit(amount: float | int, available: int) -> float | int:
    return min(amount, available) if isinstance(amount, int) else amount


@given(problem=problems(), amount=amounts, random=st.booleans())
def test_unstructured_prunes_exactly_the_count_and_never_revives(
    problem: tuple[torch.Tensor, torch.Tensor | None], amount: float | int, random: bool
) -> None:
    scores, default = problem
    before = (scores.clone(), None if default is None else default.clone())
    kept_before = scores.numel() if default is None else int(default.sum())
    amount = _fit(amount, kept_before)
    spec = fp.RandomUnstructured(amount) if random else fp.L1Unstructured(amount)
    mask = fp.compute_mask(spec, scores, default)
    assert mask.shape == scores.shape and mask.dtype == torch.bool
    assert int(mask.sum()) == kept_before - count_to_prune(amount, kept_before)
    if default is not None:
        assert not (mask & ~default).any()
    assert torch.equal(scores, before[0])
    if default is not None:
        assert torch.equal(default, before[1])  # type: ignore[arg-type]
    if not random:  # nothing pruned scores higher than anything kept
        eligible = torch.ones_like(mask) if default is None else default
        pruned_now = eligible & ~mask
        if pruned_now.any() and mask.any():
            assert scores.abs()[pruned_now].max() <= scores.abs()[mask].min()


@given(problem=problems(), amount=amounts, dim=st.integers(-2, 1), random=st.booleans())
def test_structured_prunes_exactly_the_channel_count_and_never_revives(
    problem: tuple[torch.Tensor, torch.Tensor | None], amount: float | int, dim: int, random: bool
) -> None:
    scores, default = problem
    d = dim % scores.dim()
    others = [i for i in range(scores.dim()) if i != d]
    alive = (
        torch.ones(scores.shape[d], dtype=torch.bool)
        if default is None
        else default.sum(dim=others) != 0
    )
    amount = _fit(amount, int(alive.sum()))
    spec = fp.RandomStructured(amount, dim) if random else fp.LnStructured(amount, 2, dim)
    mask = fp.compute_mask(spec, scores, default)
    channel_kept = mask.sum(dim=others) != 0
    removed = alive & ~channel_kept
    assert int(removed.sum()) == count_to_prune(amount, int(alive.sum()))
    keep = (~removed).reshape([-1 if i == d else 1 for i in range(scores.dim())])
    expected = keep.expand(scores.shape) if default is None else default & keep
    assert torch.equal(mask, expected)


@pytest.mark.parametrize(("shape", "dim"), [((0, 3), 0), ((3, 0), 1), ((3, 0), 0)])
@pytest.mark.parametrize("make", [lambda d: fp.LnStructured(0.5, n=2, dim=d), lambda d: fp.RandomStructured(0.5, dim=d)])
def test_empty_tensors_like_torch(shape: tuple[int, ...], dim: int, make: object) -> None:
    spec: fp.Spec = make(dim)  # type: ignore[operator]
    scores = torch.empty(shape)
    for default in (None, torch.ones(shape, dtype=torch.bool)):
        got = fp.compute_mask(spec, scores, default)
        expected = torch_mask(spec, scores, default)
        assert got.shape == scores.shape and torch.equal(got, expected.bool())


def test_scores_that_require_grad_give_a_plain_mask() -> None:
    """Large enough for the fast path; the mask carries no autograd history."""
    w = torch.randn(512, 256, requires_grad=True)
    mask = fp.compute_mask(fp.L1Unstructured(0.5), w)
    assert not mask.requires_grad and int((~mask).sum()) == w.numel() // 2
    pruned = fp.prune(fp.L1Unstructured(0.5), w)
    (g,) = torch.autograd.grad(pruned.sum(), w)
    assert torch.equal(g, mask.float())


@pytest.mark.parametrize("folded", [False, True])
@pytest.mark.parametrize("size", [10, 300])  # below and above the fast-path size
@pytest.mark.parametrize(("spec", "shape"), CASES[:: max(1, len(CASES) // 12)])
def test_meta_tensors_give_meta_masks(spec: fp.Spec, shape: tuple[int, ...], size: int, folded: bool) -> None:
    """Deferred initialization: shapes without values, so no value may be read."""
    scores = torch.empty((size, *shape[1:]) if len(shape) > 1 else (size * size,), device="meta")
    if isinstance(spec, fp.CustomFromMask):
        spec = fp.CustomFromMask(torch.ones(scores.shape, device="meta"))
    default = torch.ones(scores.shape, dtype=torch.bool, device="meta") if folded else None
    mask = fp.compute_mask(spec, scores, default)
    assert (mask.device.type, mask.dtype, mask.shape) == ("meta", torch.bool, scores.shape)
