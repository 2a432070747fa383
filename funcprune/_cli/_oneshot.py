"""``funcprune oneshot``: a checkpoint pruned by ``fp.oneshot``, baked, saved with its masks and a report.

The run, inside the staged output directory (``_checkpoint.staged``):

1. load: the model (``--dtype``, on ``--device``) and its tokenizer;
2. calibration: the calibration file tokenized, ``--samples`` random
   windows of ``--seq-len`` tokens drawn with ``--seed`` (``_data.py``), one
   window per batch (not read by magnitude without ``--allocation owl``);
3. prune: :func:`prune`, the one call that says how the model is pruned
   (today ``fp.oneshot`` on the model in memory);
4. save: the new weights (SparseGPT's) copied in and the masks applied in
   place (``fp.bake``'s result, without a second copy of the model), then
   ``save_pretrained`` of the model and the tokenizer, ``fp.save_masks`` to
   ``masks.safetensors`` and ``report.json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import funcprune as fp

from ._checkpoint import check_model_dir, check_out, load, staged, transformers
from ._data import check_text_file, documents, random_windows, tokens
from ._options import Sparsity, UsageError, sparsity
from ._progress import Progress
from ._report import Stages, peak_memory, sparsity_of, sparsity_of_fractions, versions
from ._world import World, launch, world

__all__ = ["Job", "arguments", "bake_", "prune", "run", "run_worker", "spec_of"]

MASKS = "masks.safetensors"
REPORT = "report.json"


def spec_of(sparsity: Sparsity, *, per_row: bool) -> fp.Spec:
    """The spec of ``--sparsity`` (and ``--per-row``): ``L1Unstructured(f)``, its ``PerSlice`` by row, or ``NM``."""
    if isinstance(sparsity, tuple):
        if per_row:
            raise UsageError("--per-row", f"given with the N:M sparsity {sparsity[0]}:{sparsity[1]}",
                             "a fraction sparsity (N:M is already within each row)")  # fmt: skip
        return fp.NM(*sparsity)
    spec = fp.L1Unstructured(sparsity)
    return fp.PerSlice(spec, dim=0) if per_row else spec


@dataclass(frozen=True)
class Job:
    """What :func:`prune` is asked: the checkpoint (its directory and the model loaded from it), the
    calibration batches, and the method, spec, allocation and device of ``fp.oneshot``."""

    model_dir: str
    model: torch.nn.Module
    batches: list[torch.Tensor]
    method: str
    spec: fp.Spec
    allocation: str
    device: str | None

    @property
    def reads_batches(self) -> bool:
        """Whether the method reads calibration batches (magnitude only for OWL's allocation)."""
        return self.method != "magnitude" or self.allocation == "owl"


def prune(
    job: Job, progress: Progress, group: Any = None
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """How the model is pruned: ``fp.oneshot`` on the model in memory (``group``: with the other processes of
    a ``--nproc`` run, ``job.batches`` this process's share); returns ``(params, masks)``."""
    with progress.oneshot(job.model, job.batches if job.reads_batches else []) as batches:
        return fp.oneshot(job.model, batches if job.reads_batches else [], method=job.method, spec=job.spec,
                          allocation=None if job.allocation == "uniform" else job.allocation,
                          device=job.device, group=group)  # fmt: skip


def bake_(model: torch.nn.Module, params: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]) -> None:
    """``model`` made ``fp.bake(model-with-params, masks)`` in place: new weights copied in, pruned entries 0."""
    with torch.no_grad():
        for name, mask in masks.items():
            weight = model.get_parameter(name)
            if params[name] is not weight:
                weight.copy_(params[name])
            weight.mul_(mask.to(weight.device))


def check(options: dict[str, Any]) -> tuple[dict[str, Any], Path, fp.Spec]:
    """The options checked before anything runs: the config, OUT_DIR and the spec."""
    config = check_model_dir(_required(options, "model", "MODEL_DIR", "a transformers checkpoint directory"))
    method = _required(options, "method", "--method", "one of magnitude, wanda, sparsegpt")
    sparsity = _required(options, "sparsity", "--sparsity", "a fraction (0.5) or N:M (2:4)")
    spec = spec_of(sparsity, per_row=options["per_row"])
    if options["stream"] and options["nproc"] > 1:
        raise UsageError("--stream", f"given with --nproc {options['nproc']}", "one of them (a streamed run is "
                         "one process)")  # fmt: skip
    if options["stream"] and options["dtype"] is not None:
        raise UsageError("--stream", f"given with --dtype {options['dtype']}", "no --dtype (a streamed run computes "
                         "in the checkpoint's own dtype)")  # fmt: skip
    if options["stream"] and options["allocation"] == "owl":
        raise UsageError("--stream", "given with --allocation owl", "uniform allocation (OWL reads every block "
                         "before pruning any)")  # fmt: skip
    if options["allocation"] == "owl" and isinstance(sparsity, tuple):
        raise UsageError("--allocation", f"owl given with the N:M sparsity {sparsity[0]}:{sparsity[1]}",
                         "a fraction sparsity (OWL sets each block's fraction)")  # fmt: skip
    if method != "magnitude" or options["allocation"] == "owl":
        calibration = _required(options, "calibration", "--calibration", 'a text file or a .jsonl of {"text": ...} '
                                f"records (method {method} with allocation {options['allocation']} calibrates)")
        check_text_file("--calibration", calibration)
    out = check_out(options.get("out"), options["overwrite"])
    return config, out, spec


def _required(options: dict[str, Any], key: str, argument: str, expected: str) -> Any:
    value = options.get(key)
    if value is None:
        raise UsageError(argument, "missing", expected)
    return value


def run(options: dict[str, Any]) -> dict[str, Any]:
    """Run ``funcprune oneshot`` with ``options`` (merged, see ``_options.merged``); returns the report."""
    config, out, spec = check(options)
    with staged(out, overwrite=options["overwrite"]) as tmp:
        if options["nproc"] > 1:  # the workers write into tmp (_world.py)
            if options["method"] != "magnitude" or options["allocation"] == "owl":  # bad text: exit 2 here
                words = transformers().AutoTokenizer.from_pretrained(options["model"], local_files_only=True)
                _calibration(options, words, Progress(False))
            launch(options["nproc"], arguments(options), tmp)
            report: dict[str, Any] = json.loads((tmp / REPORT).read_text(encoding="utf-8"))
        elif options["stream"]:
            report = _streamed(tmp, options, spec)
        else:
            report = _into(tmp, options, config, spec, None)
    return report


def run_worker(shown: dict[str, Any], stage: Path) -> None:
    """One worker of ``--nproc N`` (``_world.py``): ``shown`` the options as :func:`arguments` wrote them."""
    options = dict(shown)
    value = options["sparsity"]
    options["sparsity"] = sparsity(value) if isinstance(value, str) else float(value)
    config = check_model_dir(options["model"])
    spec = spec_of(options["sparsity"], per_row=options["per_row"])
    with world() as here:
        _into(stage, options, config, spec, here)


def _streamed(tmp: Path, options: dict[str, Any], spec: fp.Spec) -> dict[str, Any]:
    """``--stream``: ``fp.oneshot_checkpoint`` from MODEL_DIR into ``tmp``, one block in memory (it writes the
    weights, ``masks.safetensors`` and a copy of every other file, the tokenizer's included); the report."""
    progress = Progress(Progress.wanted(options["quiet"]))
    stages = Stages()
    batches: list[torch.Tensor] = []
    reads = options["method"] != "magnitude"
    with stages("calibration"):
        if reads:
            words = transformers().AutoTokenizer.from_pretrained(options["model"], local_files_only=True)
            batches = _calibration(options, words, progress)
    with stages("prune"):
        try:
            fractions = fp.oneshot_checkpoint(options["model"], tmp, batches, method=options["method"], spec=spec,
                                              device=options["device"], overwrite=True)  # fmt: skip
        except ValueError as error:  # what a stream cannot do (a layout it refuses), named by oneshot_checkpoint
            raise UsageError("--stream", str(error).removeprefix("oneshot_checkpoint: "),
                             "a checkpoint the streamed run reads (or run without --stream)") from None
    report = {
        "command": "oneshot",
        "arguments": arguments(options),
        "versions": versions(),
        "stages": stages.seconds,
        "processes": 1,
        "peak_memory": peak_memory(options["device"]),
        "calibration": {"windows": len(batches), "tokens": sum(b.numel() for b in batches)},
        "sparsity": sparsity_of_fractions(fractions, _numels(options["model"], fractions)),
    }
    (tmp / REPORT).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def _numels(model_dir: str, names: Mapping[str, float]) -> dict[str, int]:
    """The entries of each of ``names`` (the model's parameter names: a mixture of experts' stacks, not the
    checkpoint's per-expert tensors), from the model its config builds on the meta device."""
    t = transformers()
    config = t.AutoConfig.from_pretrained(model_dir, local_files_only=True)
    with torch.device("meta"):
        model = t.AutoModelForCausalLM.from_config(config)
    return {n: p.numel() for n, p in model.named_parameters() if n in names}


def _into(tmp: Path, options: dict[str, Any], config: dict[str, Any], spec: fp.Spec, here: World | None
          ) -> dict[str, Any]:  # fmt: skip
    """The run, written into ``tmp`` (by rank 0 alone in a ``--nproc`` run: ``here``); returns the report."""
    writes = here is None or here.rank == 0
    progress = Progress(Progress.wanted(options["quiet"]) and writes)
    stages = Stages()
    with stages("load"):
        loaded = load(options["model"], config, dtype=options["dtype"] or "float32", device=options["device"])
    job = Job(options["model"], loaded.model, [], options["method"], spec, options["allocation"],
              options["device"])  # fmt: skip
    with stages("calibration"):
        if job.reads_batches:
            job = Job(job.model_dir, job.model, _calibration(options, loaded.tokenizer, progress), job.method,
                      spec, job.allocation, job.device)  # fmt: skip
    drawn = job.batches
    if here is not None:  # this process's share of the windows
        job = Job(job.model_dir, job.model, drawn[here.rank :: here.size], job.method, spec, job.allocation,
                  job.device)  # fmt: skip
    with stages("prune"):
        params, masks = prune(job, progress, None if here is None else here.group)
    report = {
        "command": "oneshot",
        "arguments": arguments(options),
        "versions": versions(),
        "stages": stages.seconds,
        "processes": 1 if here is None else here.size,
        "calibration": {"windows": len(drawn), "tokens": sum(b.numel() for b in drawn)},
        "sparsity": sparsity_of(masks),
    }
    if writes:
        with stages("save"):
            bake_(loaded.model, params, masks)
            del params
            loaded.model.save_pretrained(tmp)
            loaded.tokenizer.save_pretrained(tmp)
            fp.save_masks(masks, tmp / MASKS)
        report["stages"] = stages.seconds
        report["peak_memory"] = peak_memory(options["device"])  # this process's (rank 0's in a --nproc run)
        (tmp / REPORT).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def _calibration(options: dict[str, Any], tokenizer: Any, progress: Progress) -> list[torch.Tensor]:
    path = options["calibration"]
    texts = documents("--calibration", path)
    bar = progress.bar("tokenizing", len(texts), "doc")
    try:
        stream = tokens("--calibration", path, tokenizer, texts, step=lambda: bar.update(1))
    finally:
        bar.close()
    return random_windows("--calibration", path, stream, samples=options["samples"], seq_len=options["seq_len"],
                          seed=options["seed"])  # fmt: skip


def arguments(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options as JSON values, for a report (a sparsity pair as "N:M", kinds as a list)."""
    shown: dict[str, Any] = {}
    for key, value in options.items():
        if isinstance(value, tuple) and len(value) == 2 and key == "sparsity":
            value = f"{value[0]}:{value[1]}"
        elif isinstance(value, tuple):
            value = list(value)
        shown[key] = value
    return shown

