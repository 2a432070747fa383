"""funcprune on DTensors: worlds of 2 and 4 gloo processes beside one process.

Run from the repository root (after installing the package; the structured
suite needs the ``hf`` extra, transformers):

    python benchmarks/distributed.py                 # worlds 2 and 4, both suites (about 10 min on 2 shared cores)
    python benchmarks/distributed.py --world 2 --repeats 9
    python benchmarks/distributed.py --only unstructured   # the ResNet-50 set only, 5 repetitions
    python benchmarks/distributed.py --only structured     # the 1.1B Llama's units only, 3 repetitions
    python benchmarks/distributed.py --quick         # width/4 ResNet-50 (1.6M weights), a 48M Llama, 2 repetitions

Two suites, each its own set of worlds (``--only`` picks one):

- unstructured: the ResNet-50 weight set (below), a global plan and a
  per-tensor plan.
- structured: ``fp.structured`` over the units of a Llama of about 1B
  parameters (:data:`LLAMA_1B`: hidden 2048, MLP 8192, 16 layers, 32 query
  heads in 8 KV groups, vocabulary 32000; 1.10B parameters, printed), its
  MLP channels (8192 per layer) and KV groups (8 per layer), L2 norms,
  25%, ``normalize="mean"``: one plan over both kinds (``scope="global"``:
  they compete, each layer's group normalized to mean 1), and two plans,
  one per kind (so 25% of the KV groups go too: with random weights the
  normalized KV-group norms all lie within a hair of 1, and the single
  plan's 25% all come from the channels). The parameters are the units'
  member weights only (q/k/v/o and gate/up/down of every layer, 973M
  float32 weights, 3.6 GiB in one process): no embeddings, norms or LM
  head, which no unit touches. Nothing traces the 1B model: its
  ``fp.Structure`` is built from the config (:meth:`Llama.structure`), and
  before any world starts the same builder, applied to a tiny Llama config
  (:data:`LLAMA_TINY`), must equal ``fp.structure`` of that tiny
  ``LlamaForCausalLM`` (order included), its member shapes and parameter
  count those of the model, or the run fails.

Every world (1 = one process, plain tensors, no DTensor; 2 and 4 = gloo
processes on 127.0.0.1, a free port, each tensor a ``Shard(0)`` DTensor on a
1-D mesh, as ``fully_shard`` lays out parameters) is a fresh set of processes started by
``torch.multiprocessing.start_processes``, each on 1 torch thread: forked
from a fork server, a fresh interpreter that imports torch once
(``--start-method spawn``: each rank a fresh interpreter, about 3 s of
imports per rank on 2 cores). A world that runs past ``--timeout`` is
terminated and fails the run; collectives time out after
:data:`COLLECTIVE_TIMEOUT` seconds. A suite's cases are
timed, interleaved, after an untimed warm-up call each (unstructured: one
global ranking of every weight, ``global_unstructured``, L1 50%, and a
per-tensor plan, ``Plan({"*": L1Unstructured(0.5)})``; structured: the two
above, a two-plan case timed as one call of both). Every rank waits at a
barrier before each call.

What each column measures:

- time per call: ``perf_counter`` around one call, per rank; "rank 0" is
  rank 0's median (min) over the repetitions, "slowest" the median (min)
  over repetitions of the slowest rank's time in that repetition, which is
  when the last rank has its masks. Under the table, each rank's median
  CPU time per call (``process_time``: its own work, gloo's threads
  included, whatever the contention for the cores), for worlds that
  oversubscribe or share the cores.
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
  (``full_tensor()``, not timed or counted, one tensor at a time) and rank
  0 compares them with the single process's masks (saved to a temporary
  folder, read back memory-mapped), bit for bit; "DIFFERENT" exits with
  status 1.
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
- units (lines under the structured table): the units each plan ranks,
  the units it pruned (counted in the single process's masks), and the
  bytes sent per unit. A structured plan all-reduces float64 numbers per
  unit (the maxima, then the rounded sums), never a weight, so the bytes
  follow the unit count, not the weights or the world size. One process's
  masks are stride-0 views of each unit's flag; a DTensor mask's local
  block is contiguous (``_plans._held_members.HeldMembers.wrapped``), a byte per
  weight, which the peak-memory column shows.

The unstructured suite's weights are the conv and linear weights of
ResNet-50 (``run.py``'s shapes), the structured suite's the Llama's member
weights; both He-scaled normal values. Every rank builds only its own
rows: row ``r`` of tensor ``t`` is drawn from a generator seeded with
``(seed, t, r)``, so every world size holds the same values without anyone
building, or sending, a whole tensor.
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

import _timing  # noqa: F401 (first: torchvision's meta registrations stubbed before transformers imports it)
import torch
import torch.distributed as dist
from run import resnet50_shapes
from torch.multiprocessing.spawn import ProcessExitedException, start_processes
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import funcprune as fp
from funcprune import _native, _select
from funcprune._select import _choose, _radix, _sharded
from funcprune._units import Kind
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


@dataclass(frozen=True)
class Llama:
    """A ``LlamaConfig``'s sizes: its units' member weights and their ``fp.Structure``, built without a model."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def describe(self) -> str:
        return (
            f"hidden {self.hidden}, MLP {self.intermediate}, {self.layers} layers, {self.heads} query heads in "
            f"{self.kv_heads} KV groups, vocabulary {self.vocab}"
        )

    def config(self) -> Any:
        """The ``transformers.LlamaConfig`` of these sizes (untied embeddings, as ``LlamaConfig``'s default)."""
        import transformers

        return transformers.LlamaConfig(
            vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
            num_hidden_layers=self.layers, num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
            max_position_embeddings=64,
        )  # fmt: skip

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The member weights' shapes, named and ordered as ``LlamaForCausalLM.named_parameters()``."""
        h, d = self.hidden, self.head_dim
        out: dict[str, tuple[int, ...]] = {}
        for i in range(self.layers):
            a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
            out |= {
                a + "q_proj.weight": (self.heads * d, h), a + "k_proj.weight": (self.kv_heads * d, h),
                a + "v_proj.weight": (self.kv_heads * d, h), a + "o_proj.weight": (h, self.heads * d),
                m + "gate_proj.weight": (self.intermediate, h), m + "up_proj.weight": (self.intermediate, h),
                m + "down_proj.weight": (h, self.intermediate),
            }  # fmt: skip
        return out

    def structure(self) -> fp.Structure:
        """What ``fp.structure`` reads from the model: per layer its KV groups, then its MLP channels."""
        d, per_group = self.head_dim, self.heads // self.kv_heads
        groups: dict[str, fp.UnitGroup] = {}
        for i in range(self.layers):
            a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
            groups[a] = fp.UnitGroup("kv_groups", self.kv_heads, (
                fp.Member(f"{a}.q_proj.weight", 0, per_group * d), fp.Member(f"{a}.k_proj.weight", 0, d),
                fp.Member(f"{a}.v_proj.weight", 0, d), fp.Member(f"{a}.o_proj.weight", 1, per_group * d),
            ))  # fmt: skip
            groups[m] = fp.UnitGroup("channels", self.intermediate, (
                fp.Member(f"{m}.gate_proj.weight", 0, 1), fp.Member(f"{m}.up_proj.weight", 0, 1),
                fp.Member(f"{m}.down_proj.weight", 1, 1),
            ))  # fmt: skip
        return fp.Structure(groups)

    def parameters(self) -> int:
        """The whole model's parameter count: the members, two norms per layer, the final norm, embeddings, LM head."""
        members = sum(math.prod(s) for s in self.shapes().values())
        return members + (2 * self.layers + 1) * self.hidden + 2 * self.vocab * self.hidden


#: The structured suite's model: about 1B parameters (1.10B, 973M of them in units' member weights).
LLAMA_1B = Llama(hidden=2048, intermediate=8192, layers=16, heads=32, kv_heads=8, vocab=32000)
#: ``--quick``'s: the same family at a quarter of the width, 4 layers.
LLAMA_QUICK = Llama(hidden=512, intermediate=2048, layers=4, heads=8, kv_heads=2, vocab=32000)
#: The builder's check: a model this small is traced with ``fp.structure`` (4 query heads per KV group, as above).
LLAMA_TINY = Llama(hidden=64, intermediate=96, layers=2, heads=8, kv_heads=2, vocab=64)


def check_builder(llama: Llama) -> str:
    """Fails unless ``llama``'s structure, member shapes and parameter count equal those of its model, traced."""
    import transformers

    torch.manual_seed(0)
    model: Any = transformers.LlamaForCausalLM(llama.config())
    model.eval()
    traced = fp.structure(model, (torch.randint(0, llama.vocab, (1, 8)),))
    built = llama.structure()
    assert list(traced.items()) == list(built.items()), f"the builder's structure differs:\n{traced}\n{built}"
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters() if n in llama.shapes()}
    assert list(shapes.items()) == list(llama.shapes().items()), "the builder's member shapes differ"
    count = sum(p.numel() for p in model.parameters())
    assert count == llama.parameters(), f"the parameter count differs: {count} != {llama.parameters()}"
    return f"{len(built)} groups, member shapes and {count:,} parameters equal the traced model's"


PlanCall = Callable[[Masks], Masks]
#: The structured suite's cases: the kinds of each plan a call runs (a case with two runs both, one mask dict).
STRUCTURED: dict[str, tuple[tuple[Kind, ...], ...]] = {
    "units L2 25%, one plan": (("channels", "kv_groups"),),
    "units L2 25%, two plans": (("channels",), ("kv_groups",)),
}


def _structured(kinds: tuple[tuple[Kind, ...], ...]) -> Callable[[Config], PlanCall]:
    def make(config: Config) -> PlanCall:
        assert config.llama is not None
        structure = config.llama.structure()
        plans = [fp.structured(structure, fp.LnStructured(0.25, n=2), kinds=k, normalize="mean") for k in kinds]

        def call(params: Masks) -> Masks:
            masks: Masks = {}
            for plan in plans:
                masks |= plan(params)
            return masks

        return call

    return make


CASES: dict[str, Callable[[Config], PlanCall]] = {
    "global L1 50%": lambda config: fp.global_unstructured(list(config.shapes), fp.L1Unstructured(0.5)),
    "per-tensor L1 50%": lambda config: fp.Plan({"*": fp.L1Unstructured(0.5)}),
    **{case: _structured(kinds) for case, kinds in STRUCTURED.items()},
}
#: The suites (``--only``): each its weights and its cases, every world started afresh for it.
SUITES = {"unstructured": ("global L1 50%", "per-tensor L1 50%"), "structured": tuple(STRUCTURED)}


@dataclass(frozen=True)
class Config:
    shapes: dict[str, tuple[int, ...]]
    cases: tuple[str, ...]
    repeats: int
    seed: int
    out: str  # folder for results and the single process's masks
    llama: Llama | None = None  # the structured suite's model


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
    plans = {case: CASES[case](config) for case in config.cases}
    result: dict[str, Any] = {
        "weight_bytes": sum(local(p).numel() * local(p).element_size() for p in params.values()),
        "times": {c: [] for c in config.cases},
        "cpu": {c: [] for c in config.cases},
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
            start, cpu = time.perf_counter(), time.process_time()
            plan(params)
            result["times"][case].append(time.perf_counter() - start)
            result["cpu"][case].append(time.process_time() - cpu)
    result["comm"], result["masks"], result["pruned"] = {}, {}, {}
    for case, plan in plans.items():
        _barrier(world)
        masks, comm = _communication(world, lambda: plan(params))
        result["comm"][case] = comm
        if world == 1 and config.llama is not None:
            result["pruned"][case] = pruned_units(config.llama.structure(), masks)
        result["masks"][case] = _check(rank, world, config, case, masks)
        del masks
    return result


def pruned_units(structure: fp.Structure, masks: Masks) -> dict[str, int]:
    """Units pruned per kind: those whose slice of their group's first member is all pruned."""
    out: Counter[str] = Counter()
    for group in structure.values():
        first = group.members[0]
        if first.name not in masks:
            continue
        rows = masks[first.name].movedim(first.dim, 0)[first.start : first.start + group.size * first.width]
        out[group.kind] += int((~rows.reshape(group.size, -1).any(1)).sum())
    return dict(out)


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
    reference: Masks = torch.load(path, mmap=True) if rank == 0 else {}
    same = rank != 0 or list(masks) == list(reference)
    for n, m in masks.items():  # one tensor at a time: a 1B model's masks are 1 GB whole
        whole = m.full_tensor()  # type: ignore[attr-defined]  # DTensor masks; every rank gathers
        if rank == 0:
            same = same and n in reference and whole.dtype == torch.bool and torch.equal(whole, reference[n])
        del whole
    if rank != 0:
        return ""
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
    cpu: list[str]


def summarize(world: int, results: list[dict[str, Any]], config: Config) -> Summary:
    """Table rows (one per case) and the selection-rounds (or units) lines of one world."""
    out = Summary([], [], [], [])
    weight_bytes = max(r["weight_bytes"] for r in results)
    for case in config.cases:
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
        cpu = [statistics.median(r["cpu"][case]) for r in results]
        out.cpu.append(
            f"- world {world}, {case}: {_ms(cpu[0])} ms (rank 0), {_ms(max(cpu))} ms (most), "
            f"{_ms(sum(cpu))} ms (all ranks together); wall clock {time_cell} ms"
        )
        min_cell = f"{_ms(min(times[0]))} / {_ms(min(slowest))}"
        kinds = ", ".join(f"{n} x {_payload(size)}" for _, size, n in first["sizes"]) or "none"
        out.rows.append(
            f"| {world} | {case} | {time_cell} | {min_cell} | {collectives} ({kinds}) | {_bytes(sent)} | "
            f"{_bytes(weight_bytes)} | {peak} | {masks} |"
        )
        if case in STRUCTURED:
            assert config.llama is not None
            out.rounds.append(_units_line(world, case, config.llama.structure(), results[0]["pruned"].get(case), sent))
        elif world > 1:
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


def _units_line(world: int, case: str, structure: fp.Structure, pruned: dict[str, int] | None, sent: int) -> str:
    """The units a structured case ranks (and, in the single process, prunes), and the bytes sent per unit."""
    kinds = [k for plan in STRUCTURED[case] for k in plan]
    units = {k: sum(g.size for g in structure.values() if g.kind == k) for k in kinds}
    ranked = " + ".join(f"{n} {k}" for k, n in units.items())
    plans = " and ".join(f"one over {' and '.join(ks)}" for ks in STRUCTURED[case])
    if pruned is not None:
        cut = ", ".join(f"{pruned.get(k, 0)} of {n} {k}" for k, n in units.items())
        return f"- world {world}, {case} ({plans}): {ranked} units; pruned {cut}"
    total = sum(units.values())
    return f"- world {world}, {case}: {_bytes(sent)} per call over {total} units = {sent / total:.1f} B per unit"


def _suite(suite: str, quick: bool, repeats: int, out: str) -> tuple[Config, str]:
    """A suite's config and the lines that describe it."""
    if suite == "unstructured":
        shapes = quick_shapes() if quick else resnet50_shapes()
        config = Config(shapes, SUITES[suite], repeats, seed=0, out=out)
        what = f"{'quick: ResNet-50 at 1/4 width' if quick else 'ResNet-50 weight set'}: {len(shapes)} tensors"
    else:
        llama = LLAMA_QUICK if quick else LLAMA_1B
        checked = check_builder(LLAMA_TINY)
        shapes = llama.shapes()
        config = Config(shapes, SUITES[suite], repeats, seed=0, out=out, llama=llama)
        what = (
            f"{'quick: ' if quick else ''}LlamaForCausalLM config ({llama.describe()}): {llama.parameters():,} "
            f"parameters ({llama.parameters() / 1e9:.2f}B); the params are its units' member weights only (no "
            f"embeddings, norms or LM head): {len(shapes)} tensors; fp.Structure built from the config, not traced "
            f"(the builder on a tiny Llama, {LLAMA_TINY.describe()}: {checked})"
        )
    total = sum(math.prod(s) for s in shapes.values())
    return config, (
        f"{suite}: {what}, {total / 1e6:.1f}M float32 weights ({_bytes(4 * total)}), each a Shard(0) DTensor on a "
        f"1-D mesh in worlds > 1; {repeats} interleaved repetitions after a warm-up call, a barrier before each call"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", default="2,4", help="comma-separated world sizes (1, the single process, always runs)")
    parser.add_argument("--only", choices=list(SUITES), default=None, help="one suite (default: both)")
    parser.add_argument(
        "--repeats", type=int, default=None,
        help="timed calls per case (default 5 unstructured, 3 structured; --quick 2)",
    )  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true",
        help="ResNet-50 at a quarter of the width and a 48M-parameter Llama (15M member weights), 2 repetitions",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=None, help="seconds per world (default 600, --quick 120)")
    methods = [m for m in ("forkserver", "spawn") if m in multiprocessing.get_all_start_methods()]
    parser.add_argument(
        "--start-method", choices=methods, default=methods[0],
        help="how ranks start: forked from a fresh fork server that imported torch once (default where "
        "there is one), or each a fresh spawned interpreter",
    )  # fmt: skip
    args = parser.parse_args()
    worlds = sorted({1, *(int(w) for w in args.world.split(","))})
    suites = [args.only] if args.only else list(SUITES)
    timeout = args.timeout or (120.0 if args.quick else 600.0)
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
        f"funcprune's kernels: {_native.status().detail}; DTensor blocks: funcprune._select's radix "
        f"select (its first round in those kernels where they load), bracketed from "
        f"{_select.SHARDED_BRACKET_MIN_KEYS} weights per process in a selection (funcprune._select._sharded_bracket)"
    )
    failed: list[str] = []
    walls: list[str] = []
    with tempfile.TemporaryDirectory(prefix="funcprune-distributed-") as out:
        for suite in suites:
            repeats = args.repeats or (2 if args.quick else 5 if suite == "unstructured" else 3)
            config, description = _suite(suite, args.quick, repeats, out)
            print(f"\n{description}", flush=True)
            summaries = []
            for world in worlds:
                begun = time.monotonic()
                summaries.append(summarize(world, run_world(world, config, timeout, args.start_method), config))
                walls.append(f"{suite} world {world}: {time.monotonic() - begun:.0f} s")
            failed += _table(suite, summaries)
    print(
        "\nBytes are each rank's payload (the tensors it all-reduces); a ring all-reduce moves about "
        "2 (p - 1) / p times that in and out of each rank. Peak memory: growth of VmHWM over VmRSS during "
        "one call (temporaries and the output masks), after malloc_trim."
    )
    print(f"run time: {time.monotonic() - started:.0f} s ({', '.join(walls)}, start-up included)")
    for line in failed:
        print(line, file=sys.stderr)
    return 1 if failed else 0


def _table(suite: str, summaries: list[Summary]) -> list[str]:
    """Prints a suite's table and the lines under it; returns its failures."""
    print(
        "\n| world | case | ms per call, median (rank 0 / slowest) | min (rank 0 / slowest) | collectives per call "
        "| bytes sent per rank per call | weights / rank | peak memory growth per rank (max) | masks |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    for s in summaries:
        print("\n".join(s.rows))
    if suite == "structured":
        print("\nUnits (ranked and pruned in the single process; bytes per unit in the worlds):")
    else:
        print("\nSelection rounds (from the collectives' sizes; passes and bracketed selections from wrappers):")
    for s in summaries:
        print("\n".join(s.rounds))
    print(
        "\nCPU time per call (median of each rank's process_time: its own work, whatever the cores' "
        "contention; gloo's threads included):"
    )
    for s in summaries:
        print("\n".join(s.cpu))
    sys.stdout.flush()
    return [line for s in summaries for line in s.failed]


if __name__ == "__main__":
    sys.exit(main())
