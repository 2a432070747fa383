"""REAP expert pruning: ``fp.expert_stats`` + ``fp.structured`` beside llm-compressor 0.14's ``REAPPruningModifier``.

Both prune the same model (a Qwen3-MoE built here from a config, random
weights, seeded, saved with ``save_pretrained``; llm-compressor's
transformers 5.17 loads what 5.25 saves, checked by ``--check-load``) on
the same calibration samples (random token ids, one unpadded sample per
batch, as llm-compressor feeds them), removing ``--sparsity`` of each MoE
layer's experts by REAP saliency, the mean over the tokens routed to expert
``j`` of ``g_j * ||f_j||`` (Lasby et al. 2025). Three columns of experts kept
per layer:

- **funcprune**: ``fp.expert_stats(model, batches, renormalize=norm_topk_prob)``
  once over the dense model, then ``fp.structured(structure,
  LnStructured(sparsity), kinds="experts", scope="group")`` ranking each
  layer's experts by ``"reap"`` (the lowest go), then ``fp.shrink``;
- **reap (float64)**: reap's ``update_pruning_state`` written out in float64
  from the weights (``benchmarks/_reap_reference.py``) on the same dense
  activations, llm-compressor's rule for the experts kept: funcprune must
  equal it;
- **llm-compressor**: ``oneshot`` with ``REAPPruningModifier(sparsity)`` in its
  own virtual environment (``benchmarks/_llmc_reap.py``), its example's
  settings (``moe_calibrate_all_experts=False``, the sequential pipeline),
  with ``propagate_error=False``: every layer is calibrated on the dense
  model's activations, as reap's observer and ``fp.expert_stats`` see them.

llm-compressor's default, ``propagate_error=True``, calibrates each layer on
the outputs of the layers before it *after* their experts were removed; it
is compared with funcprune done the same way, layer by layer
(``expert_stats`` on the model shrunk so far, one layer's experts planned
and shrunk, the next layer measured on that), a column of its own.

Each run is a fresh process, timed around the pruning alone (funcprune:
``expert_stats`` to the shrunk model; llm-compressor: its ``oneshot`` call,
which prunes the model in place), with the peak resident memory during it
(``VmHWM``, reset just before) and the resident memory just before. Runs
alternate (funcprune, llm-compressor, ...) after one untimed warm-up pair;
the table gives medians.

Run::

    python benchmarks/experts.py [--layers 4] [--experts 8] [--top-k 2] [--hidden 64] \
        [--samples 16] [--tokens 64] [--sparsity 0.25] [--reps 3] [--threads 1 2] \
        [--llmc /work/venvs/llmc/bin/python]
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's funcprune, never an installed copy

import _timing  # noqa: F401,E402 (first: torchvision's meta registrations stubbed before transformers imports it)
import torch  # noqa: E402
from _reap_reference import State, retained, update  # noqa: E402
from torch import nn  # noqa: E402

Retained = dict[str, list[int]]


def make(directory: Path, ns: argparse.Namespace) -> dict[str, int]:
    """Save the model and the calibration ids under ``directory``; return its sizes."""
    import transformers

    config = transformers.Qwen3MoeConfig(
        vocab_size=ns.vocab, hidden_size=ns.hidden, intermediate_size=2 * ns.hidden, moe_intermediate_size=ns.hidden,
        num_hidden_layers=ns.layers, num_attention_heads=4, num_key_value_heads=2,
        num_experts=ns.experts, num_experts_per_tok=ns.top_k, norm_topk_prob=not ns.no_norm_topk_prob,
        decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model: Any = transformers.Qwen3MoeForCausalLM(config)
    model.eval().save_pretrained(directory / "model")
    g = torch.Generator().manual_seed(1)
    torch.save(torch.randint(0, ns.vocab, (ns.samples, ns.tokens), generator=g), directory / "calibration.pt")
    return {"parameters": sum(p.numel() for p in model.parameters())}


def _load(model_dir: Path) -> Any:
    import transformers

    model: Any = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


def _rss_mib(field: str = "VmRSS:") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return float("nan")


def moe_blocks(model: nn.Module) -> dict[str, Any]:
    """The MoE blocks of a transformers 5 Qwen3-MoE or Mixtral: a router ``gate`` beside stacked ``experts``."""
    return {
        name: module
        for name, module in model.named_modules()
        if isinstance(getattr(module, "gate", None), nn.Module)
        and isinstance(getattr(getattr(module, "experts", None), "gate_up_proj", None), torch.Tensor)
    }


def reference(model: Any, ids: torch.Tensor, *, renormalize: bool) -> dict[str, torch.Tensor]:
    """reap's saliency in float64 (``_reap_reference``) per MoE layer, each on the dense model's activations.

    Each MoE block's input is read as the model runs (float32); from there
    everything is float64 from the weights: the router's logits, its top-k
    (reap's ``topk`` of the logits), every expert's output on every token.
    """
    top_k = int(model.config.num_experts_per_tok)
    blocks = moe_blocks(model)
    states = {name: State(int(block.experts.gate_up_proj.shape[0])) for name, block in blocks.items()}

    def watch(name: str, block: Any) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            x = args[0].reshape(-1, args[0].shape[-1]).double()
            logits = x @ block.gate.weight.double().T
            experts = block.experts
            activations = []
            for j in range(states[name].experts):
                gate, up = (x @ experts.gate_up_proj[j].double().T).chunk(2, dim=-1)
                activations.append((experts.act_fn(gate) * up) @ experts.down_proj[j].double().T)
            update(states[name], torch.stack(activations), logits.topk(top_k, dim=-1).indices, logits,
                   renormalize=renormalize)  # fmt: skip

        return hook

    handles = [block.register_forward_pre_hook(watch(name, block)) for name, block in blocks.items()]
    try:
        with torch.no_grad():
            for row in ids:
                model(row[None], use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return {name: state.mean for name, state in states.items()}


def kept(structure: Any, masks: dict[str, torch.Tensor], group: str) -> list[int]:
    """The experts of ``group`` its masks keep (a unit whose router row is not entirely pruned)."""
    router = next(m for m in structure[group].members if m.name.endswith("gate.weight"))
    return [int(i) for i in masks[router.name].reshape(masks[router.name].shape[0], -1).any(dim=1).nonzero()]


def fp_prune(model: nn.Module, batches: list[dict[str, torch.Tensor]], sparsity: float, renormalize: bool,
             example: tuple[torch.Tensor, ...]) -> tuple[nn.Module, dict[str, Any]]:  # fmt: skip
    """funcprune once over the dense model: REAP statistics, the experts planned per layer, the model shrunk.

    Returns the shrunk model and ``{"retained", "reap", "phases"}``: the experts
    kept per layer, the ``"reap"`` statistic, and per phase its seconds and
    peak resident memory (MiB; the peak is reset after each phase).
    """
    import funcprune as fp

    clock = [time.perf_counter()]
    phases: dict[str, tuple[float, float]] = {}

    def lap(name: str) -> None:  # the phase's seconds and peak resident memory; the peak starts afresh
        clock.append(time.perf_counter())
        phases[name] = (clock[-1] - clock[-2], _rss_mib("VmHWM:"))
        Path("/proc/self/clear_refs").write_text("5")

    stats = fp.expert_stats(model, batches, renormalize=renormalize)
    lap("expert_stats")
    structure = fp.structure(model, example)
    lap("structure")
    plan = fp.structured(structure, fp.LnStructured(sparsity, n=1), kinds="experts", scope="group")
    masks = plan(dict(model.named_parameters()), unit_scores={g: v["reap"] for g, v in stats.items()})
    lap("plan")
    small = fp.shrink(model, masks, example)
    lap("shrink")
    retained_experts = {g: kept(structure, masks, g) for g in stats}
    return small, {"retained": retained_experts, "reap": {g: v["reap"] for g, v in stats.items()}, "phases": phases}


def run_funcprune(folder: Path, sparsity: float, threads: int, out: Path) -> None:
    """The funcprune side, in its own process: load, prune, save what the other side saves."""
    import funcprune as fp
    import transformers

    torch.set_num_threads(threads)
    model = _load(folder / "model")
    ids: torch.Tensor = torch.load(folder / "calibration.pt")
    batches = [{"input_ids": row[None]} for row in ids]
    renormalize = bool(model.config.norm_topk_prob)
    example = (ids[:1],)
    sum(float(p.detach().sum()) for p in model.parameters())  # read every weight: resident before the call
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) afresh: loading's is not the call's
    before = _rss_mib()
    start = time.perf_counter()
    small, found = fp_prune(model, batches, sparsity, renormalize, example)
    seconds = time.perf_counter() - start
    peak = max([_rss_mib("VmHWM:")] + [p for _, p in found["phases"].values()])  # the peak over every phase
    counts = sorted({int(b.experts.gate_up_proj.shape[0]) for b in moe_blocks(small).values()})
    versions = {"funcprune": fp.__file__, "transformers": str(transformers.__version__), "torch": str(torch.__version__)}
    torch.save({**found, "seconds": seconds, "peak_rss_mib": peak, "rss_before_mib": before, "experts_after": counts,
                "versions": versions}, out)  # fmt: skip


def one(side: str, threads: int, work: Path, ns: argparse.Namespace, pipeline: str = "basic",
        propagate: bool = False) -> dict[str, Any]:  # fmt: skip
    """One fresh process of ``side`` ("funcprune" or "llm-compressor"); its saved result."""
    out = work / f"{side}-{threads}-{pipeline}-{int(propagate)}.pt"
    if side == "funcprune":
        command = [sys.executable, __file__, "--child", str(work), str(ns.sparsity), str(threads), str(out)]
    else:
        command = [ns.llmc, str(HERE / "_llmc_reap.py"), "--model", str(work / "model"), "--calibration",
                   str(work / "calibration.pt"), "--sparsity", str(ns.sparsity), "--threads", str(threads),
                   "--pipeline", pipeline, "--out", str(out), *(["--propagate-error"] if propagate else [])]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise RuntimeError(f"{side} ({threads} threads, {pipeline}) failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = torch.load(out, weights_only=False)
    return result


def check_load(work: Path, llmc: str) -> float:
    """The largest logit difference between this transformers and llm-compressor's loading the saved model."""
    script = (
        "import sys, torch, transformers\n"
        "m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()\n"
        "with torch.no_grad(): torch.save(m(torch.load(sys.argv[2]), use_cache=False).logits, sys.argv[3])\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([llmc, "-c", script, str(work / "model"), str(work / "calibration.pt"), str(work / "theirs.pt")],
                   check=True, capture_output=True, env=env)  # fmt: skip
    with torch.no_grad():
        ours = _load(work / "model")(torch.load(work / "calibration.pt"), use_cache=False).logits
    return float((ours - torch.load(work / "theirs.pt")).abs().max())


def table(columns: dict[str, Retained], compared: int) -> list[str]:
    """A markdown table of the experts kept per layer, and whether the first ``compared`` columns keep the same."""
    names = list(columns)
    lines = ["| layer | " + " | ".join(names) + f" | first {compared} equal |", "|---|" + "---|" * (len(names) + 1)]
    for layer in columns[names[0]]:
        sets = [columns[c][layer] for c in names]
        same = all(k == sets[0] for k in sets[:compared])
        lines.append(f"| {layer} | " + " | ".join(str(k) for k in sets) + f" | {'yes' if same else '**no**'} |")
    return lines


def relative_difference(a: dict[str, torch.Tensor], b: dict[str, Any]) -> float:
    """The largest relative difference of two saliencies over the layers (each layer's against its largest value)."""
    worst = 0.0
    for layer, x in a.items():
        y = torch.as_tensor(b[layer], dtype=torch.float64)
        worst = max(worst, float((x - y).abs().max() / x.abs().max()))
    return worst


def timings(results: dict[str, list[dict[str, Any]]], threads: int) -> list[str]:
    """Rows of medians: time, peak resident memory, its increase over the memory before the call."""
    lines = []
    for side, runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        peak = statistics.median(r["peak_rss_mib"] for r in runs)
        increase = statistics.median(r["peak_rss_mib"] - r["rss_before_mib"] for r in runs)
        phases = ""
        if "phases" in runs[0]:
            phases = ", ".join(
                f"{k} {1e3 * statistics.median(r['phases'][k][0] for r in runs):.0f} ms / "
                f"+{statistics.median(r['phases'][k][1] - r['rss_before_mib'] for r in runs):.0f} MiB"
                for k in runs[0]["phases"]
            )
        lines.append(f"| {threads} | {side} | {1e3 * seconds:.0f} ms | {peak:.0f} MiB | {increase:.0f} MiB | {phases} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--child":
        folder, sparsity, threads, out = args[1:]
        run_funcprune(Path(folder), float(sparsity), int(threads), Path(out))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("layers", 4), ("experts", 8), ("top-k", 2), ("hidden", 64), ("vocab", 512),
                          ("samples", 16), ("tokens", 64), ("reps", 3)):  # fmt: skip
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--no-norm-topk-prob", action="store_true", help="Qwen3-MoE's gates not renormalized")
    parser.add_argument("--sparsity", type=float, default=0.25)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--llmc", default="/work/venvs/llmc/bin/python")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    ns = parser.parse_args(args)
    drop = int(ns.experts * ns.sparsity)  # llm-compressor's count: it floors, funcprune's float amount rounds
    if round(ns.experts * ns.sparsity) != drop:
        parser.error(f"--sparsity {ns.sparsity} of {ns.experts} experts: llm-compressor drops {drop}, funcprune "
                     f"{round(ns.experts * ns.sparsity)}; choose a sparsity whose count is whole")  # fmt: skip
    renormalize = not ns.no_norm_topk_prob
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        sizes = make(work, ns)
        print(f"Qwen3-MoE: {ns.layers} layers, {ns.experts} experts, top-{ns.top_k}, hidden {ns.hidden}, "
              f"{sizes['parameters'] / 1e6:.2f}M parameters, norm_topk_prob={renormalize}; "
              f"{ns.samples} samples x {ns.tokens} tokens; sparsity {ns.sparsity} ({drop} experts per layer)")  # fmt: skip
        print(f"transformers 5.17 (llm-compressor's venv) loads the saved model: max |logit difference| "
              f"{check_load(work, ns.llmc):.3g}")  # fmt: skip
        saliency = reference(_load(work / "model"), torch.load(work / "calibration.pt"), renormalize=renormalize)
        columns: dict[str, Retained] = {"reap (float64)": {k: retained(v, drop) for k, v in saliency.items()}}
        raw: dict[str, Any] = {"reference": saliency}
        print("\n| threads | side | time (median) | peak RSS | peak - before | funcprune's phases: time / peak over before |\n|---|---|---|---|---|---|")
        for threads in ns.threads:
            results: dict[str, list[dict[str, Any]]] = {"funcprune": [], "llm-compressor": []}
            for rep in range(ns.reps + 1):  # the first pair warms up
                for side in results:
                    r = one(side, threads, work, ns)
                    if rep:
                        results[side].append(r)
            raw[f"{threads} threads"] = results
            print("\n".join(timings(results, threads)))
            for side, runs in results.items():
                columns[f"{side}, {threads} thread{'s' * (threads > 1)}"] = runs[0]["retained"]
                if any(r["retained"] != runs[0]["retained"] for r in runs):
                    raise RuntimeError(f"{side} kept different experts from one run to the next at {threads} threads")
        first = raw[f"{ns.threads[0]} threads"]
        print(f"\nsaliency, largest relative difference from reap (float64): funcprune "
              f"{relative_difference(saliency, first['funcprune'][0]['reap']):.1e}, llm-compressor (basic) "
              f"{relative_difference(saliency, {k: v['saliency'] for k, v in first['llm-compressor'][0]['saliency'].items()}):.1e}")  # fmt: skip
        compared = len(columns)
        for propagate in (False, True):  # llm-compressor's own pipeline for REAP, one run each
            r = one("llm-compressor", ns.threads[0], work, ns, "sequential", propagate)
            raw[f"sequential, propagate_error={propagate}"] = r
            columns[f"llm-compressor sequential, propagate_error={propagate}"] = r["retained"]
            print(f"llm-compressor sequential, propagate_error={propagate}: {1e3 * r['seconds']:.0f} ms, "
                  f"peak {r['peak_rss_mib']:.0f} MiB; saliency vs reap (float64): "
                  f"{relative_difference(saliency, {k: v['saliency'] for k, v in r['saliency'].items()}):.1e}")  # fmt: skip
        print("\nExperts kept per layer:")
        print("\n".join(table(columns, compared)))
        print("versions:", json.dumps({"funcprune": first["funcprune"][0]["versions"],
                                       "llm-compressor": first["llm-compressor"][0]["versions"]}))  # fmt: skip
        if ns.json:
            ns.json.write_text(json.dumps({"columns": columns, "raw": raw}, default=str, indent=1))


if __name__ == "__main__":
    main()
