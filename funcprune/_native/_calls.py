"""The native kernels as torch functions: each gives what its pure-torch step gives, or ``None``.

Callers (the bracket, the radix select, the mask product) run the torch
path where a function answers ``None``: the kernel does not apply (dtype,
layout, a transform's wrapper), or none is built (:mod:`._build`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import torch

from .._torch_private import is_functorch_wrapped
from .._types import Mask, Tensor
from ._build import TYPES, library

__all__ = [
    "CODE_BINS", "as_many_threads_as_torch", "code_collect", "code_histogram", "mask_multiply", "plain",
    "scan", "survivors", "threaded",
]  # fmt: skip

#: Entries below which a kernel runs in one thread (torch's own grain size for elementwise ops).
_SERIAL_MAX = 1 << 15
_Kernel = Callable[..., Any]
#: Bins of :func:`code_histogram`: the order codes' top 12 bits (``kernels.c``'s ``CODE_BINS``).
CODE_BINS = 1 << 12
#: Most pieces a kernel splits its input into (``kernels.c``'s ``MAX_PIECES``).
_MAX_PIECES = 256

def threaded() -> bool:
    """Whether the kernels in use run on torch's threads (else in the calling thread only)."""
    kernels = library()
    return kernels is not None and bool(kernels.fp_openmp())


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
        and not is_functorch_wrapped(t)
    )


def _kernel(kind: str, x: Tensor, *others: Mask) -> _Kernel | None:
    """The kernel ``kind`` for ``x``'s dtype, or ``None`` where the torch path must run."""
    if x.dtype not in TYPES or not plain(x):
        return None
    for t in others:
        if t is not None and (t.dtype != torch.bool or t.numel() != x.numel() or not plain(t)):
            return None
    kernels = library()
    if kernels is None:
        return None
    kernel: _Kernel = getattr(kernels, f"fp_{kind}_{TYPES[x.dtype][0]}")
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

    The order codes are :func:`funcprune._select`'s ``order_codes``' (``-0.0`` as
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
