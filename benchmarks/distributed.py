"""funcprune on DTensors: worlds of 2 and 4 gloo processes beside one process.

Run from the repository root (after installing the package):

    python benchmarks/distributed.py                 # worlds 2 and 4, ResNet-50 set, 5 repetitions
    python benchmarks/distributed.py --world 2 --repeats 9
    python benchmarks/distributed.py --quick         # width/4 ResNet-50 (1.6M weights), 2 repetitions

Every world (1 = one process, plain tensors, no DTensor; 2 and 4 = gloo
processes on 127.0.0.1, a free port, each tensor a ``Shard(0)`` DTensor on a
1-D mesh) is a fresh set of processes started by
``torch.multiprocessing.start_processes``, each on 1 torch thread: forked
from a fork server, a fresh interpreter that imports torch once
(``--start-method spawn``: each rank a fresh interpreter, about 3 s of
imports per rank on 2 cores). A world that runs past ``--timeout`` is
terminated and fails the run; collectives time out after
:data:`COLLECTIVE_TIMEOUT` seconds. Two cases are
timed, interleaved, after an untimed warm-up call each: one global ranking
of every weight (``global_unstructured``, L1 50%) and a per-tensor plan
(``Plan({"*": L1Unstructured(0.5)})``). Every rank waits at a barrier before
each call.

What each column measures:

- time per call: ``perf_counter`` around one call, per rank; "rank 0" is
  rank 0's median (min) over the repetitions, "slowest" the median (min)
  over repetitions of the slowest rank's time in that repetition, which is
  when the last rank has its masks.
- collectives, bytes: one more call, under ``CommDebugMode`` (which counts
  collectives issued through the dispatcher, direct ``dist.all_reduce`` on
  plain tensors included) and a dispatch mode that adds up the bytes of the
  tensor each collective reduces. That is the payload per rank: a ring
  all-reduce moves about ``2 (p - 1) / p`` times it in and out of each rank.
  A counting wrapper around ``torch.distributed``'s collective functions
  checks the count; anything but ``all_reduce`` (an all-gather of a
  parameter, say) fails the run.
- peak memory: the growth of the process's peak resident set (``VmHWM``)
  during one call, over its resident set just before it. Before the call,
  ``malloc_trim(0)`` hands freed heap pages back to the system and writing
  ``5`` to ``/proc/self/clear_refs`` resets ``VmHWM`` to the current
  resident set, so the figure is what the call itself made resident:
  temporaries and its output masks (CPU tensors are invisible to
  tracemalloc). The parameters' own block is the "weights / rank" column.
- masks: after the timing, every rank gathers the DTensor masks
  (``full_tensor()``, not timed or counted) and rank 0 compares them with
  the single process's masks, bit for bit; "DIFFERENT" exits with status 1.
- selection rounds (lines under the table): every radix round all-reduces
  one histogram of ``funcprune._select._radix.BINS`` int64 (32 KiB), the first
  one's sum the unpruned count; a bracketed selection (from
  ``funcprune._select.SHARDED_BRACKET_MIN_KEYS`` weights per process) adds two rounds
  over a sample (the unpruned count beside the first: 8 B more) and one sum
  of two counts (16 B). Rounds are counted from the collectives' sizes;
  radix passes (over all keys, over a bracket's keys, over tied positions;
  a per-parameter plan's run in lockstep, their histograms all-reduced
  together) and selections by wrapping ``funcprune._select._sharded._search_all``,
  ``funcprune._select._sharded.keep_over_shards_each`` and
  ``funcprune._select._choose.keep_by_bracket_over_shards`` in the worker processes.

The weights are the conv and linear weights of ResNet-50 (``run.py``'s
shapes, He-scaled normal values). Every rank builds only its own rows: row
``r`` of tensor ``t`` is drawn from a generator seeded with ``(seed, t, r)``,
so every world size holds the same values without anyone building, or
sending, a whole tensor.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import json
import math
import multiprocessing
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from run import resnet50_shapes
from torch.multiprocessing.spawn import ProcessExitedException, start_processes
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import funcprune as fp
from funcprune import _native
from funcprune import _select
from funcprune._select import _choose, _radix, _sharded
from funcprune._types import is_dtensor

Masks = dict[str, torch.Tensor]

#: Seconds a collective may wait for the other ranks.
COLLECTIVE_TIMEOUT = 120
#: The collectives ``torch.distributed`` offers that a counting wrapper watches.
WATCHED = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter", "reduce",
)  # fmt: skip
#: What the fork server (a fresh interpreter, never this one, that ranks are forked from) imports
#: once, so that ranks do not each import torch (seconds per rank on 2 cores): ``--start-method``.
PRELOAD = ["__main__", "torch", "torch.distributed", "torch.distributed.tensor", "torch.distributed.tensor.debug", "funcprune"]
#: Bytes of one radix round's histogram.
HISTOGRAM_BYTES = _radix.BINS * 8

CASES: dict[str, Callable[[list[str]], Callable[[Masks], Masks]]] = {
    "global L1 50%": lambda names: fp.global_unstructured(names, fp.L1Unstructured(0.5)),
    "per-tensor L1 50%": lambda names: fp.Plan({"*": fp.L1Unstructured(0.5)}),
}


@dataclass(frozen=True)
class Config:
    shapes: dict[str, tuple[int, ...]]
    repeats: int
    seed: int
    out: str  # folder for results and the single process's masks


# --- the weights: every rank its own rows -------------------------------------------


def quick_shapes() -> dict[str, tuple[int, ...]]:
    """ResNet-50's 54 weight tensors at a quarter of the width (1.6M weights)."""
    return {
        n: tuple(d // 4 if i < 2 and d >= 64 else d for i, d in enumerate(s)) for n, s in resnet50_shapes().items()
    }


def chunk(n: int, pieces: int, index: int) -> tuple[int, int]:
    """Offset and length of piece ``index`` of ``n`` rows cut as ``torch.chunk`` (and ``Shard``) cut them."""
    step = -(-n // pieces)
    offset = min(index * step, n)
    return offset, min(step, n - offset)


def rows(seed: int, index: int, shape: tuple[int, ...], start: int, count: int) -> torch.Tensor:
    """Rows ``[start, start + count)`` of weight tensor ``index``: the same values whoever builds them."""
    width = math.prod(shape[1:])
    fan_in = width  # conv: in_channels * kh * kw; linear: in_features
    block = torch.empty((count, *shape[1:]))
    flat = block.view(count, width)
    g = torch.Generator()
    for r in range(count):
        g.manual_seed((seed * 1_000_003 + index) * 65_536 + start + r)
        torch.randn(width, generator=g, out=flat[r])
    return block.mul_((2.0 / fan_in) ** 0.5)


def weights(config: Config, rank: int, world: int) -> Masks:
    """This rank's weights: whole plain tensors in a world of 1, else ``Shard(0)`` DTensors of its rows."""
    if world == 1:
        return {n: rows(config.seed, i, s, 0, s[0]) for i, (n, s) in enumerate(config.shapes.items())}
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (world,))
    params: Masks = {}
    for i, (n, s) in enumerate(config.shapes.items()):
        start, count = chunk(s[0], world, rank)
        local = rows(config.seed, i, s, start, count)
        stride = tuple(math.prod(s[d + 1 :]) for d in range(len(s)))
        params[n] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size(s), stride=stride)
    return params


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's block of ``t`` (``t`` itself when it is a plain tensor)."""
    return t.to_local() if is_dtensor(t) else t


# --- measuring ---------------------------------------------------------------------


class CommBytes(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's __init_subclass__
    """The collectives the dispatcher sees, with the bytes of the tensor each one sends (its first)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.sizes: Counter[tuple[str, int]] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.namespace in ("c10d", "_c10d_functional", "c10d_functional"):
            tensors = [a for a in tree_flatten((args, kwargs or {}))[0] if isinstance(a, torch.Tensor)]
            self.sizes[(str(func), sum(t.numel() * t.element_size() for t in tensors[:1]))] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def counting_wrappers() -> Iterator[tuple[Counter[str], list[int]]]:
    """Counts calls of ``torch.distributed``'s collective functions, the radix select's passes and the selections.

    Only module attributes of this process are swapped (funcprune looks
    ``dist.all_reduce``, ``_search_all``, ``keep_over_shards_each`` and
    ``keep_by_bracket_over_shards`` up when it calls them); they are
    restored on exit. ``passes`` holds the radix passes (searches, run in
    lockstep or alone), the selections bracketed, and those that ranked
    every key (a missed bracket's too).
    """
    calls: Counter[str] = Counter()
    passes = [0, 0, 0]
    saved: dict[tuple[object, str], Any] = {}

    def wrap(owner: object, name: str, count: Callable[[tuple[Any, ...], Any], None]) -> None:
        original = getattr(owner, name)
        saved[(owner, name)] = original

        def counted(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            count(args, result)
            return result

        setattr(owner, name, counted)

    def add(i: int) -> Callable[[tuple[Any, ...], Any], None]:  # as many as the first argument lists
        return lambda args, _: passes.__setitem__(i, passes[i] + len(args[0]))

    def counter(name: str) -> Callable[[tuple[Any, ...], Any], None]:
        return lambda args, _: calls.update([name])

    for name in WATCHED:
        if hasattr(dist, name):
            wrap(dist, name, counter(name))
    wrap(_sharded, "_search_all", add(0))
    wrap(_choose, "keep_by_bracket_over_shards", lambda _, found: None if isinstance(found, int) else passes.__setitem__(1, passes[1] + 1))
    wrap(_sharded, "keep_over_shards_each", add(2))
    try:
        yield calls, passes
    finally:
        for (owner, name), original in saved.items():
            setattr(owner, name, original)


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def peak_growth(call: Callable[[], object]) -> int | None:
    """Bytes by which ``call`` raised this process's peak resident set over its resident set before.

    ``None`` where ``/proc/self/clear_refs`` cannot reset the peak (not Linux).
    """
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap pages back, so the call cannot reuse them unseen
    except (OSError, AttributeError):
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = _status_kib("VmRSS")
    except (OSError, KeyError):
        return None
    result = call()
    peak = _status_kib("VmHWM")
    del result
    return 1024 * (peak - before)


# --- one rank ----------------------------------------------------------------------


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def rank_main(rank: int, world: int, port: int, config: Config) -> None:
    """Everything one rank does; its results go to ``world{W}_rank{R}.json`` in ``config.out``."""
    torch.set_num_threads(1)
    if world > 1:
        try:
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT),
            )  # fmt: skip
        except Exception as e:  # noqa: BLE001 (the port was taken: the parent retries with another)
            print(f"rank {rank}: init_process_group failed: {e}", file=sys.stderr)
            sys.exit(3)
    try:
        result = _measure(rank, world, config)
    finally:
        if world > 1:
            dist.destroy_process_group()
    Path(config.out, f"world{world}_rank{rank}.json").write_text(json.dumps(result))


def _measure(rank: int, world: int, config: Config) -> dict[str, Any]:
    params = weights(config, rank, world)
    names = list(params)
    plans = {case: make(names) for case, make in CASES.items()}
    result: dict[str, Any] = {
        "weight_bytes": sum(local(p).numel() * local(p).element_size() for p in params.values()),
        "times": {c: [] for c in CASES},
    }
    for plan in plans.values():  # warm-up
        _barrier(world)
        plan(params)
    result["memory"] = {}
    for case, plan in plans.items():
        _barrier(world)
        result["memory"][case] = peak_growth(lambda: plan(params))
    for _ in range(config.repeats):
        for case, plan in plans.items():
            _barrier(world)
            start = time.perf_counter()
            plan(params)
            result["times"][case].append(time.perf_counter() - start)
    result["comm"], result["masks"] = {}, {}
    for case, plan in plans.items():
        _barrier(world)
        masks, comm = _communication(world, lambda: plan(params))
        result["comm"][case] = comm
        result["masks"][case] = _check(rank, world, config, case, masks)
    return result


def _communication(world: int, call: Callable[[], Masks]) -> tuple[Masks, dict[str, Any]]:
    """``call()``'s masks, and the collectives it issued: ops, sizes, wrapper counts, radix passes."""
    if world == 1:
        with counting_wrappers() as (calls, passes):
            masks = call()
        return masks, {"ops": {}, "sizes": [], "calls": dict(calls), "passes": passes[0], "bracketed": passes[1], "ranked": passes[2]}
    from torch.distributed.tensor.debug import CommDebugMode

    with counting_wrappers() as (calls, passes), CommDebugMode() as mode, CommBytes() as sent:  # type: ignore[no-untyped-call]
        masks = call()
    ops = {str(op): n for op, n in mode.get_comm_counts().items()}
    sizes = [[op, size, n] for (op, size), n in sorted(sent.sizes.items())]
    return masks, {"ops": ops, "sizes": sizes, "calls": dict(calls), "passes": passes[0], "bracketed": passes[1], "ranked": passes[2]}


def _check(rank: int, world: int, config: Config, case: str, masks: Masks) -> str:
    """The single process saves its masks; in a world, rank 0 compares the gathered masks with them."""
    path = Path(config.out, f"reference {case}.pt")
    if world == 1:
        torch.save(masks, path)
        return "reference"
    whole = {n: m.full_tensor() for n, m in masks.items()}  # type: ignore[attr-defined]  # DTensor masks
    if rank != 0:
        return ""
    reference: Masks = torch.load(path)
    same = list(whole) == list(reference) and all(
        m.dtype == torch.bool and torch.equal(m, reference[n]) for n, m in whole.items()
    )
    return "identical" if same else "DIFFERENT"


# --- the parent --------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_world(world: int, config: Config, timeout: float, method: str, attempts: int = 3) -> list[dict[str, Any]]:
    """Starts ``world`` ranks, waits at most ``timeout`` seconds, and returns their results in rank order."""
    for attempt in range(attempts):
        port = _free_port()
        context = start_processes(  # type: ignore[no-untyped-call]
            rank_main, args=(world, port, config), nprocs=world, join=False, start_method=method
        )
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=1):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the world of {world} took over {timeout:.0f} s")
        except ProcessExitedException as e:
            if e.exit_code == 3 and attempt < attempts - 1:
                continue  # another process took the port: try another
            raise
        finally:
            for p in context.processes:
                if p.is_alive():
                    p.terminate()
                    p.join(10)
        return [json.loads(Path(config.out, f"world{world}_rank{r}.json").read_text()) for r in range(world)]
    raise AssertionError("unreachable")


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.0f}" if seconds >= 0.1 else f"{1e3 * seconds:.1f}"


def _payload(size: int) -> str:
    """A collective's payload: a histogram with a count beside it shown as the two."""
    if size == HISTOGRAM_BYTES + 8:
        return f"({_bytes(HISTOGRAM_BYTES)} + 8 B)"
    return _bytes(size)


def _bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


@dataclass
class Summary:
    rows: list[str]
    rounds: list[str]
    failed: list[str]


def summarize(world: int, results: list[dict[str, Any]]) -> Summary:
    """Table rows (one per case) and the selection-rounds lines of one world."""
    out = Summary([], [], [])
    weight_bytes = max(r["weight_bytes"] for r in results)
    for case in CASES:
        times = [r["times"][case] for r in results]
        slowest = [max(ts) for ts in zip(*times, strict=True)]
        memory = [r["memory"][case] for r in results]
        peak = "n/a" if None in memory else _bytes(max(memory))
        comm = [r["comm"][case] for r in results]
        masks = results[0]["masks"][case]
        if masks == "DIFFERENT":
            out.failed.append(f"world {world}, {case}: masks differ from the single process's")
        first = comm[0]
        collectives = sum(n for _, _, n in first["sizes"])
        sent = sum(size * n for _, size, n in first["sizes"])
        if any(c["sizes"] != first["sizes"] for c in comm):
            out.failed.append(f"world {world}, {case}: ranks issued different collectives")
        if set(first["ops"]) - {"c10d.allreduce_"} or set(first["calls"]) - {"all_reduce"}:
            out.failed.append(f"world {world}, {case}: collectives other than all_reduce: {first['ops']}, {first['calls']}")
        if sum(first["calls"].values()) != collectives or sum(first["ops"].values()) != collectives:
            out.failed.append(
                f"world {world}, {case}: the dispatcher saw {collectives} collectives, CommDebugMode "
                f"{sum(first['ops'].values())}, the wrapper {sum(first['calls'].values())}"
            )
        time_cell = f"{_ms(statistics.median(times[0]))} / {_ms(statistics.median(slowest))}"
        min_cell = f"{_ms(min(times[0]))} / {_ms(min(slowest))}"
        kinds = ", ".join(f"{n} x {_payload(size)}" for _, size, n in first["sizes"]) or "none"
        out.rows.append(
            f"| {world} | {case} | {time_cell} | {min_cell} | {collectives} ({kinds}) | {_bytes(sent)} | "
            f"{_bytes(weight_bytes)} | {peak} | {masks} |"
        )
        if world > 1:
            stacked = [(size // HISTOGRAM_BYTES, n) for _, size, n in first["sizes"] if size % HISTOGRAM_BYTES == 0]
            counted = sum(n for _, size, n in first["sizes"] if size == HISTOGRAM_BYTES + 8)
            rounds = sum(n for _, n in stacked) + counted
            histograms = sum(h * n for h, n in stacked) + counted
            selections = first["bracketed"] + first["ranked"]
            pairs = sum(n for _, size, n in first["sizes"] if size == 16)
            out.rounds.append(
                f"- world {world}, {case}: {selections} selection(s), {first['bracketed']} bracketed, "
                f"{first['passes']} radix pass(es) (one per selection, over all keys or the bracket's; another "
                f"only for ties at the cut), {histograms} histograms in {rounds} all-reduces (a plan's "
                f"selections in lockstep share each round's); each rank sends {histograms} x "
                f"{_bytes(HISTOGRAM_BYTES)} + {counted} x 8 B (the unpruned count beside a sample's first round; "
                f"a radix select's first histogram sums to it) + {pairs} x 16 B = {_bytes(sent)} per call"
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", default="2,4", help="comma-separated world sizes (1, the single process, always runs)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per case (default 5, --quick 2)")
    parser.add_argument("--quick", action="store_true", help="ResNet-50 at a quarter of the width, 2 repetitions")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per world (default 600, --quick 120)")
    methods = [m for m in ("forkserver", "spawn") if m in multiprocessing.get_all_start_methods()]
    parser.add_argument(
        "--start-method", choices=methods, default=methods[0],
        help="how ranks start: forked from a fresh fork server that imported torch once (default where "
        "there is one), or each a fresh spawned interpreter",
    )  # fmt: skip
    args = parser.parse_args()
    worlds = sorted({1, *(int(w) for w in args.world.split(","))})
    repeats = args.repeats or (2 if args.quick else 5)
    timeout = args.timeout or (120.0 if args.quick else 600.0)
    shapes = quick_shapes() if args.quick else resnet50_shapes()
    total = sum(math.prod(s) for s in shapes.values())
    started = time.monotonic()
    if args.start_method == "forkserver":
        multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    print(f"{datetime.date.today()}: funcprune {fp.__version__}, torch {torch.__version__}, gloo on 127.0.0.1")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; every "
        "process runs 1 torch thread"
        + (f" (worlds of more than {os.cpu_count()} processes oversubscribe the cores)" if max(worlds) > (os.cpu_count() or 1) else "")
    )
    print(
        f"{'quick: ResNet-50 at 1/4 width' if args.quick else 'ResNet-50 weight set'}: {len(shapes)} tensors, "
        f"{total / 1e6:.1f}M float32 weights, each a Shard(0) DTensor on a 1-D mesh in worlds > 1; "
        f"{repeats} interleaved repetitions after a warm-up call, a barrier before each call"
    )
    print(
        f"funcprune's kernels: {_native.status().detail}; DTensor blocks: funcprune._select's radix "
        f"select (its first round in those kernels where they load), bracketed from "
        f"{_select.SHARDED_BRACKET_MIN_KEYS} weights per process in a selection (funcprune._select._sharded_bracket)\n"
    )
    failed: list[str] = []
    summaries = []
    walls: list[str] = []
    with tempfile.TemporaryDirectory(prefix="funcprune-distributed-") as out:
        config = Config(shapes, repeats, seed=0, out=out)
        for world in worlds:
            begun = time.monotonic()
            summaries.append(summarize(world, run_world(world, config, timeout, args.start_method)))
            walls.append(f"world {world}: {time.monotonic() - begun:.0f} s")
    print(
        "| world | case | ms per call, median (rank 0 / slowest) | min (rank 0 / slowest) | collectives per call "
        "| bytes sent per rank per call | weights / rank | peak memory growth per rank (max) | masks |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    for s in summaries:
        print("\n".join(s.rows))
        failed += s.failed
    print("\nSelection rounds (from the collectives' sizes; passes and bracketed selections from wrappers):")
    for s in summaries:
        print("\n".join(s.rounds))
    print(
        "\nBytes are each rank's payload (the tensors it all-reduces); a ring all-reduce moves about "
        "2 (p - 1) / p times that in and out of each rank. Peak memory: growth of VmHWM over VmRSS during "
        "one call (temporaries and the output masks), after malloc_trim."
    )
    print(f"run time: {time.monotonic() - started:.0f} s ({', '.join(walls)}, start-up included)")
    for line in failed:
        print(line, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
