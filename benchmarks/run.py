"""funcprune vs torch.nn.utils.prune, side by side in one process.

Run from the repository root (after installing the package):

    python benchmarks/run.py            # the full table (about 3 minutes on 2 cores)
    python benchmarks/run.py --quick    # fewer repeats, for a smoke run

Each row times both libraries on the same tensors (best of a few runs; the
set-up that torch's in-place API needs, such as fresh modules, is outside the
timed part) and checks that both give the same masks. "abs pass" is one
``abs()`` over the same weights: the floor that reading the weights costs.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.utils.prune as tprune
from torch import nn
from torch.func import stack_module_state, vmap

import funcprune as fp

T = TypeVar("T")


def resnet50_shapes() -> dict[str, tuple[int, ...]]:
    """The conv and linear weight shapes of ResNet-50 (25.5M weights)."""
    shapes: dict[str, tuple[int, ...]] = {"conv1.weight": (64, 3, 7, 7)}
    inplanes = 64
    for stage, (planes, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], start=1):
        for b in range(blocks):
            prefix = f"layer{stage}.{b}"
            shapes[f"{prefix}.conv1.weight"] = (planes, inplanes, 1, 1)
            shapes[f"{prefix}.conv2.weight"] = (planes, planes, 3, 3)
            shapes[f"{prefix}.conv3.weight"] = (planes * 4, planes, 1, 1)
            if b == 0:
                shapes[f"{prefix}.downsample.weight"] = (planes * 4, inplanes, 1, 1)
            inplanes = planes * 4
    shapes["fc.weight"] = (1000, 2048)
    return shapes


class Holder(nn.Module):
    """One module per tensor, so torch's API can prune ``(module, "weight")``."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(w.clone())

    @property
    def mask(self) -> torch.Tensor:
        """The ``weight_mask`` buffer torch's pruning registered."""
        mask: torch.Tensor = getattr(self, "weight_mask")
        return mask


def best(fn: Callable[[], T], repeats: int, setup: Callable[[], object] | None = None) -> tuple[float, T]:
    """Best wall time of ``repeats`` runs of ``fn`` after one untimed warm-up run.

    ``setup`` runs untimed before each run.
    """
    times, result = [], None
    for i in range(repeats + 1):
        if setup is not None:
            setup()
        start = time.perf_counter()
        result = fn()
        if i:
            times.append(time.perf_counter() - start)
    return min(times), result  # type: ignore[return-value]


def same_up_to_ties(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor], scores: dict[str, torch.Tensor]) -> str:
    """'identical', or how the masks differ: only where scores tie, or really."""
    names = list(ours)
    a = torch.cat([ours[n].reshape(-1) for n in names])
    b = torch.cat([theirs[n].reshape(-1).bool() for n in names])
    if torch.equal(a, b):
        return "identical"
    s = torch.cat([scores[n].reshape(-1) for n in names])
    if int(a.sum()) == int(b.sum()) and torch.equal(torch.sort(s[a]).values, torch.sort(s[b]).values):
        return f"same but for {int((a != b).sum())} tied entries"
    return "DIFFERENT"


@dataclass(frozen=True)
class Row:
    """One line of the table: the reference (torch, or dense) against funcprune."""

    case: str
    baseline: str
    reference: float
    ours: float
    target: str
    met: bool | None
    masks: str = ""
    unit: str = "s"
    passes: bool = False


def bench_global(params: dict[str, torch.Tensor], repeats: int, abs_pass: float) -> list[Row]:
    rows: list[Row] = []
    names = list(params)
    scores = {n: p.abs() for n, p in params.items()}
    for amount in (0.2, 0.5, 0.9):
        plan = fp.global_unstructured(names, fp.L1Unstructured(amount))
        t_fp, masks = best(lambda: plan(params), repeats)
        holders: list[Holder] = []

        def fresh() -> None:
            holders[:] = [Holder(params[n]) for n in names]

        def torch_global() -> None:
            tprune.global_unstructured([(h, "weight") for h in holders], tprune.L1Unstructured, amount=amount)

        t_torch, _ = best(torch_global, repeats, fresh)
        theirs = {n: h.mask for n, h in zip(names, holders)}
        target, met = ">= 10x", t_torch / t_fp >= 10
        if amount == 0.5:  # judged against the abs() pass into new memory
            target, met = ">= 10x, <= 6 passes (new memory)", met and t_fp / abs_pass <= 6
        rows.append(Row(f"a. global L1 {amount:.0%}", "torch", t_torch, t_fp, target, met, same_up_to_ties(masks, theirs, scores), passes=True))
    return rows


def bench_per_layer(params: dict[str, torch.Tensor], repeats: int) -> Row:
    plan = fp.Plan({"*": fp.L1Unstructured(0.5)})
    t_fp, masks = best(lambda: plan(params), repeats)
    holders: dict[str, Holder] = {}

    def fresh() -> None:
        holders.clear()
        holders.update({n: Holder(p) for n, p in params.items()})

    def torch_layers() -> None:
        for h in holders.values():
            tprune.l1_unstructured(h, "weight", amount=0.5)

    t_torch, _ = best(torch_layers, repeats, fresh)
    theirs = {n: h.mask for n, h in holders.items()}
    scores = {n: p.abs() for n, p in params.items()}
    return Row("b. per-layer L1 50%", "torch", t_torch, t_fp, ">= 3x", t_torch / t_fp >= 3, same_up_to_ties(masks, theirs, scores), passes=True)


def bench_ln_structured(params: dict[str, torch.Tensor], repeats: int) -> Row:
    convs = {n: p for n, p in params.items() if p.dim() == 4}
    plan = fp.Plan({n: fp.LnStructured(0.5, n=2, dim=0) for n in convs})
    t_fp, masks = best(lambda: plan(convs), repeats)
    holders: dict[str, Holder] = {}

    def fresh() -> None:
        holders.clear()
        holders.update({n: Holder(p) for n, p in convs.items()})

    def torch_ln() -> None:
        for h in holders.values():
            tprune.ln_structured(h, "weight", amount=0.5, n=2, dim=0)

    t_torch, _ = best(torch_ln, repeats, fresh)
    theirs = {n: h.mask for n, h in holders.items()}
    norms = {n: p.flatten(1).norm(dim=1)[:, None, None, None].expand_as(p) for n, p in convs.items()}
    return Row("c. Ln-structured 50% (convs)", "torch", t_torch, t_fp, ">= 1x", t_torch >= t_fp, same_up_to_ties(masks, theirs, norms), passes=True)


def mlp() -> nn.Sequential:
    """An MLP of about 10M weights."""
    return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024), nn.ReLU(), nn.Linear(1024, 1024))


def bench_training_step(repeats: int) -> list[Row]:
    torch.manual_seed(0)
    model = mlp()
    x, y = torch.randn(256, 1024), torch.randn(256, 1024)
    params = {n: p.detach().clone().requires_grad_() for n, p in model.named_parameters()}
    weights = [n for n in params if n.endswith("weight")]
    masks = fp.global_unstructured(weights, fp.L1Unstructured(0.8))(params)
    float_masks = fp.to_multipliers(params, masks)  # checked and converted once

    def dense() -> None:
        out = torch.func.functional_call(model, params, (x,))
        torch.autograd.backward(nn.functional.mse_loss(out, y))

    def functional_bool() -> None:
        out = fp.functional_call_masked(model, params, masks, (x,))
        torch.autograd.backward(nn.functional.mse_loss(out, y))

    def functional_float() -> None:
        out = fp.functional_call_masked(model, params, float_masks, (x,))
        torch.autograd.backward(nn.functional.mse_loss(out, y))

    hooked = mlp()
    hooked.load_state_dict(model.state_dict())
    tprune.global_unstructured(
        [(m, "weight") for m in hooked if isinstance(m, nn.Linear)], tprune.L1Unstructured, amount=0.8
    )

    def hook_mode() -> None:
        torch.autograd.backward(nn.functional.mse_loss(hooked(x), y))

    # Interleaved steps and medians: a training step is short and this
    # machine's timings drift, so the variants share the same moments.
    steps = {"dense": dense, "bool": functional_bool, "float": functional_float, "hooks": hook_mode}
    times: dict[str, list[float]] = {key: [] for key in steps}
    for i in range(1 + 10 * repeats):
        for key, step in steps.items():
            start = time.perf_counter()
            step()
            if i:
                times[key].append(time.perf_counter() - start)
    t = {key: statistics.median(v) for key, v in times.items()}
    rows = []
    for key, label in (("bool", "bool masks"), ("float", "float masks")):
        case = f"d. train step, 10M MLP 80% sparse, {label}"
        rows.append(Row(case, "dense", t["dense"], t[key], f"<= 1.15x dense (is {t[key] / t['dense']:.2f}x)", t[key] <= 1.15 * t["dense"]))
        rows.append(Row(case, "torch hooks", t["hooks"], t[key], ">= 1x", t["hooks"] >= t[key]))
    return rows


def bench_memory(params: dict[str, torch.Tensor]) -> Row:
    masks = fp.global_unstructured(list(params), fp.L1Unstructured(0.5))(params)
    ours = sum(m.numel() * m.element_size() for m in masks.values())
    holders = [Holder(p) for p in params.values()]
    tprune.global_unstructured([(h, "weight") for h in holders], tprune.L1Unstructured, amount=0.5)
    theirs = sum(h.mask.numel() * h.mask.element_size() for h in holders)
    return Row("e. mask memory, ResNet-50 set", "torch", theirs / 2**20, ours / 2**20, ">= 4x less", theirs >= 4 * ours, unit="MB")


def bench_ensemble(repeats: int) -> Row:
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(784, 300), nn.ReLU(), nn.Linear(300, 100), nn.ReLU(), nn.Linear(100, 10)) for _ in range(8)]
    stacked, _ = stack_module_state(models)
    stacked = {n: p.detach() for n, p in stacked.items()}
    plan = fp.Plan({"*.weight": fp.L1Unstructured(0.5)})
    t_vmap, batched = best(lambda: vmap(plan)(stacked), repeats)
    singles = [{n: p.detach() for n, p in m.named_parameters()} for m in models]
    t_loop, looped = best(lambda: [plan(p) for p in singles], repeats)
    same = all(torch.equal(batched[n][i], looped[i][n]) for i in range(8) for n in looped[0])
    return Row("f. masks of 8 MLPs: one vmap call", "Python loop", t_loop, t_vmap, "(reported)", None, "identical" if same else "DIFFERENT")


def bench_abs(params: dict[str, torch.Tensor], repeats: int) -> tuple[float, float]:
    """One ``abs()`` over every weight: into new memory, and into reused memory.

    A fresh output pays the kernel's page faults (the output of a pass that
    keeps its result); a reused one (the previous result freed first) is the
    pure read-and-write floor.
    """
    kept: list[list[torch.Tensor]] = []
    fresh, _ = best(lambda: kept.append([p.abs() for p in params.values()]), max(5, repeats))
    kept.clear()
    reused, _ = best(lambda: [p.abs() for p in params.values()], max(5, repeats))
    return fresh, reused


def _megabytes(value: float) -> str:
    return f"{value:.1f} MB"


def _milliseconds(value: float) -> str:
    return f"{value * 1e3:.0f} ms"


def report(rows: list[Row], floors: tuple[float, float]) -> None:
    """Print the table (Markdown, as the README shows it)."""
    fresh, reused = floors
    print("| case | reference | funcprune | ratio | abs passes (new / reused memory) | target | met | masks |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        unit = "MB" if row.unit == "MB" else "s"
        fmt = _megabytes if unit == "MB" else _milliseconds
        passes = f"{row.ours / fresh:.1f} / {row.ours / reused:.1f}" if row.passes else ""
        met = {None: "", True: "yes", False: "**no**"}[row.met]
        print(
            f"| {row.case} | {row.baseline} {fmt(row.reference)} | {fmt(row.ours)} | "
            f"{row.reference / row.ours:.1f}x | {passes} | {row.target} | {met} | {row.masks} |"
        )
    print(f"| g. one abs() pass (the floor) | | {fresh * 1e3:.0f} ms new / {reused * 1e3:.0f} ms reused memory | | 1.0 / 1.0 | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one timed run per case")
    args = parser.parse_args()
    repeats = 1 if args.quick else 3
    torch.manual_seed(0)
    params = {n: torch.randn(s) * (2.0 / (s[1] * (s[2] * s[3] if len(s) == 4 else 1))) ** 0.5 for n, s in resnet50_shapes().items()}
    total = sum(p.numel() for p in params.values())
    print(f"funcprune {fp.__version__} vs torch.nn.utils.prune, torch {torch.__version__}")
    print(f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, Python {platform.python_version()}")
    print(f"ResNet-50 weight set: {len(params)} tensors, {total / 1e6:.1f}M weights\n")
    floors = bench_abs(params, repeats)
    rows = bench_global(params, repeats, floors[0])
    rows.append(bench_per_layer(params, repeats))
    rows.append(bench_ln_structured(params, repeats))
    rows += bench_training_step(repeats)
    rows.append(bench_memory(params))
    rows.append(bench_ensemble(repeats))
    report(rows, floors)


if __name__ == "__main__":
    main()
