"""Unit keys are the same bit for bit however the entries are split and in whatever order the parts are added.

``funcprune/_structure/_keys.py`` rounds every term to a quantum per unit so
that sums of parts are exact. Here "processes" are threads, each holding a
block of every member cut at random places along a random dim, and their
reduction adds the parts in a random order: the keys must equal the whole
tensors' keys bit for bit, on every thread, for values spanning 120 binary
orders of magnitude (where plain float64 sums depend on their order), and
be close to the exact norms (``math.fsum``).
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Sequence
from typing import Literal

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import funcprune as fp
from funcprune._plans._unit_keys import Piece, unit_keys

Tensor = torch.Tensor


def wide(shape: tuple[int, ...], g: torch.Generator, special: bool) -> Tensor:
    t = torch.randn(shape, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-60, 60, shape, generator=g).double()
    )
    t = t.float()
    if special and t.numel() > 2:
        t.view(-1)[0] = float("nan")
        t.view(-1)[1] = float("inf")
    return t


def cuts(length: int, parts: int, rng: random.Random) -> list[tuple[int, int]]:
    points = sorted(rng.randint(0, length) for _ in range(parts - 1))
    bounds = [0, *points, length]
    return [(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False)]


class Ring:
    """An all-reduce among threads that adds the parts in a random order."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.rng = size, random.Random(seed)
        self.parts: list[Tensor | None] = [None] * size
        self.result: Tensor | None = None
        self.barrier = threading.Barrier(size)

    def reduce(self, rank: int, values: Tensor, how: Literal["sum", "max"]) -> Tensor:
        self.parts[rank] = values.clone()
        if self.barrier.wait() == 0:
            order = list(range(self.size))
            self.rng.shuffle(order)
            total = self.parts[order[0]]
            assert total is not None
            for i in order[1:]:
                part = self.parts[i]
                assert part is not None
                total = total + part if how == "sum" else torch.maximum(total, part)
            self.result = total
        self.barrier.wait()
        assert self.result is not None
        out = self.result.clone()
        self.barrier.wait()
        return out


_N = st.sampled_from([1.0, 2.0, 3.0, 0.5, -1.0, 0.0, math.inf, -math.inf])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**20), n=_N, parts=st.integers(1, 4), special=st.booleans(), masked=st.booleans())
def test_keys_do_not_depend_on_where_the_entries_lie_or_the_order_of_the_sums(
    seed: int, n: float, parts: int, special: bool, masked: bool
) -> None:
    g, rng = torch.Generator().manual_seed(seed), random.Random(seed)
    size, width = 5, 3
    members = [fp.Member("a", 0, width), fp.Member("b", 1, 1, start=2), fp.Member("c", 2, width)]
    shapes = {"a": (size * width, 7), "b": (4, size + 3), "c": (2, 3, size * width)}
    whole = {k: wide(s, g, special) for k, s in shapes.items()}
    kept = {k: torch.rand(s, generator=g) > 0.2 for k, s in shapes.items()} if masked else {}
    group = fp.UnitGroup("channels", size, tuple(members))
    pieces = [
        Piece(m, whole[m.name], kept.get(m.name), 0, whole[m.name].numel() // shapes[m.name][m.dim])
        for m in members
    ]
    expected = unit_keys([(group, pieces)], n, lambda t, how: t)
    # every member cut along its units' dim at random points (units split between "processes")
    blocks = {k: cuts(shapes[k][m.dim], parts, rng) for k, m in zip("abc", members, strict=True)}
    ring = Ring(parts, seed)
    results: list[list[tuple[Tensor, Tensor | None]] | None] = [None] * parts
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            mine = []
            for m in members:
                offset, length = blocks[m.name][rank]
                values = whole[m.name].narrow(m.dim, offset, length)
                mask = None if m.name not in kept else kept[m.name].narrow(m.dim, offset, length)
                mine.append(Piece(m, values, mask, offset, whole[m.name].numel() // shapes[m.name][m.dim]))
            results[rank] = unit_keys([(group, mine)], n, lambda t, how: ring.reduce(rank, t, how))
        except BaseException as e:  # noqa: BLE001 (raised below)
            errors.append(e)
            ring.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(parts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    for got in results:
        assert got is not None
        (keys, eligible), ((want, want_eligible),) = got[0], expected
        assert torch.equal(keys.isnan(), want.isnan())
        assert torch.equal(torch.nan_to_num(keys), torch.nan_to_num(want))  # bit for bit, NaN in place
        assert (eligible is None) == (want_eligible is None)
        assert eligible is None or want_eligible is None or torch.equal(eligible, want_eligible)
    keys = expected[0][0]
    for u in range(size):
        entries = torch.cat([
            whole[m.name].index_select(m.dim, torch.tensor(list(m.indices(u)))).flatten().double() for m in members
        ])  # fmt: skip
        exact = _exact_norm(entries, n)
        if math.isnan(exact) or math.isinf(exact) or exact == 0:
            assert keys[u].item() == exact or (math.isnan(exact) and keys[u].isnan())
        else:
            assert math.isclose(keys[u].item(), exact, rel_tol=1e-9), (u, keys[u].item(), exact)


def _exact_norm(entries: Tensor, n: float) -> float:
    values = [abs(v) for v in entries.tolist()]
    if n == 0:
        return float(sum(v != 0 for v in values))  # NaN counts, as torch counts it
    if any(math.isnan(v) for v in values):
        return math.nan
    if n == math.inf:
        return float(max(values))
    if n == -math.inf:
        return float(min(values))
    if n < 0 and any(v == 0 for v in values):
        return 0.0
    if any(math.isinf(v) for v in values):
        return math.inf if n > 0 else 0.0
    total = math.fsum(v**n for v in values)
    return total ** (1 / n) if total else 0.0


def test_the_keys_of_a_group_of_plain_tensors_need_no_reduction() -> None:
    calls: list[str] = []

    def reduce(t: Tensor, how: Literal["sum", "max"]) -> Tensor:
        calls.append(how)
        return t

    group = fp.UnitGroup("channels", 2, (fp.Member("a", 0, 1),))
    pieces: Sequence[Piece] = [Piece(group.members[0], torch.tensor([[3.0, 4.0], [1.0, 0.0]]), None, 0, 2)]
    ((keys, eligible),) = unit_keys([(group, pieces)], 2.0, reduce)
    assert keys.tolist() == [5.0, 1.0] and eligible is None
    assert calls == ["max", "sum"]
