"""Where DTensor puts a process's block: placements cut a tensor, mesh dim by mesh dim.

:func:`box` follows ``Shard`` and ``_StridedShard`` cuts as index ranges and
says where the block starts and how long it is, or ``None`` where the
ranges do not join into one box (``README.md``).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._torch_private import strided_shard, strided_split_factor

if TYPE_CHECKING:
    from torch.distributed.tensor.placement_types import Placement

__all__ = ["box", "chunk", "cut_dim", "moved", "strided"]

#: Index ranges along one dim, in the block's order: (start, length); kept when empty, for where it lies.
_Ranges = list[tuple[int, int]]


def chunk(n: int, pieces: int, index: int) -> tuple[int, int]:
    """Offset and length of piece ``index`` of ``n`` entries cut as ``torch.chunk`` cuts them.

    Every piece but the last ones holds ``ceil(n / pieces)``; trailing pieces
    may be short or empty (5 entries in 4: 2, 2, 1, 0).
    """
    step = -(-n // pieces)
    offset = min(index * step, n)
    return offset, min(step, n - offset)


def strided(placement: object) -> int | None:
    """A ``_StridedShard``'s split factor; ``None`` for any other placement."""
    return strided_split_factor(placement)


def cut_dim(placement: Placement, ndim: int) -> int | None:
    """The tensor dim (non-negative) a ``Shard`` or ``_StridedShard`` cuts; ``None`` for others."""
    from torch.distributed.tensor import Shard

    if isinstance(placement, Shard) or strided(placement) is not None:
        return int(placement.dim) % ndim  # type: ignore[attr-defined]  # both have .dim
    return None


def moved(placement: Placement, dim: int) -> Placement:
    """The cutting ``placement`` (``Shard`` or ``_StridedShard``) along ``dim`` instead."""
    from torch.distributed.tensor import Shard

    factor = strided(placement)
    return Shard(dim) if factor is None else strided_shard(dim, factor)


def _taken(ranges: _Ranges, offset: int, length: int, ends: list[int] | None = None) -> _Ranges:
    """The entries at positions ``offset`` to ``offset + length`` of ``ranges`` (concatenated).

    ``ends``: the position where each range ends (``itertools.accumulate`` of
    the lengths), to find the first range by bisection; computed if not given.
    """
    ends = list(itertools.accumulate(n for _, n in ranges)) if ends is None else ends
    first = bisect.bisect_right(ends, offset)  # the range that holds position ``offset``, if any
    out: _Ranges = []
    for i in range(first, len(ranges)):
        start, n = ranges[i]
        position = ends[i] - n
        if position >= offset + length:
            break
        lo, hi = max(offset, position), min(offset + length, ends[i])
        if lo < hi:
            out.append((start + lo - position, hi - lo))
    if out:
        return out
    if first < len(ranges):  # nothing: where it would start
        start, n = ranges[first]
        return [(start + offset - (ends[first] - n), 0)]
    last, n = ranges[-1]
    return [(last + n, 0)]


def _cut(ranges: _Ranges, pieces: int, index: int, ends: list[int] | None = None) -> _Ranges:
    """Piece ``index`` of ``ranges`` cut into ``pieces`` as ``torch.chunk`` cuts them."""
    offset, length = chunk(sum(n for _, n in ranges) if ends is None else ends[-1], pieces, index)
    return _taken(ranges, offset, length, ends)


def _strided_cut(ranges: _Ranges, factor: int, pieces: int, index: int) -> _Ranges:
    """``ranges`` cut into ``factor`` pieces, each cut into ``pieces``, and piece ``index`` of each joined.

    Only the pieces that hold entries are cut, at most the number of
    entries whatever ``factor`` says: the empty ones after them each
    leave a zero-length range at the end, and one says as much as many.
    """
    ends = list(itertools.accumulate(n for _, n in ranges))
    total = ends[-1]
    step = -(-total // factor)
    full = -(-total // step) if total else 1  # the pieces that hold entries (or the one empty piece)
    out = [r for j in range(full) for r in _cut(_cut(ranges, factor, j, ends), pieces, index)]
    if full < factor:
        last, n = ranges[-1]
        out.append((last + n, 0))
    return out


def _joined(ranges: _Ranges) -> tuple[int, int] | None:
    """``ranges`` as one range (start, length), or ``None`` if they leave gaps or go out of order."""
    full = [(s, n) for s, n in ranges if n]
    for (s, n), (t, _) in zip(full, full[1:]):
        if s + n != t:
            return None
    return full[0][0], sum(n for _, n in full)


def box(
    shape: tuple[int, ...], mesh_shape: tuple[int, ...], coordinate: Sequence[int], placements: Sequence[Placement]
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Offsets and size of the block at mesh ``coordinate``, cut as DTensor cuts it.

    ``None`` where the block is not one box (it has entries, and those along
    a dim are no single range: a ``_StridedShard`` not undone by the cuts
    after it).
    ``(Shard(0), Shard(0))`` on a 2x2 mesh cuts 7 rows into 0-1, 2-3, 4-5
    and 6; FSDP2 over tensor parallelism, ``(_StridedShard(0, split_factor=2),
    Shard(0))``, cuts 8 rows into 0-1, 4-5, 2-3 and 6-7.
    """
    ranges: list[_Ranges] = [[(0, n)] for n in shape]
    for i, placement in enumerate(placements):
        d = cut_dim(placement, len(shape))
        if d is None:
            continue
        factor = strided(placement)
        if factor is None:
            ranges[d] = _cut(ranges[d], mesh_shape[i], coordinate[i])
        else:
            ranges[d] = _strided_cut(ranges[d], factor, mesh_shape[i], coordinate[i])
    size = tuple(sum(n for _, n in r) for r in ranges)
    if 0 in size:  # no entries: a box wherever it starts
        return tuple(r[0][0] for r in ranges), size
    joined = [_joined(r) for r in ranges]
    if any(j is None for j in joined):
        return None
    return tuple(j[0] for j in joined if j is not None), size
