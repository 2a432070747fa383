"""One-shot pruning of a Llama: ``fp.oneshot`` beside llm-compressor's ``oneshot``, time, memory, agreement.

Both prune the same model (a LlamaForCausalLM built here from a config, random
weights, seeded, saved with ``save_pretrained``) on the same calibration
samples (random token ids, one sample of ``--tokens`` per batch, as
llm-compressor feeds them), every Linear inside the decoder layers, embeddings
and LM head dense:

- SparseGPT at 50% unstructured (blocks of 128 columns) and 2:4, dampening 0.01;
- Wanda at 50% per output row and 2:4.

Each run is a fresh process (funcprune's here, llm-compressor's in its own
virtual environment, since llm-compressor 0.14 pins transformers <= 5.17; see
``benchmarks/_llmcompressor.py``), timed around the pruning call alone, with
its peak resident memory during the call (``VmHWM``, reset just before it)
and the resident memory just before it. Runs alternate (funcprune, llm-compressor, funcprune, ...) after one
untimed warm-up pair; the table gives medians and the median and minimum of
the per-repetition ratios.

The floor of SparseGPT is its matrix products: per Linear ``(out, in)`` over
``N`` calibration tokens, ``2 N in²`` for the Hessian, about ``2 out in²``
for the updates of the kept weights, ``in³`` for the inverse, and ``4 N in
out`` for the two passes of the block; timed here against the machine's
measured float32 matrix product rate at the same thread count.

Run::

    python benchmarks/oneshot.py [--layers 12] [--reps 3] [--threads 1 2] \
        [--llmc /work/venvs/llmc/bin/python]
    python benchmarks/oneshot.py --memory 2 4 8 16   # funcprune's peak memory as the model deepens
    python benchmarks/oneshot.py --inplace ...       # fp.oneshot(..., inplace=True)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import _timing  # noqa: F401 (first: torchvision's meta registrations stubbed before transformers imports it)
import torch

HERE = Path(__file__).resolve().parent
CASES = {  # name: (method, funcprune spec, llm-compressor arguments)
    "sparsegpt 50%": ("sparsegpt", "unstructured", ["--sparsity", "0.5"]),
    "sparsegpt 2:4": ("sparsegpt", "2:4", ["--nm", "2:4"]),
    "wanda 50%/row": ("wanda", "per_row", ["--sparsity", "0.5"]),
    "wanda 2:4": ("wanda", "2:4", ["--nm", "2:4"]),
}


def make(directory: Path, layers: int, samples: int, tokens: int) -> dict[str, int]:
    """Save the model and the calibration ids under ``directory``; return the config's sizes."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=layers,
        num_attention_heads=12, num_key_value_heads=4, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model: Any = transformers.LlamaForCausalLM(config)
    model.eval().save_pretrained(directory / "model")
    g = torch.Generator().manual_seed(1)
    torch.save(torch.randint(0, config.vocab_size, (samples, tokens), generator=g), directory / "calibration.pt")
    return {"parameters": sum(p.numel() for p in model.parameters()), "layers": layers}


def run_funcprune(model_dir: Path, calibration: Path, method: str, shape: str, threads: int, out: Path) -> None:
    """The funcprune side, in its own process: load, prune with ``fp.oneshot``, save what the other side saves."""
    import transformers

    import funcprune as fp

    torch.set_num_threads(threads)
    model: Any = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    ids = torch.load(calibration)
    batches = [{"input_ids": row[None]} for row in ids]
    spec = {"unstructured": fp.L1Unstructured(0.5), "per_row": fp.PerSlice(fp.L1Unstructured(0.5), dim=0),
            "2:4": fp.NM(2, 4)}[shape]  # fmt: skip
    sum(float(p.detach().sum()) for p in model.parameters())  # read every weight: resident before the call
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) afresh: loading's is not the call's
    before = _rss_mib()
    start = time.perf_counter()
    params, masks = fp.oneshot(model, batches, method=method, spec=spec, inplace=os.environ.get(INPLACE) == "1")
    seconds = time.perf_counter() - start
    peak = _rss_mib("VmHWM:")
    kept = sum(params[n].numel() * params[n].element_size() for n in masks if params[n] is not dict(model.named_parameters())[n])
    returned = (kept + sum(m.numel() for m in masks.values())) / 2**20  # new weights and the masks, MiB
    weights = {n: (params[n] * masks[n]).detach().contiguous() for n in masks}
    torch.save({"state_dict": weights, "seconds": seconds, "peak_rss_mib": peak, "rss_before_mib": before,
                "returned_mib": returned}, out)  # fmt: skip


#: Set to "1" in funcprune's child by ``--inplace``: ``fp.oneshot(..., inplace=True)``.
INPLACE = "FUNCPRUNE_BENCH_INPLACE"


def _rss_mib(field: str = "VmRSS:") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return float("nan")


def matmul_rate(threads: int) -> float:
    """The float32 matrix product rate of this machine at ``threads`` threads, in FLOP/s (best of 5)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
        a @ b
        best = min(_timed(lambda: a @ b) for _ in range(5))
    finally:
        torch.set_num_threads(before)
    return 2 * 1024**3 / best


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def sparsegpt_flops(layers: int, tokens: int) -> float:
    """The matrix-product FLOPs of SparseGPT on the model (see the module docstring)."""
    shapes = [(768, 768), (256, 768), (256, 768), (768, 768), (2048, 768), (2048, 768), (768, 2048)]
    per_layer = sum(2 * tokens * i * i + 2 * o * i * i + i**3 + 4 * tokens * i * o for o, i in shapes)
    return float(layers * per_layer)


def one(side: str, case: str, threads: int, work: Path, llmc: str) -> dict[str, Any]:
    method, shape, their_args = CASES[case]
    out = work / f"{side}-{case.replace(' ', '_').replace('/', '_').replace(':', '-')}-{threads}.pt"
    if side == "funcprune":
        command = [sys.executable, __file__, "--child", str(work), method, shape, str(threads), str(out)]
    else:
        command = [llmc, str(HERE / "_llmcompressor.py"), "--model", str(work / "model"), "--calibration",
                   str(work / "calibration.pt"), "--method", method, *their_args, "--threads", str(threads),
                   "--out", str(out)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise RuntimeError(f"{side} {case} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = torch.load(out, weights_only=False)
    return result


def agreement(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, float]:
    """The share of entries pruned alike, and the largest relative difference of a kept weight tensor."""
    same = total = 0
    worst = 0.0
    for name, wa in a.items():
        wb = b[name]
        same += int(((wa == 0) == (wb == 0)).sum())
        total += wa.numel()
        worst = max(worst, float((wa - wb).norm() / wa.norm()))
    return same / total, worst


def memory(layer_counts: list[int], samples: int, tokens: int) -> None:
    """funcprune's peak memory beyond the model as the model deepens: it should not grow but by what is returned."""
    print("\n| layers | parameters | method | RSS before MiB | peak MiB | increase MiB | returned MiB | increase - returned MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for layers in layer_counts:
        with tempfile.TemporaryDirectory() as d:
            work = Path(d)
            sizes = make(work, layers, samples, tokens)
            for case in ("wanda 2:4", "sparsegpt 2:4"):
                r = one("funcprune", case, 1, work, "")
                increase = r["peak_rss_mib"] - r["rss_before_mib"]
                print(f"| {layers} | {sizes['parameters'] / 1e6:.0f}M | {case} | {r['rss_before_mib']:.0f} "
                      f"| {r['peak_rss_mib']:.0f} | {increase:.0f} | {r['returned_mib']:.0f} "
                      f"| {increase - r['returned_mib']:.0f} |")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--child":
        folder, method, shape, threads, out = args[1:]
        run_funcprune(Path(folder) / "model", Path(folder) / "calibration.pt", method, shape, int(threads), Path(out))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--llmc", default="/work/venvs/llmc/bin/python")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    parser.add_argument("--inplace", action="store_true", help="funcprune with inplace=True (new weights written "
                        "into the model's own tensors)")  # fmt: skip
    parser.add_argument("--memory", type=int, nargs="*", help="only funcprune's peak memory, at these layer counts")
    ns = parser.parse_args(args)
    if ns.inplace:
        os.environ[INPLACE] = "1"  # (the children inherit it)
    if ns.memory:
        memory(ns.memory, ns.samples, ns.tokens)
        return
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        sizes = make(work, ns.layers, ns.samples, ns.tokens)
        print(f"Llama, {sizes['parameters'] / 1e6:.0f}M parameters, {ns.layers} layers (hidden 768, MLP 2048, "
              f"12 heads, 4 KV heads, vocab 32000); {ns.samples} calibration samples of {ns.tokens} tokens")  # fmt: skip
        raw: dict[str, Any] = {"sizes": sizes, "rows": []}
        for threads in ns.threads:
            rate = matmul_rate(threads)
            print(f"\n{threads} thread(s); float32 matmul rate {rate / 1e9:.0f} GFLOP/s")
            print("| case | funcprune s | llm-compressor s | ratio median (min) | peak RSS fp / llmc MiB "
                  "| RSS increase fp / llmc MiB | masks alike | weight diff | floor s |")  # fmt: skip
            print("|---|---|---|---|---|---|---|---|---|")
            for case in ns.cases:
                times: dict[str, list[float]] = {"funcprune": [], "llmc": []}
                last: dict[str, dict[str, Any]] = {}
                for rep in range(ns.reps + 1):  # the first pair warms up (caches, page cache)
                    for side in ("funcprune", "llmc"):
                        result = one(side, case, threads, work, ns.llmc)
                        last[side] = result
                        if rep:
                            times[side].append(result["seconds"])
                ratios = [a / b for a, b in zip(times["funcprune"], times["llmc"], strict=True)]
                alike, diff = agreement(last["funcprune"]["state_dict"], last["llmc"]["state_dict"])
                floor = sparsegpt_flops(ns.layers, ns.samples * ns.tokens) / rate if "sparsegpt" in case else float("nan")
                fp_, lc = last["funcprune"], last["llmc"]
                print(f"| {case} | {statistics.median(times['funcprune']):.2f} | {statistics.median(times['llmc']):.2f} "
                      f"| {statistics.median(ratios):.2f} ({min(ratios):.2f}) "
                      f"| {fp_['peak_rss_mib']:.0f} / {lc['peak_rss_mib']:.0f} "
                      f"| {fp_['peak_rss_mib'] - fp_['rss_before_mib']:.0f} / {lc['peak_rss_mib'] - lc['rss_before_mib']:.0f} "
                      f"| {100 * alike:.2f}% | {diff:.1e} | {floor:.2f} |")  # fmt: skip
                raw["rows"].append({"threads": threads, "case": case, "times": times, "alike": alike, "diff": diff,
                                    "peak": [fp_["peak_rss_mib"], lc["peak_rss_mib"]],
                                    "before": [fp_["rss_before_mib"], lc["rss_before_mib"]]})  # fmt: skip
        if ns.json:
            ns.json.write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
