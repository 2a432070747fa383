"""What the pruning commands write to ``report.json``, and what ``report`` reads from a checkpoint.

``report.json`` holds: ``command``; ``arguments`` (every option after the
recipe was merged under the flags: a recipe table of the run);
``versions`` (funcprune, torch, transformers, Python); ``stages`` (wall
seconds of each stage, in order); ``peak_memory`` (``max_rss_bytes``, the
process's peak resident set from ``resource.getrusage``, and
``cuda_max_allocated_bytes`` when the run used CUDA, else ``null``);
``sparsity`` (``layers``: per weight pruned, its ``numel``, ``pruned``
entries and ``sparsity``; ``total``: the same summed over them); and what
the command adds (``parameters`` before and after a shrink, the loader a
shrunk checkpoint needs).
"""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

import funcprune as fp

from ._checkpoint import transformers

__all__ = ["Stages", "peak_memory", "sparsity_of", "versions", "weights_report"]


class Stages:
    """Wall seconds per stage: ``with stages("load"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - start, 4)


def versions() -> dict[str, str]:
    """The versions a report records."""
    return {"funcprune": fp.__version__, "torch": torch.__version__, "transformers": transformers().__version__,
            "python": platform.python_version()}  # fmt: skip


def peak_memory(device: str | None) -> dict[str, int | None]:
    """The process's peak resident memory in bytes (and CUDA's peak allocation when ``device`` is CUDA)."""
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    cuda = None
    if device is not None and torch.device(device).type == "cuda":
        cuda = int(torch.cuda.max_memory_allocated(torch.device(device)))
    return {"max_rss_bytes": int(rss) * scale, "cuda_max_allocated_bytes": cuda}


def _row(numel: int, pruned: int) -> dict[str, Any]:
    return {"numel": numel, "pruned": pruned, "sparsity": pruned / numel if numel else 0.0}


def sparsity_of_fractions(fractions: Mapping[str, float], numels: Mapping[str, int]) -> dict[str, Any]:
    """:func:`sparsity_of`'s report from each weight's fraction pruned and its entries (a streamed run's)."""
    layers = {name: _row(numels[name], round(f * numels[name])) for name, f in fractions.items()}
    return {"layers": layers, "total": _row(sum(numels[n] for n in layers), sum(r["pruned"] for r in layers.values()))}


def sparsity_of(masks: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Per-mask and total pruned entries of ``masks`` (``fp.sparsity_report``'s counts)."""
    report = fp.sparsity_report(dict(masks))
    layers = {row.name: _row(_numel(row.shape), row.pruned) for row in report.rows}
    return {"layers": layers, "total": _row(report.numel, report.pruned)}


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def weights_report(model: torch.nn.Module) -> dict[str, Any]:
    """The exact zeros of each Linear-like weight of ``model`` (``fp.input_dims``'s weights), and their total."""
    linear = set(fp.input_dims(model))
    rows = [row for row in fp.sparsity_report(model).rows if row.name in linear]
    layers = {row.name: {"shape": list(row.shape), **_row(_numel(row.shape), row.pruned)} for row in rows}
    numel = sum(r["numel"] for r in layers.values())
    pruned = sum(r["pruned"] for r in layers.values())
    return {"layers": layers, "total": _row(numel, pruned)}
