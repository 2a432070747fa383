"""A small world of ``torch.distributed`` processes for the tests.

:class:`World` starts ``size`` processes joined in a gloo group on
127.0.0.1 (a free port, retried if another process takes it first). Each
waits for functions to run: ``world.run(fn, *args)`` calls
``fn(rank, size, *args)`` on every rank and returns the results in rank
order. One world serves many calls (a hypothesis property sends each
example through it). Everything is bounded in time: collectives time out,
and a call that does not answer in time terminates the world and fails.

The processes are forked by multiprocessing's fork server, a fresh
interpreter (never this one, whose torch may run threads) that imports
torch, torch.distributed, funcprune and hypothesis once for the session
(:data:`PRELOAD`); a forked process imports only the test module whose
functions it runs, and exits without an interpreter shutdown. Spawned
processes each imported all of it and shut their interpreter down: seconds
per world on 2 cores, where a forked world takes a tenth of a second. The
server starts with the first world, and its processes see the environment
variables of that moment.
"""

from __future__ import annotations

import datetime
import multiprocessing
import multiprocessing.context
import multiprocessing.queues
import os
import queue
import socket
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import _torchvision  # noqa: F401 (before transformers imports torchvision)
import torch
import torch.distributed as dist

#: Seconds a collective may wait for the other ranks.
COLLECTIVE_TIMEOUT = 30
#: Seconds a call may take before the world is torn down.
CALL_TIMEOUT = 90
#: What the fork server imports once for every process it forks (missing ones are skipped).
PRELOAD = [
    "_torchvision", "torch", "torch.distributed", "torch.distributed.tensor", "torch.distributed.fsdp", "hypothesis", "funcprune",
    "transformers", "transformers.models.llama.modeling_llama", "transformers.models.mixtral.modeling_mixtral",
    "transformers.models.gpt2.modeling_gpt2", "transformers.models.opt.modeling_opt",
    __name__,
]  # fmt: skip


def _context() -> multiprocessing.context.ForkServerContext | multiprocessing.context.SpawnContext:
    """The fork server's context where there is one (not on Windows), else spawn's."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # read when the server starts, with the first world
    # Python 3.11's fork server does not apply the parent's sys.path before it preloads: the tests' directory on
    # PYTHONPATH lets it import _torchvision (and this module) before transformers
    here = os.path.dirname(os.path.abspath(__file__))
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if here not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, *paths]))
    return context


@contextmanager
def one_process_group() -> Iterator[None]:
    """The default process group as a gloo group of this process alone (an in-memory store), for the block."""
    store = dist.HashStore()  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _serve(rank: int, size: int, port: int, inbox: Any, outbox: Any) -> None:
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=size,
            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT),
        )
    except Exception:  # noqa: BLE001 (reported to the parent, which retries)
        outbox.put((rank, False, traceback.format_exc()))
        return
    outbox.put((rank, True, None))
    try:
        while (job := inbox.get()) is not None:
            fn, args = job
            try:
                outbox.put((rank, True, fn(rank, size, *args)))
            except Exception:  # noqa: BLE001 (the parent raises it)
                outbox.put((rank, False, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class World:
    """``size`` gloo processes on 127.0.0.1 that run functions on request."""

    def __init__(self, size: int, attempts: int = 3) -> None:
        self.size = size
        context = _context()
        for attempt in range(attempts):
            self._closed = False
            self._outbox: multiprocessing.queues.Queue[Any] = context.Queue()
            self._inboxes: list[multiprocessing.queues.Queue[Any]] = [context.Queue() for _ in range(size)]
            port = _free_port()
            self._processes = [
                context.Process(target=_serve, args=(r, size, port, self._inboxes[r], self._outbox), daemon=True)
                for r in range(size)
            ]
            for p in self._processes:
                p.start()
            try:
                self._collect()
                return
            except RuntimeError:
                self.close()
                if attempt == attempts - 1:
                    raise

    def run(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """``fn(rank, size, *args)`` on every rank; the results in rank order."""
        if self._closed:
            raise RuntimeError("this world was torn down by an earlier failure")
        for inbox in self._inboxes:
            inbox.put((fn, args))
        try:
            return self._collect()
        except RuntimeError:
            self.close()
            raise

    def _collect(self) -> list[Any]:
        results: dict[int, Any] = {}
        errors: list[str] = []
        while len(results) + len(errors) < self.size:
            try:
                rank, ok, value = self._outbox.get(timeout=CALL_TIMEOUT)
            except queue.Empty:
                raise RuntimeError(f"no answer from the world of {self.size} in {CALL_TIMEOUT} s") from None
            if ok:
                results[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
        if errors:
            raise RuntimeError("\n".join(errors))
        return [results[r] for r in range(self.size)]

    def close(self) -> None:
        """Stop every process (politely first)."""
        self._closed = True
        for inbox, p in zip(self._inboxes, self._processes, strict=True):
            if p.is_alive():
                inbox.put(None)
        for p in self._processes:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
