"""fp.sparsegpt: equal to a float64 reference written from the paper and its code; exact counts; reconstruction.

The reference (``_sparsegpt_reference.py``) is a plain transcription of
IST-DASLab/sparsegpt's ``fasterprune`` with exact counts; here the optimized
function must give the same masks and the same weights (to 1e-9) in float64,
on unstructured, per-row and N:M specs, with dead inputs and every block
size. Properties hold for random layers; the reconstruction error on
correlated inputs is below magnitude's and Wanda's at the same budget.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import funcprune as fp
from funcprune import _native
from funcprune._criteria import _inverse, _sparsegpt
from funcprune._native import _calls

sys.path.insert(0, str(Path(__file__).parent))
from _sparsegpt_reference import reference_sparsegpt  # noqa: E402

Tensor = torch.Tensor


def layer(rows: int, cols: int, tokens: int, seed: int, *, dead: int = 0, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor, Tensor]:
    """A weight (rows, cols), correlated inputs X (tokens, cols) and H = XᵀX; ``dead`` inputs always 0."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(cols, cols, generator=g, dtype=torch.float64) / cols**0.5 + torch.eye(cols, dtype=torch.float64)
    scale = torch.exp(torch.randn(cols, generator=g, dtype=torch.float64))  # features of unequal size, as in LLMs
    x = torch.randn(tokens, cols, generator=g, dtype=torch.float64) @ mix * scale
    if dead:
        x[:, torch.randperm(cols, generator=g)[:dead]] = 0
    w = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    return w.to(dtype), x.to(dtype), (x.T @ x).to(dtype)


CASES = [
    # (spec, reference arguments)
    (fp.L1Unstructured(0.5), {"sparsity": 0.5}),
    (fp.L1Unstructured(0.3), {"sparsity": 0.3}),
    (fp.L1Unstructured(sparsity=0.7), {"sparsity": 0.7}),
    (fp.PerSlice(fp.L1Unstructured(0.5), dim=0), {"sparsity": 0.5, "per_row": True}),
    (fp.PerSlice(fp.L1Unstructured(0.25), dim=0), {"sparsity": 0.25, "per_row": True}),
    (fp.NM(2, 4), {"nm": (2, 4)}),
    (fp.NM(1, 4), {"nm": (1, 4)}),
    (fp.NM(4, 8), {"nm": (4, 8)}),
]


@pytest.mark.parametrize(("spec", "ref"), CASES, ids=[repr(c[0]) for c in CASES])
@pytest.mark.parametrize(("blocksize", "dead"), [(128, 0), (16, 0), (24, 3), (8, 1)])
def test_equals_the_reference_in_float64(spec: fp.Spec, ref: dict[str, object], blocksize: int, dead: int) -> None:
    w, _, h = layer(12, 48, 96, seed=blocksize + dead, dead=dead)
    new, masks = fp.sparsegpt({"w": w}, {"w": h}, spec, blocksize=blocksize)
    want_w, want_mask = reference_sparsegpt(w, h, blocksize=blocksize, **ref)  # type: ignore[arg-type]
    assert torch.equal(masks["w"], want_mask)
    torch.testing.assert_close(new["w"], want_w, rtol=0, atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 9),
    groups=st.integers(1, 6),
    fraction=st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.6, 0.9, 1.0]),
    blocksize=st.sampled_from([4, 8, 12, 128]),
    dead=st.integers(0, 2),
    per_row=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_layers_equal_the_reference(
    rows: int, groups: int, fraction: float, blocksize: int, dead: int, per_row: bool, seed: int
) -> None:
    cols = 4 * groups
    w, _, h = layer(rows, cols, 3 * cols, seed, dead=min(dead, cols - 1))
    spec: fp.Spec = fp.L1Unstructured(fraction)
    new, masks = fp.sparsegpt({"w": w}, {"w": h}, fp.PerSlice(spec, dim=0) if per_row else spec, blocksize=blocksize)
    want_w, want_mask = reference_sparsegpt(w, h, sparsity=fraction, per_row=per_row, blocksize=blocksize)
    assert torch.equal(masks["w"], want_mask)
    torch.testing.assert_close(new["w"], want_w, rtol=0, atol=1e-9)
    # exact counts: round(fraction * entries) of each block (or of each row of it), pruned entries exactly 0
    for i1 in range(0, cols, blocksize):
        block = masks["w"][:, i1 : i1 + blocksize]
        pruned = (~block).sum(dim=1) if per_row else (~block).sum()
        expected = round(fraction * block.shape[1]) if per_row else round(fraction * block.numel())
        assert torch.all(pruned == expected)
    assert torch.all(new["w"][~masks["w"]] == 0)


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 8), groups=st.integers(1, 8), nm=st.sampled_from([(2, 4), (1, 2), (0, 4), (3, 4), (4, 4), (5, 8)]),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_n_m_keeps_n_of_every_group_and_equals_the_reference(rows: int, groups: int, nm: tuple[int, int], seed: int) -> None:
    n, m = nm
    w, _, h = layer(rows, m * groups, 2 * m * groups, seed)
    new, masks = fp.sparsegpt({"w": w}, {"w": h}, fp.NM(n, m), blocksize=m * 2)
    want_w, want_mask = reference_sparsegpt(w, h, nm=nm, blocksize=m * 2)
    assert torch.equal(masks["w"], want_mask)
    torch.testing.assert_close(new["w"], want_w, rtol=0, atol=1e-9)
    assert torch.all(masks["w"].reshape(rows, groups, m).sum(dim=-1) == n)
    assert torch.all(new["w"][~masks["w"]] == 0)


def test_ties_go_to_the_lower_index() -> None:
    w = torch.ones(2, 8, dtype=torch.float64)
    h = torch.eye(8, dtype=torch.float64)  # every score equal, no update crosses columns
    _, masks = fp.sparsegpt({"w": w}, {"w": h}, fp.L1Unstructured(0.25))
    assert (~masks["w"]).nonzero().tolist() == [[0, 0], [0, 1], [0, 2], [0, 3]]
    _, masks = fp.sparsegpt({"w": w}, {"w": h}, fp.NM(2, 4))
    assert masks["w"][0].tolist() == [False, False, True, True] * 2


def test_at_sparsity_zero_nothing_changes_and_inputs_are_untouched() -> None:
    w, _, h = layer(6, 16, 40, seed=1, dtype=torch.float32)
    w0, h0 = w.clone(), h.clone()
    for spec in (fp.L1Unstructured(0.0), fp.NM(4, 4), fp.PerSlice(fp.L1Unstructured(0.0), dim=0)):
        new, masks = fp.sparsegpt({"w": w, "b": torch.zeros(6)}, {"w": h}, spec, blocksize=8)
        assert torch.equal(new["w"], w) and masks["w"].all() and set(masks) == {"w"}
    new, _ = fp.sparsegpt({"w": w}, {"w": h}, fp.L1Unstructured(0.5))
    assert torch.equal(w, w0) and torch.equal(h, h0) and new["w"] is not w


def test_reconstruction_error_is_below_magnitude_and_wanda_at_the_same_budget() -> None:
    w, x, h = layer(32, 128, 512, seed=3)

    def error(pruned: Tensor) -> float:
        return float(torch.linalg.norm((w - pruned) @ x.T))

    norms = x.square().sum(dim=0).sqrt()
    for spec in (fp.PerSlice(fp.L1Unstructured(0.5), dim=0), fp.NM(2, 4)):
        new, masks = fp.sparsegpt({"w": w}, {"w": h}, spec, blocksize=128)
        magnitude = fp.Plan({"w": spec})({"w": w})["w"]
        wanda = fp.Plan({"w": spec})({"w": w}, scores=fp.wanda({"w": w}, {"w": norms}))["w"]
        assert masks["w"].sum() == magnitude.sum() == wanda.sum()  # the same budget
        ours, theirs = error(new["w"]), error(w * wanda)
        assert ours < 0.95 * theirs and theirs < 0.5 * error(w * magnitude)


def test_conv1d_layout_and_dtypes_come_back_as_given() -> None:
    w, _, h = layer(8, 16, 64, seed=4, dtype=torch.float32)
    new, masks = fp.sparsegpt({"c": w.T.contiguous().half()}, {"c": h}, fp.NM(2, 4), input_dims={"c": 0})
    plain, plain_masks = fp.sparsegpt({"c": w.half()}, {"c": h}, fp.NM(2, 4))
    assert new["c"].dtype == torch.float16 and new["c"].shape == (16, 8)
    assert torch.equal(masks["c"], plain_masks["c"].T) and torch.equal(new["c"], plain["c"].T)
    assert torch.all(masks["c"].reshape(4, 4, 8).sum(dim=1) == 2)  # groups of 4 inputs along dim 0


def test_stacked_layers_run_under_vmap_and_equal_one_by_one() -> None:
    parts = [layer(6, 16, 48, seed=s) for s in range(3)]
    w = torch.stack([p[0] for p in parts])
    h = torch.stack([p[2] for p in parts])
    new, masks = fp.sparsegpt({"e": w}, {"e": h}, fp.L1Unstructured(0.5), blocksize=8)
    for i, (wi, _, hi) in enumerate(parts):
        one, one_masks = fp.sparsegpt({"e": wi}, {"e": hi}, fp.L1Unstructured(0.5), blocksize=8)
        assert torch.equal(masks["e"][i], one_masks["e"])
        torch.testing.assert_close(new["e"][i], one["e"], rtol=0, atol=1e-12)


def test_float32_is_close_to_float64() -> None:
    w, _, h = layer(16, 64, 256, seed=5)
    new64, m64 = fp.sparsegpt({"w": w}, {"w": h}, fp.NM(2, 4))
    new32, m32 = fp.sparsegpt({"w": w.float()}, {"w": h.float()}, fp.NM(2, 4))
    assert new32["w"].dtype == torch.float32
    assert (m32["w"] != m64["w"]).float().mean() < 0.02
    agree = m32["w"] == m64["w"]
    torch.testing.assert_close(new32["w"][agree.all(dim=1)].double(), new64["w"][agree.all(dim=1)], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda w, h: fp.sparsegpt({"w": w}, {"w": h}, fp.L1Unstructured(3)), ValueError, "float fraction"),
        (lambda w, h: fp.sparsegpt({"w": w}, {"w": h}, fp.RandomUnstructured(0.5)), ValueError, "spec must be"),
        (lambda w, h: fp.sparsegpt({"w": w}, {"w": h}, fp.NM(2, 4, dim=0)), ValueError, "input dim"),
        (lambda w, h: fp.sparsegpt({"w": w}, {"w": h}, fp.PerSlice(fp.L1Unstructured(0.5), dim=1)), ValueError, "output row"),
        (lambda w, h: fp.sparsegpt({"w": w}, {"w": h}, fp.NM(2, 4), blocksize=6), ValueError, "multiple of"),
        (lambda w, h: fp.sparsegpt({"w": w}, {"w": h}, fp.L1Unstructured(0.5), blocksize=0), ValueError, "blocksize"),
        (lambda w, h: fp.sparsegpt({"w": w}, {"w": h}, fp.L1Unstructured(0.5), percdamp=-1.0), ValueError, "percdamp"),
        (lambda w, h: fp.sparsegpt({"w": w}, {"x": h}, fp.L1Unstructured(0.5)), fp.UnknownNameError, "'x'"),
        (lambda w, h: fp.sparsegpt({"w": w}, {"w": h[:4, :4]}, fp.L1Unstructured(0.5)), ValueError, r"expected \(8, 8\)"),
        (lambda w, h: fp.sparsegpt({"w": w.T}, {"w": h}, fp.L1Unstructured(0.5)), ValueError, "input_dims={'w': 0}"),
        (lambda w, h: fp.sparsegpt({"w": w}, {"w": h}, fp.L1Unstructured(0.5), input_dims={"w": 3}), ValueError, "last two"),
        (lambda w, h: fp.sparsegpt({"w": w}, cast(Any, [h]), fp.L1Unstructured(0.5)), TypeError, "hessians must be"),
        (lambda w, h: fp.sparsegpt({"w": w}, {"w": -h}, fp.L1Unstructured(0.5)), ValueError, "positive definite"),
    ],
)
def test_errors_name_what_is_wrong(call: object, error: type[Exception], match: str) -> None:
    _, _, h = layer(4, 8, 16, seed=6)
    w = torch.randn(5, 8, dtype=torch.float64)  # (out, in) = (5, 8): its transpose does not fit H
    with pytest.raises(error, match=match):
        call(w, h)  # type: ignore[operator]


def test_non_finite_weights_and_hessians_are_refused() -> None:
    w, _, h = layer(4, 8, 16, seed=7)
    for bad_w, bad_h, which in ((w.index_put((torch.tensor([0]), torch.tensor([0])), torch.tensor(float("nan"), dtype=w.dtype)), h,
                                 "weight"), (w, h * float("inf"), "Hessian")):  # fmt: skip
        with pytest.raises(ValueError, match=f"the {which} of 'w' holds NaN or inf"):
            fp.sparsegpt({"w": bad_w}, {"w": bad_h}, fp.NM(2, 4))


def test_half_precision_weights_are_pruned_in_float32_and_come_back_in_their_dtype() -> None:
    w, _, h = layer(8, 32, 64, seed=8, dtype=torch.float32)
    for dtype in (torch.float16, torch.bfloat16):
        new, masks = fp.sparsegpt({"w": w.to(dtype)}, {"w": h.double()}, fp.NM(2, 4))
        want, want_masks = fp.sparsegpt({"w": w.to(dtype).float()}, {"w": h.double().float()}, fp.NM(2, 4))
        assert new["w"].dtype == dtype and torch.equal(masks["w"], want_masks["w"])
        assert torch.equal(new["w"], want["w"].to(dtype))


# --- the native column loop (funcprune._native.sparsegpt_block) against the torch loop, bit for bit ---


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 40),
    groups=st.integers(1, 12),
    spec=st.sampled_from([fp.L1Unstructured(0.5), fp.L1Unstructured(0.3), fp.PerSlice(fp.L1Unstructured(0.5), dim=0),
                          fp.NM(2, 4), fp.NM(1, 4), fp.NM(0, 4), fp.NM(4, 4), fp.NM(3, 8), fp.NM(5, 16)]),
    blocksize=st.sampled_from([16, 32, 48, 128]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    ties=st.booleans(),
    dead=st.integers(0, 2),
    threads=st.sampled_from([1, 3]),
    build=st.sampled_from(["native", "portable", "avx2"]),
    seed=st.integers(0, 2**16),
)  # fmt: skip
@example(rows=3, groups=1, spec=fp.NM(2, 4), blocksize=16, dtype=torch.float32, ties=True, dead=0, threads=1,
         build="native", seed=5)  # ties within every group, this CPU's build
@example(rows=21, groups=2, spec=fp.NM(3, 8), blocksize=32, dtype=torch.float64, ties=True, dead=0, threads=3,
         build="avx2", seed=6)  # a partial tile, two threads' tiles, the AVX2 build
@example(rows=5, groups=1, spec=fp.NM(1, 4), blocksize=16, dtype=torch.float32, ties=True, dead=0, threads=1,
         build="portable", seed=7)
@example(rows=17, groups=3, spec=fp.NM(1, 3), blocksize=48, dtype=torch.float32, ties=True, dead=1, threads=3,
         build="native", seed=8)  # m = 3: steps of 15 columns, a group never split by one
@example(rows=9, groups=3, spec=fp.NM(2, 6), blocksize=48, dtype=torch.float64, ties=False, dead=2, threads=1,
         build="avx2", seed=9)  # m = 6: steps of 12
def test_the_native_column_loop_gives_the_torch_loops_bits(
    rows: int, groups: int, spec: fp.Spec, blocksize: int, dtype: torch.dtype, ties: bool, dead: int, threads: int,
    build: str, seed: int, portable: ctypes.CDLL, avx2: ctypes.CDLL | None,
) -> None:  # fmt: skip
    """Weights, masks: equal bit for bit, with ties among the N:M scores, dead inputs, rows split among threads
    and tiles (16 rows a tile with AVX-512, 8 with AVX2, 4 elsewhere), from this CPU's build, the portable one
    and the AVX2 one."""
    if not _native.status().available:
        pytest.skip("no native kernels on this machine")
    library = {"native": None, "portable": portable, "avx2": avx2}[build]
    if build == "avx2" and library is None:
        build = "native"  # (this CPU's build is the AVX2 one, or it has no AVX2)
    cols = 16 * groups
    w, _, h = layer(rows, cols, 2 * cols, seed, dead=dead, dtype=dtype)
    if ties:  # small integers over an equal diagonal: equal scores within groups, no update across columns
        w = torch.randint(-2, 3, w.shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
        h = 3 * torch.eye(cols, dtype=dtype)
    ran: list[bool] = []  # whether each block's loop ran natively
    kernel = _native.sparsegpt_block

    def watched(*args: Any) -> Tensor | None:
        err = kernel(*args)
        ran.append(err is not None)
        return err

    with pytest.MonkeyPatch.context() as mp, contextlib.nullcontext() if build == "native" else _native.using(library):
        mp.setattr(_calls, "_threads", lambda n: threads)
        mp.setattr(_native, "sparsegpt_block", watched)
        native = fp.sparsegpt({"w": w}, {"w": h}, spec, blocksize=blocksize)
    assert ran and all(ran)  # (else the torch loop was compared with itself)
    with _native.disabled():
        plain = fp.sparsegpt({"w": w}, {"w": h}, spec, blocksize=blocksize)
    assert torch.equal(native[1]["w"], plain[1]["w"])
    assert torch.equal(native[0]["w"].view(torch.uint8), plain[0]["w"].view(torch.uint8))  # the bits: -0.0 too


def test_the_native_column_loop_runs_and_declines_what_it_does_not_take() -> None:
    """It runs on plain CPU float32/float64 blocks; another dtype, a layout, shapes that disagree, an N:M it cannot: None."""
    if not _native.status().available:
        pytest.skip("no native kernels on this machine")
    w, _, h = layer(6, 16, 32, seed=9, dtype=torch.float32)
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True).contiguous()
    pruned = torch.zeros(6, 8, dtype=torch.bool)
    before = w.clone()
    err = _native.sparsegpt_block(w, 0, 8, u, pruned, 2, 4)
    assert err is not None and err.shape == (6, 8)
    assert torch.all(pruned.view(6, 2, 4).sum(-1) == 2) and torch.all(w[:, :8][pruned] == 0)
    assert torch.equal(w[:, 8:], before[:, 8:])  # the columns right of the block: the caller's matrix product
    declined = [
        (w.half(), 0, 8, u.half(), pruned, 2, 4),  # a dtype it does not take
        (w, 0, 8, u.double(), pruned, 2, 4),  # u of another dtype
        (w.t().contiguous().t(), 0, 8, u, pruned, 2, 4),  # not contiguous
        (w, 0, 8, u.t(), pruned, 2, 4),  # u not contiguous
        (w, 0, 8, u, torch.zeros(6, 4, dtype=torch.bool), 2, 4),  # flags of another shape
        (w, 0, 8, u, pruned.to(torch.uint8), 2, 4),  # flags not bool
        (w, 8, 20, u, torch.zeros(6, 12, dtype=torch.bool), 2, 4),  # past the last column
        (w, 0, 8, u, pruned, 2, 3),  # m does not divide the block
        (w, 0, 8, u, pruned, 5, 4),  # n above m
    ]
    for args in declined:
        copy = args[0].clone()
        assert _native.sparsegpt_block(*args) is None
        assert torch.equal(args[0], copy)



# --- the factor of H⁻¹ by blocks of matrix products (from _BLOCKED_MIN columns) ---


@pytest.mark.parametrize("cols", [512, 600, 1100])
def test_the_blocked_factor_of_the_inverse_equals_lapacks(cols: int) -> None:
    """Upper triangular, ``UᵀU = H⁻¹``, and LAPACK's factor (the path below ``_BLOCKED_MIN`` and under vmap), to
    float64 rounding; panels that do not divide the size."""
    _, _, h = layer(4, cols, 2 * cols, seed=cols)
    h = h + cols * torch.eye(cols, dtype=torch.float64)
    u, _, info = _inverse.factor(0.0)(h)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_inverse, "_BLOCKED_MIN", 10**9)
        lapack, _, lapack_info = _inverse.factor(0.0)(h)
    assert int(info) == 0 and int(lapack_info) == 0
    assert torch.equal(u, u.triu()) and bool((torch.diagonal(u) > 0).all()) and u.is_contiguous()
    torch.testing.assert_close(u, lapack, rtol=0, atol=1e-12 * float(lapack.abs().max()))
    torch.testing.assert_close(u.T @ u, torch.linalg.inv(h), rtol=0, atol=1e-12 * float(torch.linalg.inv(h).abs().max()))


def test_the_blocked_factor_reports_a_matrix_not_positive_definite() -> None:
    """A negative eigenvalue: a nonzero info from the blocked path, and sparsegpt's error on a layer that wide."""
    _, _, h = layer(4, 600, 1200, seed=3)
    h[300, 300] = -1.0  # (its leading minors go negative from row 300 of the reversed matrix's order)
    _, _, info = _inverse.factor(0.0)(h)
    assert int(info) != 0
    w = torch.randn(4, 600, dtype=torch.float64)
    with pytest.raises(ValueError, match="not positive definite"):
        fp.sparsegpt({"w": w}, {"w": h}, fp.NM(2, 4))


@pytest.mark.parametrize(("spec", "ref"), [(fp.NM(2, 4), {"nm": (2, 4)}), (fp.L1Unstructured(0.5), {"sparsity": 0.5})])
def test_a_layer_past_the_blocked_size_equals_the_reference(spec: fp.Spec, ref: dict[str, object]) -> None:
    w, _, h = layer(6, 640, 1280, seed=11, dead=2)
    new, masks = fp.sparsegpt({"w": w}, {"w": h}, spec)
    want_w, want_mask = reference_sparsegpt(w, h, blocksize=128, **ref)  # type: ignore[arg-type]
    assert torch.equal(masks["w"], want_mask)
    torch.testing.assert_close(new["w"], want_w, rtol=0, atol=1e-9)


def test_weights_with_equal_hessians_share_one_factor_and_give_what_they_give_alone() -> None:
    """Consecutive weights whose Hessians are one tensor or equal ones (q, k, v) factor it once; the results are
    those of one call per weight, bit for bit."""
    w, _, h = layer(6, 32, 64, seed=12)
    other = layer(5, 32, 64, seed=13)
    params = {"q": w, "k": w[:3] * 2, "v": w[3:] - 1, "o": other[0]}
    hessians = {"q": h, "k": h, "v": h.clone(), "o": other[2]}
    made: list[tuple[int, ...]] = []
    real = _inverse.factor

    def counted(percdamp: float, consume: bool = False) -> Any:
        def factor(m: Tensor) -> Any:
            made.append(tuple(m.shape))
            return real(percdamp, consume)(m)

        return factor

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_inverse, "factor", counted)
        new, masks = fp.sparsegpt(params, hessians, fp.NM(2, 4))
    assert len(made) == 2  # q, k and v's; o's
    for name in params:
        alone, alone_masks = fp.sparsegpt({name: params[name]}, {name: hessians[name]}, fp.NM(2, 4))
        assert torch.equal(masks[name], alone_masks[name]) and torch.equal(new[name], alone[name])


@pytest.mark.parametrize("piece", [7, 1 << 18])
@pytest.mark.parametrize("cols", [1, 5, 512, 515])
def test_the_reversal_in_place_is_the_flip_of_both_dims(cols: int, piece: int) -> None:
    """``P t P`` in place, by pieces swapped from both ends (a last piece shorter, an odd middle entry kept)."""
    t = torch.randn(cols, cols, generator=torch.Generator().manual_seed(cols))
    want = t.flip(0, 1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_inverse, "_PIECE", piece)
        _inverse._reverse_in_place(t)
    assert torch.equal(t, want)


@pytest.mark.parametrize("cols", [64, 600])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_consuming_call_gives_the_pure_call_s_bits_and_overwrites_only_its_own_hessians(
    cols: int, dtype: torch.dtype
) -> None:
    """The runner's call (its own sums given up: each may become its factor) against ``fp.sparsegpt``: the same
    weights and masks bit for bit, below and past the blocked size; the pure call leaves its Hessians as they
    were; weights share a factor only where their Hessians are one tensor (an overwritten one equals no other)."""
    w, _, h = layer(6, cols, 2 * cols, seed=cols, dead=1)
    w, h = w.to(dtype), h.to(dtype)
    params = {"q": w, "k": w * 2, "v": w - 1, "o": w.flip(1)}
    given = {"q": h.clone(), "k": h.clone(), "v": h.clone(), "o": h.clone()}
    pure, pure_masks = fp.sparsegpt(params, given, fp.NM(2, 4))
    assert all(torch.equal(t, h) for t in given.values())
    own = h.clone()
    consumed = {"q": own, "k": own, "v": h.clone(), "o": h.clone()}
    made: list[int] = []
    real = _inverse.factor

    def counted(percdamp: float, consume: bool = False) -> Any:
        assert consume

        def factor(m: Tensor) -> Any:
            made.append(1)
            return real(percdamp, consume)(m)

        return factor

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_inverse, "factor", counted)
        new, masks = _sparsegpt.sparsegpt_consuming(params, consumed, fp.NM(2, 4))
    assert len(made) == 3  # q and k's one tensor; v's equal one; o's
    for name in params:
        assert torch.equal(masks[name], pure_masks[name]) and torch.equal(new[name], pure[name]), name
    if cols >= _inverse._BLOCKED_MIN:
        assert not torch.equal(own, h)  # (overwritten by its factor: no copy was made)


def test_a_strided_hessian_past_the_blocked_size_gives_its_contiguous_copy_s_bits() -> None:
    """A Hessian that is a transposed view (symmetric, so the same values) takes the blocked path as its
    row-major copy does: the same weights and masks, bit for bit, and the native column loop still runs."""
    w, _, h = layer(6, 600, 1200, seed=21, dead=1)
    strided = h.T.contiguous().T  # (the same values, column-major)
    assert not strided.is_contiguous()
    want, want_masks = fp.sparsegpt({"w": w}, {"w": h.contiguous()}, fp.NM(2, 4))
    got, got_masks = fp.sparsegpt({"w": w}, {"w": strided}, fp.NM(2, 4))
    assert torch.equal(got_masks["w"], want_masks["w"]) and torch.equal(got["w"], want["w"])
