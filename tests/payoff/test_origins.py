"""The walk's origins: a view of a parameter read as strides gives what its index tensor gives.

``Origin.axis_dim`` (strides only, no index tensor) must agree with the
general reading of the materialized indices (``_layers._axis_dim`` on an
origin that holds them) wherever it answers, for any chain of views.
"""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from funcprune._graph import _layers
from funcprune._graph._atoms import pairs
from funcprune._graph._walk import Origin, _row_major

Tensor = torch.Tensor


@st.composite
def views(draw: st.DrawFn) -> tuple[tuple[int, ...], Tensor]:
    """A source shape and a chain of strided views of ``arange`` of it (transpose, slice, select, unsqueeze, expand)."""
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    t = torch.arange(math.prod(shape)).reshape(shape)
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["transpose", "slice", "select", "unsqueeze", "expand"]))
        d = draw(st.integers(0, t.dim() - 1))
        if op == "transpose" and t.dim() > 1:
            t = t.transpose(d, draw(st.integers(0, t.dim() - 1)))
        elif op == "slice" and t.shape[d] > 1:
            start = draw(st.integers(0, t.shape[d] - 1))
            t = t.narrow(d, start, draw(st.integers(1, t.shape[d] - start)))
        elif op == "select" and t.dim() > 1:
            t = t.select(d, draw(st.integers(0, t.shape[d] - 1)))
        elif op == "unsqueeze":
            t = t.unsqueeze(d)
        elif op == "expand":
            sizes = [draw(st.integers(2, 3)) if n == 1 else n for n in t.shape]
            t = t.expand(sizes)
    return shape, t


@given(views(), st.data())
def test_strided_origins_agree_with_their_indices(case: tuple[tuple[int, ...], Tensor], data: st.DataObject) -> None:
    shape, view = case
    strided = Origin("w", shape, strided=(int(view.storage_offset()), tuple(view.stride()), tuple(view.shape)))
    materialized = Origin("w", shape, flat_ids=view.contiguous())
    assert torch.equal(strided.flat, view)
    axis = data.draw(st.integers(0, view.dim() - 1))
    fast = strided.axis_dim(axis)
    slow = _layers._axis_dim(materialized, axis)
    if fast is not None:
        assert slow is not None and fast[0] == slow[0] and torch.equal(fast[1], slow[1])
    assert _layers._axis_dim(strided, axis) is not None or slow is None


def test_a_strided_parameter_origin_needs_no_index_tensor() -> None:
    origin = Origin("w", (3, 4), strided=(0, _row_major((3, 4)), (3, 4)))
    dim, index = origin.axis_dim(1) or (None, None)
    assert dim == 1 and index is not None and index.tolist() == [0, 1, 2, 3]
    transposed = Origin("w", (3, 4), strided=(0, (1, 4), (4, 3)))
    assert transposed.axis_dim(0) is not None and transposed.axis_dim(0)[0] == 1  # type: ignore[index]


@given(st.lists(st.tuples(st.integers(-1, 6), st.integers(-1, 6)), max_size=40), st.integers(1, 3))
def test_pairs_are_the_distinct_pairs_of_atoms(items: list[tuple[int, int]], repeat: int) -> None:
    a = torch.tensor([x for x, _ in items], dtype=torch.long).repeat(repeat, 1)
    b = torch.tensor([y for _, y in items], dtype=torch.long).repeat(repeat, 1)
    assert pairs(a, b) == sorted({(x, y) for x, y in items if x >= 0 and y >= 0})
