"""Run llm-compressor's REAP expert pruning on a local mixture-of-experts model, for benchmarks.

This script runs in llm-compressor's own virtual environment (llm-compressor
0.14 pins transformers <= 5.17), never in funcprune's, and does not import
funcprune (``benchmarks/experts.py`` drives it):

    /work/venvs/llmc/bin/python benchmarks/_llmc_reap.py \
        --model DIR --calibration calib.pt --sparsity 0.25 --threads 1 \
        --pipeline basic|sequential [--propagate-error] --out result.pt

``--model`` is a directory written by ``save_pretrained`` (a Qwen3-MoE or
Mixtral, loaded offline in float32); ``--calibration`` is a ``torch.save``d
LongTensor (N, T) of token ids, one unpadded calibration sample per row.

The recipe is llm-compressor's REAP example: ``REAPPruningModifier(sparsity)``,
``moe_calibrate_all_experts=False``, batch size 1, samples in order; the
experts are made one Linear each (``linearize_moe``, what the modifier hooks)
before the timed call. Pipelines:

- ``basic``: the whole model runs once per batch, then every layer is
  pruned at once: REAP on the dense model's activations, as reap's observer
  and ``fp.expert_stats`` measure them;
- ``sequential`` (what llm-compressor picks for REAP): layer by layer, each
  layer pruned when its calibration ends; with ``--propagate-error`` (its
  default) the next layer is calibrated on the pruned layer's outputs.
  On Qwen3-MoE and Mixtral (transformers 5.17) its traced graph calls
  ``create_causal_mask`` with a copy of the config built inside the graph,
  which lacks the eager attention that calibration forces on the model's
  config: the mask comes back ``None`` for unpadded samples and the eager
  attention adds none, so every token attends to every other, later ones too
  (a Llama's graph keeps its mask). ``benchmarks/experts.py`` reports it.

Only the ``oneshot`` call is timed. ``--out`` receives (``torch.save``) a
dict with "retained" (``{MoE block name: [expert indices kept, ascending]}``,
what the modifier reports), "saliency" (``{MoE block name: {"saliency":
mean saliency per expert, "count": tokens per expert}}``, as the modifier
ranks them), "seconds", "peak_rss_mib" (VmHWM, reset just before the call),
"rss_before_mib", "versions" and "settings".
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"  # before huggingface_hub reads it at import

import torch
import transformers

# The helpers of the one-shot benchmark's llm-compressor side (same venv, same measures).
from _llmcompressor import calibration_dataset, current_rss_mib, peak_rss_mib, placeholder_tokenizer, reset_peak

# Only in the llm-compressor venv; imported by name so that mypy, run in the
# main environment where it is absent, sees it as Any.
llmcompressor: Any = importlib.import_module("llmcompressor")
pruning: Any = importlib.import_module("llmcompressor.modifiers.pruning")
linearize: Any = importlib.import_module("llmcompressor.modeling.moe.linearize")
reap_utils: Any = importlib.import_module("llmcompressor.modifiers.pruning.reap.utils")


def record_saliency(into: list[dict[str, list[float]]]) -> None:
    """Keep each layer's saliency and token counts as the modifier decides (layers in the order it decides them)."""
    tracker = reap_utils.REAPSaliencyTracker
    decide = tracker.compute_retained_experts

    def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
        into.append({"saliency": self.mean_saliency.tolist(), "count": self.count.cpu().tolist()})
        return decide(self, *args, **kwargs)

    tracker.compute_retained_experts = recorded


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--calibration", type=Path, required=True)
    parser.add_argument("--sparsity", type=float, required=True, help="share of each layer's experts removed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pipeline", choices=("basic", "sequential"), required=True)
    parser.add_argument("--propagate-error", action="store_true", help="sequential: llm-compressor's default")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    # Experts as one Linear each (what REAP hooks), before the timed call: ``oneshot`` would do it inside.
    # (``load_quantizable_moe`` would do it at load, but transformers 5.17's patching then imports torchvision,
    # which this venv does not have.)
    linearize.linearize_moe(model)
    model.eval()
    dataset, num_samples, seq_len = calibration_dataset(args.calibration)
    layer_class = type(model.model.layers[0]).__name__
    processor = placeholder_tokenizer(model.config.vocab_size)
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "retained.json"
        modifier = pruning.REAPPruningModifier(sparsity=args.sparsity, report_path=str(report))
        pipeline: dict[str, Any] = {"pipeline": args.pipeline}
        if args.pipeline == "sequential":
            pipeline.update(sequential_targets=[layer_class], propagate_error=args.propagate_error)
        settings: dict[str, Any] = {
            "modifier": repr(modifier),
            **pipeline,
            "moe_calibrate_all_experts": False,
            "num_calibration_samples": num_samples,
            "max_seq_length": seq_len,
            "batch_size": 1,
            "shuffle_calibration_samples": False,
            "threads": torch.get_num_threads(),
            "model": str(args.model),
            "calibration": str(args.calibration),
        }
        decisions: list[dict[str, list[float]]] = []
        record_saliency(decisions)  # outside the timing: two list copies per layer
        sum(float(p.detach().sum()) for p in model.parameters())  # read every weight: resident before the call
        reset_peak()
        rss_before = current_rss_mib()
        start = time.perf_counter()
        llmcompressor.oneshot(
            model=model,
            processor=processor,
            dataset=dataset,
            recipe=[modifier],
            num_calibration_samples=num_samples,
            max_seq_length=seq_len,
            batch_size=1,
            shuffle_calibration_samples=False,
            moe_calibrate_all_experts=False,
            **pipeline,
        )
        seconds = time.perf_counter() - start
        peak = peak_rss_mib()
        retained = {name: sorted(int(i) for i in kept) for name, kept in json.loads(report.read_text()).items()}
    torch.save(
        {
            "retained": retained,
            "saliency": dict(zip(sorted(retained), decisions, strict=True)),  # decided in sorted layer order
            "seconds": seconds,
            "peak_rss_mib": peak,
            "rss_before_mib": rss_before,
            "versions": {
                "llmcompressor": str(llmcompressor.__version__),
                "transformers": str(transformers.__version__),
                "torch": str(torch.__version__),
            },
            "settings": settings,
        },
        args.out,
    )
    print(f"REAP sparsity={args.sparsity}: {seconds:.2f} s, peak RSS {peak:.0f} MiB (before {rss_before:.0f} MiB)")


if __name__ == "__main__":
    main()
