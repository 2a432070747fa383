"""The native kernels as torch functions: each gives what its pure-torch step gives, or ``None``.

Callers (the bracket, the radix select, the mask product) run the torch
path where a function answers ``None``: the kernel does not apply (dtype,
layout, a transform's wrapper), or none is built (:mod:`._build`).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .._torch_private import is_functorch_wrapped
from .._types import Mask, Tensor
from ._build import TYPES, library

__all__ = [
    "CODE_BINS", "as_many_threads_as_torch", "block_any", "block_expand", "block_norms", "code_collect",
    "code_histogram", "mask_multiply",
    "N_M_MAX", "n_m", "plain", "ragged_keep", "row_counts", "rows_keep", "scan", "survivors", "threaded",
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
    return _own_bytes(t) and t.is_contiguous()


def _own_bytes(t: Tensor) -> bool:
    """A CPU tensor of its own class, that no transform wraps, whose bytes are its values (any layout)."""
    return (
        (type(t) is torch.Tensor or type(t) is torch.nn.Parameter)
        and t.device.type == "cpu"
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


# --- block norms and per-row selection (declared here, on first use) ------------------------

_P, _I64, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
#: Each kernel's arguments and result, by the name's stem (the dtype's suffix follows).
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "block_norms": ([_P, _I64, _I64, _I64, _I64, _I64, _I32, _P, _I32], None),
    "rows_keep": ([_P, _P, _I64, _I64, _I32, _P, _P, _I32], _I32),
    "ragged_keep": ([_P, _P, _P, _P, _I64, _I32, _P, _P, _I32], _I32),
    "row_counts": ([_P, _I64, _I64, _P, _I32], None),
    "block_any": ([_P, _I64, _I64, _I64, _I64, _P, _I32], None),
    "block_expand": ([_P, _P, _I64, _I64, _I64, _I64, _P, _I32], None),
    "n_m": ([_P, _P, _I64, _I64, _I64, _I64, _P, _I32], _I32),
    "sparsegpt_block": ([_P, _I64, _I64, _I64, _P, _I64, _P, _I64, _I64, _P, _I32], _I32),
    "unit_abs_max": ([_P, _I64, _I64, _I64, _I64, _P, _I32], None),
    "unit_rounded": ([_P, _I64, _I64, _I64, _I64, _P, _I32, _P, _I32], None),
}


#: The kernels that also take float16 and bfloat16 (read as their bits), and those dtypes' suffixes.
_HALF_KINDS = frozenset({"n_m"})
_HALVES = {torch.float16: "f16", torch.bfloat16: "bf16"}


def _declared(kind: str, x: Tensor, *others: Mask, contiguous: bool = True) -> _Kernel | None:
    """:func:`_kernel`, its signature declared (``None`` also where the library in use lacks it).

    ``contiguous=False`` lets ``x`` lie in memory in any layout (the caller checks the one its kernel reads).

    A bool ``x`` takes the kernel named ``fp_{kind}`` (no dtype suffix); a
    float16 or bfloat16 one, where ``kind`` takes them (:data:`_HALF_KINDS`),
    ``fp_{kind}_f16`` or ``fp_{kind}_bf16``.
    """
    if x.dtype == torch.bool:
        suffix = ""
    elif x.dtype in TYPES:
        suffix = f"_{TYPES[x.dtype][0]}"
    elif x.dtype in _HALVES and kind in _HALF_KINDS:
        suffix = f"_{_HALVES[x.dtype]}"
    else:
        return None
    if not (plain(x) if contiguous else _own_bytes(x)):
        return None
    kernels = library()
    name = f"fp_{kind}{suffix}"
    kernel = None if kernels is None else getattr(kernels, name, None)
    if kernel is None:
        return None
    for t in others:
        if t is not None and (t.dtype != torch.bool or t.numel() != x.numel() or not plain(t)):
            return None
    if kernel.argtypes is None:
        kernel.argtypes, kernel.restype = _SIGNATURES[kind]
    return kernel  # type: ignore[no-any-return]


def block_norms(x: Tensor, height: int, width: int, fused: bool) -> Tensor | None:
    """The L2 norm of each ``height`` x ``width`` block of the last two dims of ``x``; ``None``: use torch.

    ``x`` is read as rows of its last dim's length; each block's squares go
    into one accumulator in row-major order, ``acc + v * v`` or, where
    ``fused``, ``fma(v, v, acc)``; the norm is the correctly rounded square
    root, of ``x``'s dtype. Returns shape ``(rows of blocks, blocks a row)``
    (the lengths must be multiples of the block's).
    """
    kernel = _declared("block_norms", x)
    grid = None if kernel is None or x.dim() == 0 else _blocks_of(x.shape, height, width)
    if kernel is None or grid is None:
        return None
    rows, columns = grid
    out = torch.empty(rows, columns, dtype=x.dtype, device="cpu")
    kernel(x.data_ptr(), rows, height, columns, width, x.shape[-1], int(fused), out.data_ptr(), _threads(x.numel()))
    return out


def rows_keep(x: Tensor, eligible: Mask, absolute: bool, counts: Tensor) -> Tensor | None:
    """Per row of 2-D ``x``, kept flags (``torch.bool``) once its ``counts[r]`` lowest eligible keys go.

    Keys as in :func:`scan` (``|x|`` where ``absolute``); ties go to the
    lower index, NaN ranks above every number, a count is capped to
    ``[0, eligible in the row]``; ``counts`` is ``int64``, one per row.
    ``None`` where the kernel does not apply (then use torch).
    """
    kernel = _declared("rows_keep", x, eligible)
    if kernel is None or x.dim() != 2 or counts.dtype != torch.int64 or counts.device.type != "cpu":
        return None
    if counts.shape != (x.shape[0],):
        return None
    counts = counts.contiguous()
    kept = torch.empty(x.shape, dtype=torch.uint8, device="cpu")
    threads = min(_threads(x.numel()), max(1, x.shape[0]))  # a row is one thread's: no idle ones
    status = kernel(
        x.data_ptr(), _address(eligible), x.shape[0], x.shape[1], int(absolute), counts.data_ptr(),
        kept.data_ptr(), threads,
    )  # fmt: skip
    return kept.view(torch.bool) if status == 0 else None


def ragged_keep(
    sources: Sequence[Tensor], eligible: Sequence[Mask], absolute: bool, counts: Sequence[int],
    available: Sequence[int] | None = None,
) -> list[Tensor] | None:
    """:func:`rows_keep` over rows of their own lengths: one per tensor, each with its own count.

    Row ``r`` is ``sources[r]`` read flat (keys as in :func:`scan`), its
    entries eligible where ``eligible[r]`` (bool, of as many entries, or
    ``None``: all) is set, of which ``available[r]`` are (where given: the
    kernel does not count them); its ``counts[r]`` lowest eligible keys go
    (capped to ``[0, eligible]``). Every source has one dtype. Returns one
    new flat ``torch.bool`` tensor per row, or ``None`` where the kernel does
    not apply (then use torch). Rows go to the threads one at a time, the
    longest first, each row one thread's: the flags do not depend on the threads.
    """
    if not sources or len(eligible) != len(sources) or len(counts) != len(sources):
        return None
    if available is not None and len(available) != len(sources):
        return None
    kernel = _declared("ragged_keep", sources[0])
    if kernel is None:
        return None
    dtype = sources[0].dtype
    for source, flags in zip(sources, eligible, strict=True):
        if source.dtype != dtype or not plain(source):
            return None
        if flags is not None and (flags.dtype != torch.bool or flags.numel() != source.numel() or not plain(flags)):
            return None
    rows = len(sources)
    lengths = [x.numel() for x in sources]
    order = sorted(range(rows), key=lengths.__getitem__, reverse=True)  # the longest first
    kept = [torch.empty(n, dtype=torch.uint8) for n in lengths]
    columns = (
        [sources[r].data_ptr() for r in order],
        [_address(eligible[r]) or 0 for r in order],
        [lengths[r] for r in order],
        [-1 if available is None else available[r] for r in order],
        [max(0, min(counts[r], lengths[r])) for r in order],
        [kept[r].data_ptr() for r in order],
    )  # x, e, n, m, k, kept: one row of the table each
    table = torch.tensor([v for column in columns for v in column], dtype=torch.int64)
    at = [table.data_ptr() + 8 * rows * i for i in range(6)]
    threads = min(_threads(sum(lengths)), rows)
    status = kernel(at[0], at[1], at[2], at[3], rows, int(absolute), at[4], at[5], threads)
    return [k.view(torch.bool) for k in kept] if status == 0 else None


def row_counts(flags: Tensor) -> Tensor | None:
    """How many flags of each row of a 2-D ``torch.bool`` tensor are set (``int64``); ``None``: use torch."""
    kernel = _declared("row_counts", flags)
    if kernel is None or flags.dim() != 2:
        return None
    out = torch.empty(flags.shape[0], dtype=torch.int64, device="cpu")
    kernel(flags.data_ptr(), flags.shape[0], flags.shape[1], out.data_ptr(), _threads(flags.numel()))
    return out


# --- N:M ----------------------------------------------------------------------------------

#: The longest N:M group the kernel ranks (``kernels.c``'s ``NM_MAX_M``): it compares each entry
#: with the ``m - 1`` others of its group.
N_M_MAX = 64


def n_m(scores: Tensor, eligible: Mask, n: int, m: int, dim: int) -> Tensor | None:
    """``NM(n, m, dim)``'s kept flags (``torch.bool``, ``scores``' shape); ``None``: use torch.

    In each group of ``m`` consecutive entries along ``dim``, the ``n``
    eligible entries of largest ``|score|`` are kept (all of them where
    fewer are eligible): ties go to the lower index first, NaN ranks above
    every number, ``-0.0`` ties ``0.0``; an entry not ``eligible`` is never
    kept. Float32, float64, float16 and bfloat16 scores (the halves read as
    their bits). ``None`` where the kernel does not apply (dtype, layout, a
    ``dim`` whose length ``m`` does not divide, ``m`` above :data:`N_M_MAX`).
    """
    kernel = _declared("n_m", scores, eligible)
    if kernel is None or not 1 <= m <= N_M_MAX or (eligible is not None and eligible.shape != scores.shape):
        return None
    shape = scores.shape
    d = dim % len(shape) if shape else 0
    if (shape[d] if shape else 1) % m:
        return None
    inner = 1
    for length in shape[d + 1 :]:
        inner *= length
    kept = torch.empty(shape, dtype=torch.uint8)
    if scores.numel():
        units = scores.numel() // (m * inner)
        status = kernel(
            scores.data_ptr(), _address(eligible), units, m, inner, n, kept.data_ptr(), _threads(scores.numel())
        )
        if status != 0:
            return None
    return kept.view(torch.bool)


def _blocks_of(shape: Sequence[int], height: int, width: int) -> tuple[int, int] | None:
    """Rows of blocks and blocks a row of a tensor of ``shape`` cut in ``height`` x ``width`` blocks
    along its last two dims (``None`` where they do not tile it)."""
    length = shape[-1] if shape else 1
    numel = math.prod(shape)
    if length == 0 or height < 1 or width < 1 or length % width or numel % (height * length):
        return None
    return numel // (height * length), length // width


def block_any(mask: Tensor, height: int, width: int) -> Tensor | None:
    """Whether each ``height`` x ``width`` block of a bool mask's last two dims holds a set flag.

    A ``torch.bool`` tensor of shape ``(rows of blocks, blocks a row)``;
    ``None`` where the kernel does not apply (then use torch).
    """
    kernel = _declared("block_any", mask)
    grid = None if kernel is None or mask.dtype != torch.bool else _blocks_of(mask.shape, height, width)
    if kernel is None or grid is None:
        return None
    out = torch.empty(grid, dtype=torch.uint8, device="cpu")
    kernel(mask.data_ptr(), grid[0], height, grid[1], width, out.data_ptr(), _threads(mask.numel()))
    return out.view(torch.bool)


def block_expand(kept: Tensor, mask: Mask, height: int, width: int, shape: Sequence[int]) -> Tensor | None:
    """The bool mask of ``shape`` whose ``height`` x ``width`` blocks (last two dims) are ``kept``.

    ``kept`` is the bool grid of blocks (row-major); each block's flag is
    written over the block, and'ed with ``mask`` (bool, of ``shape``) where
    one is given. ``None`` where the kernel does not apply (then use torch).
    """
    kernel = _declared("block_expand", kept)
    grid = None if kernel is None or kept.dtype != torch.bool else _blocks_of(shape, height, width)
    if kernel is None or grid is None or kept.numel() != grid[0] * grid[1]:
        return None
    if mask is not None and (mask.dtype != torch.bool or not plain(mask) or tuple(mask.shape) != tuple(shape)):
        return None
    out = torch.empty(tuple(shape), dtype=torch.uint8, device="cpu")
    numel = out.numel()
    kernel(kept.data_ptr(), _address(mask), grid[0], height, grid[1], width, out.data_ptr(), _threads(numel))
    return out.view(torch.bool)
