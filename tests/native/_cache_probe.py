"""Run by ``test_native_cache.py`` in a subprocess: each cache scenario in a forked child of its own.

``python _cache_probe.py DIRECTORY NAME...``: ``DIRECTORY/NAME/scenario.json``
holds the scenario's environment (``env``) and working directory
(``cwd``). This process imports torch and funcprune once (seconds), then
forks one child per scenario, one after another: the child sets them, masks
a tensor (the first kernel call, which opens the cached library) and writes
what it saw to ``DIRECTORY/NAME/report.json``. A child that crashes (SIGBUS
from a library cut short) fails its own scenario only. Prints one JSON
object: per scenario, the child's exit code (``-signal`` if killed, ``None``
if it ran past its time) and its report (``None`` if it wrote none).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from pathlib import Path

import torch

import funcprune as fp
from funcprune import _native

#: Seconds a child may run: a rebuild of the kernels takes one or two.
_CHILD_TIMEOUT = 60.0


def child(folder: Path) -> None:
    """Mask a tensor through the cache the scenario sets up; report the status and the results."""
    scenario = json.loads((folder / "scenario.json").read_text())
    os.environ.update(scenario["env"])
    os.chdir(scenario["cwd"])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=g)
    mask = torch.rand(1000, generator=g) < 0.5
    masked = fp.apply_masks({"w": x}, {"w": mask})["w"]  # the first kernel call: opens the cached library
    direct = _native.mask_multiply(x, mask)
    with _native.disabled():
        pure = fp.apply_masks({"w": x}, {"w": mask})["w"]
    status = _native.status()
    report = {
        "available": status.available,
        "detail": status.detail,
        "native": direct is not None,
        "equal": torch.equal(masked, pure) and (direct is None or torch.equal(direct, pure)),
    }
    (folder / "report.json").write_text(json.dumps(report))


def run(folder: Path) -> dict[str, object]:
    """The exit code of a forked child that runs :func:`child` on ``folder``, and its report."""
    process = multiprocessing.get_context("fork").Process(target=child, args=(folder,))
    process.start()
    process.join(_CHILD_TIMEOUT)
    if process.is_alive():
        process.kill()
        process.join()
        code = None
    else:
        code = process.exitcode
    report = folder / "report.json"
    return {"exitcode": code, "report": json.loads(report.read_text()) if report.exists() else None}


def main(directory: Path, names: list[str]) -> None:
    print(json.dumps({name: run(directory / name) for name in names}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
