"""Run llm-compressor's one-shot SparseGPT or Wanda on a local Llama, for benchmarks.

This script runs in its own virtual environment (llm-compressor 0.14 pins
transformers <= 5.17), never in funcprune's, and does not import funcprune:

    /work/venvs/llmc/bin/python benchmarks/_llmcompressor.py \
        --model DIR --calibration calib.pt --method sparsegpt --sparsity 0.5 \
        --threads 1 --out result.pt

``--model`` is a directory written by ``save_pretrained`` (loaded offline, in
float32); ``--calibration`` is a ``torch.save``d LongTensor (N, T) of token ids,
one unpadded calibration sample per row.  ``--nm 2:4`` replaces ``--sparsity``.

The recipe matches the SparseGPT reference: block_size=128, dampening_frac=0.01,
every Linear inside the decoder layers pruned (lm_head and embeddings dense), and
the "sequential" pipeline over the decoder layers with batch size 1.  Only the
``oneshot`` call is timed.  ``--out`` receives (``torch.save``) a dict with the
pruned Linear weights ("state_dict"), "seconds", "peak_rss_mib" (VmHWM, reset just before the call),
"rss_before_mib" (VmRSS just before ``oneshot``), "versions" and "settings".
"""

from __future__ import annotations

import argparse
import importlib
import os
import resource
import time
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"  # before huggingface_hub reads it at import

import torch
import transformers

# Only in the llm-compressor venv; imported by name so that mypy, run in the
# main environment where they are absent, sees them as Any.
datasets: Any = importlib.import_module("datasets")
llmcompressor: Any = importlib.import_module("llmcompressor")
pruning: Any = importlib.import_module("llmcompressor.modifiers.pruning")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--calibration", type=Path, required=True)
    parser.add_argument("--method", choices=("sparsegpt", "wanda"), required=True)
    pattern = parser.add_mutually_exclusive_group(required=True)
    pattern.add_argument("--sparsity", type=float, help="unstructured, e.g. 0.5")
    pattern.add_argument("--nm", help="N:M semi-structured, e.g. 2:4")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args()


def current_rss_mib() -> float:
    """Resident set size of this process now (VmRSS), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS in /proc/self/status")


def reset_peak() -> None:
    """Start the peak resident set size (VmHWM) afresh: the peak of loading the model is not the call's."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mib() -> float:
    """Peak resident set size of this process since :func:`reset_peak` (VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def calibration_dataset(path: Path) -> tuple[Any, int, int]:
    """One row per sample: input_ids and an all-ones attention_mask (no padding).

    Returns the dataset and the tensor's shape (N samples, T tokens).
    """
    tokens: torch.Tensor = torch.load(path)
    if tokens.dtype != torch.long or tokens.ndim != 2:
        raise ValueError(
            f"expected a LongTensor (N, T), got {tokens.dtype} {tuple(tokens.shape)}"
        )
    rows = tokens.tolist()
    dataset = datasets.Dataset.from_dict(
        {"input_ids": rows, "attention_mask": [[1] * len(row) for row in rows]}
    )
    return dataset, int(tokens.shape[0]), int(tokens.shape[1])


def placeholder_tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer over the ids, never used to tokenize.

    ``oneshot`` wants a processor whenever a dataset is given and would otherwise
    look for one in the model directory; the dataset here is already tokenized.
    """
    from tokenizers import Tokenizer, models

    vocab = {str(i): i for i in range(vocab_size)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="0"))
    tokenizer_class: Any = transformers.PreTrainedTokenizerFast  # untyped in 5.x
    return tokenizer_class(tokenizer_object=backend, unk_token="0")


def pruned_linear_names(model: torch.nn.Module, layer_class: str) -> list[str]:
    """Names of every Linear inside a decoder layer (what the recipe prunes)."""
    names: list[str] = []
    for layer_name, layer in model.named_modules():
        if type(layer).__name__ == layer_class:
            for name, module in layer.named_modules():
                if isinstance(module, torch.nn.Linear):
                    names.append(f"{layer_name}.{name}")
    return names


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)

    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32
    )
    dataset, num_samples, seq_len = calibration_dataset(args.calibration)
    layer_class = type(model.model.layers[0]).__name__  # LlamaDecoderLayer
    targets = pruned_linear_names(model, layer_class)

    sparsity = 0.5 if args.nm else float(args.sparsity)
    common: dict[str, Any] = {
        "sparsity": sparsity,
        "mask_structure": args.nm or "0:0",  # 0:0 means unstructured
        "targets": [layer_class],  # the decoder layers; their Linears are pruned
        "ignore": ["re:.*lm_head"],
    }
    if args.method == "sparsegpt":
        modifier = pruning.SparseGPTModifier(
            **common, block_size=128, dampening_frac=0.01
        )
    else:
        modifier = pruning.WandaPruningModifier(**common)

    settings: dict[str, Any] = {
        **common,
        "method": args.method,
        "modifier": repr(modifier),
        "pipeline": "sequential",
        "sequential_targets": [layer_class],
        "num_calibration_samples": num_samples,
        "max_seq_length": seq_len,
        "batch_size": 1,
        "shuffle_calibration_samples": False,
        "threads": torch.get_num_threads(),
        "model": str(args.model),
        "calibration": str(args.calibration),
    }

    processor = placeholder_tokenizer(model.config.vocab_size)
    sum(float(p.detach().sum()) for p in model.parameters())  # read every weight: resident before the call
    reset_peak()
    rss_before = current_rss_mib()
    start = time.perf_counter()
    model = llmcompressor.oneshot(
        model=model,
        processor=processor,
        dataset=dataset,
        recipe=[modifier],
        num_calibration_samples=num_samples,
        max_seq_length=seq_len,
        batch_size=1,
        shuffle_calibration_samples=False,
        pipeline="sequential",
        sequential_targets=[layer_class],
    )
    seconds = time.perf_counter() - start
    peak = peak_rss_mib()

    modules = dict(model.named_modules())
    state_dict = {
        f"{name}.weight": modules[name].weight.detach().to(torch.float32).cpu().clone()
        for name in targets
    }
    torch.save(
        {
            "state_dict": state_dict,
            "seconds": seconds,
            "peak_rss_mib": peak,
            "rss_before_mib": rss_before,
            "versions": {
                # plain str: torch.__version__ is a TorchVersion, which
                # torch.load(weights_only=True) refuses
                "llmcompressor": str(llmcompressor.__version__),
                "transformers": str(transformers.__version__),
                "torch": str(torch.__version__),
            },
            "settings": settings,
        },
        args.out,
    )
    print(
        f"{args.method} {settings['mask_structure']} sparsity={sparsity}: "
        f"{seconds:.2f} s, peak RSS {peak:.0f} MiB (before {rss_before:.0f} MiB)"
    )


if __name__ == "__main__":
    main()
