"""The unit keys' native passes give the torch path's numbers bit for bit, one read each.

``unit_abs_max`` is ``max(amax, -amin)`` per index along a dim (NaN where
one is); ``unit_rounded`` the per-index sums of rounded terms of
``funcprune/_plans/_unit_keys.py``, which are exact and so the same in any
order. Both read a narrow along the dim of a contiguous tensor in place.
Checked on each build (``conftest.py``), in one piece and in three, on
values spanning 120 binary orders of magnitude with NaN, infinities and
signed zeros; then whole unit keys with the kernels and without.
"""

from __future__ import annotations

import ctypes
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import funcprune as fp
from funcprune import _native
from funcprune._plans._unit_keys import Piece, _rounded_part, unit_keys

Tensor = torch.Tensor
#: Each property runs once per build and per piece count (up to 6 times): a fifth of the profile's examples each.
_EXAMPLES = max(1, settings().max_examples // 5)
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64}


@st.composite
def narrowed(draw: st.DrawFn) -> tuple[Tensor, int]:
    """A float32/float64 tensor of 1-4 dims, or a narrow of one along ``dim``, with specials; and ``dim``."""
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=4)))
    if draw(st.booleans()):  # a long dim: the kernels' vector lanes and row tiles
        shape = (*shape[:-1], draw(st.integers(9, 70)))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * torch.exp2(torch.randint(-60, 60, shape, generator=g).double())).to(dtype)  # fmt: skip
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0], dtype=dtype)
    where = torch.rand(shape, generator=g) < draw(st.sampled_from([0.0, 0.0, 0.05, 0.3]))
    x[where] = specials[torch.randint(0, len(specials), (int(where.sum()),), generator=g)]
    dim = draw(st.integers(0, len(shape) - 1))
    start = draw(st.integers(0, shape[dim] - 1))
    length = draw(st.integers(1, shape[dim] - start))
    return x.narrow(dim, start, length), dim


def quanta(part: Tensor, dim: int, square: bool) -> Tensor:
    """Per index, the ``M`` that ``_unit_keys._quanta`` picks: every rounded term and partial sum exact."""
    others = [d for d in range(part.dim()) if d != dim]
    top = part.abs().double().amax(others) if others else part.abs().double()
    top = torch.where(top.isfinite(), top, torch.zeros_like(top))
    top = top * top if square else top
    count = part.numel() // part.shape[dim]
    e = torch.ceil(torch.log2(top.clamp(min=2.0**-1000)))
    return torch.ldexp(torch.full_like(top, 1.5), e + (math.ceil(math.log2(count + 1)) + 2))


def assert_abs_max_is_torchs(x: Tensor, dim: int) -> None:
    """The kernel's largest magnitudes are ``max(amax, -amin)``'s, NaN in place."""
    got = _native.unit_abs_max(x, dim)
    others = tuple(d for d in range(x.dim()) if d != dim)
    want = torch.maximum(x.amax(others), -x.amin(others)).double() if others else x.abs().double()
    assert got is not None and got.dtype == torch.float64
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~want.isnan()], want[~want.isnan()])


def assert_rounded_is_the_torch_paths(x: Tensor, dim: int, square: bool) -> Tensor:
    """The kernel's rounded sums are the torch path's bit for bit, NaN in place (returned: the torch path's)."""
    big = quanta(x, dim, square)
    got = _native.unit_rounded(x, dim, big, square)
    with _native.disabled():
        want = _rounded_part(x, dim, big, 2.0 if square else 1.0)
    assert got is not None
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.view(torch.int64)[~want.isnan()], want.view(torch.int64)[~want.isnan()])
    return want


@settings(max_examples=_EXAMPLES, deadline=None)
@given(case=narrowed())
def test_the_largest_magnitude_per_index_is_torchs(kernels: ctypes.CDLL, pieces: int, case: tuple[Tensor, int]) -> None:
    assert_abs_max_is_torchs(*case)


@settings(max_examples=_EXAMPLES, deadline=None)
@given(case=narrowed(), square=st.booleans())
def test_the_rounded_sums_are_the_torch_paths_bit_for_bit(
    kernels: ctypes.CDLL, pieces: int, case: tuple[Tensor, int], square: bool
) -> None:
    assert_rounded_is_the_torch_paths(*case, square)


@pytest.mark.parametrize(
    ("shape", "dim"), [((300, 2048), 0), ((2048, 300), 1), ((4, 20000), 1), ((40, 9, 300), 1)]
)  # fmt: skip
def test_large_tensors_split_into_runs_give_the_same_numbers(
    kernels: ctypes.CDLL, pieces: int, shape: tuple[int, ...], dim: int
) -> None:
    """Several runs of indices (a thread's each), and strips of them down the rows where the dim is the last."""
    g = torch.Generator().manual_seed(len(shape) + dim)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-30, 30, shape, generator=g).float())
    x.view(-1)[7::997] = float("nan")
    whole = torch.nan_to_num(x)  # the sums of finite entries: bit for bit
    for part, clean in ((x, whole), (x.narrow(dim, 3, x.shape[dim] - 5), whole.narrow(dim, 3, x.shape[dim] - 5))):
        assert_abs_max_is_torchs(part, dim)
        assert not assert_rounded_is_the_torch_paths(clean, dim, True).isnan().any()  # every sum compared


def test_what_the_unit_kernels_do_not_take_goes_to_torch(kernels: ctypes.CDLL) -> None:
    x = torch.randn(6, 8)
    big = torch.ones(8, dtype=torch.float64)
    assert _native.unit_abs_max(x.t(), 0) is None  # transposed: the dims after dim are not contiguous
    assert _native.unit_abs_max(x[:, ::2], 1) is None  # a step along the dim
    lapped = torch.randn(60).as_strided((5, 3, 4), (12, 2, 1))  # rows after the dim overlap: not one run
    assert _native.unit_abs_max(lapped, 0) is None
    assert _native.unit_abs_max(x.half(), 0) is None  # dtype
    assert _native.unit_abs_max(x, 2) is None  # no such dim
    assert _native.unit_abs_max(torch.empty(0, 3), 1) is None  # nothing to read
    assert _native.unit_rounded(x, 1, big.float(), True) is None  # quanta not float64
    assert _native.unit_rounded(x, 1, big[:4], True) is None  # a quantum per index
    assert _native.unit_rounded(x, 0, big, True) is None
    with torch.device("meta"):
        assert _native.unit_abs_max(torch.empty(3, 3), 0) is None
    seen: list[Tensor | None] = []
    torch.vmap(lambda row: seen.append(_native.unit_abs_max(row, 0)) or row)(x)  # type: ignore[func-returns-value]
    assert seen == [None]  # a transform's wrapper


def test_a_narrow_of_the_leading_dims_is_read_in_place(kernels: ctypes.CDLL) -> None:
    x = torch.randn(5, 7, 3, 4, dtype=torch.float64)
    part = x.narrow(1, 2, 4)
    got = _native.unit_abs_max(part, 1)
    assert got is not None
    assert torch.equal(got, part.abs().amax((0, 2, 3)))
    assert _native.unit_abs_max(x.narrow(2, 1, 2), 1) is None  # a narrow after the dim: not one run per index


@settings(max_examples=_EXAMPLES, deadline=None)
@given(seed=st.integers(0, 2**20), n=st.sampled_from([1.0, 2.0]), masked=st.booleans(), special=st.booleans())
def test_unit_keys_are_the_same_with_and_without_the_kernels(
    kernels: ctypes.CDLL, pieces: int, seed: int, n: float, masked: bool, special: bool
) -> None:
    g = torch.Generator().manual_seed(seed)
    size, width = 5, 3
    members = [fp.Member("a", 0, width), fp.Member("b", 1, 1, start=2), fp.Member("c", 2, width)]
    shapes = {"a": (size * width, 37), "b": (40, size + 3), "c": (2, 3, size * width)}
    whole = {k: torch.randn(s, generator=g) * torch.exp2(torch.randint(-40, 40, s, generator=g).float()) for k, s in shapes.items()}  # fmt: skip
    if special:
        whole["a"][3, 5], whole["c"][1, 2, 4] = float("nan"), float("inf")
    kept = {k: torch.rand(s, generator=g) > 0.2 for k, s in shapes.items()} if masked else {}
    group = fp.UnitGroup("channels", size, tuple(members))
    blocks = [(0, 6), (6, 9)]  # two blocks of each member, as two processes hold them, both counted here
    parts = [
        Piece(m, whole[m.name].narrow(m.dim, o, min(k, shapes[m.name][m.dim] - o)),
              None if m.name not in kept else kept[m.name].narrow(m.dim, o, min(k, shapes[m.name][m.dim] - o)),
              o, whole[m.name].numel() // shapes[m.name][m.dim])
        for m in members for o, k in blocks if o < shapes[m.name][m.dim]
    ]  # fmt: skip
    got = unit_keys([(group, parts)], n, lambda t, how: t)
    with _native.disabled():
        want = unit_keys([(group, parts)], n, lambda t, how: t)
    (keys, eligible), ((expected, expected_eligible),) = got[0], want
    assert torch.equal(keys.isnan(), expected.isnan())
    assert torch.equal(torch.nan_to_num(keys).view(torch.int64), torch.nan_to_num(expected).view(torch.int64))
    assert (eligible is None) == (expected_eligible is None)
    assert eligible is None or expected_eligible is None or torch.equal(eligible, expected_eligible)
