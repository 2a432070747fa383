"""The payoff of masks, measured: shrunk and sparse models against the masked dense one.

Run from the repository root (after installing the package); ``run.py``
prints the same table after its own:

    python benchmarks/payoff.py                  # 1 thread, then the default count
    python benchmarks/payoff.py --threads 1      # one setting only
    python benchmarks/payoff.py --quick          # 2 repetitions, 1024x1024 weights

- **shrink**: a VGG-style CNN with BatchNorm and an MLP, every layer but the
  last pruned with ``LnStructured(1 - kept, n=2, dim=0)`` so that 50% or 25%
  of its channels are kept; ``fp.shrink(model, masks, x)`` against the
  *masked dense* model (the closure's masks, ``fp.propagate``, multiplied
  into a copy's weights: the same outputs at the dense cost).
- **sparse**: one 4096x4096 float32 Linear weight pruned by
  ``L1Unstructured(sparsity=s)`` (CSR) or ``Block(sparsity=s, shape=(32, 32))``
  (BSR), ``F.linear`` through ``fp.to_sparse`` against ``F.linear`` with
  the dense masked weight, for one input row and for 64; the break-even
  sparsity (where sparse is as fast as dense) is interpolated between the
  measured sparsities.

All run under ``torch.inference_mode()``, interleaved (dense, other, dense,
other, ...) in blocks of about 30 ms after a warm-up; the ratio is dense /
other, so above 1 the payoff is faster. The script exits with status 1 if
a shrunk or sparse model's outputs differ from the masked dense model's.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

import funcprune as fp
from _timing import HEADER, Contender, Row, calls_for, interleaved

#: Seconds per timed block.
BLOCK = 0.03
SPARSITIES = (0.5, 0.7, 0.8, 0.9, 0.95, 0.99)
BSR_BLOCK = (32, 32)


def cnn() -> nn.Sequential:
    """A VGG-style CNN for 32x32 images (about 0.14 M parameters)."""

    def block(c_in: int, c_out: int) -> list[nn.Module]:
        return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU()]

    return nn.Sequential(
        *block(3, 32), *block(32, 32), nn.MaxPool2d(2),
        *block(32, 64), *block(64, 64), nn.MaxPool2d(2),
        *block(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    )  # fmt: skip


def mlp() -> nn.Sequential:
    """An MLP 512 -> 1024 -> 1024 -> 10 (about 1.6 M parameters)."""
    return nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def seeded(model: nn.Module, seed: int) -> nn.Module:
    """``model`` with seeded weights and non-trivial BatchNorm statistics, in eval mode."""
    torch.manual_seed(seed)
    for mod in model.modules():
        if isinstance(mod, nn.BatchNorm2d):
            with torch.no_grad():
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
                mod.running_mean.uniform_(-0.2, 0.2)  # type: ignore[union-attr]
                mod.running_var.uniform_(0.5, 2.0)  # type: ignore[union-attr]
    return model.eval()


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@dataclass(frozen=True)
class Outcome:
    """A section's rows and whether every output check passed."""

    rows: list[Row]
    notes: list[str]
    ok: bool


def versus_dense(case: str, dense: Callable[[], torch.Tensor], other: Callable[[], torch.Tensor], name: str,
                 repeats: int, checked: str) -> tuple[Row, float]:  # fmt: skip
    """``dense`` against ``other``, interleaved; the row and the largest output difference.

    The difference is relative to the largest dense output (or to 1, if that is smaller).
    """
    with torch.inference_mode():
        expected = dense()
        diff = float((expected - other()).abs().max() / expected.abs().max().clamp(min=1.0))
        contenders = {
            "masked dense": Contender(dense, calls=calls_for(dense, BLOCK)),
            name: Contender(other, calls=calls_for(other, BLOCK)),
        }
        times = interleaved(contenders, repeats)
    return Row(case, "masked dense", name, times, None, masks=f"{checked}; relative max diff {diff:.0e}"), diff


def shrink_rows(repeats: int) -> Outcome:
    """Shrunk models with 50% and 25% of their channels kept, against the masked dense ones."""
    generator = torch.Generator().manual_seed(0)
    models = [
        ("CNN (BN), 4x3x32x32", cnn, torch.randn(4, 3, 32, 32, generator=generator)),
        ("MLP 512-1024-1024-10, 32 rows", mlp, torch.randn(32, 512, generator=generator)),
    ]
    rows, ok = [], True
    for seed, (label, make, x) in enumerate(models):
        model = seeded(make(), seed)
        params = dict(model.named_parameters())
        for kept in (0.5, 0.25):
            plan = fp.Plan({n: fp.LnStructured(1.0 - kept, n=2, dim=0) for n in fp.prunable(model)[:-1]})
            masks = plan(params)
            dense = copy.deepcopy(model)
            fp.apply_masks_(dict(dense.named_parameters()), fp.propagate(model, masks, x))
            small = fp.shrink(model, masks, x)
            checked = f"params {count(model):,} -> {count(small):,}"
            row, diff = versus_dense(f"shrink {label}, {kept:.0%} of channels kept", lambda: dense(x),
                                     lambda: small(x), "shrunk", repeats, checked)  # fmt: skip
            rows.append(row)
            ok &= diff <= 1e-5
    return Outcome(rows, [], ok)


def sparse_rows(repeats: int, size: int, sparsities: tuple[float, ...]) -> Outcome:
    """CSR and BSR Linear weights at several sparsities, batch 1 and 64, and their break-even."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(size, size, generator=generator)
    rows, notes, ok = [], [], True
    layouts: tuple[tuple[Literal["csr", "bsr"], tuple[int, int] | None], ...] = (("csr", None), ("bsr", BSR_BLOCK))
    for layout, blocksize in layouts:
        for batch in (1, 64):
            x = torch.randn(batch, size, generator=generator)
            points = []
            for s in sparsities:
                spec: fp.Spec = fp.L1Unstructured(sparsity=s) if blocksize is None else fp.Block(sparsity=s, shape=blocksize)
                masks = {"w": fp.compute_mask(spec, weight)}
                dense_w = fp.apply_masks({"w": weight}, masks)["w"]
                sparse_w = fp.to_sparse({"w": weight}, masks, layout=layout, blocksize=blocksize,
                                        below_break_even="allow")["w"]  # fmt: skip
                what = "" if blocksize is None else f" {blocksize[0]}x{blocksize[1]}"
                row, diff = versus_dense(f"{layout}{what} {s:.0%} sparse, batch {batch}", lambda: F.linear(x, dense_w),
                                         lambda: F.linear(x, sparse_w), layout, repeats, "outputs")  # fmt: skip
                rows.append(row)
                points.append((s, row.ratio))
                ok &= diff <= 1e-5
            notes.append(f"{layout} batch {batch}: break-even {break_even(points)} (sparse as fast as dense)")
    return Outcome(rows, notes, ok)


def break_even(points: list[tuple[float, float]]) -> str:
    """The sparsity where the speed-up crosses 1, interpolated in log speed-up."""
    points = sorted(points)
    if points[0][1] >= 1.0:
        return f"at or below {points[0][0]:.0%}"
    for (s0, v0), (s1, v1) in zip(points, points[1:]):
        if v0 < 1.0 <= v1:
            t = -math.log(v0) / (math.log(v1) - math.log(v0))
            return f"{s0 + t * (s1 - s0):.0%}"
    return f"above {points[-1][0]:.0%}"


def section(threads: int, repeats: int, *, size: int = 4096) -> tuple[list[str], bool]:
    """The payoff table's lines at ``threads`` threads, and whether every output check passed."""
    torch.set_num_threads(threads)
    shrunk = shrink_rows(repeats)
    sparse = sparse_rows(repeats, size, SPARSITIES)
    lines = [row.line(threads) for row in shrunk.rows + sparse.rows]
    lines += [f"| {note} | {threads} | | | | | | | | |" for note in sparse.notes]
    return lines, shrunk.ok and sparse.ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 repetitions, 1024x1024 weights")
    parser.add_argument("--threads", default=f"1,{torch.get_num_threads()}", help="comma-separated thread counts")
    args = parser.parse_args()
    ok = True
    print(HEADER)
    for threads in sorted({int(t) for t in args.threads.split(",")}):
        lines, passed = section(threads, 2 if args.quick else 5, size=1024 if args.quick else 4096)
        print("\n".join(lines), flush=True)
        ok &= passed
    if not ok:
        print("a shrunk or sparse model's outputs differ from the masked dense model's", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
