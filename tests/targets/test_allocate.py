"""Allocations: uniform and ERK sparsities, their totals, the ERK formula, errors."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import funcprune as fp

SHAPE = st.lists(st.integers(1, 40), min_size=0, max_size=4).map(tuple)
SHAPES = st.lists(SHAPE, min_size=1, max_size=8)
SPARSITY = st.floats(0.0, 1.0, allow_subnormal=False)
POWER = st.one_of(st.just(1.0), st.floats(0.0, 3.0))


def meta_params(shapes: list[tuple[int, ...]]) -> dict[str, torch.Tensor]:
    return {f"t{i}": torch.empty(shape, device="meta") for i, shape in enumerate(shapes)}


def numel(t: torch.Tensor) -> int:
    return math.prod(t.shape)


def total(params: dict[str, torch.Tensor], allocation: dict[str, float]) -> float:
    return math.fsum(s * numel(params[n]) for n, s in allocation.items()) / sum(map(numel, params.values()))


def raw(shape: tuple[int, ...] | torch.Size, power: float) -> float:
    """The ERK score, straight from the paper's formula (a 0-d tensor as (1,))."""
    shape = tuple(shape) or (1,)
    return float((sum(shape) / math.prod(shape)) ** power)


def rigl_reference(
    params: dict[str, torch.Tensor], sparsity: float, power: float, dense: set[str]
) -> dict[str, float]:
    """RigL's loop (sparse_utils.get_sparsities_erdos_renyi): one tensor at a time, plain floats."""
    dense_layers = set(dense)
    while True:
        divisor = rhs = 0.0
        probabilities = {}
        for name, t in params.items():
            n = numel(t)
            if name in dense_layers:
                rhs -= n * sparsity
            else:
                rhs += n * (1 - sparsity)
                probabilities[name] = raw(t.shape, power)
                divisor += probabilities[name] * n
        if not probabilities:
            return {name: 0.0 for name in params}
        eps = rhs / divisor
        top = max(probabilities.values())
        if top * eps > 1:
            dense_layers |= {name for name, p in probabilities.items() if p == top}
        else:
            return {name: 0.0 if name in dense_layers else 1 - eps * probabilities[name] for name in params}


@given(SHAPES, SPARSITY, POWER)
def test_erk_total_is_the_target_and_each_sparsity_in_0_1(
    shapes: list[tuple[int, ...]], sparsity: float, power: float
) -> None:
    params = meta_params(shapes)
    allocation = fp.erk_sparsity(params, sparsity, power=power)
    assert list(allocation) == list(params)
    assert all(type(s) is float and 0.0 <= s <= 1.0 for s in allocation.values())
    assert math.isclose(total(params, allocation), sparsity, rel_tol=1e-9, abs_tol=1e-300)


@given(SHAPES, SPARSITY, POWER)
def test_erk_densities_are_min_of_1_and_eps_times_the_score(
    shapes: list[tuple[int, ...]], sparsity: float, power: float
) -> None:
    """Water filling: density_i = min(1, eps * raw_i) for one eps; the dense ones would exceed 1."""
    params = meta_params(shapes)
    allocation = fp.erk_sparsity(params, sparsity, power=power)
    density = {n: 1.0 - s for n, s in allocation.items()}
    sparse = [n for n, s in allocation.items() if s > 0.0]
    if not sparse:
        assert sparsity == 0.0 or all(numel(t) == 0 for t in params.values())
        return
    best = max(sparse, key=lambda n: density[n])  # the most accurate 1 - s
    eps = density[best] / raw(params[best].shape, power)
    for name, t in params.items():
        expected = min(1.0, eps * raw(t.shape, power)) if numel(t) else 1.0
        assert math.isclose(density[name], expected, rel_tol=1e-9, abs_tol=1e-12), name
    for i in sparse:  # the ratio of densities is the ratio of scores
        for j in sparse:
            if density[i] > 1e-3 and density[j] > 1e-3:
                ratio = raw(params[i].shape, power) / raw(params[j].shape, power)
                assert math.isclose(density[i] / density[j], ratio, rel_tol=1e-6)


@given(SHAPES, SPARSITY, POWER, st.data())
def test_erk_dense_names_stay_dense_and_the_others_make_up(
    shapes: list[tuple[int, ...]], fraction: float, power: float, data: st.DataObject
) -> None:
    params = meta_params(shapes)
    dense = set(data.draw(st.lists(st.sampled_from(list(params)), unique=True)))
    all_entries = sum(map(numel, params.values()))
    prunable = sum(numel(t) for n, t in params.items() if n not in dense)
    assume(all_entries > 0)
    sparsity = fraction * prunable / all_entries  # reachable
    allocation = fp.erk_sparsity(params, sparsity, power=power, dense=sorted(dense))
    assert all(allocation[n] == 0.0 for n in dense)
    assert all(0.0 <= s <= 1.0 for s in allocation.values())
    assert math.isclose(total(params, allocation), sparsity, rel_tol=1e-9, abs_tol=1e-300)
    reference = rigl_reference(params, sparsity, power, dense)
    for name in params:
        assert math.isclose(allocation[name], reference[name], rel_tol=1e-9, abs_tol=1e-9), name


@given(SHAPES, SPARSITY)
def test_erk_with_power_0_is_uniform(shapes: list[tuple[int, ...]], sparsity: float) -> None:
    params = meta_params(shapes)
    assume(all(numel(t) for t in params.values()))
    assert fp.erk_sparsity(params, sparsity, power=0) == fp.uniform_sparsity(params, sparsity)


@given(SHAPES, SPARSITY)
def test_uniform_is_uniform(shapes: list[tuple[int, ...]], sparsity: float) -> None:
    params = meta_params(shapes)
    allocation = fp.uniform_sparsity(params, sparsity)
    assert list(allocation) == list(params) and set(allocation.values()) == {sparsity}
    if any(numel(t) for t in params.values()):
        assert math.isclose(total(params, allocation), sparsity, rel_tol=1e-9)


def test_erk_known_values() -> None:
    """A conv and a linear layer with biases, by hand: the biases score 1 and stay dense."""
    params = {
        "conv.weight": torch.empty(16, 3, 3, 3), "conv.bias": torch.empty(16),
        "fc.weight": torch.empty(10, 64, device="meta"), "fc.bias": torch.empty(10),
    }  # fmt: skip
    allocation = fp.erk_sparsity(params, 0.5)
    assert allocation["conv.bias"] == allocation["fc.bias"] == 0.0
    # eps * (25/432 * 432 + 74/640 * 640) = 0.5 * 1098 - 26 dense entries
    eps = (0.5 * 1098 - 26) / (25 + 74)
    assert allocation["conv.weight"] == pytest.approx(1 - eps * 25 / 432)
    assert allocation["fc.weight"] == pytest.approx(1 - eps * 74 / 640)


def test_erk_small_tensors_are_kept_dense_first() -> None:
    params = {"big": torch.empty(100, 100, device="meta"), "small": torch.empty(2, 3, device="meta")}
    allocation = fp.erk_sparsity(params, 0.5)
    assert allocation["small"] == 0.0  # 5/6 vs 0.02: it would exceed density 1
    assert allocation["big"] == pytest.approx(0.5 * 10006 / 10000)


def test_erk_scalars_and_empty_tensors() -> None:
    params = {"w": torch.empty(8, 8), "scalar": torch.empty(()), "empty": torch.empty(0, 5)}
    allocation = fp.erk_sparsity(params, 0.5)
    assert allocation["scalar"] == 0.0  # a (1,) tensor scores 1: dense
    assert allocation["empty"] == 0.0  # nothing to prune
    assert allocation["w"] == pytest.approx(0.5 * 65 / 64)
    assert fp.erk_sparsity({"empty": torch.empty(0)}, 0.0) == {"empty": 0.0}
    assert fp.erk_sparsity({}, 0.0) == {} and fp.uniform_sparsity({}, 0.5) == {}


@pytest.mark.parametrize("power", [50.0, 500.0])
def test_erk_large_powers_neither_overflow_nor_underflow(power: float) -> None:
    params = meta_params([(1, 1), (2, 3), (64, 64, 3, 3), (1000, 1000)])
    allocation = fp.erk_sparsity(params, 0.6, power=power)
    assert allocation["t0"] == allocation["t1"] == allocation["t2"] == 0.0  # scores 1e13 times t3's, or more
    assert allocation["t3"] == pytest.approx(0.6 * (1 + 6 + 36864 + 10**6) / 10**6)
    assert math.isclose(total(params, allocation), 0.6, rel_tol=1e-9)


def test_erk_full_and_zero_sparsity() -> None:
    params = meta_params([(4, 5), (7,), (3, 3, 2, 2)])
    assert set(fp.erk_sparsity(params, 1.0).values()) == {1.0}
    assert set(fp.erk_sparsity(params, 0.0).values()) == {0.0}


def test_erk_reaches_exactly_the_most_there_is() -> None:
    params = {"a": torch.empty(10, 10), "b": torch.empty(30)}
    allocation = fp.erk_sparsity(params, 100 / 130, dense=["b"])
    assert allocation == {"a": 1.0, "b": 0.0}


@pytest.mark.parametrize(
    ("params", "sparsity", "dense", "message"),
    [
        ({"a": torch.empty(10, 10), "b": torch.empty(30)}, 0.9, ["b"],
         "erk_sparsity: sparsity=0.9 cannot be reached: with 30 of the 130 entries kept dense, "
         "at most 0.7692307692307693 can be pruned"),
        ({"a": torch.empty(10, 10), "b": torch.empty(30)}, 0.1, ["*"],
         "erk_sparsity: sparsity=0.1 cannot be reached: with 130 of the 130 entries kept dense, "
         "at most 0.0 can be pruned"),
        ({"empty": torch.empty(0, 3)}, 0.5, [],
         "erk_sparsity: sparsity=0.5 cannot be reached: params has no entries, at most 0.0 can be pruned"),
        ({}, 1.0, [],
         "erk_sparsity: sparsity=1.0 cannot be reached: params has no entries, at most 0.0 can be pruned"),
    ],
)  # fmt: skip
def test_erk_unreachable_targets(
    params: dict[str, torch.Tensor], sparsity: float, dense: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        fp.erk_sparsity(params, sparsity, dense=dense)


def test_erk_unknown_dense_names_suggest_close_ones() -> None:
    params = {"fc1.weight": torch.empty(3, 4), "fc1.bias": torch.empty(3)}
    expected = "erk_sparsity: dense name 'fc1.wieght' matches no parameter; did you mean 'fc1.weight'"
    with pytest.raises(fp.UnknownNameError, match=re.escape(expected)):
        fp.erk_sparsity(params, 0.5, dense=["fc1.wieght"])
    expected = "'conv*' matches no parameter; the parameters are 'fc1.weight', 'fc1.bias'"
    with pytest.raises(fp.UnknownNameError, match=re.escape(expected)):
        fp.erk_sparsity(params, 0.5, dense=["conv*"])
    assert fp.erk_sparsity(params, 0.5, dense=["*.bias"])["fc1.bias"] == 0.0


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda p: fp.erk_sparsity(p, 1.5), ValueError, "erk_sparsity: sparsity must be a float in [0, 1], got 1.5"),
        (lambda p: fp.erk_sparsity(p, True), TypeError, "erk_sparsity: sparsity must be a float in [0, 1], got the bool True"),
        (lambda p: fp.erk_sparsity(p, None), TypeError, "erk_sparsity: sparsity must be a float in [0, 1], got None of type NoneType"),  # type: ignore[arg-type]
        (lambda p: fp.uniform_sparsity(p, -0.5), ValueError, "uniform_sparsity: sparsity must be a float in [0, 1], got -0.5"),
        (lambda p: fp.uniform_sparsity(p, math.nan), ValueError, "uniform_sparsity: sparsity must be a float in [0, 1], got nan"),
        (lambda p: fp.erk_sparsity(p, 0.5, power=-1), ValueError, "erk_sparsity: power must be a finite real number >= 0, got -1"),
        (lambda p: fp.erk_sparsity(p, 0.5, power=math.nan), ValueError, "erk_sparsity: power must be a finite real number >= 0, got nan"),
        (lambda p: fp.erk_sparsity(p, 0.5, power="1"), TypeError, "erk_sparsity: power must be a real number >= 0, got '1'"),  # type: ignore[arg-type]
        (lambda p: fp.erk_sparsity(p, 0.5, dense="w"), TypeError, "erk_sparsity: dense must be a collection of names, got 'w'; write ('w',)"),
        (lambda p: fp.erk_sparsity(p, 0.5, dense=[1]), TypeError, "erk_sparsity: dense must hold names (str), got 1"),  # type: ignore[list-item]
        (lambda p: fp.erk_sparsity(p, 0.5, dense=3), TypeError, "erk_sparsity: dense must be a collection of names, got 3"),  # type: ignore[arg-type]
        (lambda p: fp.erk_sparsity(torch.nn.Linear(2, 2), 0.5), TypeError, "erk_sparsity: params must be a mapping of names to tensors, got a module; pass dict(module.named_parameters())"),  # type: ignore[arg-type]
        (lambda p: fp.uniform_sparsity([torch.empty(2)], 0.5), TypeError, "uniform_sparsity: params must be a mapping of names to tensors, got list"),  # type: ignore[arg-type]
        (lambda p: fp.erk_sparsity({"w": 3}, 0.5), TypeError, "erk_sparsity: params['w'] must be a tensor, got int"),  # type: ignore[dict-item]
    ],
)  # fmt: skip
def test_invalid_arguments(call: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        call({"w": torch.empty(4, 4)})  # type: ignore[operator]


def test_allocations_feed_a_plan() -> None:
    torch.manual_seed(0)
    params = {
        "conv.weight": torch.randn(8, 4, 3, 3), "fc.weight": torch.randn(10, 32), "fc.bias": torch.randn(10),
    }  # fmt: skip
    allocation = fp.erk_sparsity(params, 0.7)
    masks = fp.Plan({n: fp.L1Unstructured(s) for n, s in allocation.items()})(params)
    for name, mask in masks.items():
        assert int((~mask).sum()) == round(allocation[name] * mask.numel())
    one_entry = 1 / sum(t.numel() for t in params.values())
    assert fp.sparsity_report(masks).fraction == pytest.approx(0.7, abs=one_entry)


def test_inputs_untouched_and_only_shapes_read() -> None:
    params = {"w": torch.randn(6, 6), "m": torch.empty(6, 6, device="meta")}
    before = params["w"].clone()
    allocation = fp.erk_sparsity(params, 0.5)
    assert allocation["w"] == allocation["m"] == 0.5 and torch.equal(params["w"], before)
