"""Parity of the built-in methods' compute_mask and prune with torch's.

Called directly (not through a container), torch's methods pick the units to
prune from all of ``t`` and zero them in ``default_mask``; compat must give
the same values, dtypes, identities, RNG draws and exceptions.
"""

from __future__ import annotations

import contextlib

import math
import types
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
import torch
import torch.nn.utils.prune as tp
from hypothesis import given
from hypothesis import strategies as st

import funcprune.compat as cp
import funcprune._specs
from funcprune._specs import _kernels as kernels

from ._helpers import assert_same_tensor, distinct, outcome

Tensor = torch.Tensor
Make = Callable[[types.ModuleType], Any]

MASK_DTYPES = [torch.float32, torch.float64, torch.int64, torch.bool]
NORMS: list[Any] = [1, 2, 3, 0.5, -1, math.inf, -math.inf, "fro"]


def binary_mask(shape: tuple[int, ...], seed: int, dtype: torch.dtype, p: float) -> Tensor:
    g = torch.Generator().manual_seed(seed + 1)
    return (torch.rand(shape, generator=g) >= p).to(dtype)


def leaf_parity(make: Make, t: Tensor, default_mask: Tensor, seed: int) -> None:
    """Same result (values, dtype, identity with default_mask), same RNG use."""
    results = []
    for lib in (tp, cp):
        mask = default_mask.clone()
        torch.manual_seed(seed)
        got = outcome(lambda: make(lib).compute_mask(t, mask))
        aliased = got[0] == "ok" and got[1] is mask
        results.append((got, aliased, torch.get_rng_state()))
    (a, alias_a, rng_a), (b, alias_b, rng_b) = results
    assert a[0] == b[0], (a, b)
    if a[0] == "ok":
        assert_same_tensor(a[1], b[1])
    else:
        assert a[1] == b[1]
    assert alias_a == alias_b
    assert torch.equal(rng_a, rng_b)


@st.composite
def amounts(draw: st.DrawFn, units: int) -> int | float:
    if draw(st.booleans()):
        return draw(st.integers(0, units))
    return draw(st.floats(0.0, 1.0))


@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from(MASK_DTYPES),
    density=st.sampled_from([0.0, 0.3, 0.7]),
    random=st.booleans(),
    data=st.data(),
)
def test_unstructured_parity(
    shape: tuple[int, ...],
    seed: int,
    dtype: torch.dtype,
    density: float,
    random: bool,
    data: st.DataObject,
) -> None:
    t = distinct(shape, seed)
    amount = data.draw(amounts(t.numel()))
    name = "RandomUnstructured" if random else "L1Unstructured"
    mask = binary_mask(shape, seed, dtype, density)
    leaf_parity(lambda lib: getattr(lib, name)(amount), t, mask, seed)


@given(
    shape=st.lists(st.integers(1, 4), min_size=2, max_size=4).map(tuple),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from(MASK_DTYPES),
    n=st.sampled_from(NORMS + [None]),
    data=st.data(),
)
def test_structured_parity(
    shape: tuple[int, ...], seed: int, dtype: torch.dtype, n: Any, data: st.DataObject
) -> None:
    t = distinct(shape, seed)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    amount = data.draw(amounts(shape[dim]))
    mask = binary_mask(shape, seed, dtype, 0.2)
    if n is None:
        leaf_parity(lambda lib: lib.RandomStructured(amount, dim), t, mask, seed)
    else:
        leaf_parity(lambda lib: lib.LnStructured(amount, n, dim), t, mask, seed)


@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
       seed=st.integers(0, 2**16), dtype=st.sampled_from(MASK_DTYPES + [torch.int8]),
       mask_dtype=st.sampled_from(MASK_DTYPES))
def test_custom_from_mask_and_identity_parity(
    shape: tuple[int, ...], seed: int, dtype: torch.dtype, mask_dtype: torch.dtype
) -> None:
    t = distinct(shape, seed)
    given_mask = binary_mask(shape, seed + 7, dtype, 0.5)
    default_mask = binary_mask(shape, seed, mask_dtype, 0.3)
    leaf_parity(lambda lib: lib.CustomFromMask(given_mask), t, default_mask, seed)
    leaf_parity(lambda lib: lib.Identity(), t, default_mask, seed)


def test_nuclear_norm_on_3d_parity() -> None:
    t = distinct((3, 4, 2), 1)
    for dim in (0, 1, 2, -1):
        leaf_parity(lambda lib: lib.LnStructured(1, "nuc", dim), t, torch.ones(3, 4, 2), 0)


def test_random_methods_draw_what_torch_draws_on_large_tensors() -> None:
    t = torch.randn(64, 33)
    for amount in (0.3, 0.5, 100):
        leaf_parity(lambda lib: lib.RandomUnstructured(amount), t, torch.ones(64, 33), 3)
        leaf_parity(lambda lib: lib.RandomStructured(amount if amount != 100 else 10, 0), t,
                    torch.ones(64, 33), 3)


# Inputs torch accepts oddly, or rejects: compat must do the same.
ODD_CASES: list[tuple[str, Make, Callable[[], Tensor], Callable[[], Tensor]]] = [
    ("int-amount-too-large", lambda lib: lib.L1Unstructured(7), lambda: torch.randn(6),
     lambda: torch.ones(6)),
    ("random-int-amount-too-large", lambda lib: lib.RandomUnstructured(7),
     lambda: torch.randn(2, 3), lambda: torch.ones(2, 3)),
    ("l1-int-scores", lambda lib: lib.L1Unstructured(3),
     lambda: torch.tensor([[1, -5], [3, 2]]), lambda: torch.ones(2, 2, dtype=torch.long)),
    ("l1-int-scores-float-amount", lambda lib: lib.L1Unstructured(0.5),
     lambda: torch.tensor([4, -9, 1, 7, -2, 3]), lambda: torch.ones(6)),
    ("l1-bool-scores", lambda lib: lib.L1Unstructured(1), lambda: torch.tensor([True, False]),
     lambda: torch.ones(2)),
    ("l1-complex-scores", lambda lib: lib.L1Unstructured(2),
     lambda: torch.tensor([1 + 1j, 0.1j, 3, -0.5]), lambda: torch.ones(4)),
    ("random-int-scores", lambda lib: lib.RandomUnstructured(1), lambda: torch.tensor([1, 2]),
     lambda: torch.ones(2)),
    ("l1-noncontiguous", lambda lib: lib.L1Unstructured(1), lambda: distinct((4, 3), 0).t(),
     lambda: torch.ones(3, 4)),
    ("random-noncontiguous", lambda lib: lib.RandomUnstructured(1),
     lambda: distinct((4, 3), 0).t(), lambda: torch.ones(3, 4)),
    ("l1-strided-viewable", lambda lib: lib.L1Unstructured(2), lambda: distinct((8,), 0)[::2],
     lambda: torch.ones(4)),
    ("random-strided-viewable", lambda lib: lib.RandomUnstructured(2),
     lambda: distinct((8,), 0)[::2], lambda: torch.ones(4)),
    ("mask-fewer-elements", lambda lib: lib.L1Unstructured(1),
     lambda: torch.tensor([3.0, 1.0, 2.0]), lambda: torch.ones(2)),
    ("mask-too-few-elements", lambda lib: lib.L1Unstructured(1),
     lambda: torch.tensor([3.0, 2.0, 1.0]), lambda: torch.ones(2)),
    ("mask-other-shape", lambda lib: lib.L1Unstructured(1),
     lambda: torch.tensor([3.0, 1.0, 2.0, 4.0]), lambda: torch.ones(2, 2)),
    ("amount-nan", lambda lib: lib.L1Unstructured(float("nan")), lambda: torch.randn(3),
     lambda: torch.ones(3)),
    ("structured-1d", lambda lib: lib.LnStructured(1, 2, 0), lambda: torch.randn(3),
     lambda: torch.ones(3)),
    ("random-structured-1d", lambda lib: lib.RandomStructured(1, 0), lambda: torch.randn(3),
     lambda: torch.ones(3)),
    ("dim-too-large", lambda lib: lib.LnStructured(1, 2, 2), lambda: distinct((4, 3), 0),
     lambda: torch.ones(4, 3)),
    ("dim-too-negative", lambda lib: lib.LnStructured(1, 2, -3), lambda: distinct((4, 3), 0),
     lambda: torch.ones(4, 3)),
    ("random-dim-too-negative", lambda lib: lib.RandomStructured(1, -3),
     lambda: distinct((4, 3), 0), lambda: torch.ones(4, 3)),
    ("dim-float", lambda lib: lib.LnStructured(1, 2, 0.0), lambda: distinct((4, 3), 0),
     lambda: torch.ones(4, 3)),
    ("dim-str", lambda lib: lib.RandomStructured(1, "0"), lambda: distinct((4, 3), 0),
     lambda: torch.ones(4, 3)),
    ("dim-bool", lambda lib: lib.LnStructured(1, 2, True), lambda: distinct((4, 3), 0),
     lambda: torch.ones(4, 3)),
    ("structured-amount-too-large", lambda lib: lib.LnStructured(5, 2, 0),
     lambda: distinct((4, 3), 0), lambda: torch.ones(4, 3)),
    ("n-str", lambda lib: lib.LnStructured(1, "bad", 0), lambda: distinct((4, 3), 0),
     lambda: torch.ones(4, 3)),
    ("n-str-amount-0", lambda lib: lib.LnStructured(0, "bad", 0), lambda: distinct((4, 3), 0),
     lambda: torch.ones(4, 3)),
    ("n-complex", lambda lib: lib.LnStructured(1, 2 + 0j, 0), lambda: distinct((4, 3), 0),
     lambda: torch.ones(4, 3)),
    ("n-none", lambda lib: lib.LnStructured(1, None, 0), lambda: distinct((4, 3), 0),
     lambda: torch.ones(4, 3)),
    ("n-true", lambda lib: lib.LnStructured(2, True, 1), lambda: distinct((4, 3), 0),
     lambda: torch.ones(4, 3)),
    ("n-fro-4d", lambda lib: lib.LnStructured(1, "fro", 0), lambda: distinct((3, 2, 2, 2), 0),
     lambda: torch.ones(3, 2, 2, 2)),
    ("n-nuc-2d", lambda lib: lib.LnStructured(1, "nuc", 0), lambda: distinct((3, 2), 0),
     lambda: torch.ones(3, 2)),
    ("n-nuc-3d-half-amount-0", lambda lib: lib.LnStructured(0, "nuc", 0),
     lambda: distinct((3, 2, 2), 0).half(), lambda: torch.ones(3, 2, 2)),
    ("ln-int-scores", lambda lib: lib.LnStructured(1, 2, 0),
     lambda: torch.tensor([[1, 2], [3, 4]]), lambda: torch.ones(2, 2)),
    ("ln-complex-scores", lambda lib: lib.LnStructured(1, 2, 0),
     lambda: torch.tensor([[1j, 2], [3, 4j], [0.1, 0.2j]]), lambda: torch.ones(3, 2)),
    ("random-structured-int-scores", lambda lib: lib.RandomStructured(1, 0),
     lambda: torch.tensor([[1, 2], [3, 4]]), lambda: torch.ones(2, 2)),
    ("custom-soft-mask", lambda lib: lib.CustomFromMask(torch.tensor([0.0, 0.5, 2.0])),
     lambda: torch.randn(3), lambda: torch.ones(3)),
    ("custom-shape-mismatch", lambda lib: lib.CustomFromMask(torch.tensor([0, 1])),
     lambda: torch.randn(3), lambda: torch.ones(3)),
    ("custom-list-mask", lambda lib: lib.CustomFromMask([0, 1]), lambda: torch.randn(2),
     lambda: torch.ones(2)),
    ("custom-bool-default", lambda lib: lib.CustomFromMask(torch.tensor([0, 1, 1])),
     lambda: torch.randn(3), lambda: torch.tensor([True, False, True])),
    ("empty-inf-norm", lambda lib: lib.LnStructured(0.2, math.inf, 1), lambda: torch.empty(0, 3),
     lambda: torch.ones(0, 3)),
    ("empty-channels", lambda lib: lib.LnStructured(0.5, 2, 0), lambda: torch.empty(0, 3),
     lambda: torch.ones(0, 3)),
    ("empty-random", lambda lib: lib.RandomUnstructured(0.5), lambda: torch.empty(2, 0),
     lambda: torch.ones(2, 0)),
]


@pytest.mark.parametrize("case", ODD_CASES, ids=[c[0] for c in ODD_CASES])
def test_odd_inputs_parity(
    case: tuple[str, Make, Callable[[], Tensor], Callable[[], Tensor]],
) -> None:
    _, make, t, default_mask = case
    leaf_parity(make, t(), default_mask(), 5)


@pytest.mark.parametrize(
    "args",
    [("I'm a string",), (1.1,), (20.0,), (-10,), (None,), (0.34,), (1500,), (0,), (0.0,), (1,),
     (1.0,), (True,)],
)
@pytest.mark.parametrize(
    "cls", ["RandomUnstructured", "L1Unstructured", "RandomStructured", "LnStructured"]
)
def test_construction_parity(cls: str, args: tuple[Any, ...]) -> None:
    extra: tuple[Any, ...] = (2,) if cls == "LnStructured" else ()
    ours = outcome(lambda: getattr(cp, cls)(*args, *extra))
    theirs = outcome(lambda: getattr(tp, cls)(*args, *extra))
    assert ours[0] == theirs[0]
    if ours[0] != "ok":
        assert ours[1] == theirs[1]


def test_construction_does_not_check_n_or_dim_like_torch() -> None:
    method = cp.LnStructured(0.5, n="bad", dim="nonsense")  # type: ignore[arg-type]
    assert vars(method) == {"amount": 0.5, "n": "bad", "dim": "nonsense"}
    cp.RandomStructured(0.5, dim=None)  # type: ignore[arg-type]
    cp.CustomFromMask(mask="anything")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="Order bad not supported"):
        cp.LnStructured(0.5, n="bad", dim=0).compute_mask(torch.randn(4, 3), torch.ones(4, 3))


def test_attributes_are_settable_like_torch() -> None:
    t = distinct((4, 3), 2)
    for lib in (tp, cp):
        method = lib.LnStructured(1, n=1, dim=0)
        method.amount, method.n, method.dim = 2, math.inf, 1
    leaf_parity(_retuned, t, torch.ones(4, 3), 0)


def _retuned(lib: types.ModuleType) -> Any:
    method = lib.LnStructured(1, n=1, dim=0)
    method.amount, method.n, method.dim = 2, math.inf, 1
    return method


@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
       seed=st.integers(0, 2**16), with_scores=st.booleans(), with_mask=st.booleans())
def test_prune_parity(
    shape: tuple[int, ...], seed: int, with_scores: bool, with_mask: bool
) -> None:
    t = distinct(shape, seed)
    scores = distinct(shape, seed + 1) if with_scores else None
    mask = binary_mask(shape, seed, torch.int64, 0.3) if with_mask else None
    results = [lib.L1Unstructured(0.4).prune(t, mask, scores) for lib in (tp, cp)]
    assert_same_tensor(*results)
    torch.manual_seed(seed)
    a = tp.RandomUnstructured(0.4).prune(t, default_mask=mask, importance_scores=scores)
    torch.manual_seed(seed)
    b = cp.RandomUnstructured(0.4).prune(t, default_mask=mask, importance_scores=scores)
    assert_same_tensor(a, b)


def test_prune_rejects_scores_of_another_shape_like_torch() -> None:
    ours = outcome(lambda: cp.L1Unstructured(1).prune(torch.randn(3), None, torch.randn(4)))
    theirs = outcome(lambda: tp.L1Unstructured(1).prune(torch.randn(3), None, torch.randn(4)))
    assert ours == theirs and ours[0] == "AssertionError"


def test_exact_count_on_ties_like_torch() -> None:
    t = 2 * torch.randint(low=-1, high=2, size=(10, 7))
    mask = cp.L1Unstructured(0.2).compute_mask(t, default_mask=torch.ones_like(t))
    assert int((mask == 0).sum()) == cp._compute_nparams_toprune(0.2, t.nelement()) == 14
    structured = cp.RandomStructured(0.6, dim=2).compute_mask(
        torch.randn(5, 4, 2), torch.ones(5, 4, 2)
    )
    assert sorted((structured == 0).sum(dim=(0, 1)).tolist()) == [0, 20]


@pytest.mark.parametrize(
    "make, t, kernel",
    [
        (lambda: cp.L1Unstructured(2), distinct((3, 4), 0), "l1_unstructured"),
        (lambda: cp.RandomUnstructured(0.5), distinct((3, 4), 0), "random_unstructured"),
        (lambda: cp.RandomStructured(1, 0), distinct((3, 4), 0), "random_structured"),
        (lambda: cp.LnStructured(1, 2, -1), distinct((3, 4), 0), "structured_by_keys"),
        (lambda: cp.LnStructured(1, None, -1), distinct((3, 4), 0),  # type: ignore[arg-type]
         "structured_by_keys"),
        (lambda: cp.CustomFromMask(torch.tensor([[0, 1, 1, 1]] * 3)), distinct((3, 4), 0),
         "custom_from_mask"),
    ],
)
def test_builtins_compute_masks_with_the_kernels(
    make: Callable[[], Any], t: Tensor, kernel: str
) -> None:
    called = mock.Mock(wraps=getattr(kernels, kernel))
    with contextlib.ExitStack() as patched:  # where the specs (_kernels) and compat (the door) look it up
        patched.enter_context(mock.patch(f"funcprune._specs._kernels.{kernel}", called))
        if hasattr(funcprune._specs, kernel):
            patched.enter_context(mock.patch(f"funcprune._specs.{kernel}", called))
        make().compute_mask(t, torch.ones_like(t))
    assert called.call_count == 1


META_CALLS: list[tuple[str, Callable[[Any, torch.nn.Module], object]]] = [
    ("identity", lambda lib, m: lib.identity(m, "weight")),
    ("l1", lambda lib, m: lib.l1_unstructured(m, "weight", amount=0.5)),
    ("random", lambda lib, m: lib.random_unstructured(m, "weight", amount=3)),
    ("custom", lambda lib, m: lib.custom_from_mask(m, "weight", torch.ones(40, 50, device="meta"))),
    ("ln", lambda lib, m: lib.ln_structured(m, "weight", amount=0.5, n=2, dim=0)),
    ("random-structured", lambda lib, m: lib.random_structured(m, "weight", amount=2, dim=1)),
]


@pytest.mark.parametrize("size", [(40, 50), (400, 500)])  # below and above the fast-path size
@pytest.mark.parametrize("call", META_CALLS, ids=[c[0] for c in META_CALLS])
def test_meta_device_modules_prune_like_torch(
    call: tuple[str, Callable[[Any, torch.nn.Module], object]], size: tuple[int, int]
) -> None:
    """Shapes without values (deferred initialization): torch prunes them, so does compat."""
    results = []
    for lib in (tp, cp):
        module = torch.nn.Linear(size[1], size[0], device="meta")
        torch.manual_seed(0)
        if call[0] == "custom":
            lib.custom_from_mask(module, "weight", torch.ones(size, device="meta"))
        else:
            call[1](lib, module)
        mask = module.weight_mask
        results.append((mask.device, mask.dtype, mask.shape, module.weight.shape, torch.rand(1)))
    assert results[0][:4] == results[1][:4]
    assert torch.equal(results[0][4], results[1][4])  # the RNG advanced alike


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_low_precision_nuclear_norm_at_amount_0_fails_like_torch_when_re_pruning(dtype: torch.dtype) -> None:
    """Found by the differential fuzzer: the container path skipped torch's norm."""
    errors = []
    for lib in (tp, cp):
        m = torch.nn.Conv1d(3, 2, 1, dtype=dtype)
        lib.identity(m, "weight")
        with pytest.raises(RuntimeError) as caught:
            lib.ln_structured(m, "weight", amount=0, n="nuc", dim=0)
        errors.append(str(caught.value))
    assert errors[0] == errors[1]
