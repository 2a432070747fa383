"""Selection over shards held by real processes equals selection on the whole.

A world of gloo processes on 127.0.0.1 (``tests/_distributed.py``) holds the
blocks of each example: split along any dims, unevenly (empty blocks too),
replicated across part of the world (counted once). Gathered, the kept
flags equal the single-process sort path on the concatenated keys, ties
and NaN included, and the number of collectives stays bounded whatever
``k`` and the sizes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _distributed import World
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import vmap

from funcprune._select import _choose
from funcprune._select._choose import keep, keep_jointly
from funcprune._select._groups import KeyPart, LocalShard, magnitude_of

SIZE = 4  # ranks in the world (a 2-core machine runs them; they mostly wait)


@dataclass(frozen=True)
class Layout:
    """How one part is cut: per dim, the block boundaries (a grid of cells).

    Rank ``r`` holds cell ``r % cells``; ranks from ``cells`` on hold
    replicas, counted on the first holder only.
    """

    bounds: tuple[tuple[int, ...], ...]

    @property
    def cells(self) -> int:
        return math.prod(len(b) - 1 for b in self.bounds)

    def block(self, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Offsets and size of the cell that ``rank`` holds."""
        cell = rank % self.cells
        coords = []
        for b in reversed(self.bounds):
            cell, c = divmod(cell, len(b) - 1)
            coords.append(c)
        coords.reverse()
        return (
            tuple(b[c] for b, c in zip(self.bounds, coords, strict=True)),
            tuple(b[c + 1] - b[c] for b, c in zip(self.bounds, coords, strict=True)),
        )


Part = tuple[torch.Tensor, "torch.Tensor | None", Layout]


def _cut(t: torch.Tensor, offsets: tuple[int, ...], size: tuple[int, ...]) -> torch.Tensor:
    return t[tuple(slice(o, o + s) for o, s in zip(offsets, size, strict=True))]


def _part(block: torch.Tensor, flags: torch.Tensor | None, shard: LocalShard | None = None, magnitude: bool = False) -> KeyPart:
    if magnitude:  # the keys are the block's magnitudes (what L1 ranks)
        return KeyPart(block, magnitude_of, flags, shard)
    return KeyPart(block, eligible=flags, shard=shard)


def _keep_my_blocks(
    rank: int, size: int, parts: list[Part], k: int, magnitude: bool = False, bracket_from: int | None = None
) -> tuple[list[torch.Tensor], int]:
    """On one rank: its blocks' kept flags, and how many all-reduces it took.

    ``bracket_from``: the keys per process from which the selection is
    bracketed (:data:`~funcprune._select.SHARDED_BRACKET_MIN_KEYS`, for this call).
    """
    key_parts = []
    for keys, eligible, layout in parts:
        offsets, shape = layout.block(rank)
        block = _cut(keys, offsets, shape).reshape(-1)
        flags = None if eligible is None else _cut(eligible, offsets, shape).reshape(-1)
        shard = LocalShard(tuple(keys.shape), offsets, shape, counted=rank < layout.cells)
        key_parts.append(_part(block, flags, shard, magnitude))
    calls = 0
    all_reduce = dist.all_reduce

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return all_reduce(*args, **kwargs)

    dist.all_reduce = counting
    threshold = _choose.SHARDED_BRACKET_MIN_KEYS
    _choose.SHARDED_BRACKET_MIN_KEYS = threshold if bracket_from is None else bracket_from
    try:
        kept = keep_jointly(key_parts, k)
    finally:
        dist.all_reduce = all_reduce
        _choose.SHARDED_BRACKET_MIN_KEYS = threshold
    return kept, calls


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    w = World(SIZE)
    yield w
    w.close()


def _gathered(
    world: World, parts: list[Part], k: int, magnitude: bool = False, bracket_from: int | None = None
) -> tuple[list[torch.Tensor], list[int]]:
    """The whole kept flags assembled from the ranks' blocks (replicas checked equal)."""
    assert all(layout.cells <= world.size for _, _, layout in parts)
    answers = world.run(_keep_my_blocks, parts, k, magnitude, bracket_from)
    wholes = []
    for i, (keys, _, layout) in enumerate(parts):
        whole = torch.zeros(keys.shape, dtype=torch.bool)
        for rank, (kept, _) in enumerate(answers):
            offsets, shape = layout.block(rank)
            block = kept[i].reshape(shape)
            if rank < layout.cells:
                _cut(whole, offsets, shape).copy_(block)
            else:  # a replica decides exactly as its first holder
                assert torch.equal(block, answers[rank % layout.cells][0][i].reshape(shape))
        wholes.append(whole)
    return wholes, [calls for _, calls in answers]


def _expected(parts: list[Part], k: int) -> list[torch.Tensor]:
    keys = torch.cat([p[0].reshape(-1) for p in parts])
    eligible = torch.cat([torch.ones(p[0].numel(), dtype=torch.bool) if p[1] is None else p[1].reshape(-1) for p in parts])
    flat = keep(keys, k, eligible)
    return [f.reshape(p[0].shape) for f, p in zip(torch.split(flat, [p[0].numel() for p in parts]), parts, strict=True)]


def _bound(dtype: torch.dtype, positions: int, bracketed: bool = False) -> int:
    """All-reduces allowed: one per 12 bits of the keys, then of the positions.

    Bracketed, 3 more: the two rounds over the sample and the counts
    (whether the bracket holds the k-th key or not).
    """
    bracket = 3 if bracketed else 0
    return bracket + -(-torch.finfo(dtype).bits // 12) + -(-max(positions - 1, 1).bit_length() // 12)


@st.composite
def _layouts(draw: st.DrawFn, shape: tuple[int, ...]) -> Layout:
    bounds = []
    cells = 1
    for n in shape:
        pieces = draw(st.integers(1, max(1, SIZE // cells)))
        cells *= pieces
        inner = sorted(draw(st.lists(st.integers(0, n), min_size=pieces - 1, max_size=pieces - 1)))
        bounds.append((0, *inner, n))
    return Layout(tuple(bounds))


@st.composite
def _examples(draw: st.DrawFn) -> tuple[list[Part], int]:
    dtype = draw(st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    parts: list[Part] = []
    for _ in range(draw(st.integers(1, 3))):
        shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=3)))
        kind = draw(st.sampled_from(["normal", "ties", "specials"]))
        if kind == "normal":
            keys = torch.randn(shape, generator=g).to(dtype)
        elif kind == "ties":
            keys = torch.randint(-2, draw(st.integers(-1, 4)), shape, generator=g).to(dtype)
        else:
            pool = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0])
            keys = pool[torch.randint(0, len(pool), shape, generator=g)].to(dtype)
        eligible = torch.rand(shape, generator=g) < draw(st.floats(0.0, 1.0)) if draw(st.booleans()) else None
        parts.append((keys, eligible, draw(_layouts(shape))))
    total = sum(p[0].numel() for p in parts)
    return parts, draw(st.integers(0, total + 2))


@settings(max_examples=40)
@given(example=_examples())
def test_shards_select_exactly_what_the_whole_selects(world: World, example: tuple[list[Part], int]) -> None:
    parts, k = example
    gathered, calls = _gathered(world, parts, k)
    for got, want in zip(gathered, _expected(parts, k), strict=True):
        assert torch.equal(got, want)
    total = sum(p[0].numel() for p in parts)
    assert max(calls) <= _bound(parts[0][0].dtype, total)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_spread_keys_take_few_fixed_size_rounds_whatever_k(world: World, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(300, 700, generator=g, dtype=dtype).abs()
    keys[::7, ::5] = keys[0, 0]  # many ties at one value
    parts: list[Part] = [
        (keys, None, Layout(((0, 300), (0, 100, 450, 700)))),  # split along dim 1
        (torch.randn(90_000, generator=g, dtype=dtype), None, Layout(((0, 0, 40_000, 90_000),))),
    ]
    for k in (1, 77, 6001, 105_000, 300 * 700 + 90_000):
        for bracket_from in (None, 1):  # the radix select over every key, or bracketed
            gathered, calls = _gathered(world, parts, k, bracket_from=bracket_from)
            for got, want in zip(gathered, _expected(parts, k), strict=True):
                assert torch.equal(got, want)
            assert max(calls) <= _bound(dtype, 300 * 700 + 90_000, bracketed=bracket_from is not None)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_bracketed_selection_over_large_shards_equals_the_whole(world: World, dtype: torch.dtype) -> None:
    """Bracketed (forced here): eligibility, NaN, -0.0, ties, replicas, magnitudes."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(400, 300, generator=g)
    a[a.abs() < 0.02] = -0.0
    a[a.abs() < 0.04] = 0.0
    a[::11, ::13] = float("nan")
    b = torch.randn(70_000, generator=g)  # replicated on every rank: counted once
    c = torch.randint(-3, 4, (256, 300), generator=g).float()  # a few values, tied by the thousand
    parts: list[Part] = [
        (a.to(dtype), torch.rand(400, 300, generator=g) < 0.8, Layout(((0, 150, 400), (0, 300)))),
        (b.to(dtype), None, Layout(((0, 70_000),))),
        (c.to(dtype), torch.rand(256, 300, generator=g) < 0.5, Layout(((0, 100, 256), (0, 120, 300)))),
    ]
    eligible = int(parts[0][1].sum()) + 70_000 + int(parts[2][1].sum())  # type: ignore[union-attr]
    total = sum(p[0].numel() for p in parts)
    for k, magnitude in ((1, False), (5_000, True), (90_000, False), (150_000, True), (eligible, False), (eligible + 5, True)):
        gathered, calls = _gathered(world, parts, k, magnitude, 1)  # always bracketed
        keys = [(v.abs() if magnitude else v, e, layout) for v, e, layout in parts]
        for got, want in zip(gathered, _expected(keys, k), strict=True):
            assert torch.equal(got, want), (k, magnitude)
        assert max(calls) <= _bound(dtype, total, bracketed=True)


@pytest.mark.parametrize(
    "bounds",
    [((0, 2, 5), (0, 3, 7)), ((0, 5), (0, 1, 4, 7)), ((0, 1, 3, 5), (0, 7)), ((0, 4, 5), (0, 0, 7))],
    ids=["2x2", "columns", "rows", "empty"],
)
def test_ties_go_in_global_index_order_across_blocks(world: World, bounds: tuple[tuple[int, ...], ...]) -> None:
    keys = torch.ones(5, 7)
    keys[4, 6] = 0.0
    parts: list[Part] = [(torch.full((3,), 1.0), None, Layout(((0, 1, 3),))), (keys, None, Layout(bounds))]
    for k in (2, 4, 9, 20, 37):
        gathered, _ = _gathered(world, parts, k)
        flat = torch.cat([g.reshape(-1) for g in gathered])
        assert not flat[-1]  # the one lower key goes first
        assert torch.equal(flat[:-1], torch.arange(37) >= k - 1)  # then the lowest global indices


def test_keep_with_a_shard_group_selects_over_the_whole_tensor(world: World) -> None:
    keys = torch.tensor([[3.0, 1.0, 1.0, 2.0], [1.0, 0.5, 4.0, 1.0]])
    answers = world.run(_keep_a_column_block, keys, 3)
    whole = torch.cat([a for a in answers if a.numel()], dim=1)
    assert torch.equal(whole, keep(keys, 3))  # 0.5, then the 1.0s at flat indices 1 and 2


def _keep_a_column_block(rank: int, size: int, keys: torch.Tensor, k: int) -> torch.Tensor:
    cuts = [0, 1, 3, 4][: size + 1] + [4] * max(0, size - 3)
    lo, hi = cuts[rank], cuts[rank + 1]
    block = keys[:, lo:hi].contiguous()
    return keep(block, k, group=LocalShard((2, 4), (0, lo), (2, hi - lo)))


def test_a_shard_is_checked_against_its_tensor() -> None:
    with pytest.raises(ValueError, match=r"along dim 1 a block of 3 entries at offset 2 does not fit in the whole length 4"):
        LocalShard((2, 4), (0, 2), (2, 3))
    with pytest.raises(ValueError, match="one entry per dim"):
        LocalShard((2, 4), (0,), (2, 4))
    with pytest.raises(ValueError, match=r"a block of 6 keys does not match its shard's size \(2, 2\)"):
        keep(torch.ones(2, 3), 1, group=LocalShard((2, 4), (0, 0), (2, 2)))


def test_shards_and_whole_parts_do_not_mix_and_need_an_int_count() -> None:
    shard = LocalShard((4,), (0,), (4,))
    keys = torch.ones(4)
    part, whole = _part(keys, None, shard), _part(keys, None)
    with pytest.raises(ValueError, match="must all be shards, with a Python int count; got 1 shards among 2 parts"):
        keep_jointly([part, whole], 1)
    with pytest.raises(ValueError, match="count of type Tensor"):
        keep_jointly([part], torch.tensor(1))


def test_selection_over_shards_refuses_transforms_before_communicating() -> None:
    shard = LocalShard((4,), (0,), (4,))
    with pytest.raises(RuntimeError, match="runs eagerly only"):
        vmap(lambda t: keep(t, 1, group=shard))(torch.ones(2, 4))


def test_the_bracket_opens_at_the_ends_where_the_k_th_key_lies_past_the_sample() -> None:
    """k = 1 and k = every eligible key are bracketed (an end opened), not missed into the radix select."""
    from _distributed import one_process_group

    from funcprune._select._sharded_bracket import keep_by_bracket_over_shards

    g = torch.Generator().manual_seed(0)
    keys, eligible = torch.randn(400_000, generator=g), torch.rand(400_000, generator=g) < 0.9
    shard = LocalShard((400_000,), (0,), (400_000,))
    n = int(eligible.sum())
    with one_process_group():
        for k in (1, 5, 200_000, n - 3, n):
            found = keep_by_bracket_over_shards([KeyPart(keys, magnitude_of, eligible, shard)], [shard], k)
            assert not isinstance(found, int), k  # bracketed
            assert torch.equal(found[0], keep(keys.abs(), k, eligible)), k
