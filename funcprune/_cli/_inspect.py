"""``funcprune eval`` (perplexity) and ``funcprune report`` (sparsity): read a checkpoint, write nothing.

Both load the checkpoint as the pruning commands do (``fp.load_shrunk``
where the config carries shrink's record, else ``from_pretrained``) and
print to stdout: text, or with ``--json`` one JSON object.

- ``eval``: ``fp.perplexity`` of the model on the data file cut into
  consecutive windows of ``--seq-len`` tokens (the first ``--samples``),
  ``--batch-size`` windows per forward: the perplexity, the mean negative
  log-likelihood per token in nats and the count of tokens predicted.
- ``report``: per Linear-like weight (``fp.input_dims``'s), its shape and
  exact zeros; their totals; and, where the directory holds the
  ``masks.safetensors`` that ``oneshot`` and ``structured`` write,
  ``fp.load_masks``'s masks: per mask its pruned entries, their total, and
  whether every entry a mask prunes is zero in the weights (true of a
  ``oneshot`` checkpoint; ``null`` where a mask does not fit its weight: a
  ``structured`` checkpoint's weights were shrunk, its masks are the dense
  model's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import funcprune as fp

from ._checkpoint import check_model_dir, load
from ._data import check_text_file, consecutive_windows, documents, tokens
from ._oneshot import MASKS
from ._options import UsageError
from ._progress import Progress
from ._report import sparsity_of, weights_report

__all__ = ["evaluate", "report"]


def evaluate(options: dict[str, Any]) -> dict[str, Any]:
    """Run ``funcprune eval``; returns what it prints."""
    if options.get("model") is None:
        raise UsageError("MODEL_DIR", "missing", "a transformers checkpoint directory")
    config = check_model_dir(options["model"])
    if options.get("data") is None:
        raise UsageError("--data", "missing", 'a text file or a .jsonl of {"text": ...} records')
    check_text_file("--data", options["data"])
    loaded = load(options["model"], config, dtype=options["dtype"], device=options["device"])
    texts = documents("--data", options["data"])
    stream = tokens("--data", options["data"], loaded.tokenizer, texts)
    batches = consecutive_windows("--data", options["data"], stream, seq_len=options["seq_len"],
                                  samples=options.get("samples"), batch_size=options["batch_size"])  # fmt: skip
    bar = Progress(Progress.wanted(options["quiet"])).bar("eval", len(batches), "batch")

    def counted() -> Any:
        for batch in batches:
            yield batch.to(loaded.model.device)
            bar.update(1)

    try:
        result = fp.perplexity(loaded.model, counted())
    finally:
        bar.close()
    return {"perplexity": result.perplexity, "nll": result.nll, "tokens": result.tokens,
            "windows": sum(len(b) for b in batches), "seq_len": options["seq_len"], "loader": loaded.loader}  # fmt: skip


def show_eval(result: dict[str, Any]) -> str:
    """``eval``'s text output."""
    return (f"perplexity {result['perplexity']:.4f} (nll {result['nll']:.6f} nats/token) over {result['tokens']} "
            f"tokens predicted in {result['windows']} windows of {result['seq_len']} ({result['loader']})")  # fmt: skip


def report(options: dict[str, Any]) -> dict[str, Any]:
    """Run ``funcprune report``; returns what it prints."""
    if options.get("model") is None:
        raise UsageError("MODEL_DIR", "missing", "a transformers checkpoint directory")
    config = check_model_dir(options["model"])
    loaded = load(options["model"], config, dtype="float32", device=None, tokenizer=False)
    found: dict[str, Any] = {"loader": loaded.loader, "weights": weights_report(loaded.model), "masks": None}
    path = Path(options["model"]) / MASKS
    if path.is_file():
        masks = fp.load_masks(path)
        params = dict(loaded.model.named_parameters())
        fits = all(n in params and params[n].shape == m.shape for n, m in masks.items())
        agree = all(not bool(params[n][~m].any()) for n, m in masks.items()) if fits else None
        found["masks"] = {"file": MASKS, **sparsity_of(masks), "weights_zero_where_pruned": agree}
    return found


def show_report(found: dict[str, Any]) -> str:
    """``report``'s text output: a table of weights, totals, and the masks file's summary."""
    rows = found["weights"]["layers"]
    width = max([len("weight"), *map(len, rows)])
    lines = [f"{'weight':<{width}}  {'shape':>14}  {'zeros':>10}  {'sparsity':>8}"]
    for name, row in rows.items():
        shape = "x".join(map(str, row["shape"]))
        lines.append(f"{name:<{width}}  {shape:>14}  {row['pruned']:>10}  {row['sparsity']:>8.2%}")
    total = found["weights"]["total"]
    lines.append(f"{'total':<{width}}  {total['numel']:>14}  {total['pruned']:>10}  {total['sparsity']:>8.2%}")
    masks = found["masks"]
    if masks is None:
        lines.append(f"no {MASKS} in the directory")
    else:
        t = masks["total"]
        agree = {True: "yes", False: "no", None: "n/a (the weights were shrunk)"}[masks["weights_zero_where_pruned"]]
        lines.append(f"{masks['file']}: {len(masks['layers'])} masks, {t['pruned']} of {t['numel']} entries pruned "
                     f"({t['sparsity']:.2%}); weights zero where pruned: {agree}")  # fmt: skip
    return "\n".join(lines)


def printed(result: dict[str, Any], as_json: bool, text: str) -> str:
    """The output: ``result`` as JSON, or ``text``."""
    return json.dumps(result, indent=2) if as_json else text
