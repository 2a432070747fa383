"""``fp.oneshot`` over 2 processes (``group=``) beside 1 process: time, where it goes, agreement.

The model is benchmarks/oneshot.py's Llama (hidden 768, MLP 2048, 12
heads, 4 KV heads, vocabulary 32000; ``--layers`` layers, random weights,
seeded), float32, CPU; the calibration set ``--samples`` random sequences
of ``--tokens`` tokens, one per batch. Every Linear of the decoder layers is
pruned (embeddings and LM head dense): SparseGPT 2:4 and Wanda 50% per
output row.

- 1 process: ``fp.oneshot(model, batches, ...)`` on every batch.
- 2 processes: a gloo group on 127.0.0.1, each process calling
  ``fp.oneshot(model, its_half, ..., group=dist.group.WORLD)`` on half the
  batches (rank 0 the first half).

Every run is a fresh set of processes (spawned, each on 1 torch thread),
which build the model and the batches untimed, meet at a barrier, and time
the ``oneshot`` call alone; a 2-process run's time is its slower rank's.
Runs alternate (1, 2, 1, 2, ...) for each method, ``--reps`` of each after
an untimed warm-up pair; the table gives the medians and the median and
minimum of the per-repetition ratios (1-process time / 2-process time: the
speed-up). Inside the call, each process also times its ``all_reduce``
calls (count, bytes, seconds: the collectives of the runner and of
``collect``) and the method's prune step (``_pruned``: SparseGPT's solve,
run on every process on the same statistics). Checked: the 2-process masks
and weights against the 1-process ones (same masks, and the largest weight
difference).

Run from the repository root::

    python benchmarks/oneshot_distributed.py [--layers 4] [--samples 32] [--tokens 256] [--reps 3]
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import _timing  # noqa: F401 (first: torchvision's meta registrations stubbed before transformers imports it)
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CASES = {"sparsegpt 2:4": "sparsegpt", "wanda 50%/row": "wanda"}


def model_and_batches(layers: int, samples: int, tokens: int) -> tuple[Any, list[dict[str, torch.Tensor]]]:
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=layers,
        num_attention_heads=12, num_key_value_heads=4, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model: Any = transformers.LlamaForCausalLM(config)
    model.eval()
    ids = torch.randint(0, config.vocab_size, (samples, tokens), generator=torch.Generator().manual_seed(1))
    return model, [{"input_ids": row[None], "use_cache": False} for row in ids]


def _worker(rank: int, size: int, port: int, case: str, args: argparse.Namespace, out: str) -> None:
    import funcprune as fp
    import funcprune._runner._blocks as runner

    torch.set_num_threads(1)
    model, batches = model_and_batches(args.layers, args.samples, args.tokens)
    spec = fp.NM(2, 4) if CASES[case] == "sparsegpt" else fp.PerSlice(fp.L1Unstructured(0.5), dim=0)
    group = None
    if size > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=600))  # fmt: skip
        group = dist.group.WORLD
        half = len(batches) // size
        batches = batches[rank * half : (rank + 1) * half] if rank < size - 1 else batches[rank * half :]
    spent = {"all_reduce s": 0.0, "all_reduce n": 0.0, "all_reduce MiB": 0.0, "prune s": 0.0}
    reduce, pruned = dist.all_reduce, runner._pruned

    def timed_reduce(tensor: torch.Tensor, *a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        try:
            return reduce(tensor, *a, **k)
        finally:
            spent["all_reduce s"] += time.perf_counter() - start
            spent["all_reduce n"] += 1
            spent["all_reduce MiB"] += tensor.numel() * tensor.element_size() / 2**20

    def timed_pruned(*a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        try:
            return pruned(*a, **k)
        finally:
            spent["prune s"] += time.perf_counter() - start

    setattr(dist, "all_reduce", timed_reduce)  # noqa: B010 (patched for timing, undone below)
    setattr(runner, "_pruned", timed_pruned)  # noqa: B010
    if group is not None:
        dist.barrier()
    start = time.perf_counter()
    params, masks = fp.oneshot(model, batches, method=CASES[case], spec=spec, group=group)
    seconds = time.perf_counter() - start
    if rank == 0:
        torch.save({"seconds": seconds, **spent, "masks": masks, "weights": {n: params[n].detach() for n in masks}},
                   out)  # fmt: skip
    else:
        torch.save({"seconds": seconds, **spent}, out)
    if group is not None:
        dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run(size: int, case: str, args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """One fresh run of ``size`` processes; each rank's record."""
    outs = [str(work / f"{size}-{r}.pt") for r in range(size)]
    port = _port()
    context = mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]
        _spawned, args=(size, port, case, args, outs), nprocs=size, join=False, start_method="spawn"
    )
    while not context.join(timeout=args.timeout):
        pass
    return [torch.load(o) for o in outs]


def _spawned(rank: int, size: int, port: int, case: str, args: argparse.Namespace, outs: list[str]) -> None:
    _worker(rank, size, port, case, args, outs[rank])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; Llama of {args.layers} layers, {args.samples} samples "
          f"of {args.tokens} tokens; 1 thread per process; {datetime.date.today()}", flush=True)  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for case in args.cases:
            times: dict[int, list[float]] = {1: [], 2: []}
            last: dict[int, list[dict[str, Any]]] = {}
            for rep in range(args.reps + 1):  # the first pair: a warm-up
                for size in (1, 2):
                    records = run(size, case, args, work)
                    last[size] = records
                    slowest = max(r["seconds"] for r in records)
                    print(f"  {case}: {'warm-up' if not rep else f'rep {rep}'}, {size} process(es): {slowest:.1f} s",
                          flush=True)  # fmt: skip
                    if rep:
                        times[size].append(slowest)
            ratios = [a / b for a, b in zip(times[1], times[2], strict=True)]
            one, two = last[1][0], last[2][0]
            same = all(torch.equal(one["masks"][n], two["masks"][n]) for n in one["masks"])
            alike = sum(int((one["masks"][n] == two["masks"][n]).sum()) for n in one["masks"])
            total = sum(m.numel() for m in one["masks"].values())
            diff = max(float((one["weights"][n] - two["weights"][n]).abs().max()) for n in one["masks"])
            rows.append((case, statistics.median(times[1]), statistics.median(times[2]), statistics.median(ratios),
                         min(ratios), two, last[2][1], one, same, alike / total, diff))  # fmt: skip
    print("\n| case | 1 process | 2 processes | speed-up, median (min) | all_reduce per process: calls, MiB, s "
          "| prune step, s (1 / 2 processes) | masks equal | largest weight difference |")
    print("|---|---|---|---|---|---|---|---|")
    for case, t1, t2, med, low, r0, r1, one, same, alike, diff in rows:
        reduce = f"{r0['all_reduce n']:.0f}, {r0['all_reduce MiB']:.0f}, {r0['all_reduce s']:.2f} / {r1['all_reduce s']:.2f}"
        print(f"| {case} | {t1:.1f} s | {t2:.1f} s | {med:.2f} ({low:.2f}) | {reduce} | {one['prune s']:.1f} / "
              f"{r0['prune s']:.1f} | {'yes' if same else f'{alike:.2%} alike'} | {diff:.2g} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
