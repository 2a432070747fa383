"""``funcprune structured``: whole units pruned (``fp.structure``, ``fp.structured``) and removed (``fp.shrink``).

The run, inside the staged output directory:

1. load: the model and its tokenizer;
2. calibration (for ``--scores taylor`` and ``fluctuation``): random windows
   of the calibration file, as ``oneshot`` draws them;
3. structure: ``fp.structure`` on an example input, the first calibration
   window (or, without calibration, ``--seq-len`` tokens ``0, 1, 2...``
   modulo the vocabulary, at most 16);
4. prune: the scores (``magnitude``: none, the plan's L2 norms of the
   weights; ``taylor``: ``fp.taylor`` of the gradients of the causal LM loss
   summed over the windows; ``fluctuation``: ``fp.fluctuation`` of
   ``fp.input_moments`` on the weights whose input features are the units,
   zero scores elsewhere), then the plan ``fp.structured(structure,
   fp.LnStructured(F, n=2), kinds=..., scope=..., normalize=...)``;
5. save: ``fp.shrink`` on the example input, ``save_pretrained`` of the
   shrunk model (with shrink's record in its config where the config cannot
   say the new widths: then ``fp.load_shrunk`` reloads it; the report's
   ``loader`` says which), the tokenizer, the masks (``masks.safetensors``,
   on the dense model's names) and ``report.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

import funcprune as fp

from ._checkpoint import check_model_dir, check_out, load, staged
from ._data import check_text_file, documents, random_windows, tokens
from ._oneshot import MASKS, REPORT, arguments
from ._options import UsageError
from ._progress import Progress
from ._report import Stages, peak_memory, sparsity_of, versions

__all__ = ["example_of", "scores_of", "run"]


def check(options: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    """The options checked before anything runs: the config and OUT_DIR."""
    if options.get("model") is None:
        raise UsageError("MODEL_DIR", "missing", "a transformers checkpoint directory")
    config = check_model_dir(options["model"])
    if options.get("sparsity") is None:
        raise UsageError("--sparsity", "missing", "a fraction strictly between 0 and 1 (0.3)")
    if options["scores"] != "magnitude":
        if options.get("calibration") is None:
            raise UsageError("--calibration", "missing", f'a text file or a .jsonl of {{"text": ...}} records '
                             f"(--scores {options['scores']} reads calibration data)")  # fmt: skip
        check_text_file("--calibration", options["calibration"])
    return config, check_out(options.get("out"), options["overwrite"])


def example_of(batches: list[torch.Tensor], vocab: int, seq_len: int) -> dict[str, Any]:
    """The example input of ``fp.structure`` and ``fp.shrink``: the first window, or ids ``0, 1, ...``."""
    ids = batches[0] if batches else (torch.arange(min(seq_len, 16)) % vocab).unsqueeze(0)
    return {"input_ids": ids, "use_cache": False}


def scores_of(
    how: str, model: torch.nn.Module, structure: fp.Structure, batches: list[torch.Tensor], progress: Progress
) -> dict[str, torch.Tensor] | None:
    """The plan's ``scores=`` for ``--scores how`` (``None``: the weights themselves)."""
    params = dict(model.named_parameters())
    if how == "magnitude":
        return None
    bar = progress.bar(f"{how} scores", len(batches), "batch")
    try:
        if how == "taylor":
            return fp.taylor(params, _gradients(model, batches, bar))
        dims = fp.input_dims(model)
        inputs = sorted({m.name for g in structure.values() for m in g.members if dims.get(m.name) == m.dim})

        def counted() -> Any:
            for batch in batches:
                yield batch
                bar.update(1)

        moments = fp.input_moments(model, counted(), inputs)
        zeros = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
        return zeros | fp.fluctuation(params, moments)
    finally:
        bar.close()


def _gradients(model: torch.nn.Module, batches: list[torch.Tensor], bar: Any) -> dict[str, torch.Tensor | None]:
    """The gradients of the causal LM loss summed over ``batches`` (the model's own ``.grad`` left as it was)."""
    params = dict(model.named_parameters())
    total: dict[str, torch.Tensor] = {}
    for batch in batches:
        grads = torch.autograd.grad(model(input_ids=batch, labels=batch, use_cache=False).loss,
                                    list(params.values()), allow_unused=True)  # fmt: skip
        for name, grad in zip(params, grads):
            if grad is not None:
                total[name] = total[name] + grad if name in total else grad
        bar.update(1)
    return {n: total.get(n) for n in params}


def run(options: dict[str, Any]) -> dict[str, Any]:
    """Run ``funcprune structured`` with ``options``; returns the report."""
    config, out = check(options)
    progress = Progress(Progress.wanted(options["quiet"]))
    stages = Stages()
    with staged(out, overwrite=options["overwrite"]) as tmp:
        with stages("load"):
            loaded = load(options["model"], config, dtype=options["dtype"], device=options["device"])
        model: Any = loaded.model
        batches: list[torch.Tensor] = []
        with stages("calibration"):
            if options["scores"] != "magnitude":
                texts = documents("--calibration", options["calibration"])
                stream = tokens("--calibration", options["calibration"], loaded.tokenizer, texts)
                batches = random_windows("--calibration", options["calibration"], stream, samples=options["samples"],
                                         seq_len=options["seq_len"], seed=options["seed"])  # fmt: skip
                batches = [b.to(model.device) for b in batches]
        example = example_of(batches, model.get_input_embeddings().num_embeddings, options["seq_len"])
        example["input_ids"] = example["input_ids"].to(model.device)
        with stages("structure"):
            structure = fp.structure(model, example)
        with stages("prune"):
            scores = scores_of(options["scores"], model, structure, batches, progress)
            normalize = None if options["normalize"] == "none" else options["normalize"]
            plan = fp.structured(structure, fp.LnStructured(options["sparsity"], n=2), kinds=options["kinds"],
                                 scope=options["scope"], normalize=normalize)  # fmt: skip
            masks = plan(dict(model.named_parameters()), scores=scores)
        with stages("shrink"):
            small = fp.shrink(model, masks, example, structure=structure)  # its analysis, not made again
        with stages("save"):
            small.save_pretrained(tmp)
            loaded.tokenizer.save_pretrained(tmp)
            fp.save_masks(masks, tmp / MASKS)
        report = {
            "command": "structured",
            "arguments": arguments(options),
            "versions": versions(),
            "stages": stages.seconds,
            "peak_memory": peak_memory(options["device"]),
            "calibration": {"windows": len(batches), "tokens": sum(b.numel() for b in batches)},
            "parameters": {"before": sum(p.numel() for p in model.parameters()),
                           "after": sum(p.numel() for p in small.parameters())},
            "loader": "fp.load_shrunk" if hasattr(small.config, "funcprune_shrunk") else "from_pretrained",
            "sparsity": sparsity_of(masks),
        }  # fmt: skip
        (tmp / REPORT).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report
