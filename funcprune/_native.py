"""Optional native kernels: ``_native.c``, compiled on first use, called through ``ctypes``.

Three steps of the eager CPU path are each one pass of C over the data
instead of several torch passes: the bool-mask product (forward and
backward, :mod:`._multiply`), the bracket's scan (count the keys below a
bracket, collect those inside) and its last pass (write the kept flags,
ties to the lower index), both in :mod:`._bracket`. The selection over
shards (:mod:`._sharded`) histograms its keys' order codes by their top bits
and collects one bin's codes, indices and the flags above it
(:func:`code_histogram`, :func:`code_collect`). Each gives exactly what the
pure-torch step gives; the tests run both and compare them.

Nothing is needed at install time and nothing new at run time: the first
call that can use a kernel compiles ``_native.c`` (plain C, no torch
headers, about a second) with the system's C compiler (``$CC``, else ``cc``,
``gcc`` or ``clang``) into a cache directory (``$FUNCPRUNE_CACHE_DIR``, else
``$XDG_CACHE_HOME/funcprune``, else ``~/.cache/funcprune``), under a name
that hashes the source, the compiler, its flags and the CPU's, and later
processes load it from there. Without a compiler, or where compiling or
loading fails, or with ``FUNCPRUNE_NATIVE=0``, every step runs its
pure-torch path and :func:`status` says why. The kernels take float32 and
float64 tensors that are contiguous, on the CPU, and not wrapped by a
transform (vmap's rows reach them one by one through the eager path);
anything else takes the torch path.
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, final

import torch

from ._types import Mask, Tensor

__all__ = [
    "CODE_BINS",
    "NativeStatus",
    "as_many_threads_as_torch",
    "code_collect",
    "code_histogram",
    "disabled",
    "load",
    "mask_multiply",
    "open_library",
    "plain",
    "scan",
    "status",
    "survivors",
    "threaded",
    "using",
]

_SOURCE = Path(__file__).with_name("_native.c")
_FLAGS = ("-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math")
#: Code for this machine's CPU (the library is cached per CPU), in 512-bit vectors where
#: it has them (the mask product streams about 15% faster so).
_NATIVE_ARCH = ("-march=native", "-mprefer-vector-width=512")
#: On torch's OpenMP workers (see _native.c); where it fails, the kernels run in one thread.
_OPENMP = ("-fopenmp",)
#: Entries below which a kernel runs in one thread (torch's own grain size for elementwise ops).
_SERIAL_MAX = 1 << 15
_Kernel = Callable[..., Any]
_TYPES = {torch.float32: ("f32", ctypes.c_float), torch.float64: ("f64", ctypes.c_double)}
#: Bins of :func:`code_histogram`: the order codes' top 12 bits (``_native.c``'s ``CODE_BINS``).
CODE_BINS = 1 << 12
#: Most pieces a kernel splits its input into (``_native.c``'s ``MAX_PIECES``).
_MAX_PIECES = 256


@final
@dataclass(frozen=True, slots=True)
class NativeStatus:
    """Whether the native kernels are in use, and where from or why not."""

    available: bool
    detail: str


_lock = threading.Lock()
_UNSET = object()
_chosen: object = _UNSET  # a library (or None) that :func:`using` put in place of the cached one


@contextmanager
def using(library: ctypes.CDLL | None) -> Iterator[None]:
    """Within the block, the kernels come from ``library`` (``None``: every step takes its torch path).

    For tests and benchmarks: ``using(None)`` runs the pure-torch path,
    ``using(load(path))`` another build of the kernels.
    """
    global _chosen
    previous, _chosen = _chosen, library
    try:
        yield
    finally:
        _chosen = previous


def disabled() -> contextlib.AbstractContextManager[None]:
    """Within the block, every step takes its pure-torch path."""
    return using(None)


def status() -> NativeStatus:
    """Whether the native kernels load (compiling them first if needed), and from where or why not."""
    return _cached()[1]


def _library() -> ctypes.CDLL | None:
    if _chosen is not _UNSET:
        return _chosen  # type: ignore[return-value]
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
        path = _build(directory, portable)
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


def _build(directory: Path, portable: bool) -> Path:
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
    for suffix, real in _TYPES.values():
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


def threaded() -> bool:
    """Whether the kernels in use run on torch's threads (else in the calling thread only)."""
    library = _library()
    return library is not None and bool(library.fp_openmp())


def as_many_threads_as_torch(n: int) -> bool:
    """Whether a kernel over ``n`` entries runs on as many threads as torch's own op would."""
    return threaded() or _threads(n) == 1


def _threads(n: int) -> int:
    """How many threads a kernel over ``n`` entries runs on: torch's count, or one for few entries."""
    return 1 if n <= _SERIAL_MAX else torch.get_num_threads()


def plain(t: Tensor) -> bool:
    """A contiguous CPU tensor of its own class, that no transform wraps, whose bytes are its values."""
    return (
        (type(t) is torch.Tensor or type(t) is torch.nn.Parameter)
        and t.device.type == "cpu"
        and t.is_contiguous()
        and not t.is_neg()
        and not t.is_conj()
        and not torch._C._functorch.is_functorch_wrapped_tensor(t)
    )


def _kernel(kind: str, x: Tensor, *others: Mask) -> _Kernel | None:
    """The kernel ``kind`` for ``x``'s dtype, or ``None`` where the torch path must run."""
    if x.dtype not in _TYPES or not plain(x):
        return None
    for t in others:
        if t is not None and (t.dtype != torch.bool or t.numel() != x.numel() or not plain(t)):
            return None
    library = _library()
    if library is None:
        return None
    kernel: _Kernel = getattr(library, f"fp_{kind}_{_TYPES[x.dtype][0]}")
    return kernel


def _address(t: Mask) -> int | None:
    return None if t is None else t.data_ptr()


def mask_multiply(x: Tensor, mask: Tensor) -> Tensor | None:
    """``x * mask.to(x.dtype)`` for a bool ``mask`` of ``x``'s shape, bit for bit; ``None``: use torch."""
    kernel = _kernel("mask_multiply", x, mask)
    if kernel is None or x.shape != mask.shape:
        return None
    out = torch.empty_like(x)
    kernel(x.data_ptr(), mask.data_ptr(), out.data_ptr(), x.numel(), _threads(x.numel()))
    return out


def scan(
    source: Tensor, eligible: Mask, absolute: bool, lo: float, hi: float, capacity: int
) -> tuple[int, Tensor] | None:
    """How many keys lie below ``lo``, and the keys in ``[lo, hi]`` in index order.

    The keys are ``|source|`` (``absolute``) or ``source``, ``+inf`` where
    ``eligible`` is False; NaN is neither below nor inside. ``None`` where
    the kernel does not apply, or more than ``capacity`` keys lie inside.
    """
    kernel = _kernel("scan", source, eligible)
    if kernel is None:
        return None
    n = source.numel()
    threads = _threads(n)
    capacity = max(0, min(capacity, n + threads))  # each thread's piece has room for all its keys
    inside = torch.empty(capacity, dtype=source.dtype)
    below = ctypes.c_int64(0)
    for pieces in (threads, 1) if threads > 1 else (1,):
        # each piece collects into capacity / pieces: where the keys inside crowd into
        # one piece (sorted data), that piece overflows, and one piece takes them all
        found = kernel(
            source.data_ptr(), _address(eligible), n, int(absolute), lo, hi,
            inside.data_ptr(), capacity, ctypes.byref(below), pieces,
        )  # fmt: skip
        if found <= capacity:
            return below.value, inside[:found]
    return None


def survivors(source: Tensor, eligible: Mask, absolute: bool, v: float, take: int | None) -> Tensor | None:
    """Kept flags (``torch.bool``): keys above ``v`` (or NaN) and eligible; ``None``: use torch.

    Keys as in :func:`scan`. ``take=None`` prunes every key equal to ``v``;
    otherwise the first ``take`` of them, in index order.
    """
    kernel = _kernel("survivors", source, eligible)
    if kernel is None:
        return None
    n = source.numel()
    kept = torch.empty(n, dtype=torch.uint8)
    threads = _threads(n) if take is None else 1  # ties go in index order: one thread
    kernel(source.data_ptr(), _address(eligible), n, int(absolute), v, -1 if take is None else take, kept.data_ptr(), threads)
    return kept.view(torch.bool)


def code_histogram(keys: Tensor, eligible: Mask) -> Tensor | None:
    """Per piece of ``keys``, how many eligible keys have each value of their order codes' top 12 bits.

    The order codes are :func:`._short_rows.order_codes`' (``-0.0`` as
    ``0.0``, NaN one above ``+inf``), none written: bin ``b`` counts the
    codes ``c`` with ``(c >> (bits - 12)) + 2048 == b``, ``bits`` the keys'
    width. Returns ``int64`` of shape ``(pieces, CODE_BINS)``, row ``p`` for
    the ``p``-th of ``pieces`` contiguous pieces (the threads' pieces, as
    :func:`code_collect` splits them); ``None`` where the kernel does not
    apply (then use torch).
    """
    kernel = _kernel("code_histogram", keys, eligible)
    if kernel is None:
        return None
    n = keys.numel()
    pieces = max(1, min(_threads(n), _MAX_PIECES))
    histogram = torch.zeros(pieces, CODE_BINS, dtype=torch.int64)
    kernel(keys.data_ptr(), _address(eligible), n, histogram.data_ptr(), pieces)
    return histogram


def code_collect(keys: Tensor, eligible: Mask, b: int, counts: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
    """The eligible keys in bin ``b``: their order codes and indices (``int64``, in index order), and flags.

    Bins as in :func:`code_histogram`; ``counts`` is column ``b`` of its
    answer for the same ``keys`` and ``eligible`` (per piece, how many are
    in the bin: where each piece writes, and all the room it has). The
    flags (``torch.bool``, one per key) are set for the eligible keys in a
    higher bin: the kept flags of a cut inside bin ``b``, but for the keys
    in it. ``None`` where the kernel does not apply, or a piece holds
    another number than ``counts`` says (nothing is written past the room).
    """
    kernel = _kernel("code_collect", keys, eligible)
    if kernel is None or counts.dim() != 1 or not 1 <= counts.numel() <= _MAX_PIECES or not 0 <= b < CODE_BINS:
        return None
    if int(counts.min()) < 0:
        return None
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.int64)
    torch.cumsum(counts.to(torch.int64), 0, out=offsets[1:])
    total = int(offsets[-1])
    codes = torch.empty(total, dtype=torch.int64)
    where = torch.empty(total, dtype=torch.int64)
    above = torch.empty(keys.numel(), dtype=torch.uint8)
    found = kernel(
        keys.data_ptr(), _address(eligible), keys.numel(), b, offsets.data_ptr(),
        codes.data_ptr(), where.data_ptr(), above.data_ptr(), counts.numel(),
    )  # fmt: skip
    return (codes, where, above.view(torch.bool)) if found == total else None
