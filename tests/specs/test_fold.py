"""Chains: the fold equals torch's repeated module pruning and is closed."""

from __future__ import annotations

import pytest
import torch
from _reference import torch_sequential_mask
from hypothesis import given
from hypothesis import strategies as st

import funcprune as fp

STEPS: list[fp.Spec] = [
    fp.Identity(),
    fp.L1Unstructured(0.3),
    fp.L1Unstructured(4),
    fp.RandomUnstructured(0.25),
    fp.LnStructured(0.5, n=2, dim=0),
    fp.LnStructured(1, n=1, dim=-1),
    fp.RandomStructured(0.34, dim=1),
    fp.CustomFromMask(torch.arange(6 * 5 * 3).reshape(6, 5, 3) % 3 != 0),
]


@given(steps=st.lists(st.sampled_from(STEPS), min_size=1, max_size=4), seed=st.integers(0, 1000))
def test_chain_equals_torch_applying_the_steps_one_after_another(
    steps: list[fp.Spec], seed: int
) -> None:
    t = torch.randn(6, 5, 3, generator=torch.Generator().manual_seed(seed))
    torch.manual_seed(seed)
    try:
        expected = torch_sequential_mask(tuple(steps), t)
    except ValueError as refused:  # a count larger than what the earlier steps left
        torch.manual_seed(seed)
        with pytest.raises(ValueError) as ours:
            fp.compute_mask(fp.chain(*steps), t)
        assert str(ours.value) == str(refused)
        return
    torch.manual_seed(seed)
    got = fp.compute_mask(fp.chain(*steps), t)
    assert torch.equal(got, expected.bool())


def test_tutorial_sequence_on_conv1() -> None:
    """The tutorial: random 30% of conv1.weight, then Ln-structured 50% on top."""
    torch.manual_seed(0)
    weight = torch.nn.Conv2d(1, 6, 3).weight.detach()
    steps = (fp.RandomUnstructured(0.3), fp.LnStructured(0.5, n=2, dim=0))
    torch.manual_seed(1)
    expected = torch_sequential_mask(steps, weight)
    torch.manual_seed(1)
    got = fp.compute_mask(fp.chain(*steps), weight)
    assert torch.equal(got, expected.bool())
    assert int((~got).flatten(1).all(1).sum()) == 3


def test_chain_equals_applying_each_step_by_hand() -> None:
    t = torch.randn(8, 6, generator=torch.Generator().manual_seed(3))
    a, b, c = fp.L1Unstructured(0.2), fp.LnStructured(0.5, n=1, dim=0), fp.L1Unstructured(5)
    m1 = fp.compute_mask(a, t)
    m2 = fp.compute_mask(b, t * m1, m1)
    m3 = fp.compute_mask(c, t * m2, m2)
    assert torch.equal(fp.compute_mask(fp.chain(a, b, c), t), m3)


def test_chain_on_a_default_mask_scores_the_given_scores_first() -> None:
    t = torch.randn(8, 6, generator=torch.Generator().manual_seed(4))
    default = torch.rand(8, 6, generator=torch.Generator().manual_seed(5)) > 0.3
    a, b = fp.LnStructured(0.5, n=2, dim=0), fp.L1Unstructured(0.5)
    m1 = fp.compute_mask(a, t, default)
    expected = fp.compute_mask(b, t * m1, m1)
    assert torch.equal(fp.compute_mask(fp.chain(a, b), t, default), expected)


def test_composition_is_closed_and_flat() -> None:
    a, b, c = fp.L1Unstructured(0.2), fp.RandomUnstructured(1), fp.Identity()
    assert fp.chain(fp.chain(a, b), c) == fp.chain(a, fp.chain(b, c)) == fp.chain(a, b, c)
    assert isinstance(fp.chain(a), fp.Chain)
    assert fp.chain(a, b, c).specs == (a, b, c)


@pytest.mark.parametrize(
    "spec", [fp.L1Unstructured(0.4), fp.LnStructured(2, n=2, dim=0), fp.Identity()]
)
def test_a_chain_of_one_is_the_spec(spec: fp.Spec) -> None:
    t = torch.randn(5, 4, generator=torch.Generator().manual_seed(6))
    default = torch.rand(5, 4, generator=torch.Generator().manual_seed(7)) > 0.2
    assert torch.equal(fp.compute_mask(fp.chain(spec), t), fp.compute_mask(spec, t))
    assert torch.equal(fp.compute_mask(fp.chain(spec), t, default), fp.compute_mask(spec, t, default))


def test_empty_chain_prunes_nothing() -> None:
    t = torch.randn(3, 4)
    default = torch.rand(3, 4) > 0.5
    assert fp.compute_mask(fp.chain(), t).all()
    got = fp.compute_mask(fp.chain(), t, default)
    assert torch.equal(got, default) and got.data_ptr() != default.data_ptr()


def test_chain_pruning_type() -> None:
    assert fp.chain().pruning_type == "unstructured"
    assert fp.chain(fp.L1Unstructured(1), fp.RandomUnstructured(1)).pruning_type == "unstructured"
    assert fp.chain(fp.LnStructured(1, 2), fp.RandomStructured(1)).pruning_type == "structured"
    assert fp.chain(fp.L1Unstructured(1), fp.LnStructured(1, 2)).pruning_type == "global"


def test_chain_refuses_non_specs() -> None:
    with pytest.raises(TypeError, match=r"chain: argument 1 must be a funcprune spec, got 0\.5"):
        fp.chain(fp.Identity(), 0.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Chain.specs\[0\]"):
        fp.Chain((fp.chain(fp.Identity()),))
