"""The native kernels give exactly what their pure-torch steps give; without them, torch runs.

Each kernel is checked against a reference written here in torch (the
semantics the pure-torch path implements), on data with NaN, infinities,
signed zeros and ties, with and without eligibility, in one piece and in
several threads' pieces, from the build for this CPU, from the portable
build and, on an x86 CPU with AVX-512, from a build for AVX2 without it
(``x86-64-v3``: the vector paths of the machines that lack AVX-512).
The end-to-end tests compare whole plans with the kernels on and off.
"""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import funcprune as fp
from funcprune import _native
from funcprune._native import _build
from funcprune._select import _choose
from funcprune._select._short_rows import order_codes

Tensor = torch.Tensor
HAVE_COMPILER = any(shutil.which(c) for c in ("cc", "gcc", "clang"))
needs_compiler = pytest.mark.skipif(not HAVE_COMPILER, reason="no C compiler on this machine")
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64}
#: Each property runs once per build and per piece count (up to 6 times): a fifth of the profile's examples each.
_EXAMPLES = max(1, settings().max_examples // 5)


@st.composite
def data(draw: st.DrawFn) -> tuple[Tensor, Tensor | None]:
    """1-D float32/float64 values with specials and ties, and eligibility flags or ``None``."""
    n = draw(st.integers(0, 3000))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    x = torch.randn(n, generator=g, dtype=dtype)
    if draw(st.booleans()):  # ties
        x = torch.randint(-4, 5, (n,), generator=g).to(dtype) / 2
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40], dtype=dtype)
    where = torch.rand(n, generator=g) < draw(st.sampled_from([0.0, 0.1, 0.5]))
    x[where] = specials[torch.randint(0, len(specials), (int(where.sum()),), generator=g)]
    eligible = torch.rand(n, generator=g) < draw(st.floats(0.0, 1.0)) if draw(st.booleans()) else None
    return x, eligible


def keys_of(x: Tensor, eligible: Tensor | None, absolute: bool) -> Tensor:
    keys = x.abs() if absolute else x.clone()
    return keys if eligible is None else keys.masked_fill(~eligible, torch.inf)


def bound(picks: st.DataObject, keys: Tensor) -> float:
    """A key of the data (ties with it), an infinity, or any float."""
    choices = [float("inf"), -float("inf"), picks.draw(st.floats(-3, 3))]
    if keys.numel():
        choices.append(float(keys[picks.draw(st.integers(0, keys.numel() - 1))]))
    value: float = picks.draw(st.sampled_from(choices))
    return value


@settings(max_examples=_EXAMPLES)
@given(case=data(), absolute=st.booleans(), picks=st.data())
def test_the_scan_counts_below_and_collects_inside_in_index_order(
    kernels: ctypes.CDLL, pieces: int, case: tuple[Tensor, Tensor | None], absolute: bool, picks: st.DataObject
) -> None:
    x, eligible = case
    keys = keys_of(x, eligible, absolute)
    lo, hi = sorted((bound(picks, keys), bound(picks, keys)))
    inside = keys[(keys >= lo) & (keys <= hi)]
    scanned = _native.scan(x, eligible, absolute, lo, hi, capacity=x.numel() + 64)
    assert scanned is not None
    below, found = scanned
    assert below == int((keys < lo).sum())
    assert found.dtype == x.dtype and torch.equal(found.view(_BITS[x.dtype]), inside.view(_BITS[x.dtype]))


@settings(max_examples=_EXAMPLES)
@given(case=data(), absolute=st.booleans(), picks=st.data())
def test_the_scan_steps_aside_when_the_keys_inside_do_not_fit(
    kernels: ctypes.CDLL, pieces: int, case: tuple[Tensor, Tensor | None], absolute: bool, picks: st.DataObject
) -> None:
    x, eligible = case
    keys = keys_of(x, eligible, absolute)
    inside = int(((keys >= -1) & (keys <= 1)).sum())
    capacity = picks.draw(st.integers(0, x.numel() + 8))
    scanned = _native.scan(x, eligible, absolute, -1.0, 1.0, capacity)
    if scanned is None:  # a piece that overflows its share is retried as one piece
        assert inside > capacity
    else:
        assert scanned[1].numel() == inside <= capacity


def test_keys_crowding_into_one_piece_are_collected_all_the_same(kernels: ctypes.CDLL, pieces: int) -> None:
    x = torch.arange(3000, dtype=torch.float32)  # sorted: the keys inside all sit in the last piece
    scanned = _native.scan(x, None, True, 2000.0, 2999.0, capacity=1200)
    assert scanned is not None
    assert scanned[0] == 2000 and torch.equal(scanned[1], x[2000:])


@settings(max_examples=_EXAMPLES)
@given(case=data(), absolute=st.booleans(), picks=st.data())
def test_survivors_prune_below_v_and_the_first_ties(
    kernels: ctypes.CDLL, pieces: int, case: tuple[Tensor, Tensor | None], absolute: bool, picks: st.DataObject
) -> None:
    x, eligible = case
    keys = keys_of(x, eligible, absolute)
    finite = keys[keys.isfinite()]
    if not finite.numel():
        return
    v = float(finite[picks.draw(st.integers(0, finite.numel() - 1))])
    ties = (keys == v).nonzero().squeeze(1)
    take = picks.draw(st.one_of(st.none(), st.integers(0, ties.numel())))
    pruned = keys < v
    pruned[ties if take is None else ties[:take]] = True
    expected = ~pruned if eligible is None else ~pruned & eligible
    kept = _native.survivors(x, eligible, absolute, v, take)
    assert kept is not None and kept.dtype == torch.bool
    assert torch.equal(kept, expected)


@settings(max_examples=_EXAMPLES)
@given(case=data())
def test_the_mask_product_has_the_float_products_bits(
    kernels: ctypes.CDLL, pieces: int, case: tuple[Tensor, Tensor | None]
) -> None:
    x, mask = case
    mask = torch.ones_like(x, dtype=torch.bool) if mask is None else mask
    out = _native.mask_multiply(x, mask)
    expected = x * mask.to(x.dtype)
    assert out is not None
    nan = expected.isnan()
    assert torch.equal(out.isnan(), nan)
    assert torch.equal(out[~nan].view(_BITS[x.dtype]), expected[~nan].view(_BITS[x.dtype]))  # -0.0 kept


def test_what_the_kernels_do_not_take_goes_to_torch(kernels: ctypes.CDLL) -> None:
    x = torch.randn(8, 6)
    mask = torch.rand(8, 6) < 0.5
    assert _native.mask_multiply(x.half(), mask) is None  # dtype
    assert _native.mask_multiply(x.t(), mask.t()) is None  # not contiguous
    assert _native.mask_multiply(x, mask.float()) is None  # not a bool mask
    assert _native.scan(x.flatten()[::2], None, True, 0.0, 1.0, 100) is None
    assert _native.survivors(x.flatten(), mask.flatten()[:10], True, 0.5, None) is None  # sizes differ
    with torch.device("meta"):
        assert _native.mask_multiply(torch.empty(3), torch.empty(3, dtype=torch.bool)) is None


@pytest.mark.parametrize(("dtype", "ties"), [(torch.float32, True), (torch.float64, False)])
def test_plans_give_the_same_masks_with_and_without_the_kernels(
    kernels: ctypes.CDLL, pieces: int, dtype: torch.dtype, ties: bool
) -> None:
    g = torch.Generator().manual_seed(7)
    shapes = {"a": (300, 250), "b": (64, 32, 3, 3), "c": (1000,), "d": (50, 7)}  # per layer, "a" is bracketed
    params = {n: torch.randn(s, generator=g, dtype=dtype) for n, s in shapes.items()}
    if ties:
        params = {n: (p * 4).round() / 4 for n, p in params.items()}
    params["b"][0, 0] = float("nan")
    assert params["a"].numel() >= _choose.FAST_MIN_KEYS
    plans = [fp.global_unstructured(list(params), fp.L1Unstructured(0.6)), fp.Plan({"*": fp.L1Unstructured(0.3)})]
    for plan in plans:
        first = plan(params)
        masks = plan(params, first)  # a second round: eligibility from the first
        with _native.disabled():
            expected_first = plan(params)
            expected = plan(params, expected_first)
        for name in params:
            assert torch.equal(first[name], expected_first[name]), name
            assert torch.equal(masks[name], expected[name]), name


def test_the_masked_training_step_is_the_same_with_and_without_the_kernels(kernels: ctypes.CDLL) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.ReLU(), torch.nn.Linear(30, 5))
    params = {n: p.detach().clone().requires_grad_() for n, p in model.named_parameters()}
    masks = fp.global_unstructured(["0.weight", "2.weight"], fp.L1Unstructured(0.7))(params)
    x = torch.randn(16, 40)

    def grads() -> list[Tensor]:
        out = fp.functional_call_masked(model, params, masks, (x,))
        return list(torch.autograd.grad(out.square().sum(), list(params.values())))

    native = grads()
    with _native.disabled():
        plain = grads()
    for a, b in zip(native, plain, strict=True):
        assert torch.equal(a, b)


def test_without_a_compiler_the_kernels_are_unavailable_and_say_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, gcc or clang
    monkeypatch.delenv("CC", raising=False)
    library, status = _native.open_library(tmp_path / "cache", portable=False)
    assert library is None and not status.available
    assert "no C compiler found" in status.detail


@needs_compiler
def test_a_compiler_that_fails_leaves_the_torch_path_and_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\necho 'fake compiler: no' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    library, status = _native.open_library(tmp_path / "cache", portable=False)
    assert library is None and "fake compiler: no" in status.detail
    assert not list((tmp_path / "cache").glob("*.so"))  # nothing half-written left behind


@needs_compiler
def test_the_library_is_compiled_once_into_the_cache(tmp_path: Path) -> None:
    first, status = _native.open_library(tmp_path, portable=True)
    assert first is not None and status.available
    built = list(tmp_path.glob("native-*.so"))
    assert len(built) == 1 and str(built[0]) in status.detail
    stamp = built[0].stat().st_mtime_ns
    again, _ = _native.open_library(tmp_path, portable=True)
    assert again is not None and built[0].stat().st_mtime_ns == stamp


def test_the_environment_can_turn_the_kernels_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUNCPRUNE_NATIVE", "0")
    _build._cached.cache_clear()
    try:
        assert _native.status() == _native.NativeStatus(False, "turned off by FUNCPRUNE_NATIVE")
        library, _ = _build._cached()
        assert library is None
    finally:
        _build._cached.cache_clear()
    with _native.using(library):  # what the process then runs on
        x, mask = torch.randn(10), torch.rand(10) < 0.5
        assert _native.mask_multiply(x, mask) is None
        assert torch.equal(fp.apply_masks({"w": x}, {"w": mask})["w"], x * mask)


@needs_compiler
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")
def test_this_machine_uses_the_kernels_on_torchs_threads() -> None:
    """CI's machine has a compiler: the default path there is the native one, on torch's OpenMP workers."""
    assert _native.status().available, _native.status().detail
    library, _ = _build._cached()
    assert library is not None and library.fp_openmp() == 1
    with open("/proc/self/maps", encoding="utf-8") as maps:  # one OpenMP runtime: torch's
        runtimes = {line.split()[-1] for line in maps if "libgomp" in line}
    assert len(runtimes) <= 1, runtimes


# --- the order codes' kernels of the selection over shards (_sharded.py's first round) ---


def _top_bins(x: Tensor) -> Tensor:
    """Each key's bin in the first round over shards: its order code's top 12 bits, offset (int64)."""
    bits = torch.finfo(x.dtype).bits
    return (order_codes(x).to(torch.int64) >> (bits - 12)) + 2048


def _pieces_of(n: int, count: int) -> list[tuple[int, int]]:
    return [(n * p // count, n * (p + 1) // count) for p in range(count)]


@settings(max_examples=_EXAMPLES)
@given(case=data())
def test_the_code_histogram_counts_each_pieces_codes_by_their_top_bits(
    kernels: ctypes.CDLL, pieces: int, case: tuple[Tensor, Tensor | None]
) -> None:
    x, eligible = case
    flags = torch.ones_like(x, dtype=torch.bool) if eligible is None else eligible
    bins = _top_bins(x)
    histogram = _native.code_histogram(x, eligible)
    assert histogram is not None and histogram.dtype == torch.int64
    assert histogram.shape == (pieces, _native.CODE_BINS)
    for row, (start, stop) in zip(histogram, _pieces_of(x.numel(), pieces), strict=True):
        expected = torch.bincount(bins[start:stop][flags[start:stop]], minlength=_native.CODE_BINS)
        assert torch.equal(row, expected)


@settings(max_examples=_EXAMPLES)
@given(case=data(), picks=st.data())
def test_the_code_collect_writes_one_bins_codes_and_indices_and_flags_the_keys_above(
    kernels: ctypes.CDLL, pieces: int, case: tuple[Tensor, Tensor | None], picks: st.DataObject
) -> None:
    x, eligible = case
    flags = torch.ones_like(x, dtype=torch.bool) if eligible is None else eligible
    bins = _top_bins(x)
    histogram = _native.code_histogram(x, eligible)
    assert histogram is not None
    filled = histogram.sum(0).nonzero().squeeze(1).tolist()
    b = picks.draw(st.sampled_from(filled) if filled else st.integers(0, _native.CODE_BINS - 1))
    collected = _native.code_collect(x, eligible, b, histogram[:, b])
    assert collected is not None
    inside = flags & (bins == b)
    codes, where, above = collected
    assert codes.dtype == where.dtype == torch.int64 and above.dtype == torch.bool
    assert torch.equal(where, inside.nonzero().squeeze(1))
    assert torch.equal(codes, order_codes(x).to(torch.int64)[inside])
    assert torch.equal(above, flags & (bins > b))


def test_the_code_collect_refuses_counts_that_are_not_its_keys_and_writes_nothing_past_its_room(
    kernels: ctypes.CDLL,
) -> None:
    x = torch.tensor([1.0, -0.0, 0.0, 1.0, float("nan"), 1.0, 2.0, 1.0])
    histogram = _native.code_histogram(x, None)
    assert histogram is not None
    b = int(_top_bins(torch.tensor([1.0]))[0])
    counts = histogram[:, b]
    assert int(counts.sum()) == 4
    assert _native.code_collect(x, None, b, counts - (counts > 0).long()) is None  # too few: refused
    assert _native.code_collect(x, None, b, counts + 1) is None  # too many
    assert _native.code_collect(x, None, _native.CODE_BINS, counts) is None  # no such bin
    # the raw kernel: one piece with room for 2 of the 4 keys writes 2, the rest of the buffers stays
    codes = torch.full((6,), -7, dtype=torch.int64)
    where = torch.full((6,), -7, dtype=torch.int64)
    offsets = torch.tensor([0, 2], dtype=torch.int64)
    found = kernels.fp_code_collect_f32(
        x.data_ptr(), None, 8, b, offsets.data_ptr(), codes.data_ptr(), where.data_ptr(), None, 1
    )
    assert found == -1
    assert torch.equal(where, torch.tensor([0, 3, -7, -7, -7, -7]))
    assert torch.equal(codes[2:], torch.full((4,), -7, dtype=torch.int64))


def test_the_code_kernels_code_signed_zeros_nans_and_subnormals_as_order_codes(
    kernels: ctypes.CDLL, pieces: int
) -> None:
    for dtype in (torch.float32, torch.float64):
        tiny = torch.finfo(dtype).tiny
        x = torch.tensor(
            [-0.0, 0.0, float("nan"), -float("nan"), float("inf"), -float("inf"), tiny / 4, -tiny / 4, tiny, -1.5, 1.5],
            dtype=dtype,
        )
        histogram = _native.code_histogram(x, None)
        assert histogram is not None
        assert torch.equal(histogram.sum(0), torch.bincount(_top_bins(x), minlength=_native.CODE_BINS))
        for b in histogram.sum(0).nonzero().squeeze(1).tolist():
            collected = _native.code_collect(x, None, b, histogram[:, b])
            assert collected is not None
            assert torch.equal(collected[0], order_codes(x).to(torch.int64)[_top_bins(x) == b])
            assert torch.equal(collected[2], _top_bins(x) > b)


def test_what_the_code_kernels_do_not_take_goes_to_torch(kernels: ctypes.CDLL) -> None:
    x = torch.randn(40)
    counts = torch.tensor([40])
    assert _native.code_histogram(x.half(), None) is None  # dtype
    assert _native.code_histogram(x.bfloat16(), None) is None
    assert _native.code_histogram(x[::2], None) is None  # not contiguous
    assert _native.code_histogram(x, torch.ones(40)) is None  # not a bool mask
    assert _native.code_histogram(x, torch.ones(39, dtype=torch.bool)) is None  # sizes differ
    assert _native.code_collect(x[::2], None, 0, counts) is None
    with _native.disabled():
        assert _native.code_histogram(x, None) is None
        assert _native.code_collect(x, None, 0, counts) is None


def test_a_portable_build_for_a_named_cpu_level_is_refused_by_name(tmp_path: Path) -> None:
    """``portable`` and ``march`` name two different builds: both at once is an error, nothing compiled."""
    with pytest.raises(ValueError, match=r"portable=True and march='x86-64-v3'"):
        _native.open_library(tmp_path, portable=True, march="x86-64-v3")
    assert not any(tmp_path.iterdir())
