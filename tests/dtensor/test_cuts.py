"""``_cuts.box``: every strided piece cut, against only those that hold entries, and a split factor of 10**12 at once.

The reference cuts each of a ``_StridedShard``'s ``split_factor`` pieces, as
``box`` did before it learned to skip the empty ones; both must give the
same offsets and sizes (those of an empty block included, which files
record). Where DTensor's own split agrees: ``test_dtensor_mesh.py``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pytest
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from funcprune._dtensor._cuts import box, chunk, cut_dim, strided

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="needs torch.distributed")

if TYPE_CHECKING:
    from torch.distributed.tensor.placement_types import Placement

Ranges = list[tuple[int, int]]


def _taken(ranges: Ranges, offset: int, length: int) -> Ranges:
    out: Ranges = []
    position, at = 0, None
    for start, n in ranges:
        if at is None and offset < position + n:
            at = start + offset - position
        lo, hi = max(offset, position), min(offset + length, position + n)
        if lo < hi:
            out.append((start + lo - position, hi - lo))
        position += n
    if out:
        return out
    last, n = ranges[-1]
    return [(last + n if at is None else at, 0)]


def _cut(ranges: Ranges, pieces: int, index: int) -> Ranges:
    offset, length = chunk(sum(n for _, n in ranges), pieces, index)
    return _taken(ranges, offset, length)


def reference_box(
    shape: tuple[int, ...], mesh_shape: tuple[int, ...], coordinate: Sequence[int], placements: Sequence[Placement]
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``box`` as it was: every one of a split factor's pieces cut, empty or not."""
    ranges: list[Ranges] = [[(0, n)] for n in shape]
    for i, placement in enumerate(placements):
        d = cut_dim(placement, len(shape))
        if d is None:
            continue
        factor = strided(placement)
        if factor is None:
            ranges[d] = _cut(ranges[d], mesh_shape[i], coordinate[i])
        else:
            pieces = [_cut(ranges[d], factor, j) for j in range(factor)]
            ranges[d] = [r for piece in pieces for r in _cut(piece, mesh_shape[i], coordinate[i])]
    size = tuple(sum(n for _, n in r) for r in ranges)
    if 0 in size:
        return tuple(r[0][0] for r in ranges), size
    starts = []
    for r in ranges:
        full = [(s, n) for s, n in r if n]
        if any(s + n != t for (s, n), (t, _) in zip(full, full[1:])):
            return None
        starts.append(full[0][0])
    return tuple(starts), size


def placement(cut: tuple[int, int] | int | None) -> Placement:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if cut is None:
        return Replicate()
    if isinstance(cut, int):
        return Shard(cut)
    return _StridedShard(cut[0], split_factor=cut[1])


@given(
    shape=st.lists(st.integers(0, 13), min_size=1, max_size=3).map(tuple),
    mesh_shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
    data=st.data(),
)
def test_box_cuts_only_the_pieces_that_hold_entries_and_gives_what_cutting_every_piece_gives(
    shape: tuple[int, ...], mesh_shape: tuple[int, ...], data: st.DataObject
) -> None:
    dims = range(len(shape))
    cuts = st.one_of(st.none(), st.sampled_from(list(dims)), st.tuples(st.sampled_from(list(dims)), st.integers(1, 30)))
    placements = [placement(data.draw(cuts)) for _ in mesh_shape]
    for coordinate in itertools.product(*map(range, mesh_shape)):
        assert box(shape, mesh_shape, coordinate, placements) == reference_box(shape, mesh_shape, coordinate, placements)


def test_a_split_factor_of_a_trillion_is_cut_at_once() -> None:
    """8 rows cut into 10**12 pieces: 8 hold a row; on a mesh of 1 the block is all of them, on 2 it is no box."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    start = time.perf_counter()
    huge = _StridedShard(0, split_factor=10**12)
    assert box((8, 4), (1,), (0,), [huge]) == ((0, 0), (8, 4))
    assert box((8, 4), (2,), (0,), [huge]) == ((0, 0), (8, 4))  # each 1-row piece goes whole to coordinate 0
    assert box((8, 4), (2,), (1,), [huge]) == ((1, 0), (0, 4))  # and leaves coordinate 1 nothing (after row 0)
    assert box((8, 4), (2, 4), (1, 3), [huge, Shard(0)]) == ((8, 0), (0, 4))
    assert box((16, 4), (2,), (0,), [_StridedShard(0, split_factor=8)]) is None  # rows 0, 2, 4...: no box
    assert time.perf_counter() - start < 1.0
