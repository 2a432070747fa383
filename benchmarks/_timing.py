"""Interleaved timing shared by the benchmark scripts.

Every comparison alternates its contenders (A, B, A, B, ...) after an
untimed warm-up round, so that both share the machine's moods; a row
reports the median and the minimum of the per-repetition ratios.

Every script imports this module first: it also stubs torchvision's meta
registrations, which fail beside the CPU torch wheel when the test extra's
torchvision 0.28 is installed and transformers imports it (as
``tests/_torchvision.py`` does for the tests).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass

sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))


@dataclass(frozen=True)
class Contender:
    """One side of a comparison: what is timed, untimed set-up before it, and calls per block.

    A timed block runs ``run`` ``calls`` times; its time divided by ``calls``
    is one repetition's time per call.
    """

    run: Callable[[], object]
    setup: Callable[[], object] | None = None
    calls: int = 1


def _no_sync() -> None:
    pass


def calls_for(run: Callable[[], object], seconds: float, sync: Callable[[], None] = _no_sync) -> int:
    """How many calls of ``run`` (warmed up here) make a block of about ``seconds``.

    ``sync`` waits for queued work (``torch.cuda.synchronize`` on a GPU).
    """
    run()
    sync()
    start = time.perf_counter()
    run()
    sync()
    return max(1, math.ceil(seconds / max(time.perf_counter() - start, 1e-9)))


def interleaved(
    contenders: Mapping[str, Contender], repeats: int, sync: Callable[[], None] = _no_sync
) -> dict[str, list[float]]:
    """Seconds per call over ``repeats`` alternating blocks of each contender, after a warm-up round.

    ``sync`` waits for queued work before and after each timed block.
    """
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for i in range(repeats + 1):
        for name, c in contenders.items():
            if c.setup is not None:
                c.setup()
            sync()
            start = time.perf_counter()
            for _ in range(c.calls):
                c.run()
            sync()
            if i:  # the first round warms up
                times[name].append((time.perf_counter() - start) / c.calls)
    return times


@dataclass(frozen=True)
class Row:
    """One comparison: ``numerator / denominator`` per repetition, against a target."""

    case: str
    numerator: str
    denominator: str
    times: dict[str, list[float]]
    target: float | None  # None: reported, no target
    at_least: bool = True  # the ratio must be >= target (else <= target)
    masks: str = ""  # what the row checked besides time (masks, outputs)

    @property
    def ratios(self) -> list[float]:
        return [a / b for a, b in zip(self.times[self.numerator], self.times[self.denominator], strict=True)]

    @property
    def ratio(self) -> float:
        """The median of the per-repetition ratios."""
        return statistics.median(self.ratios)

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.ratio >= self.target if self.at_least else self.ratio <= self.target

    def line(self, threads: int) -> str:
        ms = {name: 1e3 * statistics.median(t) for name, t in self.times.items()}
        target = "(reported)" if self.target is None else f"{'>=' if self.at_least else '<='} {self.target:g}"
        met = {None: "", True: "yes", False: "**no**"}[self.met]
        return (
            f"| {self.case} | {threads} | {self.numerator} {ms[self.numerator]:.2f} ms | "
            f"{self.denominator} {ms[self.denominator]:.2f} ms | {self.numerator} / {self.denominator} | "
            f"{self.ratio:.2f} | {min(self.ratios):.2f} | {target} | {met} | {self.masks} |"
        )


HEADER = (
    "| case | threads | A (median) | B (median) | ratio | median | min | target | met | checked |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)
