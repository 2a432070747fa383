"""Specs: validation at construction, immutability, equality, pruning types."""

from __future__ import annotations

import dataclasses
import math

from fractions import Fraction
import pytest
import torch
import torch.nn.utils.prune as tprune

import funcprune as fp

AMOUNT_SPECS = [
    lambda a: fp.RandomUnstructured(a),
    lambda a: fp.L1Unstructured(a),
    lambda a: fp.RandomStructured(a, dim=0),
    lambda a: fp.LnStructured(a, n=2),
]


@pytest.mark.parametrize("make", AMOUNT_SPECS)
@pytest.mark.parametrize("amount", [-1, -0.1, 1.01, 2.5, float("inf")])
def test_amount_out_of_range_is_a_value_error_like_torch(make: object, amount: float) -> None:
    with pytest.raises(ValueError) as ours:
        make(amount)  # type: ignore[operator]
    with pytest.raises(ValueError) as theirs:
        tprune.L1Unstructured(amount)
    name = str(ours.value).split(":")[0]
    assert str(ours.value) == f"{name}: {theirs.value}"  # torch's text, after the spec's name
    assert name in {"L1Unstructured", "RandomUnstructured", "LnStructured", "RandomStructured"}
    assert f"amount={amount}" in str(ours.value)


@pytest.mark.parametrize("make", AMOUNT_SPECS)
@pytest.mark.parametrize("amount", ["0.3", None, torch.tensor(0.3), [1]])
def test_amount_of_wrong_type_is_a_type_error_like_torch(make: object, amount: object) -> None:
    with pytest.raises(TypeError, match="Invalid type for amount"):
        make(amount)  # type: ignore[operator]
    with pytest.raises(TypeError):
        tprune.L1Unstructured(amount)  # type: ignore[arg-type]  # deliberately wrong


@pytest.mark.parametrize("amount", [0, 3, 0.0, 0.5, 1.0, Fraction(1, 4)])
def test_valid_amounts_are_accepted_like_torch(amount: float) -> None:
    tprune.L1Unstructured(amount)
    assert fp.L1Unstructured(amount).amount == amount


@pytest.mark.parametrize("n", [1, 2, 0, -1, 0.5, math.inf, -math.inf, "fro", "nuc"])
def test_valid_norm_orders(n: float | str) -> None:
    assert fp.LnStructured(0.5, n=n).n == n


@pytest.mark.parametrize(("n", "error"), [("l2", ValueError), (math.nan, ValueError), (None, TypeError), (True, TypeError), ([2], TypeError)])
def test_invalid_norm_orders(n: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"n"):
        fp.LnStructured(0.5, n=n)  # type: ignore[arg-type]


@pytest.mark.parametrize("dim", [1.0, "0", None, True])
def test_dim_must_be_an_int(dim: object) -> None:
    with pytest.raises(TypeError, match=r"dim must be an int"):
        fp.RandomStructured(0.5, dim=dim)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"dim must be an int"):
        fp.LnStructured(0.5, 2, dim=dim)  # type: ignore[arg-type]


def test_specs_are_frozen_and_replaceable() -> None:
    spec = fp.LnStructured(0.5, n=2, dim=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.amount = 0.7  # type: ignore[misc]
    other = dataclasses.replace(spec, amount=0.7)
    assert other == fp.LnStructured(0.7, n=2, dim=0) and spec.amount == 0.5
    with pytest.raises(ValueError):
        dataclasses.replace(spec, amount=7.0)


@pytest.mark.parametrize("make", AMOUNT_SPECS)
def test_bool_and_nan_amounts_are_refused(make: object) -> None:
    with pytest.raises(TypeError, match=r"amount must be an int count or a float fraction, got the bool True"):
        make(True)  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"amount=nan"):
        make(math.nan)  # type: ignore[operator]


@pytest.mark.parametrize("make", AMOUNT_SPECS)
def test_a_count_and_a_fraction_are_different_specs(make: object) -> None:
    count, fraction = make(1), make(1.0)  # type: ignore[operator]
    assert count != fraction and hash(count) != hash(fraction)
    assert len({count, fraction, make(1)}) == 2  # type: ignore[operator]
    assert fp.chain(count) != fp.chain(fraction)


def test_equality_and_hashing() -> None:
    assert fp.L1Unstructured(0.5) == fp.L1Unstructured(0.5)
    assert fp.L1Unstructured(0.5) != fp.RandomUnstructured(0.5)  # type: ignore[comparison-overlap]
    assert len({fp.L1Unstructured(1), fp.L1Unstructured(1), fp.Identity()}) == 2
    mask = torch.ones(3)
    assert fp.CustomFromMask(mask) == fp.CustomFromMask(mask.bool())  # by the mask's values
    assert hash(fp.CustomFromMask(mask)) == hash(fp.CustomFromMask(mask.clone()))
    assert fp.CustomFromMask(mask) != fp.CustomFromMask(torch.tensor([1, 0, 1]))
    assert fp.CustomFromMask(mask) != fp.CustomFromMask(torch.ones(1, 3))
    assert fp.chain(fp.Identity()) == fp.chain(fp.Identity())


def test_pruning_types() -> None:
    assert fp.Identity().pruning_type == "unstructured"
    assert fp.RandomUnstructured(1).pruning_type == tprune.RandomUnstructured.PRUNING_TYPE
    assert fp.L1Unstructured(1).pruning_type == tprune.L1Unstructured.PRUNING_TYPE
    assert fp.RandomStructured(1).pruning_type == tprune.RandomStructured.PRUNING_TYPE
    assert fp.LnStructured(1, 2).pruning_type == tprune.LnStructured.PRUNING_TYPE
    assert fp.CustomFromMask(torch.ones(2)).pruning_type == tprune.CustomFromMask.PRUNING_TYPE


def test_defaults_follow_torch() -> None:
    assert fp.RandomStructured(0.5).dim == -1
    assert fp.LnStructured(0.5, 2).dim == -1


def test_custom_mask_is_a_private_bool_copy() -> None:
    source = torch.tensor([1.0, 0.0, 1.0])
    spec = fp.CustomFromMask(source)
    source[0] = 0.0
    assert spec.mask.tolist() == [True, False, True]
    assert spec.mask.dtype == torch.bool
    assert repr(spec) == "CustomFromMask(mask=<(3,) bool>)"


@pytest.mark.parametrize("bad", [torch.tensor([0.0, 0.5]), torch.tensor([2, 1]), torch.tensor([-1.0])])
def test_custom_mask_values_must_be_binary(bad: torch.Tensor) -> None:
    with pytest.raises(ValueError, match=r"mask must hold only 0 and 1, got other values such as"):
        fp.CustomFromMask(bad)


def test_custom_mask_must_be_a_tensor() -> None:
    with pytest.raises(TypeError, match=r"mask must be a torch.Tensor of 0/1 values, got list"):
        fp.CustomFromMask([1, 0])  # type: ignore[arg-type]
