"""funcprune vs torch.nn.utils.prune, interleaved in one process.

Run from the repository root (after installing the package):

    python benchmarks/run.py             # 1 thread, then the default count (about 5 minutes on 2 cores)
    python benchmarks/run.py --threads 1 # one setting only
    python benchmarks/run.py --quick     # 2 repetitions, for a smoke run
    python benchmarks/run.py --march x86-64-v3  # the kernels built for AVX2 without AVX-512

Every comparison alternates its contenders (A, B, A, B, ...) after an
untimed warm-up, so both share the machine's moods; each row reports the
median and the minimum of the per-repetition ratios. Set-up that torch's
in-place API needs (fresh modules) runs outside the timed part. The floor
is one pass that reads every weight and writes one byte per weight:
``torch.gt(w, c, out=preallocated_bool)``. Masks are compared with torch's:
the script exits with status 1 if they differ beyond ties (equal scores),
and prints a digest of funcprune's masks, so that two runs can be checked
identical. A second table (``payoff.py``; ``--no-payoff`` skips it) times
shrunk and sparse models against the masked dense model.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import hashlib
import os
import platform
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.utils.prune as tprune
from torch import nn
from torch.func import stack_module_state, vmap

import funcprune as fp
from funcprune import _native
import payoff
from _timing import HEADER, Contender, Row, interleaved

Masks = dict[str, torch.Tensor]


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


def compare_masks(ours: Masks, theirs: Masks, scores: Masks) -> str:
    """'identical', 'same but for N tied entries', or 'DIFFERENT'."""
    names = list(ours)
    a = torch.cat([ours[n].reshape(-1) for n in names])
    b = torch.cat([theirs[n].reshape(-1).bool() for n in names])
    if torch.equal(a, b):
        return "identical"
    s = torch.cat([scores[n].reshape(-1) for n in names])
    if int(a.sum()) == int(b.sum()) and torch.equal(torch.sort(s[a]).values, torch.sort(s[b]).values):
        return f"same but for {int((a != b).sum())} tied entries"
    return "DIFFERENT"


class Bench:
    """The cases, over one weight set, at the current thread count."""

    def __init__(self, params: dict[str, torch.Tensor], repeats: int) -> None:
        self.params = params
        self.repeats = repeats
        self.digest = hashlib.sha256()
        outs = {n: torch.empty(p.shape, dtype=torch.bool) for n, p in params.items()}

        def floor() -> None:
            for n, p in params.items():
                torch.gt(p, 0.01, out=outs[n])

        flat = [p.reshape(-1) for p in params.values()]

        def native_floor() -> None:  # the survivors kernel: |w| > c, one read, one byte written
            for p in flat:
                _native.survivors(p, None, True, 0.01, None)

        self.floor = Contender(floor)
        self.native_floor = Contender(native_floor) if _native.status().available else None

    def _record(self, masks: Masks) -> None:
        for name in sorted(masks):
            self.digest.update(name.encode())
            self.digest.update(masks[name].to(torch.uint8).numpy().tobytes())

    def versus_torch(
        self, case: str, ours: Callable[[], Masks], theirs: Callable[[list[Holder]], None],
        params: dict[str, torch.Tensor], speedup: float, floor_ratio: float | None, scores: Masks,
    ) -> list[Row]:  # fmt: skip
        """funcprune against torch's in-place API (fresh modules each time), and the floor."""
        holders: list[Holder] = []

        def fresh() -> None:
            holders[:] = [Holder(p) for p in params.values()]

        result: list[Masks] = []
        plain: list[Masks] = []

        def torch_path() -> None:
            with _native.disabled():
                plain.append(ours())

        contenders = {
            "torch": Contender(lambda: theirs(holders), fresh),
            "funcprune": Contender(lambda: result.append(ours())),
            "funcprune, torch path": Contender(torch_path),
        }
        if floor_ratio is not None:
            contenders["floor"] = self.floor
            if self.native_floor is not None:
                contenders["C floor"] = self.native_floor
        times = interleaved(contenders, self.repeats)
        masks = result[-1]
        self._record(masks)
        same = compare_masks(masks, {n: h.mask for n, h in zip(params, holders, strict=True)}, scores)
        same_paths = all(torch.equal(masks[n], plain[-1][n]) for n in masks)
        rows = [
            Row(case, "torch", "funcprune", times, speedup, True, same),
            Row(case, "torch", "funcprune, torch path", times, None, True, "identical" if same_paths else "DIFFERENT"),
        ]
        if floor_ratio is not None:
            rows.append(Row(case, "funcprune", "floor", times, floor_ratio, False))
            if "C floor" in times:
                rows.append(Row(case, "funcprune", "C floor", times, None, False))
        return rows

    def global_l1(self, amount: float, speedup: float, floor_ratio: float | None) -> list[Row]:
        names = list(self.params)
        plan = fp.global_unstructured(names, fp.L1Unstructured(amount))

        def theirs(holders: list[Holder]) -> None:
            tprune.global_unstructured([(h, "weight") for h in holders], tprune.L1Unstructured, amount=amount)

        scores = {n: p.abs() for n, p in self.params.items()}
        return self.versus_torch(
            f"a. global L1 {amount:.0%}", lambda: plan(self.params), theirs, self.params, speedup, floor_ratio, scores
        )

    def per_layer_l1(self) -> list[Row]:
        plan = fp.Plan({"*": fp.L1Unstructured(0.5)})

        def theirs(holders: list[Holder]) -> None:
            for h in holders:
                tprune.l1_unstructured(h, "weight", amount=0.5)

        scores = {n: p.abs() for n, p in self.params.items()}
        return self.versus_torch("b. per-layer L1 50%", lambda: plan(self.params), theirs, self.params, 40, None, scores)

    def ln_structured(self) -> list[Row]:
        convs = {n: p for n, p in self.params.items() if p.dim() == 4}
        plan = fp.Plan({n: fp.LnStructured(0.5, n=2, dim=0) for n in convs})

        def theirs(holders: list[Holder]) -> None:
            for h in holders:
                tprune.ln_structured(h, "weight", amount=0.5, n=2, dim=0)

        norms = {n: p.flatten(1).norm(dim=1)[:, None, None, None].expand_as(p) for n, p in convs.items()}
        return self.versus_torch("c. Ln-structured 50%, convs", lambda: plan(convs), theirs, convs, 1, None, norms)

    def training_step(self) -> list[Row]:
        torch.manual_seed(0)
        model = mlp()
        x, y = torch.randn(256, 1024), torch.randn(256, 1024)
        params = {n: p.detach().clone().requires_grad_() for n, p in model.named_parameters()}
        weights = [n for n in params if n.endswith("weight")]
        masks = fp.global_unstructured(weights, fp.L1Unstructured(0.8))(params)
        multipliers = fp.to_multipliers(params, masks)  # checked and converted once
        hooked = mlp()
        hooked.load_state_dict(model.state_dict())
        tprune.global_unstructured(
            [(m, "weight") for m in hooked if isinstance(m, nn.Linear)], tprune.L1Unstructured, amount=0.8
        )

        def step(forward: Callable[[], torch.Tensor], native: bool = True) -> Contender:
            def run() -> None:
                with contextlib.nullcontext() if native else _native.disabled():
                    torch.autograd.backward(nn.functional.mse_loss(forward(), y))

            return Contender(run)

        contenders = {
            "bool masks": step(lambda: fp.functional_call_masked(model, params, masks, (x,))),
            "hooks": step(lambda: hooked(x)),
            "float masks": step(lambda: fp.functional_call_masked(model, params, multipliers, (x,))),
            "dense": step(lambda: torch.func.functional_call(model, params, (x,))),
            "bool, torch path": step(lambda: fp.functional_call_masked(model, params, masks, (x,)), native=False),
        }
        times = interleaved(contenders, 10 * self.repeats)
        case = "d. train step, 10M MLP 80% sparse"
        return [
            Row(case, "bool masks", "hooks", times, 1.0, False),
            Row(case, "float masks", "hooks", times, None),
            Row(case, "bool, torch path", "hooks", times, None),
            Row(case, "bool masks", "dense", times, None),
        ]

    def shapes(self) -> list[Row]:
        """N:M, Block and per-row masks of one 4096 x 4096 weight against the floor (|w| > c)."""
        g = torch.Generator().manual_seed(0)
        w = torch.randn(4096, 4096, generator=g)
        magnitude, out = w.abs(), torch.empty(w.shape, dtype=torch.bool)
        cut = float(magnitude.median())
        earlier = torch.rand(w.shape, generator=g) > 0.3
        results: dict[str, torch.Tensor] = {}

        def ours(key: str, spec: fp.Spec, default: torch.Tensor | None = None, native: bool = True) -> Contender:
            def run() -> None:
                with contextlib.nullcontext() if native else _native.disabled():
                    results[key] = fp.compute_mask(spec, w, default)

            return Contender(run)

        floor = Contender(lambda: torch.gt(magnitude, cut, out=out))
        halves = {"bfloat16": w.bfloat16(), "float16": w.half()}
        half_floors = {name: Contender(functools.partial(torch.gt, x.abs(), cut, out=out)) for name, x in halves.items()}

        def ours_half(key: str, x: torch.Tensor, native: bool = True) -> Contender:
            def run() -> None:
                with contextlib.nullcontext() if native else _native.disabled():
                    results[key] = fp.compute_mask(fp.NM(2, 4), x)

            return Contender(run)
        nm_ao, nm_ao_mask = sparsifier(w, (1, 4), 2, 1.0)
        block_ao, block_ao_mask = sparsifier(w, (4, 4), 16, 0.5)
        contenders = {
            "floor": floor,
            "NM(2, 4)": ours("nm", fp.NM(2, 4)),
            "NM(2, 4), torch path": ours("nm torch", fp.NM(2, 4), native=False),
            "NM(2, 4) after a mask": ours("nm earlier", fp.NM(2, 4), earlier),
            "NM(2, 4, dim=0)": ours("nm dim 0", fp.NM(2, 4, dim=0)),
            "Block(0.5, (4, 4))": ours("block", fp.Block(0.5, (4, 4))),
            "Block, torch path": ours("block torch", fp.Block(0.5, (4, 4)), native=False),
            "PerSlice(L1Unstructured(0.5), dim=0)": ours("rows", fp.PerSlice(fp.L1Unstructured(0.5), dim=0)),
            "PerSlice, torch path": ours("rows torch", fp.PerSlice(fp.L1Unstructured(0.5), dim=0), native=False),
            "L1Unstructured(0.5)": ours("whole", fp.L1Unstructured(0.5)),
            "torch.ao 2:4": nm_ao,
            "torch.ao 4x4 blocks": block_ao,
        }
        for name, x in halves.items():
            contenders[f"floor {name}"] = half_floors[name]
            contenders[f"NM(2, 4) {name}"] = ours_half(f"nm {name}", x)
            contenders[f"NM(2, 4) {name}, torch path"] = ours_half(f"nm {name} torch", x, native=False)
        times = interleaved(contenders, self.repeats)
        # (the half-precision masks are checked against the torch path's, outside the digest: it stays comparable)
        self._record({key: results[key] for key in ("nm", "nm earlier", "nm dim 0", "block", "rows")})

        def same(a: str, b: torch.Tensor) -> str:
            return "identical" if torch.equal(results[a], b) else "DIFFERENT"

        nm_dim0 = fp.compute_mask(fp.NM(2, 4), w.t().contiguous()).t()
        return [
            Row("g. N:M 2:4, 4096x4096", "NM(2, 4)", "floor", times, 1.5, False, same("nm", nm_ao_mask())),
            Row("g. N:M 2:4, 4096x4096", "NM(2, 4), torch path", "floor", times, None, False, same("nm torch", results["nm"])),
            Row("g. N:M 2:4, 4096x4096", "torch.ao 2:4", "NM(2, 4)", times, None, True, "masks: the row above"),
            Row("g. N:M 2:4, 4096x4096", "NM(2, 4) after a mask", "floor", times, 2.0, False),
            Row("g. N:M 2:4, 4096x4096", "NM(2, 4, dim=0)", "floor", times, None, False, same("nm dim 0", nm_dim0)),
            *(row for name in halves for row in (
                Row(f"g. N:M 2:4, 4096x4096 {name}", f"NM(2, 4) {name}", f"floor {name}", times, 1.5, False, same(f"nm {name}", results[f"nm {name} torch"])),
                Row(f"g. N:M 2:4, 4096x4096 {name}", f"NM(2, 4) {name}", "floor", times, None, False),
                Row(f"g. N:M 2:4, 4096x4096 {name}", f"NM(2, 4) {name}, torch path", f"floor {name}", times, None, False),
            )),
            Row("h. Block 4x4 50%, 4096x4096", "Block(0.5, (4, 4))", "floor", times, 2.0, False, same("block", block_ao_mask())),
            Row("h. Block 4x4 50%, 4096x4096", "Block, torch path", "floor", times, None, False, same("block torch", results["block"])),
            Row("h. Block 4x4 50%, 4096x4096", "torch.ao 4x4 blocks", "Block(0.5, (4, 4))", times, None, True, "masks: the row above"),
            Row("i. per-row L1 50%, 4096x4096", "PerSlice(L1Unstructured(0.5), dim=0)", "L1Unstructured(0.5)", times, 1.5, False),
            Row("i. per-row L1 50%, 4096x4096", "PerSlice, torch path", "L1Unstructured(0.5)", times, None, False, same("rows torch", results["rows"])),
            Row("i. per-row L1 50%, 4096x4096", "L1Unstructured(0.5)", "floor", times, None, False),
        ]

    def ensemble(self) -> list[Row]:
        torch.manual_seed(0)
        models = [nn.Sequential(nn.Linear(784, 300), nn.ReLU(), nn.Linear(300, 100), nn.ReLU(), nn.Linear(100, 10)) for _ in range(8)]  # fmt: skip
        stacked = {n: p.detach() for n, p in stack_module_state(models)[0].items()}
        singles = [{n: p.detach() for n, p in m.named_parameters()} for m in models]
        plan = fp.Plan({"*.weight": fp.L1Unstructured(0.5)})
        results: dict[str, object] = {}
        contenders = {
            "vmap": Contender(lambda: results.update(vmap=vmap(plan)(stacked))),
            "loop": Contender(lambda: results.update(loop=[plan(p) for p in singles])),
        }
        times = interleaved(contenders, 10 * self.repeats)
        batched, looped = results["vmap"], results["loop"]
        assert isinstance(batched, dict) and isinstance(looped, list)
        same = all(torch.equal(batched[n][i], looped[i][n]) for i in range(8) for n in looped[0])
        return [Row("f. masks of 8 stacked MLPs", "vmap", "loop", times, 1.0, False, "identical" if same else "DIFFERENT")]


def sparsifier(w: torch.Tensor, block: tuple[int, int], zeros: int, level: float) -> tuple[Contender, Callable[[], torch.Tensor]]:
    """torch.ao's ``WeightNormSparsifier`` on ``w`` (prepared once): its step, and its mask."""
    from torch.ao.pruning import WeightNormSparsifier  # type: ignore[attr-defined]

    layer = nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        layer.weight.copy_(w)
    model = nn.Sequential(layer)
    sparse = WeightNormSparsifier(sparsity_level=level, sparse_block_shape=block, zeros_per_block=zeros)
    sparse.prepare(model, config=[{"tensor_fqn": "0.weight"}])  # type: ignore[no-untyped-call]

    def mask() -> torch.Tensor:
        found: torch.Tensor = getattr(layer, "parametrizations").weight[0].mask
        return found

    return Contender(sparse.step), mask


def mlp() -> nn.Sequential:
    """An MLP of about 10M weights."""
    return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024), nn.ReLU(), nn.Linear(1024, 1024))


def memory_line(params: dict[str, torch.Tensor]) -> str:
    masks = fp.global_unstructured(list(params), fp.L1Unstructured(0.5))(params)
    ours = sum(m.numel() * m.element_size() for m in masks.values())
    holders = [Holder(p) for p in params.values()]
    tprune.global_unstructured([(h, "weight") for h in holders], tprune.L1Unstructured, amount=0.5)
    theirs = sum(h.mask.numel() * h.mask.element_size() for h in holders)
    return f"mask memory, ResNet-50 set: torch {theirs / 2**20:.1f} MB, funcprune {ours / 2**20:.1f} MB ({theirs / ours:.1f}x less)"


def run(threads: int, repeats: int, params: dict[str, torch.Tensor], only: str | None = None) -> tuple[list[Row], str, float]:
    torch.set_num_threads(threads)
    bench = Bench(params, repeats)
    if only == "shapes":
        rows = bench.shapes()
        return rows, bench.digest.hexdigest()[:16], statistics.median(interleaved({"floor": bench.floor}, 5 * repeats)["floor"])
    rows = bench.global_l1(0.2, 10, None) + bench.global_l1(0.5, 30, 4) + bench.global_l1(0.9, 10, None)
    rows += bench.per_layer_l1() + bench.ln_structured() + bench.training_step() + bench.ensemble()
    rows += bench.shapes()
    floor = statistics.median(interleaved({"floor": bench.floor}, 5 * repeats)["floor"])
    return rows, bench.digest.hexdigest()[:16], floor


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 repetitions per comparison (else 5)")
    parser.add_argument("--threads", default=f"1,{torch.get_num_threads()}", help="comma-separated thread counts")
    parser.add_argument("--no-payoff", action="store_true", help="skip the payoff table (shrink, sparse)")
    parser.add_argument("--only", choices=["shapes"], help="run one section only (its rows; the digest covers them only)")
    parser.add_argument(
        "--march", help="time the native kernels built for this CPU level instead of this machine's "
        "(x86-64-v3: the vector paths of an AVX2 CPU without AVX-512, on a CPU that has both)",
    )  # fmt: skip
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if args.march:
            where = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            library, status = _native.open_library(where, portable=False, march=args.march)
            if library is None:
                print(f"--march {args.march}: {status.detail}", file=sys.stderr)
                return 2
            stack.enter_context(_native.using(library))
            print(f"kernels built with -march={args.march}: {status.detail}")
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    repeats = 2 if args.quick else 5
    torch.manual_seed(0)
    params = {n: torch.randn(s) * (2.0 / (s[1] * (s[2] * s[3] if len(s) == 4 else 1))) ** 0.5 for n, s in resnet50_shapes().items()}  # fmt: skip
    total = sum(p.numel() for p in params.values())
    print(f"{datetime.date.today()}: funcprune {fp.__version__} vs torch.nn.utils.prune, torch {torch.__version__}")
    print(f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"ResNet-50 weight set: {len(params)} tensors, {total / 1e6:.1f}M weights; {repeats} interleaved repetitions")
    print(f"funcprune kernels: {_native.status().detail}; on torch's threads: {_native.threaded()}\n")
    print(HEADER)
    failed = False
    for threads in sorted({int(t) for t in args.threads.split(",")}):
        rows, digest, floor = run(threads, repeats, params, args.only)
        for row in rows:
            print(row.line(threads))
            failed |= row.masks == "DIFFERENT"
        print(f"| floor pass: gt(w, c, out=bool) over every weight | {threads} | {1e3 * floor:.1f} ms | | | | | | | masks digest {digest} |")
    if not args.only:
        print(f"\n{memory_line(params)}")
    if failed:
        print("funcprune's masks differ from torch's beyond ties", file=sys.stderr)
    if not args.no_payoff and not args.only:
        print("\nPayoff: shrunk and sparse models against the masked dense model (ratio > 1: faster)\n")
        print(HEADER)
        for threads in sorted({int(t) for t in args.threads.split(",")}):
            lines, ok = payoff.section(threads, repeats, size=1024 if args.quick else 4096)
            print("\n".join(lines), flush=True)
            if not ok:
                print("a shrunk or sparse model's outputs differ from the masked dense model's", file=sys.stderr)
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
