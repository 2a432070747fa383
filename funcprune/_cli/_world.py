"""``--nproc N``: the one-shot run over ``N`` processes started by ``torch.distributed.run``.

The command checks its input in the process the user started (bad input:
one line, exit code 2, nothing started), stages the output directory
there, and starts ``python -m torch.distributed.run --standalone
--nproc-per-node N -m funcprune._cli`` with the checked options (and the
staged directory) in the environment variable :data:`WORKER`. Each worker
joins a gloo process group, loads the model, draws the same calibration
windows (the same seed) and keeps its share of them (``windows[rank::N]``);
``fp.oneshot(..., group=)`` sums the statistics across the processes once
per block, so every process computes the same masks and weights; the
process of rank 0 writes the checkpoint, the masks and the report into the
staged directory. The starting process renames it into place when every
worker succeeded, and removes it otherwise (exit code 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["WORKER", "World", "launch", "world", "worker_job"]

#: The environment variable that carries a worker's job: ``{"options": ..., "stage": ...}`` as JSON.
WORKER = "FUNCPRUNE_CLI_WORKER"


@dataclass(frozen=True)
class World:
    """A worker's place: its rank, the number of processes and their group."""

    rank: int
    size: int
    group: Any


def launch(nproc: int, options: Mapping[str, Any], stage: Path) -> None:
    """Run the workers (``torch.distributed.run``) on ``options``, writing into ``stage``; raise if one failed."""
    env = dict(os.environ)
    env[WORKER] = json.dumps({"options": dict(options), "stage": str(stage)})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "funcprune._cli"]  # fmt: skip
    done = subprocess.run(command, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"funcprune oneshot --nproc {nproc}: a process failed (torch.distributed.run exited "
                           f"{done.returncode}; its error is above); nothing was written")  # fmt: skip


def worker_job() -> tuple[dict[str, Any], Path] | None:
    """This worker's options and staged directory (``None`` outside a worker)."""
    job = os.environ.get(WORKER)
    if job is None or "WORLD_SIZE" not in os.environ:
        return None
    got = json.loads(job)
    return dict(got["options"]), Path(got["stage"])


@contextmanager
def world() -> Iterator[World]:
    """This worker in a gloo process group (``torch.distributed.run``'s environment), its threads its share of
    the cores; the group is destroyed at the end."""
    dist.init_process_group("gloo")
    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
        yield World(dist.get_rank(), dist.get_world_size(), dist.group.WORLD)
    finally:
        dist.destroy_process_group()
