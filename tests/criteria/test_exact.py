"""Sums of float64 terms whose bits depend neither on the order nor on the grouping (funcprune._criteria._exact).

The collect engine sums the statistics of ``float64`` inputs in an
``ExactSum``, so that ``fp.oneshot(..., group=)`` over several processes
gives the bits of one process over every batch. Checked here:

- the bits do not depend on the order of the terms, nor on how they are
  split into groups summed apart and then added (two processes' bins,
  moved to the same tops), including terms of very different sizes, zeros,
  and entries of unrelated sizes side by side;
- the value is within ``n * 2**-52`` of the largest term (plus one rounding
  of the result, and the digits under ``2**-988``, which are dropped) of
  the exact sum (``math.fsum``), and equal to it where
  every partial sum is exact (integers);
- infinite and NaN terms give what a plain sum gives;
- ``fp.hessians`` and ``fp.input_norms`` on ``float64`` inputs give the
  same bits whatever the order of the batches, where a running sum does
  not.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import funcprune as fp
from funcprune._criteria._exact import ExactSum, fold

Tensor = torch.Tensor

#: Terms: each entry a float64 of any sign and size from 2**-900 to 2**900, or zero.
VALUE = st.one_of(st.just(0.0), st.builds(lambda m, e: math.ldexp(m, e), st.floats(-1.0, 1.0), st.integers(-900, 900)))


def terms_of(draw: st.DrawFn, count: int, width: int) -> list[Tensor]:
    return [torch.tensor(draw(st.lists(VALUE, min_size=width, max_size=width)), dtype=torch.float64)
            for _ in range(count)]  # fmt: skip


def summed(terms: list[Tensor], shape: tuple[int, ...]) -> ExactSum:
    out = ExactSum(shape, torch.device("cpu"))
    for t in terms:
        out.add(t)
    return out


def grouped(groups: list[list[Tensor]], shape: tuple[int, ...]) -> Tensor:
    """The groups summed apart, moved to their highest tops, and their bins added (as ``_across`` does)."""
    sums = [summed(g, shape) for g in groups]
    top = torch.stack([s.top for s in sums]).amax(0)
    for s in sums:
        s.move_to(top)
    bins = sums[0].bins.clone()
    for s in sums[1:]:
        bins += s.bins
    return fold(bins)


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[Tensor], list[int], list[int]]:
    width = draw(st.integers(1, 6))
    terms = terms_of(draw, draw(st.integers(1, 10)), width)
    order = draw(st.permutations(range(len(terms))))
    cuts = sorted(draw(st.lists(st.integers(0, len(terms)), max_size=3)))
    return terms, list(order), cuts


@settings(deadline=None)
@given(cases())
def test_the_bits_depend_neither_on_the_order_nor_on_the_grouping(case: tuple[list[Tensor], list[int], list[int]]) -> None:
    terms, order, cuts = case
    shape = tuple(terms[0].shape)
    reference = summed(terms, shape).value()
    shuffled = [terms[i] for i in order]
    assert torch.equal(summed(shuffled, shape).value(), reference)
    bounds = [0, *cuts, len(terms)]
    groups = [shuffled[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert torch.equal(grouped(groups, shape), reference)


@settings(deadline=None)
@given(cases())
def test_the_value_is_the_exact_sum_within_a_rounding_per_term_of_the_largest(
    case: tuple[list[Tensor], list[int], list[int]],
) -> None:
    terms = case[0]
    got = summed(terms, tuple(terms[0].shape)).value()
    for i in range(got.numel()):
        values = [float(t[i]) for t in terms]
        exact = math.fsum(values)
        largest = max(abs(v) for v in values)
        bound = len(values) * (2.0**-52 * largest + 2.0**-988) + 2.0**-52 * abs(exact)  # (digits below 2**-988 drop)
        assert abs(float(got[i]) - exact) <= bound, (values, got[i])


def test_integer_terms_sum_exactly() -> None:
    g = torch.Generator().manual_seed(0)
    terms = [torch.randint(-(2**40), 2**40, (64,), generator=g).to(torch.float64) for _ in range(50)]
    got = summed(terms, (64,)).value()
    assert torch.equal(got, torch.stack(terms).sum(0))  # every partial sum below 2**53: exact both ways


def test_a_running_sum_depends_on_the_order_where_this_does_not() -> None:
    """The point of it: 1 + 2**-53 + 2**-53 is 1 one way and 1 + 2**-52 the other; the exact sum is one of them
    both ways (its lowest bin, 2**-52, rounds each 2**-53 to even: 0)."""
    terms = [torch.tensor([1.0], dtype=torch.float64), torch.tensor([2.0**-53], dtype=torch.float64),
             torch.tensor([2.0**-53], dtype=torch.float64)]  # fmt: skip
    assert (terms[0] + terms[1]) + terms[2] != terms[0] + (terms[1] + terms[2])
    forward, backward = summed(terms, (1,)).value(), summed(terms[::-1], (1,)).value()
    assert torch.equal(forward, backward) and float(forward[0]) == 1.0


def test_entries_of_unrelated_sizes_keep_their_own_precision() -> None:
    big, small = 2.0**800, 2.0**-800
    terms = [torch.tensor([big, small * 3], dtype=torch.float64), torch.tensor([-big, small], dtype=torch.float64)]
    assert summed(terms, (2,)).value().tolist() == [0.0, small * 4]


@pytest.mark.parametrize(("values", "expected"), [
    ([1.0, math.inf, 2.0], math.inf), ([math.inf, -math.inf], math.nan), ([1.0, math.nan], math.nan),
    ([-math.inf, 5.0], -math.inf),
])  # fmt: skip
def test_infinite_and_nan_terms_give_what_a_plain_sum_gives(values: list[float], expected: float) -> None:
    for order in (values, values[::-1]):
        got = float(summed([torch.tensor([v], dtype=torch.float64) for v in order], (1,)).value()[0])
        assert got == expected or (math.isnan(got) and math.isnan(expected)), (order, got)


def test_slices_add_apart() -> None:
    out = ExactSum((3, 2), torch.device("cpu"))
    out.add_at(1, torch.tensor([1.0, 2.0**-60], dtype=torch.float64))
    out.add_at(1, torch.tensor([2.0**40, 1.0], dtype=torch.float64))
    out.add_at(0, torch.tensor([-1.0, 0.0], dtype=torch.float64))
    assert out.value().tolist() == [[-1.0, 0.0], [2.0**40 + 1.0, 1.0 + 2.0**-60], [0.0, 0.0]]


def test_a_term_of_another_dtype_or_shape_is_refused() -> None:
    out = ExactSum((2,), torch.device("cpu"))
    with pytest.raises(ValueError, match=r"ExactSum: a term must be float64 of shape \(2,\), got torch.float32"):
        out.add(torch.zeros(2))
    with pytest.raises(ValueError, match=r"got torch.float64 of shape \(3,\)"):
        out.add(torch.zeros(3, dtype=torch.float64))


def test_hessians_and_input_norms_of_float64_inputs_do_not_depend_on_the_order_of_the_batches() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 16), nn.ReLU(), nn.Linear(16, 8)).double()
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(5, 24, generator=g, dtype=torch.float64) * 10.0 ** (i % 5) for i in range(12)]
    shuffled = batches[:]
    random.Random(3).shuffle(shuffled)
    names = ["0.weight", "2.weight"]
    for collect in (fp.hessians, fp.input_norms):
        one, two = collect(model, batches, names), collect(model, shuffled, names)
        for n in names:
            assert one[n].dtype == torch.float64 and torch.equal(one[n], two[n]), (collect.__name__, n)
    plain = [sum((b.T @ b for b in order), torch.zeros(24, 24, dtype=torch.float64)) for order in (batches, shuffled)]
    assert not torch.equal(plain[0], plain[1])  # a running sum of these batches does depend on it
    largest = torch.stack([(b.T @ b).abs() for b in batches]).amax(0)  # each entry's largest term
    error = (fp.hessians(model, batches, ["0.weight"])["0.weight"] - plain[0]).abs()
    assert bool((error <= 2 * len(batches) * 2.0**-52 * largest).all())  # both within a rounding per term of it
