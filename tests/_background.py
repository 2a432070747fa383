"""Long subprocesses that tests wait for, run one after another beside the tests.

A few tests check what one long subprocess prints (the demo; mypy on a probe
file; ``python -m funcprune`` with a flag): seconds of one core each, mostly
spent importing torch or type-checking it, while the other core idled. Such
a test module lists its subprocesses in a dict ``BACKGROUND``, each
:class:`Job` under the name of the fixture that waits for it.
``tests/conftest.py`` hands the jobs that the collected tests use to
:func:`run_in_order` as soon as collection ends: a thread of this process
runs them one at a time (one core for them, the other for the tests, which
go on meanwhile), and the fixture waits for what is left of its job
(:meth:`Job.result`). A job not started by then (or by nothing: a module
imported otherwise) starts when first waited for.

Each job runs in a temporary directory of its own, which it may first fill
(``prepare``: in the thread that hands the jobs over, before the tests
start, since a preparation may use torch's global RNG, which the tests use
too), with its output in files there (a pipe nobody reads could
fill and stall it). It is bounded in time, counted from its start: past its
timeout it is killed, and :meth:`Job.result` raises
:class:`subprocess.TimeoutExpired`. At the end of the session
(:func:`stop_all`) no job starts any more, any still running is killed and
the directories are removed.
"""

from __future__ import annotations

import locale
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

_LOCK = threading.Lock()
_JOBS: list[Job] = []
_stopped = False


class Job:
    """A subprocess: ``prepare(directory)`` returns its command line (after writing any files it needs)."""

    def __init__(
        self,
        prepare: Callable[[Path], list[str]],
        *,
        timeout: float,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._prepare = prepare
        self._args: list[str] | None = None
        self._timeout = timeout
        self._cwd = cwd
        self._env = env
        self._directory: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._outputs: tuple[IO[bytes], ...] = ()
        self._deadline = 0.0
        self._timed_out = False
        self._result: subprocess.CompletedProcess[str] | None = None
        _JOBS.append(self)

    @property
    def directory(self) -> Path:
        """The job's own temporary directory (made on first use)."""
        with _LOCK:
            return self._make_directory()

    def _make_directory(self) -> Path:
        if self._directory is None:
            self._directory = Path(tempfile.mkdtemp(prefix="funcprune-tests-"))
        return self._directory

    def prepare(self) -> None:
        """Write the job's files and make its command line (once), in the calling thread."""
        with _LOCK:
            self._prepared()

    def _prepared(self) -> list[str]:
        if self._args is None:
            self._args = self._prepare(self._make_directory())
        return self._args

    def start(self) -> None:
        """Start the subprocess, unless it was started already (or the session ended)."""
        with _LOCK:
            if self._process is not None or _stopped:
                return
            directory = self._make_directory()
            args = self._prepared()
            stdout, stderr = self._outputs = tuple(open(directory / name, "w+b") for name in ("stdout", "stderr"))  # noqa: SIM115
            self._deadline = time.monotonic() + self._timeout
            try:
                self._process = subprocess.Popen(
                    args, cwd=self._cwd if self._cwd is not None else directory, env=self._env,
                    stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                )  # fmt: skip
            except BaseException:
                for file in self._outputs:
                    file.close()
                raise

    def _wait(self) -> None:
        """Wait until the subprocess exits, or kill it once its time is up (``TimeoutExpired``)."""
        assert self._process is not None
        try:
            self._process.wait(timeout=max(self._deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            self._timed_out = True
            self._process.kill()
            self._process.wait()
            raise

    def result(self) -> subprocess.CompletedProcess[str]:
        """Wait for the subprocess (starting it if need be): its exit status and output, as text."""
        if self._result is not None:
            return self._result
        self.start()
        if self._process is None:
            raise RuntimeError("the session's background jobs were stopped")
        self._wait()
        if self._timed_out:  # killed by the thread that runs the jobs
            raise subprocess.TimeoutExpired(self._process.args, self._timeout)
        stdout, stderr = (self._text(f) for f in self._outputs)
        self._result = subprocess.CompletedProcess(self._process.args, self._process.returncode, stdout, stderr)
        return self._result

    @staticmethod
    def _text(file: IO[bytes]) -> str:
        """What the subprocess wrote, decoded as ``subprocess.run(..., text=True)`` decodes it."""
        file.seek(0)
        text = file.read().decode(locale.getpreferredencoding(False))
        return text.replace("\r\n", "\n").replace("\r", "\n")

    def stop(self) -> None:
        """Kill the subprocess if it still runs; close its files and remove its directory."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        for file in self._outputs:
            file.close()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)


def run_in_order(jobs: Sequence[Job]) -> None:
    """Prepare ``jobs`` here, then run them one after another on a thread of their own (this returns then).

    The preparations run in the calling thread, before the tests: one may use
    torch's global RNG (a tiny model built and saved, seeded), which on the
    thread beside the tests raced with them for it (a test comparing RNG states
    saw a seed of 0 appear mid-test, once in a few runs).
    """
    if not jobs:
        return
    for job in jobs:
        try:
            job.prepare()
        except Exception:  # noqa: BLE001 (the test's own call of result() meets it again and fails)
            pass

    def run() -> None:
        for job in jobs:
            try:
                job.start()
                if job._process is not None:
                    job._wait()
            except Exception:  # noqa: BLE001 (the test's own call of result() meets it again and fails)
                pass

    threading.Thread(target=run, name="funcprune-tests-background", daemon=True).start()


def stop_all() -> None:
    """No job starts any more; each still running is killed, and the directories are removed."""
    global _stopped
    with _LOCK:
        _stopped = True
    for job in _JOBS:
        job.stop()
