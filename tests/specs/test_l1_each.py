"""A plan's per-tensor ``L1Unstructured`` rule, selected for all tensors at once (issue 27), equals each tensor alone.

The reference is today's path, tensor by tensor: ``fp.compute_mask`` of the
spec (``l1_unstructured``: the bracket, the threshold or the sort), and the
sort itself (``_keep_rows``). The paths compared with it: the plan's rule
(``_l1_at_once``: every tensor a row of ``funcprune._native``'s
``ragged_keep``), ``keep_each`` of parts keyed by their values or their
magnitudes, and the kernel itself on long rows (the one-read pass from
``ROW_FUSE_MIN`` keys, its larger samples, a sample that misleads) from this
CPU's build and the portable one (no vector pass). With the kernels on and off
(``funcprune._native.using(None)``), at 1 and 2 threads (the kernel's threads
split even a few entries here), over ties, NaN, ``±inf``, ``-0.0``,
subnormals, empty and 0-dim tensors, mixed dtypes, earlier masks, ``int``,
``float`` and ``sparsity`` amounts, chains of steps and swapped weights; under
``vmap``, ``grad`` and ``torch.compile`` the rule goes tensor by tensor.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable

import pytest
import torch
from _inputs import DTYPES, mode, values
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.func import vmap

import funcprune as fp
from funcprune import _native
from funcprune._plans import _rules
from funcprune._select import (
    KeyPart,
    _choose,
    keep_each,
    keep_jointly,
    magnitude_of,
    resolve_count,
)
from funcprune._select._choose import _keep_rows
from funcprune._select._groups import identity

Tensor = torch.Tensor
#: Shapes: 0-dim, empty, a few entries, and rows past the kernel's select-all (1024) and one-read (32768) lengths.
SHAPES = [(), (0,), (3, 0), (1,), (5,), (4, 7), (2, 3, 5), (33, 33), (1030,), (40, 1000), (2, 17000)]


def earlier(shape: tuple[int, ...], seed: int, how: int) -> Tensor | None:
    """None (0), random (1), all pruned (2), all kept (3)."""
    if how == 0:
        return None
    if how in (2, 3):
        return torch.full(shape, how == 3, dtype=torch.bool)
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed + 7)) < 0.6


def reference(spec: fp.L1Unstructured, scores: Tensor, default: Tensor | None) -> Tensor:
    """The sort path on one tensor: ``|scores|`` ranked, ties to the lower index, NaN last."""
    eligible = None if default is None else default.reshape(1, -1)
    unpruned = scores.numel() if default is None else int(default.sum())
    k = resolve_count(spec.target, unpruned, scores.numel())
    assert isinstance(k, int)
    keys = scores.detach().abs().reshape(1, -1)
    return _keep_rows(keys, k, eligible).reshape(scores.shape)


def outcome(call: Callable[[], object]) -> object:
    """The result, or the error's type and message."""
    try:
        return call()
    except (TypeError, ValueError, IndexError) as e:
        return type(e), str(e)


def equal(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    return a == b


def spec_of(how: str, value: float, units: int) -> fp.L1Unstructured:
    if how == "count":
        return fp.L1Unstructured(round(value * units))
    if how == "fraction":
        return fp.L1Unstructured(value)
    return fp.L1Unstructured(sparsity=value)


@st.composite
def tensor_sets(draw: st.DrawFn) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """2 to 6 tensors of mixed shapes and dtypes, some with earlier masks."""
    params, masks = {}, {}
    for i in range(draw(st.integers(2, 6))):
        shape = draw(st.sampled_from(SHAPES))
        seed = draw(st.integers(0, 10_000))
        params[f"t{i}"] = values(shape, seed, draw(st.integers(0, 3)), draw(st.sampled_from(DTYPES)))
        mask = earlier(shape, seed, draw(st.integers(0, 3)))
        if mask is not None:
            masks[f"t{i}"] = mask
    return params, masks


@settings(deadline=None, max_examples=150)
@given(
    case=tensor_sets(), value=st.floats(0, 1), how=st.sampled_from(["count", "fraction", "sparsity"]),
    native=st.booleans(), threads=st.sampled_from([1, 2]),
)  # fmt: skip
@example(  # ties, specials and an earlier mask; an empty and a 0-dim tensor beside them
    case=(
        {"a": torch.tensor([-0.0, 0.0, float("nan"), -float("inf"), 1.0, -1.0]), "b": torch.zeros(0),
         "c": torch.tensor(2.0), "d": torch.full((3, 40000), -0.5)},
        {"a": torch.tensor([True, True, True, False, True, True])},
    ),
    value=0.5, how="fraction", native=True, threads=1,
)  # fmt: skip
def test_a_per_tensor_rule_equals_each_tensor_alone(
    case: tuple[dict[str, Tensor], dict[str, Tensor]], value: float, how: str, native: bool, threads: int
) -> None:
    params, masks = case
    units = min(p.numel() for p in params.values())
    spec = spec_of(how, value, units)
    plan = fp.Plan({"*": spec})
    with mode(native, threads):
        got = outcome(lambda: plan(params, masks))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_rules, "_l1_at_once", lambda steps, items: None)  # today's fold, tensor by tensor
            today = outcome(lambda: plan(params, masks))
        alone = outcome(lambda: {n: fp.compute_mask(spec, p, masks.get(n)) for n, p in params.items()})
    assert equal(got, today), (got, today)
    if isinstance(got, dict):
        assert equal(got, alone)
        assert equal(got, {n: reference(spec, p, masks.get(n)) for n, p in params.items()})
    else:  # an int amount beyond a tensor: the same error, naming the tensor
        assert isinstance(alone, tuple) and got[0] is alone[0]  # type: ignore[index]


@settings(deadline=None, max_examples=100)
@given(case=tensor_sets(), fractions=st.lists(st.floats(0, 1), min_size=6, max_size=6), magnitude=st.booleans(),
       native=st.booleans(), threads=st.sampled_from([1, 2]))  # fmt: skip
def test_keep_each_equals_each_part_alone(
    case: tuple[dict[str, Tensor], dict[str, Tensor]], fractions: list[float], magnitude: bool, native: bool,
    threads: int,
) -> None:
    """Keys that are the values or their magnitudes, each part its own count of its eligible keys."""
    params, masks = case
    parts: list[KeyPart] = []
    counts, available = [], []
    for (name, p), f in zip(params.items(), fractions):
        eligible = None if name not in masks else masks[name].reshape(-1)
        key = magnitude_of if magnitude else identity
        parts.append(KeyPart(p.reshape(-1), key, eligible))
        available.append(p.numel() if eligible is None else int(eligible.sum()))
        counts.append(round(f * available[-1]))
    with mode(native, threads):
        got = keep_each(parts, counts, available)
        alone = [keep_jointly([p], k)[0] for p, k in zip(parts, counts, strict=True)]
    for g, a, part, k in zip(got, alone, parts, counts, strict=True):
        assert torch.equal(g, a)
        flags = None if part.eligible is None else part.eligible[None]
        assert torch.equal(g, _keep_rows(part.keys()[None], k, flags)[0])


def test_a_long_part_with_several_threads_is_bracketed_alone() -> None:
    """Past ``ROW_ALONE_MAX`` (made small here) with 2 threads: the bracket, on all of them; the same flags."""
    parts = [KeyPart(values((70000,), s, s % 3, torch.float32), magnitude_of) for s in range(3)]
    counts = [35000, 1, 69999]
    with mode(True, 2), pytest.MonkeyPatch.context() as mp:
        mp.setattr(_choose, "ROW_ALONE_MAX", 50000)
        assert not _choose._in_ragged_rows(parts[0], counts[0])
        got = keep_each(parts, counts, [70000] * 3)
    for g, p, k in zip(got, parts, counts, strict=True):
        assert torch.equal(g, _keep_rows(p.keys()[None], k, None)[0])


# --- the kernel on long rows ------------------------------------------------------------------------


#: Around the lengths where the kernel changes its ways: select-all below 1024, the one-read pass from 32768,
#: samples of 1024 from 65536, 4096 from 262144 and 16384 from 1048576 keys.
LENGTHS = [1023, 1024, 32767, 32768, 65536 + 5, 262144 + 3, 1048576 + 7]


@pytest.mark.ci  # slow (issue 42's session: the default suite back under 5 minutes); CI runs it
@pytest.mark.parametrize(
    ("dtype", "threads"),
    [(torch.float32, 1), *(pytest.param(d, t, marks=pytest.mark.ci) for d, t in
                           [(torch.float32, 2), (torch.float64, 1), (torch.float64, 2)])],
)  # fmt: skip
def test_the_kernel_on_long_rows_from_both_builds(portable: ctypes.CDLL, dtype: torch.dtype, threads: int) -> None:
    """Every length at once (each row one thread's), each with its own count and earlier mask."""
    if not _native.status().available:
        pytest.skip("no native kernels")
    rows = [values((n,), n + kind, kind, dtype) for n in LENGTHS for kind in (0, 1, 2)]
    flags = [None if i % 3 == 0 else earlier((r.numel(),), i, 1 if i % 3 == 1 else 3) for i, r in enumerate(rows)]
    for fraction in (0.0, 1e-4, 0.3, 0.5, 0.97, 1.0):
        available = [r.numel() if e is None else int(e.sum()) for r, e in zip(rows, flags, strict=True)]
        counts = [round(fraction * a) for a in available]
        for absolute in (True, False):
            expected = [
                _keep_rows((r.abs() if absolute else r)[None], k, None if e is None else e[None])[0]
                for r, k, e in zip(rows, counts, flags, strict=True)
            ]
            for library in (None, portable):
                with mode(True, threads), contextlib.nullcontext() if library is None else _native.using(library):
                    for given_available in (available, None):
                        got = _native.ragged_keep(rows, flags, absolute, counts, given_available)
                        assert got is not None
                        assert all(torch.equal(g, x) for g, x in zip(got, expected, strict=True))
                    two_d = _native.rows_keep(rows[-1][None], flags[-1] if flags[-1] is None else flags[-1][None],
                                              absolute, torch.tensor([counts[-1]]))  # fmt: skip
                    assert two_d is not None and torch.equal(two_d[0], expected[-1])


@pytest.mark.parametrize("n", [40000, 70000, 300000, 1100000])
def test_a_long_row_whose_sample_misleads_falls_back_to_every_key(portable: ctypes.CDLL, n: int) -> None:
    """Large keys exactly where the sample looks: the one-read pass misses, every key is ranked (and ties cut)."""
    if not _native.status().available:
        pytest.skip("no native kernels")
    s = 256 if n < 1 << 16 else 1024 if n < 1 << 18 else 4096 if n < 1 << 20 else 16384
    at = torch.tensor([(2 * (j // 16) + 1) * (n - 16) // (2 * s // 16) + j % 16 for j in range(s)])
    row = torch.rand(n, generator=torch.Generator().manual_seed(n))
    row[at] = 1000 + torch.arange(float(s))
    row[: n // 8] = 0.25  # ties at the k-th key
    for library in (None, portable):
        with contextlib.nullcontext() if library is None else _native.using(library):
            for k in (1, n // 8, n // 2, n - 300, n - 1):
                expected = _keep_rows(row[None], k, None)[0]
                for keys in (row, row.double()):
                    got = _native.ragged_keep([keys, keys[:100]], [None, None], False, [k, 50])
                    assert got is not None and torch.equal(got[0], expected)


def test_the_kernel_declines_what_it_does_not_take() -> None:
    rows = [torch.randn(10), torch.randn(12)]
    assert _native.ragged_keep([rows[0], rows[1].double()], [None, None], True, [1, 1]) is None
    assert _native.ragged_keep([rows[0], rows[1].half()], [None, None], True, [1, 1]) is None
    assert _native.ragged_keep([rows[0], torch.randn(4, 3).t()], [None, None], True, [1, 1]) is None
    assert _native.ragged_keep(rows, [None, torch.ones(11, dtype=torch.bool)], True, [1, 1]) is None
    assert _native.ragged_keep(rows, [None], True, [1, 1]) is None
    assert _native.ragged_keep([], [], True, []) is None


# --- plans: chains, swapped weights, transforms -----------------------------------------------------


@pytest.mark.parametrize("native", [True, False])
def test_a_chain_and_swapped_weights_equal_todays_fold(native: bool) -> None:
    """A list of L1 steps, given scores for one tensor, a weight stored (in, out): as tensor by tensor."""
    params = {"a": values((30, 50), 1, 2, torch.float32), "b": values((40, 30), 2, 1, torch.bfloat16),
              "c": values((1000,), 3, 0, torch.float64)}  # fmt: skip
    first = earlier((30, 50), 1, 1)
    assert first is not None
    masks = {"a": first}
    scores = {"c": values((1000,), 4, 1, torch.float64)}
    plan = fp.Plan({"*": [fp.L1Unstructured(0.3), fp.L1Unstructured(7), fp.L1Unstructured(sparsity=0.8)]},
                   input_dims={"b": 0})  # fmt: skip
    with mode(native, 2):
        got = plan(params, masks, scores)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_rules, "_l1_at_once", lambda steps, items: None)
            today = plan(params, masks, scores)
    assert equal(got, today)


def test_an_error_names_the_tensor_as_before() -> None:
    params = {"a": torch.randn(10), "b": torch.randn(3)}
    with pytest.raises(ValueError, match="Plan: cannot prune 'b' with L1Unstructured"):
        fp.Plan({"*": fp.L1Unstructured(5)})(params)


def test_under_vmap_grad_and_compile_the_rule_goes_tensor_by_tensor() -> None:
    params = {"a": values((4, 30, 20), 1, 2, torch.float32), "b": values((4, 50), 2, 1, torch.float32)}
    plan = fp.Plan({"*": fp.L1Unstructured(0.5)})
    batched = vmap(plan)(params)
    for i in range(4):
        one = plan({n: p[i] for n, p in params.items()})
        assert equal({n: m[i] for n, m in batched.items()}, one)
    w = {n: p[0].nan_to_num(0.0, 0.0, 0.0) for n, p in params.items()}

    def loss(x: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        masks = plan(x)
        return sum(((x[n] * masks[n]) ** 2).sum() for n in x), masks  # type: ignore[return-value]

    g, masks = torch.func.grad(loss, has_aux=True)(w)
    assert equal(masks, plan(w))
    assert all(torch.equal(g[n], 2 * w[n] * masks[n]) for n in w)
    compiled = torch.compile(plan, fullgraph=False)
    assert equal(compiled(w), plan(w))


@settings(deadline=None, max_examples=60)
@given(case=tensor_sets(), value=st.floats(0, 1), overlap=st.booleans(), native=st.booleans())
def test_one_rule_per_tensor_is_one_joint_selection_with_the_same_masks(
    case: tuple[dict[str, Tensor], dict[str, Tensor]], value: float, overlap: bool, native: bool
) -> None:
    """Issue 42: ``{name: spec for name in names}``, the per-layer torch loop's spelling, takes the joint path as a
    glob rule does (one selection for all), with the masks of the fold tensor by tensor. A rule that selects a
    tensor again (``overlap``) starts a new joint selection after it: that tensor is folded twice, in order."""
    params, masks = case
    spec = fp.L1Unstructured(value)
    rules: dict[str, fp.Spec] = {n: spec for n in params}
    if overlap:
        rules["*"] = spec  # every tensor again, after
    plan = fp.Plan(rules)
    calls: list[int] = []
    real = _rules._l1_at_once

    def counted(steps: object, items: list[object]) -> object:
        calls.append(len(items))
        return real(steps, items)  # type: ignore[arg-type]

    with mode(native, 1):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_rules, "_l1_at_once", counted)
            got = outcome(lambda: plan(params, masks))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_rules, "_l1_at_once", lambda steps, items: None)  # the fold, rule by rule, tensor by tensor
            today = outcome(lambda: plan(params, masks))
    assert equal(got, today), (got, today)
    assert calls == [len(params)] * (2 if overlap else 1)  # one joint call per run of rules
