"""Schedules: the formulas, monotonicity, start and end values, validation."""

from __future__ import annotations

import dataclasses
import inspect
import math
import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import funcprune as fp

SPARSITY = st.floats(0.0, 1.0)
STEP = st.integers(0, 10**6)
POWER = st.one_of(st.integers(1, 6), st.floats(0.01, 20.0))


@st.composite
def polynomials(draw: st.DrawFn) -> fp.Polynomial:
    a, b = draw(SPARSITY), draw(SPARSITY)
    begin = draw(st.integers(0, 1000))
    end = begin + draw(st.integers(1, 1000))
    return fp.Polynomial(max(a, b), begin, end, initial=min(a, b), power=draw(POWER))


@st.composite
def iteratives(draw: st.DrawFn) -> fp.Iterative:
    return fp.Iterative(
        draw(SPARSITY), draw(st.integers(1, 50)), draw(st.integers(1, 100)), begin=draw(st.integers(0, 1000))
    )


one_shots = st.builds(fp.OneShot, SPARSITY, STEP)
schedules = st.one_of(one_shots, polynomials(), iteratives())


def polynomial_formula(s: fp.Polynomial, t: int) -> float:
    """Zhu & Gupta's formula, as the paper writes it."""
    t = min(max(t, s.begin), s.end)
    return float(s.final + (s.initial - s.final) * (1 - (t - s.begin) / (s.end - s.begin)) ** s.power)


def iterative_formula(s: fp.Iterative, t: int) -> float:
    r = min(max((t - s.begin) // s.every, 0), s.rounds)
    return float(1 - (1 - s.final) ** (r / s.rounds))


@given(schedules, STEP, STEP)
def test_schedules_are_monotone_floats_in_0_1(schedule: fp.Schedule, t1: int, t2: int) -> None:
    t1, t2 = sorted((t1, t2))
    a, b = schedule(t1), schedule(t2)
    assert type(a) is float and type(b) is float
    assert 0.0 <= a <= b <= 1.0


@given(st.one_of(polynomials(), iteratives()))
def test_monotone_at_every_step_of_the_ramp(schedule: fp.Polynomial | fp.Iterative) -> None:
    last = schedule.end if isinstance(schedule, fp.Polynomial) else schedule.steps[-1]
    values = [schedule(t) for t in range(last + 2)]
    assert values == sorted(values)


@given(SPARSITY, STEP, STEP)
def test_one_shot(sparsity: float, step: int, t: int) -> None:
    schedule = fp.OneShot(sparsity, step)
    assert schedule(t) == (sparsity if t >= step else 0.0)
    assert schedule(step) == sparsity and schedule.steps == (step,)
    if step:
        assert schedule(step - 1) == 0.0


@given(polynomials(), STEP)
def test_polynomial_matches_the_formula(schedule: fp.Polynomial, t: int) -> None:
    t = t % (schedule.end + 100)
    assert math.isclose(schedule(t), polynomial_formula(schedule, t), rel_tol=1e-12, abs_tol=1e-12)


@given(polynomials())
def test_polynomial_starts_and_ends_exactly(schedule: fp.Polynomial) -> None:
    for t in range(schedule.begin + 1):
        assert schedule(t) == schedule.initial
    assert schedule(schedule.end) == schedule(schedule.end + 10**6) == schedule.final
    if schedule.final - schedule.initial > 1e-6:  # the ramp starts at once
        assert schedule(schedule.begin + 1) > schedule.initial


@given(iteratives(), STEP)
def test_iterative_matches_the_formula(schedule: fp.Iterative, t: int) -> None:
    assert math.isclose(schedule(t), iterative_formula(schedule, t), rel_tol=1e-12, abs_tol=1e-12)


@given(iteratives())
def test_iterative_changes_only_at_its_rounds(schedule: fp.Iterative) -> None:
    steps = schedule.steps
    assert steps == tuple(schedule.begin + r * schedule.every for r in range(1, schedule.rounds + 1))
    assert schedule(steps[0] - 1) == 0.0 and schedule(steps[-1]) == schedule.final
    for t in range(1, steps[-1] + 2):
        if t not in steps:
            assert schedule(t) == schedule(t - 1)
        elif 0.01 <= schedule.final <= 0.99:  # (at 1.0 the first round prunes everything)
            assert schedule(t) > schedule(t - 1)


@given(st.floats(0.0, 0.999), st.integers(1, 30), st.integers(1, 10))
def test_iterative_rounds_prune_the_same_fraction_of_what_remains(
    final: float, rounds: int, every: int
) -> None:
    schedule = fp.Iterative(final, rounds, every)
    kept = [1.0 - schedule(t) for t in (0, *schedule.steps)]
    ratios = [after / before for before, after in zip(kept, kept[1:])]
    for ratio in ratios:
        assert math.isclose(ratio, (1.0 - final) ** (1 / rounds), rel_tol=1e-9)


def test_known_values() -> None:
    assert [fp.Iterative(0.875, 3, 10)(t) for t in (9, 10, 20, 30)] == [0.0, 0.5, 0.75, 0.875]
    assert fp.Iterative(0.36, 2, 5, begin=3)(8) == pytest.approx(0.2)  # keeps 80%, then 80% of it
    zhu_gupta = fp.Polynomial(0.9, 0, 100, initial=0.1)
    assert zhu_gupta(50) == pytest.approx(0.9 - 0.8 * 0.5**3)
    assert fp.Polynomial(0.5, 10, 20, power=1)(15) == pytest.approx(0.25)
    assert fp.OneShot(1, 0)(0) == 1.0 and type(fp.OneShot(1, 0)(0)) is float


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: fp.OneShot(1.5, 0), ValueError, "OneShot: sparsity must be a float in [0, 1], got 1.5"),
        (lambda: fp.OneShot(-0.1, 0), ValueError, "OneShot: sparsity must be a float in [0, 1], got -0.1"),
        (lambda: fp.OneShot(math.nan, 0), ValueError, "OneShot: sparsity must be a float in [0, 1], got nan"),
        (lambda: fp.OneShot(True, 0), TypeError, "OneShot: sparsity must be a float in [0, 1], got the bool True"),
        (lambda: fp.OneShot("0.5", 0), TypeError, "OneShot: sparsity must be a float in [0, 1], got '0.5' of type str"),  # type: ignore[arg-type]
        (lambda: fp.OneShot(0.5, -1), ValueError, "OneShot: step must be an int >= 0, got -1"),
        (lambda: fp.OneShot(0.5, 2.0), TypeError, "OneShot: step must be an int >= 0, got 2.0 of type float"),  # type: ignore[arg-type]
        (lambda: fp.Polynomial(1.5, 0, 10), ValueError, "Polynomial: final must be a float in [0, 1], got 1.5"),
        (lambda: fp.Polynomial(0.5, 0, 10, initial=2), ValueError, "Polynomial: initial must be a float in [0, 1], got 2"),
        (lambda: fp.Polynomial(0.5, 0, 10, initial=0.6), ValueError, "Polynomial: initial must be at most final, got initial=0.6 and final=0.5"),
        (lambda: fp.Polynomial(0.5, -1, 10), ValueError, "Polynomial: begin must be an int >= 0, got -1"),
        (lambda: fp.Polynomial(0.5, 10, 10), ValueError, "Polynomial: end must be greater than begin, got begin=10 and end=10"),
        (lambda: fp.Polynomial(0.5, 0, False), TypeError, "Polynomial: end must be an int >= 0, got the bool False"),
        (lambda: fp.Polynomial(0.5, 0, 10, power=0), ValueError, "Polynomial: power must be a finite real number > 0, got 0"),
        (lambda: fp.Polynomial(0.5, 0, 10, power=-2.0), ValueError, "Polynomial: power must be a finite real number > 0, got -2.0"),
        (lambda: fp.Polynomial(0.5, 0, 10, power=math.inf), ValueError, "Polynomial: power must be a finite real number > 0, got inf"),
        (lambda: fp.Polynomial(0.5, 0, 10, power=True), TypeError, "Polynomial: power must be a real number > 0, got True"),
        (lambda: fp.Polynomial(0.5, 0, 10, power="3"), TypeError, "Polynomial: power must be a real number > 0, got '3'"),  # type: ignore[arg-type]
        (lambda: fp.Iterative(1.01, 3, 10), ValueError, "Iterative: final must be a float in [0, 1], got 1.01"),
        (lambda: fp.Iterative(0.5, 0, 10), ValueError, "Iterative: rounds must be an int >= 1, got 0"),
        (lambda: fp.Iterative(0.5, 3, 0), ValueError, "Iterative: every must be an int >= 1, got 0"),
        (lambda: fp.Iterative(0.5, 3, 10, begin=-5), ValueError, "Iterative: begin must be an int >= 0, got -5"),
        (lambda: fp.Iterative(0.5, 3.0, 10), TypeError, "Iterative: rounds must be an int >= 1, got 3.0 of type float"),  # type: ignore[arg-type]
    ],
)  # fmt: skip
def test_invalid_arguments(make: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        make()  # type: ignore[operator]


@pytest.mark.parametrize(
    "schedule", [fp.OneShot(0.5, 3), fp.Polynomial(0.5, 0, 10), fp.Iterative(0.5, 2, 5)], ids=repr
)
@pytest.mark.parametrize(
    ("step", "error", "shown"),
    [(-1, ValueError, "-1"), (1.0, TypeError, "1.0 of type float"), (True, TypeError, "the bool True"),
     ("3", TypeError, "'3' of type str")],
)  # fmt: skip
def test_invalid_steps(schedule: fp.Schedule, step: object, error: type[Exception], shown: str) -> None:
    expected = f"{type(schedule).__name__}: step must be an int >= 0, got {shown}"
    with pytest.raises(error, match=f"^{re.escape(expected)}$"):
        schedule(step)  # type: ignore[arg-type]


def plain_signature(cls: type) -> str:
    """The parameters' names, defaults and kinds, without annotations."""
    signature = inspect.signature(cls)
    parameters = [p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()]
    return str(signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty))


def test_keyword_only_arguments_and_signatures() -> None:
    assert plain_signature(fp.OneShot) == "(sparsity, step)"
    assert plain_signature(fp.Polynomial) == "(final, begin, end, *, initial=0.0, power=3)"
    assert plain_signature(fp.Iterative) == "(final, rounds, every, *, begin=0)"
    with pytest.raises(TypeError):
        fp.Polynomial(0.5, 0, 10, 0.1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        fp.Iterative(0.5, 2, 5, 1)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "schedule",
    [fp.OneShot(0.5, 3), fp.Polynomial(0.5, 0, 10, initial=0.1, power=2.5), fp.Iterative(0.5, 2, 5, begin=1)],
    ids=repr,
)
def test_frozen_and_repr_reads_like_the_constructor(schedule: fp.Schedule) -> None:
    assert isinstance(schedule, fp.Schedule)
    assert eval(repr(schedule), vars(fp)) == schedule  # noqa: S307 - our own repr
    field = dataclasses.fields(schedule)[0].name  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(schedule, field, 0.0)
    assert dataclasses.replace(schedule) == schedule  # type: ignore[type-var]


def test_numbers_are_stored_as_python_floats_and_ints() -> None:
    schedule = fp.Polynomial(1, 0, 10)
    assert type(schedule.final) is float and type(schedule.initial) is float
    assert schedule(10) == 1.0 and type(schedule(10)) is float and type(schedule(0)) is float
    assert fp.OneShot(0, 2) == fp.OneShot(0.0, 2)


def test_schedule_is_abstract_and_subclassable() -> None:
    with pytest.raises(TypeError):
        fp.Schedule()  # type: ignore[abstract]

    @dataclasses.dataclass(frozen=True)
    class Constant(fp.Schedule):
        sparsity: float

        def __call__(self, step: int) -> float:
            return self.sparsity

    assert Constant(0.3)(7) == 0.3


@given(polynomials())
def test_polynomial_with_power_one_is_linear(schedule: fp.Polynomial) -> None:
    linear = dataclasses.replace(schedule, power=1)
    assume(linear.end - linear.begin >= 2)
    middle = (linear.begin + linear.end) // 2
    fraction = (middle - linear.begin) / (linear.end - linear.begin)
    expected = linear.initial + (linear.final - linear.initial) * fraction
    assert math.isclose(linear(middle), expected, rel_tol=1e-12, abs_tol=1e-12)
