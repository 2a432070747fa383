"""Building the native kernels: ``kernels.c`` compiled on first use into a cache, loaded with ``ctypes``.

:func:`library` gives the kernels in use (or ``None``: the pure-torch
paths run); :func:`status` says where they come from or why not. How and
where they are compiled: ``README.md`` in this folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import final

import torch

__all__ = ["NativeStatus", "TYPES", "disabled", "library", "load", "open_library", "status", "using"]

_SOURCE = Path(__file__).with_name("kernels.c")
_FLAGS = ("-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math")
#: Code for this machine's CPU (the library is cached per CPU), in 512-bit vectors where
#: it has them (the mask product streams about 15% faster so).
_NATIVE_ARCH = ("-march=native", "-mprefer-vector-width=512")
#: On torch's OpenMP workers (see kernels.c); where it fails, the kernels run in one thread.
_OPENMP = ("-fopenmp",)
#: The dtypes the kernels take: each one's suffix in the C names, and its ctypes type.
TYPES = {torch.float32: ("f32", ctypes.c_float), torch.float64: ("f64", ctypes.c_double)}


@final
@dataclass(frozen=True, slots=True)
class NativeStatus:
    """Whether the native kernels are in use, and where from or why not."""

    available: bool
    detail: str


_lock = threading.Lock()
_UNSET = object()
#: A library (or None) that :func:`using` put in place of the cached one, in this thread (context) only.
_chosen: ContextVar[object] = ContextVar("funcprune_native_library", default=_UNSET)


@contextmanager
def using(library: ctypes.CDLL | None) -> Iterator[None]:
    """Within the block, the kernels come from ``library`` (``None``: every step takes its torch path).

    For tests and benchmarks: ``using(None)`` runs the pure-torch path,
    ``using(load(path))`` another build of the kernels. Only the calling
    thread (context) is affected: another thread keeps its own choice.
    """
    token = _chosen.set(library)
    try:
        yield
    finally:
        _chosen.reset(token)


def disabled() -> contextlib.AbstractContextManager[None]:
    """Within the block, every step takes its pure-torch path."""
    return using(None)


def status() -> NativeStatus:
    """Whether the native kernels load (compiling them first if needed), and from where or why not."""
    return _cached()[1]


def library() -> ctypes.CDLL | None:
    """The kernels in use: :func:`using`'s choice in this context, else the cached build (``None``: none)."""
    chosen = _chosen.get()
    if chosen is not _UNSET:
        return chosen  # type: ignore[return-value]
    return _cached()[0]


@functools.cache
def _cached() -> tuple[ctypes.CDLL | None, NativeStatus]:
    if os.environ.get("FUNCPRUNE_NATIVE", "1").strip().lower() in {"0", "false", "no", "off"}:
        return None, NativeStatus(False, "turned off by FUNCPRUNE_NATIVE")
    with _lock:
        return open_library(_cache_dir(), portable=False)


def open_library(directory: Path, *, portable: bool) -> tuple[ctypes.CDLL | None, NativeStatus]:
    """The kernels built in ``directory`` (compiled there first if needed), or ``None`` and why not.

    ``portable`` leaves out ``-march=native``: code for any CPU of the
    architecture (the tests compare the two builds).
    """
    try:
        path = _compile(directory, portable)
        library = load(path)
    except (OSError, subprocess.SubprocessError, _BuildError) as e:
        return None, NativeStatus(False, f"pure-torch kernels: {e}")
    return library, NativeStatus(True, f"native kernels from {path}")


def load(path: Path) -> ctypes.CDLL:
    """The library at ``path``, its functions' signatures declared."""
    library = ctypes.CDLL(str(path))
    _declare(library)
    return library


class _BuildError(Exception):
    pass


def _cache_dir() -> Path:
    if "FUNCPRUNE_CACHE_DIR" in os.environ:
        return Path(os.environ["FUNCPRUNE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "funcprune"


def _compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and (found := shutil.which(name)):
            return found
    raise _BuildError("no C compiler found ($CC, cc, gcc or clang)")


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def _compile(directory: Path, portable: bool) -> Path:
    """The compiled library's path, compiling it into ``directory`` if it is not there."""
    cc = _compiler()
    arches = [_OPENMP, ()] if portable else [_NATIVE_ARCH + _OPENMP, _NATIVE_ARCH, _OPENMP, ()]
    source = _SOURCE.read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, timeout=30).stdout
    digest = hashlib.sha256()
    parts = (source, version, " ".join(_FLAGS).encode(), repr(arches).encode(), platform.machine().encode(), _cpu_flags().encode())  # fmt: skip
    for part in parts:
        digest.update(part)
        digest.update(b"\0")
    path = directory / f"native-{digest.hexdigest()[:16]}.so"
    if path.exists():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    errors = []
    for arch in arches:
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=directory)
        os.close(fd)
        try:
            done = subprocess.run(
                [cc, *_FLAGS, *arch, "-o", tmp, str(_SOURCE), "-lm"], capture_output=True, timeout=120
            )
            if done.returncode == 0:
                os.replace(tmp, path)  # atomic: another process may be compiling the same
                return path
            errors.append(done.stderr.decode(errors="replace").strip()[-500:])
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise _BuildError(f"compiling {_SOURCE.name} with {cc} failed: {errors[-1]}")


def _declare(library: ctypes.CDLL) -> None:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    library.fp_openmp.argtypes, library.fp_openmp.restype = [], i32
    for suffix, real in TYPES.values():
        multiply = getattr(library, f"fp_mask_multiply_{suffix}")
        multiply.argtypes, multiply.restype = [p, p, p, i64, i32], None
        scan_ = getattr(library, f"fp_scan_{suffix}")
        scan_.argtypes, scan_.restype = [p, p, i64, i32, real, real, p, i64, p, i32], i64
        survivors_ = getattr(library, f"fp_survivors_{suffix}")
        survivors_.argtypes, survivors_.restype = [p, p, i64, i32, real, i64, p, i32], None
        histogram = getattr(library, f"fp_code_histogram_{suffix}")
        histogram.argtypes, histogram.restype = [p, p, i64, p, i32], None
        collect = getattr(library, f"fp_code_collect_{suffix}")
        collect.argtypes, collect.restype = [p, p, i64, i64, p, p, p, p, i32], i64

