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


def open_library(
    directory: Path, *, portable: bool, march: str | None = None
) -> tuple[ctypes.CDLL | None, NativeStatus]:
    """The kernels built in ``directory`` (compiled there first if needed), or ``None`` and why not.

    A build found there is loaded only where its bytes match the SHA-256
    recorded beside it when it was compiled; else it is rebuilt first (a
    copy cut short or altered crashes the process when loaded or called).
    ``portable`` leaves out ``-march=native``: code for any CPU of the
    architecture (the tests compare the two builds). ``march`` builds for
    that CPU level instead of this machine's (``"x86-64-v3"``: AVX2 without
    AVX-512), for tests and benchmarks of another machine's vector paths.
    """
    if portable and march is not None:
        raise ValueError(f"open_library: portable=True and march={march!r} both given; expected one of them")
    try:
        path, rebuilt = _compile(directory.absolute(), portable, march)
        library = _load_verified(path)
    except (OSError, subprocess.SubprocessError, _BuildError) as e:
        return None, NativeStatus(False, f"pure-torch kernels: {e}")
    detail = f"native kernels from {path}" + (f" (rebuilt: {rebuilt})" if rebuilt else "")
    return library, NativeStatus(True, detail)


def load(path: Path) -> ctypes.CDLL:
    """The library at ``path``, its functions' signatures declared (``AttributeError``: one lacks).

    ``path`` is made absolute: a bare file name would send ``dlopen`` to
    search the library path instead. Nothing checks the file: a library
    cut short or altered may crash the process (:func:`open_library`
    checks its builds against their records first).
    """
    library = ctypes.CDLL(str(path.absolute()))
    _declare(library)
    return library


class _BuildError(Exception):
    pass


def _cache_dir() -> Path:
    """``$FUNCPRUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/funcprune``, else ``~/.cache/funcprune``; empty counts as unset."""
    chosen = os.environ.get("FUNCPRUNE_CACHE_DIR")
    if chosen:
        return Path(chosen)
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


def _compile(directory: Path, portable: bool, march: str | None = None) -> tuple[Path, str | None]:
    """The library's path in ``directory``, compiled there unless a build that matches its record is there.

    Also why a file found there was rebuilt (``None``: it matched, or there was none).
    """
    cc = _compiler()
    if march is not None:
        arches = [(f"-march={march}", *_OPENMP), (f"-march={march}",)]
    else:
        arches = [_OPENMP, ()] if portable else [_NATIVE_ARCH + _OPENMP, _NATIVE_ARCH, _OPENMP, ()]
    source = _SOURCE.read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, timeout=30).stdout
    digest = hashlib.sha256()
    parts = (source, version, " ".join(_FLAGS).encode(), repr(arches).encode(), platform.machine().encode(), _cpu_flags().encode())  # fmt: skip
    for part in parts:
        digest.update(part)
        digest.update(b"\0")
    path = directory / f"native-{digest.hexdigest()[:16]}.so"
    if not path.exists():
        _build_to(cc, arches, path)
        return path, None
    mismatch = _mismatch(path)
    if mismatch is not None:  # never loaded: cut short or altered, it may crash the process
        _build_to(cc, arches, path)
    return path, mismatch


def _build_to(cc: str, arches: list[tuple[str, ...]], path: Path) -> None:
    """Compile the kernels to ``path`` (the first of ``arches`` that compiles), then record its hash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    for arch in arches:
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
        os.close(fd)
        try:
            done = subprocess.run(
                [cc, *_FLAGS, *arch, "-o", tmp, str(_SOURCE), "-lm"], capture_output=True, timeout=120
            )
            if done.returncode == 0:
                recorded = _sha256(Path(tmp))
                os.replace(tmp, path)  # atomic: another process may be compiling the same
                _write_atomically(_record(path), recorded + "\n")
                return
            errors.append(done.stderr.decode(errors="replace").strip()[-500:])
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise _BuildError(f"compiling {_SOURCE.name} with {cc} failed: {errors[-1]}")


def _record(path: Path) -> Path:
    """Where the SHA-256 of the library at ``path`` is recorded: written after each successful build."""
    return path.with_name(path.name + ".sha256")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _mismatch(path: Path) -> str | None:
    """Why the library at ``path`` must not be loaded (``None``: it matches the hash recorded when built)."""
    try:
        recorded = _record(path).read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        return f"{path.name} had no record of its SHA-256 ({_record(path).name})"
    if _sha256(path) != recorded:
        size = path.stat().st_size
        return f"{path.name} ({size} bytes) did not match the SHA-256 recorded when it was built: cut short or altered"
    return None


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it: readers see all of it or none."""
    fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o644)  # readable as the library is (mkstemp's file is the owner's only)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load_verified(path: Path) -> ctypes.CDLL:
    """:func:`load` a build that matched its record; one that lacks a kernel is removed (``_BuildError``).

    It matched its record but is no build of ``kernels.c``: this process
    cannot load a rebuild under the same name (``dlopen`` gives back the
    library it loaded), so it runs the pure-torch path and the next
    process rebuilds.
    """
    try:
        return load(path)
    except AttributeError as e:
        for stale in (path, _record(path)):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        raise _BuildError(f"{path.name} lacks the kernels ({e}): removed, the next process rebuilds it") from e


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

