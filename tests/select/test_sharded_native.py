"""Selection over shards gives the same flags with the native kernels as on the pure-torch path.

The native path (``_radix.py`` with ``_native.code_histogram``,
``code_collect`` and ``survivors``) histograms the first round straight from
the float keys and codes only the chosen bin's entries; the torch path codes
every entry. Both must send the same histograms (so ranks on either path
agree) and give the same flags, ties cut by global position, NaN, signed
zeros, infinities, subnormals and replicas included: here on a 1-process
group, and in a world of processes (``tests/_distributed.py``) whose ranks
take one path or the other, the kernels split into several pieces.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _distributed import World, one_process_group
from hypothesis import given, settings
from hypothesis import strategies as st

from funcprune import _native
from funcprune._native import _calls
from funcprune._select import _radix, _short_rows
from funcprune._select._choose import keep
from funcprune._select._groups import LocalShard
from funcprune._select._sharded import keep_over_shards

HAVE_KERNELS = _native.status().available
needs_kernels = pytest.mark.skipif(not HAVE_KERNELS, reason="the native kernels do not load here")
SIZE = 3  # ranks in the world
#: Per part: the whole keys, their eligibility, the row boundaries of the blocks (rank r holds
#: block r % blocks; ranks past the last block hold replicas, counted on the first holder).
Part = tuple[torch.Tensor, "torch.Tensor | None", tuple[int, ...]]


@pytest.fixture(scope="module")
def group() -> Iterator[None]:
    """A 1-process gloo group (the default one)."""
    with one_process_group():
        yield


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    w = World(SIZE)
    yield w
    w.close()


def _keys(g: torch.Generator, n: int, dtype: torch.dtype, kind: str) -> torch.Tensor:
    """Keys with ties, specials (NaN of both signs, infinities, signed zeros, subnormals) or neither."""
    if kind == "ties":
        return (torch.randint(-3, 4, (n,), generator=g) / 2).to(dtype)
    x = torch.randn(n, generator=g, dtype=dtype)
    if kind == "specials":
        tiny = torch.finfo(dtype).tiny
        pool = torch.tensor(
            [float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, tiny / 8, -tiny / 8, 1.0], dtype=dtype
        )
        where = torch.rand(n, generator=g) < 0.5
        x[where] = pool[torch.randint(0, len(pool), (int(where.sum()),), generator=g)]
    return x


def _select(parts: list[Part], k: int, rank: int = 0, size: int = 1) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """This rank's kept flags per part, and the tensors it all-reduced (copies, before the sums)."""
    blocks, flags, shards = [], [], []
    for keys, eligible, bounds in parts:
        cells = len(bounds) - 1
        cell = rank % cells
        start, stop = bounds[cell], bounds[cell + 1]
        blocks.append(keys[start:stop].contiguous())
        flags.append(None if eligible is None else eligible[start:stop].contiguous())
        shards.append(LocalShard((keys.numel(),), (start,), (stop - start,), counted=rank < cells))
    sent: list[torch.Tensor] = []
    all_reduce = dist.all_reduce

    def recording(*args: Any, **kwargs: Any) -> Any:
        sent.append(args[0].clone())
        return all_reduce(*args, **kwargs)

    dist.all_reduce = recording
    try:
        kept = keep_over_shards([_returning(b) for b in blocks], flags, shards, k)
    finally:
        dist.all_reduce = all_reduce
    return kept, sent


def _returning(block: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: block


def _both(rank: int, size: int, parts: list[Part], k: int, pieces: int) -> tuple[Any, Any, Any]:
    """On one rank: native flags and sends, pure-torch ones, and those of a mix (odd ranks on torch)."""
    saved = _calls._threads
    setattr(_calls, "_threads", lambda n: pieces)  # noqa: B010 (in a worker: no monkeypatch)
    try:
        native = _select(parts, k, rank, size)
        with _native.disabled():
            plain = _select(parts, k, rank, size)
        if rank % 2:
            with _native.disabled():
                mixed = _select(parts, k, rank, size)
        else:
            mixed = _select(parts, k, rank, size)
    finally:
        setattr(_calls, "_threads", saved)  # noqa: B010
    return native, plain, mixed


def _whole(parts: list[Part], k: int) -> list[torch.Tensor]:
    keys = torch.cat([p[0] for p in parts])
    eligible = torch.cat([torch.ones(p[0].numel(), dtype=torch.bool) if p[1] is None else p[1] for p in parts])
    flat = keep(keys, k, eligible)
    return list(torch.split(flat, [p[0].numel() for p in parts]))


def _check(answers: list[tuple[Any, Any, Any]], parts: list[Part], k: int) -> None:
    """Every rank: the same flags and sends on every path; assembled, the flags of one process."""
    for native, plain, mixed in answers:
        assert len(native[1]) == len(plain[1]) == len(mixed[1])
        for a, b, c in zip(native[1], plain[1], mixed[1], strict=True):
            assert torch.equal(a, b) and torch.equal(a, c)  # the same histograms cross
        for a, b, c in zip(native[0], plain[0], mixed[0], strict=True):
            assert a.dtype == b.dtype == torch.bool
            assert torch.equal(a, b) and torch.equal(a, c)
    for i, (want, (_, _, bounds)) in enumerate(zip(_whole(parts, k), parts, strict=True)):
        cells = len(bounds) - 1
        got = torch.cat([answers[r][0][0][i] for r in range(cells)])
        assert torch.equal(got, want)
        for r in range(cells, len(answers)):  # a replica decides exactly as its first holder
            assert torch.equal(answers[r][0][0][i], answers[r % cells][0][0][i])


@st.composite
def _examples(draw: st.DrawFn, ranks: int) -> tuple[list[Part], int]:
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    parts: list[Part] = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(0, 400))
        keys = _keys(g, n, dtype, draw(st.sampled_from(["normal", "ties", "specials"])))
        eligible = torch.rand(n, generator=g) < draw(st.floats(0.0, 1.0)) if draw(st.booleans()) else None
        cells = draw(st.integers(1, ranks))
        bounds = (0, *sorted(draw(st.lists(st.integers(0, n), min_size=cells - 1, max_size=cells - 1))), n)
        parts.append((keys, eligible, bounds))
    total = sum(p[0].numel() for p in parts)
    return parts, draw(st.integers(0, total + 2))


@needs_kernels
@settings(max_examples=30)
@given(example=_examples(1), pieces=st.integers(1, 3))
def test_one_process_gives_the_same_flags_with_and_without_the_kernels(
    group: None, example: tuple[list[Part], int], pieces: int
) -> None:
    parts, k = example
    _check([_both(0, 1, parts, k, pieces)], parts, k)


@needs_kernels
@settings(max_examples=12)
@given(example=_examples(SIZE), pieces=st.integers(1, 3))
def test_ranks_on_either_path_give_the_same_flags_and_send_the_same_histograms(
    world: World, example: tuple[list[Part], int], pieces: int
) -> None:
    parts, k = example
    _check(world.run(_both, parts, k, pieces), parts, k)


def _ties_and_nans() -> list[tuple[list[Part], list[int]]]:
    """Cases whose cut falls in ties (all pruned, or cut by global position) at 1.0, 2.0, NaN, +-0.0, +inf."""
    cases = []
    for dtype in (torch.float32, torch.float64):
        ones = torch.ones(300, dtype=dtype)
        ones[::7] = 0.5
        nan = torch.full((200,), float("nan"), dtype=dtype)
        nan[1::2] = -float("nan")
        nan[:10] = 2.0
        zeros = torch.zeros(150, dtype=dtype)
        zeros[::2] = -0.0
        zeros[::5] = float("inf")
        cases.append(([(ones, None, (0, 100, 100, 300)), (nan, torch.arange(200) % 3 > 0, (0, 150, 200))],
                      [44, 306, 350, 433]))  # fmt: skip
        cases.append(([(zeros, None, (0, 70, 150))], [60, 120, 121]))
    return cases


@needs_kernels
def test_ties_nan_and_signed_zeros_at_the_cut_match_the_torch_path(world: World, group: None) -> None:
    for parts, ks in _ties_and_nans():
        for k in ks:
            _check(world.run(_both, parts, k, 2), parts, k)
            _check([_both(0, 1, [(p[0], p[1], (0, p[0].numel())) for p in parts], k, 3)],
                   [(p[0], p[1], (0, p[0].numel())) for p in parts], k)  # fmt: skip


@needs_kernels
def test_the_native_path_codes_no_block(group: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the chosen bin's entries are coded: ``order_codes`` never sees more than one key."""
    seen: list[int] = []
    order_codes = _short_rows.order_codes

    def watched(t: torch.Tensor) -> torch.Tensor:
        seen.append(t.numel())
        return order_codes(t)

    monkeypatch.setattr(_radix, "order_codes", watched)
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.float64):
        keys = (torch.randn(20_000, generator=g, dtype=dtype) * 8).round()  # many ties at the cut
        parts: list[Part] = [(keys, torch.rand(20_000, generator=g) < 0.8, (0, 20_000))]
        for k in (0, 7_000, 16_000):
            seen.clear()
            kept, sent = _select(parts, k)
            assert max(seen, default=0) <= 1
            assert len(sent) <= math.ceil(torch.finfo(dtype).bits / 12) + 2  # keys' rounds, then positions'
            with _native.disabled():
                assert torch.equal(kept[0], _select(parts, k)[0][0])
            assert torch.equal(kept[0], _whole(parts, k)[0])


@needs_kernels
def test_what_the_kernels_do_not_take_runs_on_torch_alike(group: None) -> None:
    g = torch.Generator().manual_seed(5)
    x = _keys(g, 500, torch.float32, "specials")
    for keys in (x.half(), x.bfloat16(), x):
        parts: list[Part] = [(keys, torch.rand(500, generator=g) < 0.7, (0, 500))]
        for k in (3, 250, 420):
            _check([_both(0, 1, parts, k, 1)], parts, k)
    wide = torch.randn(20, 2, generator=g)  # a non-contiguous block
    shard = LocalShard((20,), (0,), (20,))
    for k in (1, 7, 20):
        kept = keep_over_shards([lambda: wide[:, 0]], [None], [shard], k)
        assert torch.equal(kept[0], keep(wide[:, 0].contiguous(), k))


@needs_kernels
def test_a_bin_the_kernel_cannot_collect_is_coded_in_torch(group: None, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(9)
    parts: list[Part] = [(_keys(g, 700, torch.float64, "specials"), torch.rand(700, generator=g) < 0.6, (0, 700)),
                         (_keys(g, 300, torch.float64, "ties"), None, (0, 300))]  # fmt: skip
    expected = {k: _select(parts, k)[0] for k in (5, 300, 640)}
    monkeypatch.setattr(_native, "code_collect", lambda *args: None)  # as if the counts were off
    for k, want in expected.items():
        kept, _ = _select(parts, k)
        for a, b in zip(kept, want, strict=True):
            assert torch.equal(a, b)
