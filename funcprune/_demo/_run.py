"""The demo run by ``python -m funcprune``: pruning a CNN on real handwritten digits.

On scikit-learn's digits (1797 8x8 images shipped in its wheel; a synthetic
stand-in without scikit-learn, and the output says so) it trains a small
CNN densely, then shows: gradual (cubic) magnitude pruning while training,
iterative magnitude pruning with rewinding (the lottery ticket) against
random masks at the same sparsities, ERK against uniform allocation, an
ensemble with its own masks per model trained in one ``vmap(grad(...))``,
the tutorial's steps in hook mode through ``funcprune.compat`` with the
same masks as ``torch.nn.utils.prune``, and at last the payoff: half the
channels pruned across layers, fine-tuned, and the CNN shrunk to a smaller,
faster model with the same accuracy. All training is functional: a
parameter dict, a mask dict, ``torch.func.grad`` and
``functional_call_masked``. It saves the curves as a PNG with matplotlib.
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .._apply import apply_masks, sparsity_report
from .._payoff import bake, propagate, shrink
from .._plans import Plan, global_structured, global_unstructured
from .._specs import L1Unstructured, LnStructured, RandomUnstructured
from .._targets import Iterative, Polynomial, erk_sparsity, prunable, uniform_sparsity
from .._types import Masks, Params
from ._digits import (
    Adam,
    Data,
    DigitsCNN,
    accuracy,
    adam_step,
    load_data,
    loss_of,
    params_of,
    train_steps,
)
from ._tutorial import tutorial

Allocate = Callable[[Params, float], dict[str, float]]
FINAL = 0.95  # the target sparsity of the prunable weights


@dataclass(frozen=True)
class Budget:
    """Training steps of each part (``--quick`` divides them)."""

    dense: int = 800
    rewind: int = 50
    gradual: int = 800
    rounds: int = 5
    round_steps: int = 400
    finetune: int = 400
    ensemble: int = 150

    @staticmethod
    def quick() -> Budget:
        return Budget(dense=200, rewind=20, gradual=200, rounds=3, round_steps=120, finetune=100, ensemble=60)


@dataclass
class Clock:
    """The demo's cumulative time, for the time columns."""

    start: float = field(default_factory=time.perf_counter)

    def __str__(self) -> str:
        return f"{time.perf_counter() - self.start:5.1f} s"


def allocation_plan(
    weights: Params, sparsity: float, spec: type[L1Unstructured | RandomUnstructured], allocate: Allocate
) -> Plan:
    """A plan pruning each weight to its share of ``sparsity`` (cumulative ``sparsity=`` specs)."""
    return Plan({name: spec(sparsity=s) for name, s in allocate(weights, sparsity).items()})


def _weight_sparsity(masks: Masks, params: Params, names: list[str]) -> float:
    return sparsity_report(masks, params={n: params[n] for n in names}).fraction


@dataclass
class Curves:
    """What the PNG plots: (sparsity, accuracy) points and per-layer sparsities."""

    gradual: list[tuple[float, float]] = field(default_factory=list)
    rewind: list[tuple[float, float]] = field(default_factory=list)
    random: list[tuple[float, float]] = field(default_factory=list)
    layers: dict[str, dict[str, float]] = field(default_factory=dict)


def dense(model: nn.Module, train: Data, test: Data, budget: Budget, clock: Clock) -> tuple[Params, Params]:
    """Part 1a: dense training; returns the weights at the rewind step and at the end."""
    print(f"1. Dense training: {budget.dense} Adam steps (lr 3e-3, batch 64) with torch.func.grad")
    params = params_of(model)
    early, _ = train_steps(model, params, {}, train, budget.rewind, seed=1)
    trained, _ = train_steps(model, early, {}, train, budget.dense - budget.rewind, seed=2)
    print(f"   dense test accuracy: {accuracy(model, trained, {}, test):.1f}%   (time so far {clock})")
    return early, trained


def gradual(
    model: nn.Module, params: Params, data: tuple[Data, Data], budget: Budget, clock: Clock, curves: Curves
) -> None:
    """Part 1b: gradual (cubic) magnitude pruning of the trained model, with ERK allocation."""
    train, test = data
    names = prunable(model)
    weights = {n: params[n] for n in names}
    curves.gradual.append((0.0, accuracy(model, params, {}, test)))
    ramp = budget.gradual * 2 // 3
    schedule = Polynomial(FINAL, begin=0, end=ramp)
    every = max(1, ramp // 8)
    print(f"   then gradual pruning while training: {schedule} over {names},")
    print(f"   L1Unstructured(sparsity=s) with erk_sparsity every {every} steps, then fine-tuning")
    print("   (each row: the test accuracy after training at the sparsity reached so far)")
    print(f"   {'step':>6}  {'weight sparsity':>15}  {'test accuracy':>13}  {'time (cumulative)':>17}")

    def prune_at(step: int, p: Params, masks: Masks) -> Masks:
        if step % every or step > ramp:
            return masks
        if masks:
            _report_gradual(model, step, p, masks, test, names, clock, curves)
        return allocation_plan(weights, schedule(step), L1Unstructured, erk_sparsity)(p, masks)

    params, masks = train_steps(model, params, {}, train, budget.gradual, seed=3, prune_at=prune_at)
    _report_gradual(model, budget.gradual, params, masks, test, names, clock, curves)


def _report_gradual(
    model: nn.Module, step: int, params: Params, masks: Masks, test: Data,
    names: list[str], clock: Clock, curves: Curves,
) -> None:  # fmt: skip
    sparsity = _weight_sparsity(masks, params, names)
    acc = accuracy(model, params, masks, test)
    curves.gradual.append((sparsity, acc))
    print(f"   {step:>6}  {100 * sparsity:14.1f}%  {acc:12.1f}%  {clock!s:>17}", flush=True)


def rewinding(
    model: nn.Module, early: Params, trained: Params, data: tuple[Data, Data], budget: Budget,
    clock: Clock, curves: Curves,
) -> None:  # fmt: skip
    """Parts 2 and 3: iterative magnitude pruning with rewinding, and random masks alike."""
    train, test = data
    names = prunable(model)
    weights = {n: trained[n] for n in names}
    schedule = Iterative(FINAL, rounds=budget.rounds, every=1)
    print(f"2. Iterative magnitude pruning with rewinding (lottery ticket): {schedule};")
    print("   each round prunes to the round's target with L1Unstructured(sparsity=s) per weight")
    print(f"   (erk_sparsity), rewinds the unpruned weights to step {budget.rewind} of the dense run")
    print(f"   (apply_masks(early_params, masks)) and retrains {budget.round_steps} steps;")
    print("   the baseline: RandomUnstructured(sparsity=s) masks, the same rewinding and training")
    dense_acc = accuracy(model, trained, {}, test)
    curves.rewind.append((0.0, dense_acc))
    curves.random.append((0.0, dense_acc))
    rows = [("dense", 0.0, dense_acc, dense_acc)]
    print(f"   {'round':>6}  {'target':>7}  {'IMP acc':>8}  {'rand acc':>8}  {'time (cumulative)':>17}")
    params: Params = trained
    masks: Masks = {}
    for r, step in enumerate(schedule.steps, start=1):
        target = schedule(step)
        masks = allocation_plan(weights, target, L1Unstructured, erk_sparsity)(params, masks)
        steps = budget.round_steps
        params, _ = train_steps(model, apply_masks(early, masks), masks, train, steps, seed=10 + r)
        random_masks = allocation_plan(weights, target, RandomUnstructured, erk_sparsity)(params)
        rewound = apply_masks(early, random_masks)
        random_params, _ = train_steps(model, rewound, random_masks, train, steps, seed=10 + r)
        sparsity = _weight_sparsity(masks, params, names)
        acc, rand = accuracy(model, params, masks, test), accuracy(model, random_params, random_masks, test)
        curves.rewind.append((sparsity, acc))
        curves.random.append((sparsity, rand))
        label = "final" if r == budget.rounds else f"{r}/{budget.rounds}"
        rows.append((f"round {label}", sparsity, acc, rand))
        print(f"   {label:>6}  {100 * target:6.1f}%  {acc:7.1f}%  {rand:7.1f}%  {clock!s:>17}", flush=True)
    print("3. Test accuracy against weight sparsity (held-out 25% of the digits)")
    print(f"   {'model':<14} {'weight sparsity':>15}  {'IMP + rewinding':>15}  {'random masks':>12}")
    for label, sparsity, acc, rand in rows:
        print(f"   {label:<14} {100 * sparsity:14.1f}%  {acc:14.1f}%  {rand:11.1f}%")
    gradual_sparsity, gradual_acc = curves.gradual[-1]
    print(f"   {'gradual final':<14} {100 * gradual_sparsity:14.1f}%  {gradual_acc:14.1f}%  {'-':>12}")


def allocations(
    model: nn.Module, trained: Params, data: tuple[Data, Data], budget: Budget, clock: Clock,
    curves: Curves,
) -> None:  # fmt: skip
    """Part 4: ERK against uniform allocation at the same total sparsity."""
    train, test = data
    names = prunable(model)
    weights = {n: trained[n] for n in names}
    print(f"4. ERK against uniform allocation at {100 * FINAL:.0f}% weight sparsity: one-shot")
    print(f"   L1Unstructured(sparsity=s) from the dense model, then {budget.finetune} fine-tuning steps")
    results = {}
    for label, allocate in (("ERK", erk_sparsity), ("uniform", uniform_sparsity)):
        curves.layers[label] = allocate(weights, FINAL)
        masks = allocation_plan(weights, FINAL, L1Unstructured, allocate)(trained)
        tuned, _ = train_steps(model, apply_masks(trained, masks), masks, train, budget.finetune, seed=20)
        results[label] = (accuracy(model, tuned, masks, test), _weight_sparsity(masks, tuned, names))
    print(f"   {'weight':<14} {'numel':>6}  {'ERK':>6}  {'uniform':>7}")
    for name in names:
        erk, uni = curves.layers["ERK"][name], curves.layers["uniform"][name]
        print(f"   {name:<14} {weights[name].numel():>6}  {100 * erk:5.1f}%  {100 * uni:6.1f}%")
    for label, (acc, sparsity) in results.items():
        print(f"   {label:<8} test accuracy {acc:5.1f}% at {100 * sparsity:.1f}% weight sparsity")
    print(f"   (time so far {clock})")


def ensemble(
    model: nn.Module, data: tuple[Data, Data], budget: Budget, clock: Clock, n_models: int = 4
) -> None:
    """Part 5: an ensemble, each model with its own random masks, trained in one vmap(grad(...))."""
    train, test = data
    print(f"5. vmap: {n_models} CNNs, each with its own random 80% masks (one vmapped plan call),")
    print(f"   trained together for {budget.ensemble} steps with torch.func.vmap(torch.func.grad(loss))")
    torch.manual_seed(0)
    models = [DigitsCNN() for _ in range(n_models)]
    params, buffers = torch.func.stack_module_state(models)
    plan = global_unstructured(prunable(model), RandomUnstructured(sparsity=0.8))
    masks = torch.func.vmap(lambda p: plan(p), randomness="different")(params)
    grad_fn = torch.func.vmap(torch.func.grad(loss_of(model)), in_dims=(0, 0, None, None))
    generator = torch.Generator().manual_seed(30)
    zeros = {n: torch.zeros_like(p) for n, p in params.items()}
    state: Adam = (zeros, dict(zeros), 0)
    for _ in range(budget.ensemble):
        idx = torch.randint(0, len(train[1]), (64,), generator=generator)
        params, state = adam_step(params, grad_fn(params, masks, train[0][idx], train[1][idx]), state)
    print(f"   {'model':<6} {'conv1.weight':>12}  {'all weights':>11}  {'test accuracy':>13}")
    for i in range(n_models):
        mine = {n: m[i] for n, m in masks.items()}
        mine_params = {n: p[i] for n, p in params.items()}
        report = sparsity_report(mine)
        acc = accuracy(model, mine_params, mine, test)
        conv1 = report["conv1.weight"].fraction
        print(f"   {i:<6} {100 * conv1:11.1f}%  {100 * report.fraction:10.1f}%  {acc:12.1f}%")
    print(f"   (time so far {clock})")


def payoff(model: nn.Module, trained: Params, data: tuple[Data, Data], budget: Budget, clock: Clock) -> None:
    """Part 7: half the channels pruned across layers, fine-tuned, and the model shrunk."""
    train, test = data
    names = ["conv1.weight", "conv2.weight", "fc1.weight"]  # fc2's outputs are the classes
    plan = global_structured(names, LnStructured(0.5, n=2, dim=0), normalize="mean")
    example = test[0][:1]
    masks = propagate(model, plan(trained), example)  # the channels' biases and input columns too
    print(f"7. Payoff: {plan}")
    print("   prunes half the channels of conv1, conv2 and fc1 jointly; fp.propagate adds their")
    print(f"   biases and the columns that read them; {budget.finetune} steps of fine-tuning, then")
    print("   fp.shrink(model, masks, example) builds the smaller model; the dense model timed")
    print("   against it is fp.bake(model, masks), a copy with the masks applied")
    params, masks = train_steps(model, trained, masks, train, budget.finetune, seed=40)
    tuned = copy.deepcopy(model)
    tuned.load_state_dict(params)
    small = shrink(tuned, masks, example)
    kept = ", ".join(f"{n.removesuffix('.weight')} {small.get_parameter(n).shape[0]}" for n in names)
    print(f"   output channels kept: {kept} (of 16, 32, 64)")
    baked = bake(tuned, masks)  # the masked dense model, as a plain module
    with torch.no_grad():
        shrunk_acc = 100.0 * float((small(test[0]).argmax(1) == test[1]).float().mean())
        times = _interleaved(lambda: baked(test[0]), lambda: small(test[0]))
    print(f"   {'model':<13} {'parameters':>10}  {'test accuracy':>13}  {'forward, 449 images':>19}")
    dense_ms, small_ms = (1e3 * statistics.median(t) for t in times)
    print(f"   {'masked dense':<13} {_count(tuned):>10,}  {accuracy(model, params, masks, test):12.1f}%  {dense_ms:16.2f} ms")
    print(f"   {'shrunk':<13} {_count(small):>10,}  {shrunk_acc:12.1f}%  {small_ms:16.2f} ms")
    ratio = statistics.median(d / s for d, s in zip(*times))
    print(f"   shrunk: {_count(tuned) / _count(small):.1f}x fewer parameters, {ratio:.1f}x faster forward")
    print(f"   (median of {len(times[0])} interleaved repetitions; time so far {clock})")


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _interleaved(a: Callable[[], object], b: Callable[[], object], repeats: int = 21) -> tuple[list[float], list[float]]:
    """Seconds per call of ``a`` and ``b``, alternating, after one untimed call of each."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(repeats + 1):
        for run, record in zip((a, b), times):
            start = time.perf_counter()
            run()
            if i:
                record.append(time.perf_counter() - start)
    return times


def save_png(path: str, curves: Curves, title: str) -> str:
    """Plot the curves and per-layer sparsities into ``path``; says what it did."""
    try:
        import matplotlib
    except ImportError:
        return "PNG skipped: matplotlib is not installed (pip install \".[demo]\")"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for label, points, style in (
        ("gradual (cubic, ERK)", curves.gradual, "-"),
        ("IMP with rewinding", curves.rewind, "o-"),
        ("random masks", curves.random, "s--"),
    ):
        left.plot([100 * s for s, _ in points], [a for _, a in points], style, label=label)
    left.set(xlabel="weight sparsity (%)", ylabel="test accuracy (%)", title=title)
    left.legend()
    names = list(curves.layers.get("ERK", {}))
    for k, label in enumerate(curves.layers):
        xs = [i + 0.4 * k - 0.2 for i in range(len(names))]
        right.bar(xs, [100 * curves.layers[label][n] for n in names], width=0.4, label=label)
    right.set_xticks(range(len(names)), names)
    right.set(ylabel="sparsity (%)", title=f"per-layer sparsity at {100 * FINAL:.0f}% overall")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"saved the curves and per-layer sparsities to {os.path.abspath(path)}"


def main(*, quick: bool = False, png: str = "funcprune-demo.png") -> None:
    """Run the demo (``quick``: fewer training steps) and save its figure to ``png``."""
    clock = Clock()
    # The CNN's ops are too small to gain from a second thread, and they slow
    # down badly (tens of times) when another process keeps the other core
    # busy: one thread keeps the run steady.
    torch.set_num_threads(1)
    budget = Budget.quick() if quick else Budget()
    name, train, test = load_data()
    print(f"funcprune demo{' (--quick)' if quick else ''}: pruning a small CNN, functionally")
    print(f"data: {name}; {len(train[1])} train / {len(test[1])} held-out test images")
    torch.manual_seed(0)
    model = DigitsCNN()
    curves = Curves()
    early, trained = dense(model, train, test, budget, clock)
    gradual(model, trained, (train, test), budget, clock, curves)
    rewinding(model, early, trained, (train, test), budget, clock, curves)
    allocations(model, trained, (train, test), budget, clock, curves)
    ensemble(model, (train, test), budget, clock)
    tutorial()
    payoff(model, trained, (train, test), budget, clock)
    print(save_png(png, curves, "digits" if "scikit" in name else "synthetic digits"))
    print(f"done in {time.perf_counter() - clock.start:.1f} s")
