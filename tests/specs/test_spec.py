"""User-defined specs: accepted wherever a built-in is, and held to the same properties."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.func import vmap

import funcprune as fp
from funcprune._validate import count_to_prune

Tensor = torch.Tensor


@dataclasses.dataclass(frozen=True)
class SquaredMagnitude(fp.Spec):
    """A user's unstructured spec: prunes the entries of smallest ``scores ** 2``."""

    amount: float | int
    pruning_type = "unstructured"

    def compute_mask(
        self, scores: Tensor, default_mask: Tensor | None = None, *, generator: torch.Generator | None = None
    ) -> Tensor:
        return fp.compute_mask(fp.L1Unstructured(self.amount), scores * scores, default_mask)


@dataclasses.dataclass(frozen=True)
class QuietRows(fp.Spec):
    """A user's structured spec written with plain torch: prunes the rows whose
    largest magnitude is below ``threshold`` (a mask that reads no values in Python)."""

    threshold: float
    pruning_type = "structured"

    def compute_mask(
        self, scores: Tensor, default_mask: Tensor | None = None, *, generator: torch.Generator | None = None
    ) -> Tensor:
        loud = scores.abs().amax(dim=tuple(range(1, scores.dim()))) >= self.threshold
        mask = loud.reshape(-1, *([1] * (scores.dim() - 1))).expand(scores.shape)
        return mask.clone() if default_mask is None else mask & default_mask.bool()


@dataclasses.dataclass(frozen=True)
class Broken(fp.Spec):
    """Returns what it is told to: for the error tests."""

    result: object
    pruning_type = "unstructured"

    def compute_mask(
        self, scores: Tensor, default_mask: Tensor | None = None, *, generator: torch.Generator | None = None
    ) -> Tensor:
        return self.result  # type: ignore[return-value]  # deliberately wrong


@st.composite
def problems(draw: st.DrawFn) -> tuple[Tensor, Tensor | None]:
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    ties = draw(st.booleans())
    scores = torch.randint(-2, 3, shape, generator=g).float() if ties else torch.randn(shape, generator=g)
    default = torch.rand(shape, generator=g) < 0.7 if draw(st.booleans()) else None
    return scores, default


@given(problem=problems(), amount=st.one_of(st.floats(0.0, 1.0), st.integers(0, 5)))
def test_a_user_spec_prunes_exactly_never_revives_and_leaves_inputs(
    problem: tuple[Tensor, Tensor | None], amount: float | int
) -> None:
    scores, default = problem
    before = (scores.clone(), None if default is None else default.clone())
    unpruned = scores.numel() if default is None else int(default.sum())
    amount = min(amount, unpruned) if isinstance(amount, int) else amount
    mask = fp.compute_mask(SquaredMagnitude(amount), scores, default)
    assert mask.shape == scores.shape and mask.dtype == torch.bool
    assert int(mask.sum()) == unpruned - count_to_prune(amount, unpruned)
    if default is not None:
        assert not bool((mask & ~default).any())
        assert torch.equal(default, before[1])  # type: ignore[arg-type]
    assert torch.equal(scores, before[0])
    expected = fp.compute_mask(fp.L1Unstructured(amount), scores.abs(), default)
    assert torch.equal(mask, expected)  # |s|^2 ranks like |s|


@pytest.mark.parametrize("spec", [SquaredMagnitude(0.5), SquaredMagnitude(3), QuietRows(0.8)], ids=repr)
def test_a_user_spec_under_vmap_equals_a_loop_and_compiles(spec: fp.Spec) -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(4, 6, 5, generator=g)
    masks = torch.rand(4, 6, 5, generator=g) < 0.8
    loop = torch.stack([fp.compute_mask(spec, s, m) for s, m in zip(scores, masks)])
    assert torch.equal(vmap(lambda s, m: fp.compute_mask(spec, s, m))(scores, masks), loop)
    compiled = torch.compile(lambda s, m: fp.compute_mask(spec, s, m), fullgraph=True)
    assert torch.equal(compiled(scores[0], masks[0]), loop[0])


def test_a_user_spec_chains_like_applying_it_step_by_step() -> None:
    w = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    first = fp.compute_mask(QuietRows(0.9), w)
    second = fp.compute_mask(SquaredMagnitude(0.5), w * first, first)
    assert torch.equal(fp.compute_mask(fp.chain(QuietRows(0.9), SquaredMagnitude(0.5)), w), second)
    assert torch.equal(fp.prune(SquaredMagnitude(0.5), w), w * fp.compute_mask(SquaredMagnitude(0.5), w))


def test_a_user_spec_in_plans_and_global_plans() -> None:
    params = {"a": torch.randn(5, 4, generator=torch.Generator().manual_seed(2)), "b": torch.randn(7)}
    rules: dict[str, fp.Rule] = {"a": [QuietRows(0.5), SquaredMagnitude(2)], "b": SquaredMagnitude(0.5)}
    masks = fp.Plan(rules)(params)
    assert torch.equal(masks["a"], fp.compute_mask(fp.chain(QuietRows(0.5), SquaredMagnitude(2)), params["a"]))
    assert torch.equal(masks["b"], fp.compute_mask(SquaredMagnitude(0.5), params["b"]))
    joint = fp.global_unstructured(["a", "b"], SquaredMagnitude(0.4))(params)
    flat = fp.compute_mask(SquaredMagnitude(0.4), torch.cat([params["a"].reshape(-1), params["b"]]))
    assert torch.equal(torch.cat([joint["a"].reshape(-1), joint["b"]]), flat)
    with pytest.raises(TypeError, match="global_unstructured: spec must have pruning_type 'unstructured'"):
        fp.global_unstructured(["a"], QuietRows(0.5))


@pytest.mark.parametrize(
    ("result", "error", "message"),
    [([True], TypeError, r"Broken.compute_mask must return a tensor, got list"),
     (torch.ones(3), ValueError, r"Broken.compute_mask returned a torch.float32 tensor of shape \(3,\)"),
     (torch.ones(2, dtype=torch.bool), ValueError, r"must return a torch.bool mask of the scores' shape \(3,\)")],
)  # fmt: skip
def test_a_spec_returning_no_mask_of_the_scores_is_refused(
    result: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        fp.compute_mask(Broken(result), torch.randn(3))
    with pytest.raises(error, match=message):
        fp.Plan({"w": Broken(result)})({"w": torch.randn(3)})


def test_an_abstract_spec_cannot_be_built_and_a_non_spec_is_named() -> None:
    @dataclasses.dataclass(frozen=True)
    class Unfinished(fp.Spec):
        pruning_type = "unstructured"

    with pytest.raises(TypeError, match="abstract"):
        Unfinished()  # type: ignore[abstract]
    with pytest.raises(TypeError, match=r"compute_mask: spec must be a funcprune spec, got .* a funcprune.Spec subclass"):
        fp.compute_mask(object(), torch.randn(3))  # type: ignore[arg-type]
