"""Handing the memory freed with a block back to the system (the one-shot runs, in memory and streamed)."""

from __future__ import annotations

from typing import Any

__all__ = ["trim"]


def trim() -> None:
    """Hand the memory freed with a block back to the system, where the C library is glibc (``malloc_trim``).

    glibc keeps freed heap memory for later allocations, and a block's
    workspace leaves it in pieces of many sizes, which the next block's
    tensors do not all fit: SparseGPT on the 8-block, 576 MiB Llama of
    ``benchmarks/oneshot_streamed.py`` peaked 575 MiB above the start
    without this, 519 with it (one run each, 2026-12-05). Elsewhere, nothing.
    """
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


_LIBC: Any = None
