"""Schedules: WHEN to prune and how much in total, as pure data.

A schedule is a frozen dataclass, callable as ``schedule(step) -> float``:
the cumulative target sparsity at a training step (``README.md``).
"""

from __future__ import annotations

import abc
import math
import numbers
from dataclasses import KW_ONLY, dataclass
from typing import final

from .._validate import check_count, check_sparsity

__all__ = ["Schedule", "OneShot", "Polynomial", "Iterative"]




class Schedule(abc.ABC):
    """Abstract base of the schedules: ``schedule(step) -> target sparsity``.

    A schedule maps a training step (an ``int`` >= 0) to the cumulative
    target sparsity in [0, 1] at that step: the fraction pruned after
    pruning at that step, earlier pruning included. It should be pure and
    non-decreasing in the step. To define one, subclass it as a frozen
    dataclass and implement ``__call__``:

    >>> import dataclasses, funcprune as fp
    >>> @dataclasses.dataclass(frozen=True)
    ... class Linear(fp.Schedule):
    ...     final: float
    ...     end: int
    ...     def __call__(self, step: int) -> float:
    ...         return self.final * min(step, self.end) / self.end
    >>> [Linear(0.5, 4)(t) for t in range(6)]
    [0.0, 0.125, 0.25, 0.375, 0.5, 0.5]
    """

    __slots__ = ()

    @abc.abstractmethod
    def __call__(self, step: int) -> float:
        """The target sparsity at ``step``, a float in [0, 1].

        Args:
            step: the training step, an ``int`` >= 0.

        Raises:
            TypeError: if ``step`` is not an ``int`` (or is a ``bool``).
            ValueError: if ``step`` is negative.
        """


@final
@dataclass(frozen=True, slots=True)
class OneShot(Schedule):
    """Prunes to ``sparsity`` at ``step`` in one go: 0.0 before, ``sparsity`` from then on.

    Args:
        sparsity: the target, a float in [0, 1].
        step: the step at which to prune, an ``int`` >= 0.

    Raises:
        TypeError: if ``sparsity`` is not a real number or ``step`` not an int.
        ValueError: if ``sparsity`` is outside [0, 1] or ``step`` negative.

    >>> schedule = OneShot(0.9, step=100)
    >>> schedule(99), schedule(100), schedule(10**6), schedule.steps
    (0.0, 0.9, 0.9, (100,))
    """

    sparsity: float
    step: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "sparsity", check_sparsity("OneShot", "sparsity", self.sparsity))
        object.__setattr__(self, "step", check_count("OneShot", "step", self.step, least=0))

    @property
    def steps(self) -> tuple[int, ...]:
        """The steps at which pruning happens: ``(step,)``."""
        return (self.step,)

    def __call__(self, step: int) -> float:
        step = check_count("OneShot", "step", step, least=0)
        return self.sparsity if step >= self.step else 0.0


@final
@dataclass(frozen=True, slots=True)
class Polynomial(Schedule):
    """Gradual magnitude pruning (Zhu & Gupta, 2017): a polynomial ramp.

    For ``begin <= t <= end`` the target is
    ``final + (initial - final) * (1 - (t - begin) / (end - begin)) ** power``:
    it rises quickly at first, while there are many redundant weights, and
    slowly near the end. Before ``begin`` it is ``initial``, from ``end`` on
    ``final`` (both exactly). It is non-decreasing in the step; the value is
    computed so that float rounding keeps it so.

    Args:
        final: the target reached at ``end``, a float in [0, 1].
        begin: the first step of the ramp, an ``int`` >= 0.
        end: the step at which ``final`` is reached, an ``int`` > ``begin``.
        initial: the target up to ``begin``, in [0, ``final``] (default 0.0).
        power: the exponent, a real number > 0 (default 3, the paper's).

    Raises:
        TypeError: if an argument has the wrong type (``bool`` included).
        ValueError: if a sparsity is outside [0, 1], ``initial > final``,
            ``begin`` is negative, ``end <= begin`` or ``power <= 0``.

    >>> schedule = Polynomial(0.8, begin=0, end=4)
    >>> [round(schedule(t), 4) for t in range(6)]
    [0.0, 0.4625, 0.7, 0.7875, 0.8, 0.8]
    >>> Polynomial(1.5, 0, 10)
    Traceback (most recent call last):
    ...
    ValueError: Polynomial: final must be a float in [0, 1], got 1.5
    """

    final: float
    begin: int
    end: int
    _: KW_ONLY
    initial: float = 0.0
    power: float = 3

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "final", check_sparsity("Polynomial", "final", self.final))
        set_(self, "initial", check_sparsity("Polynomial", "initial", self.initial))
        if self.initial > self.final:
            raise ValueError(
                f"Polynomial: initial must be at most final, got initial={self.initial!r} "
                f"and final={self.final!r}"
            )
        set_(self, "begin", check_count("Polynomial", "begin", self.begin, least=0))
        set_(self, "end", check_count("Polynomial", "end", self.end, least=0))
        if self.end <= self.begin:
            raise ValueError(
                f"Polynomial: end must be greater than begin, got begin={self.begin} and end={self.end}"
            )
        power = self.power
        if isinstance(power, bool) or not isinstance(power, numbers.Real):
            raise TypeError(f"Polynomial: power must be a real number > 0, got {power!r}")
        if not 0.0 < float(power) < math.inf:
            raise ValueError(f"Polynomial: power must be a finite real number > 0, got {power!r}")

    def __call__(self, step: int) -> float:
        step = check_count("Polynomial", "step", step, least=0)
        if step <= self.begin:
            return self.initial
        if step >= self.end:
            return self.final
        remaining = 1.0 - (step - self.begin) / (self.end - self.begin)
        # initial + (final - initial) * (1 - remaining ** power), the formula
        # rearranged: each float operation is monotone in the step, so the
        # rounded result is too; the clamp keeps it within [initial, final].
        ramp = 1.0 - float(remaining**self.power)
        return min(self.final, max(self.initial, self.initial + (self.final - self.initial) * ramp))


@final
@dataclass(frozen=True, slots=True)
class Iterative(Schedule):
    """Iterative magnitude pruning: ``rounds`` rounds, each pruning the same fraction of what remains.

    Round ``r`` (for ``r = 1 .. rounds``) happens at step
    ``begin + r * every``; from then on the target is
    ``1 - (1 - final) ** (r / rounds)``, so each round keeps the same
    fraction, ``(1 - final) ** (1 / rounds)``, of the weights the rounds
    before it kept (the lottery-ticket recipe: 20% of what remains, say).
    Before the first round the target is 0.0; from the last round on it is
    ``final`` exactly.

    Args:
        final: the target after the last round, a float in [0, 1].
        rounds: the number of rounds, an ``int`` >= 1.
        every: the steps between rounds, an ``int`` >= 1.
        begin: the step before the first round (default 0), an ``int`` >= 0.

    Raises:
        TypeError: if an argument has the wrong type (``bool`` included).
        ValueError: if ``final`` is outside [0, 1], ``rounds`` or ``every``
            is below 1 or ``begin`` negative.

    >>> schedule = Iterative(0.875, rounds=3, every=10)
    >>> schedule.steps
    (10, 20, 30)
    >>> [schedule(t) for t in (0, 9, 10, 20, 29, 30, 1000)]
    [0.0, 0.0, 0.5, 0.75, 0.75, 0.875, 0.875]
    """

    final: float
    rounds: int
    every: int
    _: KW_ONLY
    begin: int = 0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "final", check_sparsity("Iterative", "final", self.final))
        set_(self, "rounds", check_count("Iterative", "rounds", self.rounds, least=1))
        set_(self, "every", check_count("Iterative", "every", self.every, least=1))
        set_(self, "begin", check_count("Iterative", "begin", self.begin, least=0))

    @property
    def steps(self) -> tuple[int, ...]:
        """The steps at which the rounds happen, ``begin + r * every`` for ``r = 1 .. rounds``."""
        return tuple(self.begin + r * self.every for r in range(1, self.rounds + 1))

    def __call__(self, step: int) -> float:
        step = check_count("Iterative", "step", step, least=0)
        done = min(self.rounds, max(0, step - self.begin) // self.every)
        if done == 0:
            return 0.0
        if done == self.rounds:
            return self.final
        # Monotone in `done` (pow is monotone in its exponent); rounding may
        # put 1 - (1 - final) a hair above final, hence the clamp.
        return min(self.final, 1.0 - float((1.0 - self.final) ** (done / self.rounds)))
