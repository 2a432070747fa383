"""Shrunk vs masked dense: parameters and CPU forward time, interleaved in one process.

Run from the repository root (after installing the package):

    python benchmarks/_shrink_bench.py          # 1 thread, then the default count
    python benchmarks/_shrink_bench.py --quick  # 3 repetitions, for a smoke run

Two models, a VGG-style CNN with BatchNorm and an MLP, sized so that a dense
forward takes a few milliseconds on one core. Every Linear and Conv except
the last layer is pruned with ``LnStructured(amount, n=2, dim=0)`` so that
50% or 25% of its channels are kept; the *masked dense* model is the model
with those masks (the closure's, which adds only bias and norm entries)
multiplied into its weights: the same outputs, the dense cost. The *shrunk*
model is ``fp.shrink(model, masks, x)``. Both run in eval mode under
``torch.inference_mode()``. Every repetition times a block of calls of each
in turn (A, B, A, B, ...), after an untimed warm-up; the table reports the
medians and the median, minimum and maximum of the per-repetition ratios
dense / shrunk (> 1: the shrunk model is faster). The script checks that the
two models' outputs agree and exits with status 1 if they do not.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

import funcprune as fp


def cnn() -> nn.Sequential:
    """A VGG-style CNN for 32x32 images (about 0.3 M parameters)."""

    def block(c_in: int, c_out: int) -> list[nn.Module]:
        return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU()]

    return nn.Sequential(
        *block(3, 32), *block(32, 32), nn.MaxPool2d(2),
        *block(32, 64), *block(64, 64), nn.MaxPool2d(2),
        *block(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    )  # fmt: skip


def mlp() -> nn.Sequential:
    """An MLP 512 -> 1024 -> 1024 -> 10 (about 1.6 M parameters)."""
    return nn.Sequential(
        nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
    )


@dataclass(frozen=True)
class Case:
    """A model, its example inputs, and the share of channels kept."""

    name: str
    model: nn.Module
    inputs: torch.Tensor
    kept: float


@dataclass(frozen=True)
class Result:
    case: Case
    threads: int
    dense_params: int
    shrunk_params: int
    dense_s: list[float]
    shrunk_s: list[float]
    max_diff: float

    @property
    def ratios(self) -> list[float]:
        return [d / s for d, s in zip(self.dense_s, self.shrunk_s, strict=True)]

    def line(self) -> str:
        ratios = self.ratios
        return (
            f"| {self.case.name} | {self.case.kept:.0%} | {self.threads} | "
            f"{self.dense_params:,} | {self.shrunk_params:,} | "
            f"{self.dense_params / self.shrunk_params:.2f}x | "
            f"{1e3 * statistics.median(self.dense_s):.2f} | "
            f"{1e3 * statistics.median(self.shrunk_s):.2f} | "
            f"{statistics.median(ratios):.2f}x | {min(ratios):.2f} | {max(ratios):.2f} | "
            f"{self.max_diff:.1e} |"
        )


HEADER = (
    "| model | kept | threads | params dense | params shrunk | params ratio | dense ms | "
    "shrunk ms | speed-up (median) | min | max | max abs diff |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def seeded(model: nn.Module, seed: int) -> nn.Module:
    """``model`` with seeded weights and non-trivial BatchNorm statistics, in eval mode."""
    torch.manual_seed(seed)
    for mod in model.modules():
        if isinstance(mod, nn.BatchNorm2d):
            with torch.no_grad():
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
                if mod.running_mean is not None and mod.running_var is not None:
                    mod.running_mean.uniform_(-0.2, 0.2)
                    mod.running_var.uniform_(0.5, 2.0)
    return model.eval()


def channel_masks(model: nn.Module, kept: float) -> dict[str, torch.Tensor]:
    """Masks keeping ``kept`` of the output channels of every layer but the last."""
    names = fp.prunable(model)[:-1]
    plan = fp.Plan({name: fp.LnStructured(1.0 - kept, n=2, dim=0) for name in names})
    return plan(dict(model.named_parameters()))


def masked_dense(model: nn.Module, masks: dict[str, torch.Tensor]) -> nn.Module:
    """A copy of ``model`` with ``masks`` multiplied into its parameters."""
    dense = copy.deepcopy(model)
    fp.apply_masks_(dict(dense.named_parameters()), masks)
    return dense


def calls_per_block(forward: Callable[[], object], seconds: float) -> int:
    """How many calls make a timed block of about ``seconds``."""
    start = time.perf_counter()
    forward()
    once = max(time.perf_counter() - start, 1e-6)
    return max(1, math.ceil(seconds / once))


def interleaved(
    dense: Callable[[], object], small: Callable[[], object], repeats: int, calls: int
) -> tuple[list[float], list[float]]:
    """Per-call seconds of each, alternating blocks of ``calls`` calls; round 0 warms up."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(repeats + 1):
        for forward, record in ((dense, times[0]), (small, times[1])):
            start = time.perf_counter()
            for _ in range(calls):
                forward()
            if i:
                record.append((time.perf_counter() - start) / calls)
    return times


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def measure(case: Case, threads: int, repeats: int) -> Result:
    torch.set_num_threads(threads)
    masks = channel_masks(case.model, case.kept)
    dense = masked_dense(case.model, fp.propagate(case.model, masks, case.inputs))
    small = fp.shrink(case.model, masks, case.inputs).eval()
    x = case.inputs
    with torch.inference_mode():
        diff = (dense(x) - small(x)).abs().max().item()
        for _ in range(3):
            dense(x), small(x)
        calls = calls_per_block(lambda: dense(x), 0.05)
        dense_s, shrunk_s = interleaved(lambda: dense(x), lambda: small(x), repeats, calls)
    return Result(case, threads, count(dense), count(small), dense_s, shrunk_s, diff)


def cases() -> list[Case]:
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(4, 3, 32, 32, generator=generator)
    vectors = torch.randn(32, 512, generator=generator)
    models = [
        ("CNN (VGG-style, BN), 4x3x32x32", cnn, images),
        ("MLP 512-1024-1024-10, 32", mlp, vectors),
    ]
    return [
        Case(name, seeded(make(), seed), inputs, kept)
        for seed, (name, make, inputs) in enumerate(models)
        for kept in (0.5, 0.25)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repetitions, for a smoke run")
    parser.add_argument("--repeats", type=int, default=15, help="timed repetitions per row")
    parser.add_argument("--threads", type=int, default=0, help="one thread count only")
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    default_threads = torch.get_num_threads()
    settings = [args.threads] if args.threads else sorted({1, default_threads})
    print(f"torch {torch.__version__}, {repeats} repetitions, threads {settings}\n")
    print(HEADER)
    worst = 0.0
    for threads in settings:
        for case in cases():
            result = measure(case, threads, repeats)
            worst = max(worst, result.max_diff)
            print(result.line(), flush=True)
    if worst > 1e-4:
        print(f"\nthe shrunk and masked dense outputs differ by {worst:.2e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
