"""The fast paths of ``Block`` and ``PerSlice`` (issue 27) equal the implementation they replace, bit for bit.

The reference is today's code, kept in ``_shapes_reference.py``: the blocks'
norms from ``torch.linalg.vector_norm``, each slice selected by the sort
path. Every property runs with the native kernels on and off
(``funcprune._native.using(None)``) and at 1 and 2 threads, over ties, NaN,
``±inf``, ``-0.0``, every floating dtype, earlier masks, empty tensors and
``int``, ``float`` and ``Sparsity`` amounts.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from _inputs import DTYPES, values
from _inputs import mode as kernels_mode
from _shapes_reference import (
    block_norms_reference,
    blocks_reference,
    kept_blocks_reference,
    per_slice_reference,
)
from hypothesis import example, given
from hypothesis import strategies as st
from torch.func import vmap

import funcprune as fp
from funcprune import _native
from funcprune._select import Slices, Sparsity, _blocks, eligible_per_group, keep
from funcprune._select._choose import _keep_rows
from funcprune._select._rows import keep_in_rows
from funcprune._specs._shape_kernels import block_view, blocks, kept_blocks

Tensor = torch.Tensor
BLOCKS = [(4, 4), (2, 4), (4, 2), (3, 5), (1, 4), (4, 1), (2, 2), (1, 1), (2,), (1,), (2, 2, 2), (8, 8), (1, 2, 3)]


def mode(native: bool, threads: int) -> contextlib.AbstractContextManager[None]:
    """The native kernels on or off, and torch's thread count, restored after."""
    return kernels_mode(native, threads, every_size=False)


def earlier(shape: tuple[int, ...], seed: int, how: int) -> Tensor | None:
    """No mask (0), a random one (1), one that prunes everything (2), or whole leading slices (3)."""
    if how == 0:
        return None
    if how == 2:
        return torch.zeros(shape, dtype=torch.bool)
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(seed + 7)) < 0.6
    if how == 3 and shape and shape[0] > 1:
        mask[0] = False
    return mask


def amount_of(how: str, value: float, units: int) -> fp.Amount | Sparsity:
    if how == "count":
        return round(value * units)
    if how == "fraction":
        return value
    return Sparsity(value)


def same(a: Tensor, b: Tensor) -> bool:
    """Equal values, NaN where NaN (any NaN's bits)."""
    return a.dtype == b.dtype and a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def outcome(call: object) -> Tensor | type[BaseException]:
    try:
        return call()  # type: ignore[operator, no-any-return]
    except (ValueError, IndexError) as e:
        return type(e)


# --- Block --------------------------------------------------------------------------------------


@st.composite
def block_cases(draw: st.DrawFn) -> tuple[Tensor, tuple[int, ...], Tensor | None]:
    shape = draw(st.sampled_from(BLOCKS))
    lead = draw(st.lists(st.integers(1, 3), max_size=1))
    grid = draw(st.lists(st.integers(1, 5), min_size=len(shape), max_size=len(shape)))
    full = (*lead, *(g * s for g, s in zip(grid, shape, strict=True)))
    seed = draw(st.integers(0, 10_000))
    scores = values(full, seed, draw(st.integers(0, 3)), draw(st.sampled_from(DTYPES)))
    default = earlier(full, seed, draw(st.integers(0, 3)))
    if draw(st.booleans()) and scores.dim() >= 2:  # not contiguous: torch's order (and ops), not the kernels'
        scores = scores.transpose(-1, -2).contiguous().transpose(-1, -2)
        default = None if default is None else default.transpose(-1, -2).contiguous().transpose(-1, -2)
    return scores, shape, default


@given(
    case=block_cases(), value=st.floats(0, 1), how=st.sampled_from(["count", "fraction", "sparsity"]),
    native=st.booleans(), threads=st.sampled_from([1, 2]),
)  # fmt: skip
@example(case=(torch.zeros(0, 8), (2, 4), None), value=0.5, how="fraction", native=True, threads=1)
@example(  # empty, its strides not multiples of a block's width
    case=(torch.zeros(4, 1, 6, 0), (2, 4), torch.ones(4, 1, 6, 0, dtype=torch.bool)), value=0.5, how="fraction",
    native=True, threads=1,
)  # fmt: skip
@example(case=(torch.full((8, 8), -0.0), (4, 4), None), value=0.5, how="fraction", native=True, threads=2)
def test_block_equals_todays_kernel(
    case: tuple[Tensor, tuple[int, ...], Tensor | None], value: float, how: str, native: bool, threads: int
) -> None:
    scores, shape, default = case
    units = max(1, scores.numel() // max(1, torch.Size(shape).numel()))
    amount = amount_of(how, value, units)
    with mode(native, threads):
        expected = outcome(lambda: blocks_reference(amount, shape, scores, default))
        got = outcome(lambda: blocks(amount, shape, scores, default))
        view, inner = block_view(shape, scores)
        assert same(_blocks.block_norms(scores, shape, view, inner), block_norms_reference(scores, shape))
        if default is not None:
            assert torch.equal(kept_blocks(default, shape), kept_blocks_reference(default, shape))
    if isinstance(expected, Tensor):
        assert isinstance(got, Tensor) and torch.equal(got, expected)
    else:
        assert got is expected


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("shape", "block"),
    [((512, 512), (256, 256)), ((128, 256), (128, 256)), ((256, 256), (16, 16)), ((4, 96, 64), (8, 16))],
)
def test_block_norms_of_large_blocks_equal_torchs(shape: tuple[int, ...], block: tuple[int, ...], threads: int) -> None:
    """Blocks of many entries: several per tensor (each summed by one thread), or one (split by torch's)."""
    scores = values(shape, 3, 0, torch.float32)
    view, inner = block_view(block, scores)
    with mode(True, threads):
        assert same(_blocks.block_norms(scores, block, view, inner), block_norms_reference(scores, block))
        assert torch.equal(blocks(0.5, block, scores, None), blocks_reference(0.5, block, scores, None))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_native_block_norms_follow_torchs_arithmetic(dtype: torch.dtype) -> None:
    """Where the kernels are built, the probe finds how torch sums (else the fast path would stay off)."""
    if not _native.status().available:
        pytest.skip("no native kernels")
    assert _blocks._scheme(dtype) is not None
    scores = values((64, 256), 11, 0, dtype)
    norms = _blocks._native_norms(scores, (4, 4))
    assert norms is not None and same(norms.reshape(16, 64), block_norms_reference(scores, (4, 4)))


# --- PerSlice -------------------------------------------------------------------------------------


@st.composite
def slice_cases(draw: st.DrawFn) -> tuple[Tensor, int, Tensor | None]:
    length = draw(st.sampled_from([17, 40, 300, 1030, 2500]))
    shape = draw(
        st.sampled_from([(3, length), (length, 3), (1, length), (2, 3, length // 3 + 1), (5, length)])
    )
    dim = draw(st.integers(-len(shape), len(shape) - 1))
    seed = draw(st.integers(0, 10_000))
    scores = values(shape, seed, draw(st.integers(0, 3)), draw(st.sampled_from(DTYPES)))
    return scores, dim, earlier(shape, seed, draw(st.integers(0, 3)))


@given(
    case=slice_cases(), value=st.floats(0, 1), how=st.sampled_from(["count", "fraction", "sparsity"]),
    random=st.booleans(), native=st.booleans(), threads=st.sampled_from([1, 2]),
)  # fmt: skip
@example(case=(torch.zeros(0, 40), 0, None), value=0.5, how="fraction", random=False, native=True, threads=1)
@example(case=(torch.zeros(3, 0), 1, None), value=0.5, how="fraction", random=False, native=True, threads=1)
def test_per_slice_equals_the_sort_path(
    case: tuple[Tensor, int, Tensor | None], value: float, how: str, random: bool, native: bool, threads: int
) -> None:
    scores, dim, default = case
    per_slice = scores.numel() // max(1, scores.shape[dim])
    amount = amount_of(how, value, per_slice)
    kind = fp.RandomUnstructured if random else fp.L1Unstructured
    inner = kind(sparsity=amount.value) if isinstance(amount, Sparsity) else kind(amount)
    spec = fp.PerSlice(inner, dim=dim)
    if random:
        keys = torch.rand(scores.shape, generator=torch.Generator().manual_seed(5), dtype=scores.dtype)
    else:
        keys = scores.abs()
    with mode(native, threads):
        got = outcome(lambda: spec.compute_mask(scores, default, generator=torch.Generator().manual_seed(5)))
        expected = outcome(lambda: per_slice_reference(amount, dim % max(1, scores.dim()), keys, scores, default))
    if isinstance(expected, Tensor):
        assert isinstance(got, Tensor) and torch.equal(got, expected)
    else:
        assert got is expected


def test_rows_where_the_sample_misleads_fall_back_to_every_key() -> None:
    """Large keys exactly where each row's sample looks: the bracket misses, every key is ranked."""
    n = 4096
    at = torch.tensor([(2 * (j // 16) + 1) * (n - 16) // 32 + j % 16 for j in range(256)])
    rows = torch.rand(3, n, generator=torch.Generator().manual_seed(2))
    rows[:, at] = 1000 + torch.arange(256.0)
    rows[1, :100] = 0.25  # and ties at the k-th key
    for k in (1, n // 2, n - 300, n - 1):
        got = keep_in_rows(rows, k, None)
        assert got is None or torch.equal(got, _keep_rows(rows, k, None))
        assert torch.equal(keep(rows, k, group=Slices(0)), _keep_rows(rows, k, None))


@pytest.mark.parametrize("native", [True, False])
def test_per_row_counts_beyond_a_row_are_capped(native: bool) -> None:
    rows = values((4, 1500), 4, 1, torch.float32)
    eligible = torch.rand(4, 1500, generator=torch.Generator().manual_seed(4)) < 0.5
    counts = torch.tensor([0, 700, 1500, 3000])
    capped = torch.minimum(counts, eligible.sum(1))
    with mode(native, 2):
        got = keep(rows, capped, eligible, group=Slices(0))
        direct = keep_in_rows(rows, counts, eligible)
    assert torch.equal(got, _keep_rows(rows, capped, eligible))
    assert direct is None or torch.equal(direct, got)


@pytest.mark.parametrize("native", [True, False])
def test_eligible_counts_per_slice(native: bool) -> None:
    mask = torch.rand(5, 3000, generator=torch.Generator().manual_seed(6)) < 0.4
    with mode(native, 2):
        for dim in (0, 1):
            expected = mask.movedim(dim, 0).reshape(mask.shape[dim], -1).sum(1)
            assert torch.equal(eligible_per_group(mask, Slices(dim)), expected)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("kind", [0, 2])
def test_vmap_of_l1_over_long_rows_equals_the_loop(native: bool, kind: int) -> None:
    """Under vmap, the rows of a batch reach the long-rows path together (``funcprune::keep_lowest``)."""
    batch = values((4, 1200), 9, kind, torch.float32)
    spec = fp.L1Unstructured(0.5)
    with mode(native, 2):
        got = vmap(lambda s: fp.compute_mask(spec, s))(batch)
        loop = torch.stack([fp.compute_mask(spec, s) for s in batch])
    assert torch.equal(got, loop)
    assert torch.equal(loop, _keep_rows(batch.abs(), 600, None))
