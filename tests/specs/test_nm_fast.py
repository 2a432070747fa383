"""The fast paths of ``NM`` (issue 27) equal the implementation they replace, bit for bit.

The reference is today's kernel, kept in ``_nm_reference.py``: ``|scores|``
ranked by ``funcprune._select.keep`` over ``Runs(m, dim)``. The paths
compared with it (``funcprune/_select/_n_m.py``): the native kernel (this
CPU's build and the portable one), the torch path by comparisons (eagerly,
a chunk of groups at a time, and under ``vmap``, ``grad`` and
``torch.compile``), and the dispatch between them, with the kernels on and
off (``funcprune._native.using(None)``), at 1 and 2 threads (the kernel's
threads split even small tensors here), over ties, NaN, ``±inf``, ``-0.0``,
subnormals, every floating dtype (float16 and bfloat16 natively too, read
as their bits), dims ``-1``, ``0`` and between, 1-D to
4-D, ``m`` from 1 to 64 (beyond the torch path's 16), every ``n``, and
earlier masks (random, pruning whole groups, pruning all, keeping all).
"""

from __future__ import annotations

import ctypes

import pytest
import torch
from _inputs import DTYPES, mode, values
from _nm_reference import n_m_reference
from hypothesis import example, given
from hypothesis import strategies as st
from torch.func import vmap

import funcprune as fp
from funcprune import _native
from funcprune._select import _n_m

Tensor = torch.Tensor


def earlier(shape: tuple[int, ...], seed: int, how: int, m: int, dim: int) -> Tensor | None:
    """None (0), random (1), all pruned (2), all kept (3), random with whole groups pruned (4)."""
    if how == 0:
        return None
    if how in (2, 3):
        return torch.full(shape, how == 3, dtype=torch.bool)
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(seed + 7)) < 0.6
    if how == 4:  # every other group along dim pruned whole
        moved = mask.movedim(dim, -1)
        moved.view(*moved.shape[:-1], moved.shape[-1] // m, m)[..., ::2, :] = False
    return mask


@st.composite
def nm_cases(draw: st.DrawFn) -> tuple[int, int, int, Tensor, Tensor | None]:
    """``(n, m, dim, scores, default_mask)``: 1-D to 4-D, the length along ``dim`` a multiple of ``m``."""
    m = draw(st.sampled_from([1, 2, 3, 4, 4, 5, 8, 16, 32, 64]))
    n = draw(st.integers(0, m))
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    dim = draw(st.integers(-len(shape), len(shape) - 1))
    shape[dim] *= m * draw(st.sampled_from([1, 2, 3, 9]))  # 9: runs of 36 groups of 4 (a vector's tail)
    seed = draw(st.integers(0, 10_000))
    scores = values(tuple(shape), seed, draw(st.integers(0, 3)), draw(st.sampled_from(DTYPES)))
    if draw(st.booleans()) and scores.dim() >= 2:  # not contiguous: the torch path
        scores = scores.transpose(0, -1).contiguous().transpose(0, -1)
    return n, m, dim, scores, earlier(tuple(shape), seed, draw(st.integers(0, 4)), m, dim)


@given(case=nm_cases(), threads=st.sampled_from([1, 2]), chunk=st.sampled_from([None, 1, 40]))
@example(case=(2, 4, -1, torch.zeros(0, 8), None), threads=1, chunk=None)
@example(case=(1, 4, 0, torch.zeros(8, 0), torch.ones(8, 0, dtype=torch.bool)), threads=2, chunk=None)
@example(case=(2, 4, -1, torch.full((2, 8), float("nan")), None), threads=1, chunk=None)
@example(case=(2, 2, -1, torch.tensor([-0.0, 0.0, 0.0, -0.0]), None), threads=1, chunk=None)
def test_nm_equals_todays_kernel(
    case: tuple[int, int, int, Tensor, Tensor | None], threads: int, chunk: int | None
) -> None:
    """The spec with the kernels on and off, the torch path by comparisons (in chunks), the kernel itself."""
    n, m, dim, scores, default = case
    spec = fp.NM(n, m, dim)
    expected = n_m_reference(n, m, dim, scores, default)
    with pytest.MonkeyPatch.context() as mp:
        if chunk is not None:  # a chunk of groups at a time (at least one group)
            mp.setattr(_n_m, "_CHUNK", chunk)
        for native in (True, False):
            with mode(native, threads):
                assert torch.equal(spec.compute_mask(scores, default), expected)
                if m <= _n_m.PORTABLE_MAX_M:
                    assert torch.equal(_n_m.n_m_by_comparisons(n, m, dim, scores, default), expected)
                fast = _native.n_m(scores, default, n, m, dim)
                if native and scores.is_contiguous():  # every floating dtype: float16 and bfloat16 too
                    assert fast is not None or not _native.status().available
                assert fast is None or torch.equal(fast, expected)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("shape", "dim", "m"),
    [((64, 1036), -1, 4), ((37, 4100), -1, 2), ((12, 777 * 8), 1, 8), ((4, 3, 64, 70), 2, 4),
     ((4096, 3), 0, 16), ((5, 64 * 3, 9), 1, 64), ((2, 48, 130), 1, 3)],
)  # fmt: skip
def test_the_kernel_on_larger_tensors_from_both_builds(
    portable: ctypes.CDLL, avx2: ctypes.CDLL | None, shape: tuple[int, ...], dim: int, m: int, threads: int
) -> None:
    """Many runs and tiles a thread, vectors' tails; this CPU's build, the portable one, the AVX2 one (beside
    AVX-512), and torch's path."""
    kinds = ((torch.float32, 2), (torch.float64, 1), (torch.float32, 0), (torch.bfloat16, 2), (torch.float16, 1))
    for dtype, kind in kinds:
        scores = values(shape, m, kind, dtype)
        for how in (0, 1, 4):
            default = earlier(shape, m, how, m, dim)
            for n in sorted({0, 1, m // 2, m - 1, m}):
                expected = n_m_reference(n, m, dim, scores, default)
                with mode(True, threads):
                    assert torch.equal(fp.NM(n, m, dim).compute_mask(scores, default), expected)
                    for build in (portable, avx2):
                        if build is None:
                            continue
                        with _native.using(build):
                            fast = _native.n_m(scores, default, n, m, dim)
                        assert fast is not None and torch.equal(fast, expected)
                if dtype in (torch.float32, torch.bfloat16) and n == m // 2 and m <= _n_m.PORTABLE_MAX_M:
                    with mode(False, threads):
                        assert torch.equal(fp.NM(n, m, dim).compute_mask(scores, default), expected)


def test_the_kernel_declines_what_it_does_not_take() -> None:
    """A dtype not floating, a layout not contiguous, a group longer than 64, a mask of another shape: ``None``."""
    scores = torch.randn(8, 128)
    assert _native.n_m(scores.to(torch.int16), None, 2, 4, -1) is None
    assert _native.n_m(scores.to(torch.float8_e4m3fn), None, 2, 4, -1) is None
    assert _native.n_m(scores.t(), None, 2, 4, -1) is None
    assert _native.n_m(scores, None, 64, 128, -1) is None
    assert _native.n_m(scores, torch.ones(128, 8, dtype=torch.bool).t(), 2, 4, -1) is None
    assert _native.n_m(scores, torch.ones(1, 128, dtype=torch.bool), 2, 4, -1) is None
    assert _native.n_m(scores, None, 2, 3, -1) is None  # 3 does not divide 128
    got = fp.NM(64, 128).compute_mask(scores)  # the selection path
    assert torch.equal(got, n_m_reference(64, 128, -1, scores, None))


# --- under transforms: the torch path -------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "m", "dim"), [(2, 4, -1), (1, 4, 0), (3, 8, 1), (5, 32, -1)])
def test_vmap_equals_the_reference_per_element(n: int, m: int, dim: int, dtype: torch.dtype) -> None:
    """Batched scores and masks, and batched scores with one mask (the torch path, or the selection's)."""
    scores = values((3, 8, 32, 64), 5, 2, dtype)
    masks = torch.rand(scores.shape, generator=torch.Generator().manual_seed(1)) < 0.7
    spec = fp.NM(n, m, dim)
    both = vmap(lambda s, e: spec.compute_mask(s, e))(scores, masks)
    shared = vmap(lambda s: spec.compute_mask(s, masks[0]))(scores)
    alone = vmap(spec.compute_mask)(scores)
    for i in range(scores.shape[0]):
        assert torch.equal(both[i], n_m_reference(n, m, dim, scores[i], masks[i]))
        assert torch.equal(shared[i], n_m_reference(n, m, dim, scores[i], masks[0]))
        assert torch.equal(alone[i], n_m_reference(n, m, dim, scores[i], None))


def test_grad_sees_the_reference_mask() -> None:
    """The mask computed inside ``torch.func.grad`` (on the wrapped weight) is the reference's."""
    w = values((8, 16), 9, 2, torch.float32)
    w = torch.where(w.isfinite(), w, 0.0)  # (the gradient of inf * 0 would be NaN)
    earlier_mask = torch.rand(w.shape, generator=torch.Generator().manual_seed(2)) < 0.7
    spec = fp.NM(2, 4)

    def loss(x: Tensor) -> tuple[Tensor, Tensor]:
        mask = spec.compute_mask(x, earlier_mask)
        return (x * mask).pow(2).sum(), mask

    g, mask = torch.func.grad(loss, has_aux=True)(w)
    expected = n_m_reference(2, 4, -1, w, earlier_mask)
    assert torch.equal(mask, expected) and torch.equal(g, 2 * w * expected)


def test_compile_equals_the_reference_on_specials() -> None:
    """One fullgraph compile (bf16 codes, NaN, ties, an earlier mask, dim 0)."""
    scores = values((16, 12), 4, 2, torch.bfloat16)
    default = earlier((16, 12), 4, 4, 4, 0)
    compiled = torch.compile(lambda s, e: fp.NM(2, 4, dim=0).compute_mask(s, e), fullgraph=True)
    assert torch.equal(compiled(scores, default), n_m_reference(2, 4, 0, scores, default))
