"""Break-even sparsity of sparse weights: ``F.linear`` with CSR and BSR against dense.

Run from the repository root (after installing the package):

    python benchmarks/_sparse_breakeven.py            # 4096x4096, 1 thread (about 2 minutes)
    python benchmarks/_sparse_breakeven.py --quick    # 1024x1024, 3 repetitions: a smoke run
    python benchmarks/_sparse_breakeven.py --device cuda   # adds 2:4 (semi_structured), float16

For each layout, batch size (rows of ``x``) and sparsity, the weights come
from :func:`funcprune._sparse.to_sparse` (what a user gets) and the dense
contender is the masked weight from :func:`funcprune.apply_masks`; both run
``F.linear(x, W)`` with no bias under ``torch.inference_mode``. CSR gets
unstructured random masks; BSR gets masks of whole random blocks of its
blocksize, and its sparsity is the fraction of blocks pruned. The row "csr
int64" converts with torch's own ``Tensor.to_sparse_csr()``, whose ``int64``
indices torch converts for MKL on every call (``to_sparse`` makes ``int32``
ones). The two
contenders alternate (dense, sparse, dense, sparse, ...) after an untimed
warm-up, each timed over enough calls to last ``--min-time`` seconds; a row
reports their median times per call and the median of the per-repetition
speedups (dense time / sparse time: above 1, sparse is faster). The last
table interpolates, for each layout and batch size, the sparsity where the
speedup crosses 1 (linearly in the log of the speedup, between the two
sparsities measured around it): the break-even constants of
``funcprune/_sparse.py`` come from it. ``run.py``'s payoff table (``payoff.py``)
measures the CSR and BSR rows of this sweep at 4096x4096; this script adds
options (size, dtype, CUDA with 2:4, torch's own CSR conversion).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from _timing import Contender, calls_for, interleaved
from payoff import SPARSITIES, break_even

import funcprune as fp
from funcprune._payoff._sparse import SparseLayout, to_sparse


@dataclass(frozen=True)
class Case:
    """One layout to measure: its name in the tables, ``to_sparse``'s layout and blocksize."""

    label: str
    layout: SparseLayout
    blocksize: tuple[int, int] | None = None
    #: Convert with torch's own ``Tensor.to_sparse_csr()`` (``int64`` indices), for comparison.
    torch_csr: bool = False


@dataclass(frozen=True)
class Row:
    """The measurements of one case at one batch size and sparsity."""

    case: Case
    batch: int
    sparsity: float
    dense_ms: float
    sparse_ms: float
    speedup: float


def random_mask(shape: tuple[int, int], sparsity: float, block: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    """A mask pruning exactly ``round(sparsity * blocks)`` random blocks of ``block``."""
    grid = (shape[0] // block[0], shape[1] // block[1])
    count = grid[0] * grid[1]
    kept = torch.ones(count, dtype=torch.bool)
    kept[torch.randperm(count, generator=gen)[: round(sparsity * count)]] = False
    blocks = kept.reshape(grid)
    return blocks.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)


def two_four_mask(shape: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    """A random 2:4 mask: 2 kept in every 4 consecutive entries of a row."""
    scores = torch.rand(shape[0], shape[1] // 4, 4, generator=gen)
    top = scores.topk(2, dim=-1).indices
    mask = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, top, True)
    return mask.reshape(shape)


def measure(
    dense: Callable[[], object], sparse: Callable[[], object], repeats: int, min_time: float,
    sync: Callable[[], None],
) -> tuple[float, float, float]:  # fmt: skip
    """Median dense and sparse times per call, and the median of the per-repetition speedups."""
    contenders = {
        "dense": Contender(dense, calls=calls_for(dense, min_time, sync)),
        "sparse": Contender(sparse, calls=calls_for(sparse, min_time, sync)),
    }
    times = interleaved(contenders, repeats, sync)
    speedups = [d / s for d, s in zip(times["dense"], times["sparse"])]
    return statistics.median(times["dense"]), statistics.median(times["sparse"]), statistics.median(speedups)


def run_case(
    case: Case, weight: torch.Tensor, batch: int, sparsity: float, args: argparse.Namespace,
    gen: torch.Generator,
) -> Row:  # fmt: skip
    """Measure ``case`` at one batch size and sparsity."""
    shape = (weight.shape[0], weight.shape[1])
    if case.layout == "semi_structured":
        mask = two_four_mask(shape, gen).to(weight.device)
    else:
        mask = random_mask(shape, sparsity, case.blocksize or (1, 1), gen).to(weight.device)
    params = {"w": weight}
    dense_w = fp.apply_masks(params, {"w": mask})["w"]
    sparse_w = to_sparse(params, {"w": mask}, layout=case.layout, blocksize=case.blocksize,
                         below_break_even="allow")["w"]  # fmt: skip
    if case.torch_csr:
        with torch.inference_mode():
            sparse_w = dense_w.to_sparse_csr()
    x = torch.randn(batch, shape[1], generator=gen).to(weight)
    sync = torch.cuda.synchronize if weight.is_cuda else (lambda: None)
    with torch.inference_mode():
        times = measure(lambda: F.linear(x, dense_w), lambda: F.linear(x, sparse_w),
                        args.repeats, args.min_time, sync)  # fmt: skip
    return Row(case, batch, sparsity, times[0] * 1e3, times[1] * 1e3, times[2])


def cases(device: str) -> list[Case]:
    found = [
        Case("csr", "csr"),
        Case("csr int64", "csr", torch_csr=True),
        Case("bsr 16x16", "bsr", (16, 16)),
        Case("bsr 32x32", "bsr", (32, 32)),
    ]
    if device == "cuda":
        found.append(Case("2:4 float16", "semi_structured"))
    return found


def header(args: argparse.Namespace) -> str:
    machine = f"{platform.machine()} {platform.processor() or ''}".strip()
    if args.device == "cuda":
        machine += f", {torch.cuda.get_device_name()}"
    return (
        f"# {datetime.date.today()}, torch {torch.__version__}, Python {platform.python_version()}, "
        f"{machine}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch thread(s), "
        f"{args.size}x{args.size} {args.dtype} weights, {args.repeats} repetitions of "
        f">= {args.min_time * 1e3:.0f} ms"
    )


def print_tables(rows: Sequence[Row], batches: Sequence[int]) -> None:
    print(f"{'layout':<12} {'batch':>5} {'sparsity':>8} {'dense ms':>9} {'sparse ms':>10} {'speedup':>8}")
    for r in rows:
        print(f"{r.case.label:<12} {r.batch:>5} {r.sparsity:>8.0%} {r.dense_ms:>9.3f} "
              f"{r.sparse_ms:>10.3f} {r.speedup:>7.2f}x")  # fmt: skip
    print("\nbreak-even sparsity (sparse as fast as dense):")
    for label in dict.fromkeys(r.case.label for r in rows):
        if label.startswith("2:4"):
            continue
        found = [break_even([(r.sparsity, r.speedup) for r in rows if r.case.label == label and r.batch == b])
                 for b in batches]  # fmt: skip
        print(f"{label:<12} " + ", ".join(f"batch {b}: {f}" for b, f in zip(batches, found)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1024x1024 weights, 3 repetitions")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--size", type=int, default=4096, help="the weight is size x size")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--min-time", type=float, default=0.03, help="seconds per timing")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    args = parser.parse_args()
    if args.quick:
        args.size, args.repeats, args.min_time = 1024, 3, 0.005
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
    gen = torch.Generator().manual_seed(0)
    dtype = getattr(torch, args.dtype)
    print(header(args), flush=True)
    rows: list[Row] = []
    for case in cases(args.device):
        wdtype = torch.float16 if case.layout == "semi_structured" else dtype
        weight = torch.randn(args.size, args.size, generator=gen).to(args.device, wdtype)
        for batch in args.batches:
            for sparsity in (0.5,) if case.layout == "semi_structured" else SPARSITIES:
                rows.append(run_case(case, weight, batch, sparsity, args, gen))
                print(f"  {case.label} batch {batch} {sparsity:.0%}: {rows[-1].speedup:.2f}x",
                      file=sys.stderr, flush=True)  # fmt: skip
    print_tables(rows, args.batches)
    return 0


if __name__ == "__main__":
    sys.exit(main())
