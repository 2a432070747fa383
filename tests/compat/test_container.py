"""PruningContainer: history, checks, and the fold of the latest method.

Built-in methods fold through ``funcprune.compute_mask``; user-defined ones
go through torch's slicing. Either way the mask must be torch's, bit for bit
(random methods drawing the same numbers).
"""

from __future__ import annotations

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
from funcprune import compute_mask as fp_compute_mask

from ._helpers import assert_same_tensor, distinct, normalize, outcome

Tensor = torch.Tensor
Make = Callable[[types.ModuleType], Any]


def container(lib: types.ModuleType, *methods: Any, name: str = "w") -> Any:
    box = lib.PruningContainer()
    box._tensor_name = name
    for method in methods:
        method._tensor_name = name
        box.add_pruning_method(method)
    return box


def fold_parity(make: Make, t: Tensor, default_mask: Tensor, seed: int) -> None:
    """Same folded mask, dtype, aliasing of default_mask and RNG use as torch."""
    results = []
    for lib in (tp, cp):
        mask = default_mask.clone()
        torch.manual_seed(seed)
        got = outcome(lambda: container(lib, make(lib)).compute_mask(t, mask))
        results.append((got, got[0] == "ok" and got[1] is mask, mask, torch.get_rng_state()))
    (a, alias_a, mask_a, rng_a), (b, alias_b, mask_b, rng_b) = results
    assert a[0] == b[0], (a, b)
    if a[0] == "ok":
        assert_same_tensor(a[1], b[1])
    else:
        assert a[1] == b[1]
    assert alias_a == alias_b
    assert_same_tensor(mask_a, mask_b)  # torch writes into default_mask when dtypes match
    assert torch.equal(rng_a, rng_b)


def mask_of(shape: tuple[int, ...], seed: int, dtype: torch.dtype, p: float) -> Tensor:
    g = torch.Generator().manual_seed(seed + 3)
    return (torch.rand(shape, generator=g) >= p).to(dtype)


METHODS: list[tuple[str, Callable[[int, float | int, int], Make]]] = [
    ("l1", lambda n, a, d: lambda lib: lib.L1Unstructured(a)),
    ("random", lambda n, a, d: lambda lib: lib.RandomUnstructured(a)),
    ("random_structured", lambda n, a, d: lambda lib: lib.RandomStructured(a, d)),
    ("ln2", lambda n, a, d: lambda lib: lib.LnStructured(a, 2, d)),
    ("ln1", lambda n, a, d: lambda lib: lib.LnStructured(a, 1, d)),
    ("lninf", lambda n, a, d: lambda lib: lib.LnStructured(a, math.inf, d)),
    ("identity", lambda n, a, d: lambda lib: lib.Identity()),
]


@given(
    shape=st.lists(st.integers(1, 4), min_size=2, max_size=3).map(tuple),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bool]),
    density=st.sampled_from([0.0, 0.25, 0.6]),
    method=st.sampled_from(METHODS),
    data=st.data(),
)
def test_fold_parity(
    shape: tuple[int, ...],
    seed: int,
    dtype: torch.dtype,
    density: float,
    method: tuple[str, Callable[[int, float | int, int], Make]],
    data: st.DataObject,
) -> None:
    t = distinct(shape, seed)
    default_mask = mask_of(shape, seed, dtype, density)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    if data.draw(st.booleans()):
        amount: float | int = data.draw(st.floats(0.0, 1.0))
    else:
        amount = data.draw(st.integers(0, 3))  # may exceed what is left: ValueError
    fold_parity(method[1](0, amount, dim), t, default_mask, seed)


@given(seed=st.integers(0, 2**16), dtype=st.sampled_from([torch.float32, torch.int64]))
def test_custom_from_mask_fold_parity(seed: int, dtype: torch.dtype) -> None:
    t = distinct((3, 4), seed)
    given_mask = mask_of((3, 4), seed + 1, dtype, 0.5)
    fold_parity(lambda lib: lib.CustomFromMask(given_mask), t, mask_of((3, 4), seed, dtype, 0.3),
                seed)


ODD = [
    ("nonbinary-default", lambda lib: lib.L1Unstructured(1), distinct((2, 3), 0),
     torch.tensor([[1.0, 0.5, 1.0], [2.0, 1.0, 0.0]])),
    ("shape-mismatch-rows", lambda lib: lib.L1Unstructured(1), distinct((2, 3), 0),
     torch.tensor([1.0, 1.0])),
    ("structured-1d", lambda lib: lib.LnStructured(1, 1, -1), distinct((5,), 0),
     torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0])),
    ("structured-dim-too-large", lambda lib: lib.LnStructured(1, 1, 2), distinct((2, 3), 0),
     torch.ones(2, 3)),
    ("structured-dim-too-negative", lambda lib: lib.RandomStructured(1, -3),
     distinct((2, 3), 0), torch.ones(2, 3)),
    ("n-bad", lambda lib: lib.LnStructured(1, "bad", 0), distinct((2, 3), 0), torch.ones(2, 3)),
    ("n-none", lambda lib: lib.LnStructured(1, None, 1), distinct((2, 3), 0), torch.ones(2, 3)),
    ("n-fro-4d", lambda lib: lib.LnStructured(1, "fro", 1), distinct((2, 3, 2, 2), 0),
     torch.ones(2, 3, 2, 2)),
    ("n-nuc-3d", lambda lib: lib.LnStructured(1, "nuc", 1), distinct((2, 3, 2), 0),
     torch.ones(2, 3, 2)),
    ("int-scores", lambda lib: lib.L1Unstructured(2), torch.tensor([[4, -1], [3, 2]]),
     torch.tensor([[1, 1], [0, 1]])),
    ("custom-shape-mismatch", lambda lib: lib.CustomFromMask(torch.tensor([1, 0])),
     distinct((3,), 0), torch.ones(3)),
    ("custom-soft", lambda lib: lib.CustomFromMask(torch.tensor([0.5, 2.0, 0.0])),
     distinct((3,), 0), torch.ones(3)),
    ("too-many-for-what-is-left", lambda lib: lib.L1Unstructured(3), distinct((2, 2), 0),
     torch.tensor([[1.0, 0.0], [0.0, 1.0]])),
    ("empty-channels", lambda lib: lib.LnStructured(0.5, 2, 0), torch.empty(0, 3),
     torch.ones(0, 3)),
    ("empty-other-dim", lambda lib: lib.RandomStructured(1, 0), torch.empty(3, 0),
     torch.ones(3, 0)),
    ("empty-unstructured", lambda lib: lib.L1Unstructured(0.5), torch.empty(0, 3),
     torch.ones(0, 3)),
]


@pytest.mark.parametrize("case", ODD, ids=[c[0] for c in ODD])
def test_odd_fold_parity(case: tuple[str, Make, Tensor, Tensor]) -> None:
    _, make, t, default_mask = case
    fold_parity(make, t, default_mask, 0)


def test_torch_test_suite_example() -> None:
    t = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]).to(dtype=torch.float32)
    default_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 1]])
    box = container(cp, cp.L1Unstructured(amount=2))
    assert torch.equal(box.compute_mask(t, default_mask),
                       torch.tensor([[0, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.float32))
    q = cp.LnStructured(amount=1, n=2, dim=0)
    q._tensor_name = "w"
    box.add_pruning_method(q)
    assert torch.equal(box.compute_mask(t, default_mask),
                       torch.tensor([[0, 0, 0, 0], [1, 1, 0, 1]], dtype=torch.float32))


def test_builtins_fold_with_the_kernel() -> None:
    for make in (lambda: cp.L1Unstructured(0.5), lambda: cp.RandomStructured(1, 0),
                 lambda: cp.LnStructured(1, 2, 1), lambda: cp.CustomFromMask(torch.ones(3, 4)),
                 lambda: cp.Identity()):
        with mock.patch("funcprune.compat._combine.fold_mask", wraps=fp_compute_mask) as fold:
            container(cp, make()).compute_mask(distinct((3, 4), 0), mask_of((3, 4), 0,
                                                                          torch.float32, 0.3))
        assert fold.call_count == 1
        (spec, scores, default_mask), _ = fold.call_args
        assert default_mask is not None


# --- user-defined methods go through torch's slicing ----------------------------------


def foobar(lib: types.ModuleType) -> type:
    class FooBarPruningMethod(lib.BasePruningMethod):  # type: ignore[misc,name-defined]
        """Prune every other entry (the tutorial's method)."""

        PRUNING_TYPE = "unstructured"

        def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
            mask = default_mask.clone()
            mask.view(-1)[::2] = 0
            return mask

    return FooBarPruningMethod


def rows(lib: types.ModuleType) -> type:
    class DropFirstChannel(lib.BasePruningMethod):  # type: ignore[misc,name-defined]
        PRUNING_TYPE = "structured"

        def __init__(self, dim: int) -> None:
            self.dim = dim

        def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
            mask = default_mask.clone()
            mask.select(self.dim, 0).zero_()
            return mask

    return DropFirstChannel


@pytest.mark.parametrize("density", [0.0, 0.4])
def test_user_methods_fold_parity(density: float) -> None:
    t = distinct((4, 5), 1)
    default_mask = mask_of((4, 5), 1, torch.float32, density)
    fold_parity(lambda lib: foobar(lib)(), t, default_mask, 0)
    fold_parity(lambda lib: rows(lib)(1), t, default_mask, 0)
    fold_parity(lambda lib: rows(lib)(-2), t, default_mask, 0)


USER_ODD = [
    ("mask-of-higher-rank", (2, 3), torch.ones(2, 3, 1), 0),
    ("mask-of-lower-rank", (2, 3, 1), torch.ones(2, 3), 0),
    ("dim-past-the-last", (4, 3), torch.ones(4, 3), 5),
    ("dim-too-negative", (4, 3), torch.ones(4, 3), -3),
    ("one-dim", (4,), torch.ones(4), 0),
    ("channel-summing-to-zero", (3, 2), torch.tensor([[1.0, -1.0], [0.5, 0.0], [0.0, 0.0]]), 0),
]


@pytest.mark.parametrize("case", USER_ODD, ids=[c[0] for c in USER_ODD])
def test_user_structured_methods_on_odd_inputs_like_torch(
    case: tuple[str, tuple[int, ...], Tensor, int],
) -> None:
    """torch's slicing quirks and errors, kept for methods without a kernel."""
    _, shape, default_mask, dim = case
    fold_parity(lambda lib: rows(lib)(dim), distinct(shape, 2), default_mask, 0)


def test_subclass_overriding_compute_mask_is_called() -> None:
    class Half(cp.L1Unstructured):
        def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
            return torch.zeros_like(default_mask)

    box = container(cp, Half(1))
    assert torch.equal(box.compute_mask(torch.ones(4), torch.tensor([1.0, 0, 1, 1])),
                       torch.zeros(4))


def test_mocked_compute_mask_is_called_in_the_container() -> None:
    with mock.patch("funcprune.compat.L1Unstructured.compute_mask") as compute_mask:
        compute_mask.return_value = torch.tensor([7.0])
        out = container(cp, cp.L1Unstructured(1)).compute_mask(
            torch.ones(3), torch.tensor([0.0, 1.0, 0.0])
        )
    assert out.tolist() == [0.0, 7.0, 0.0]


def test_mixed_methods_fold_in_either_container() -> None:
    t = distinct((3, 4), 2)
    default_mask = mask_of((3, 4), 2, torch.float32, 0.3)
    torch.manual_seed(0)
    expected = container(tp, tp.RandomStructured(1, 1)).compute_mask(t, default_mask.clone())
    torch.manual_seed(0)
    ours_in_torch = container(tp, cp.RandomStructured(1, 1)).compute_mask(t, default_mask.clone())
    torch.manual_seed(0)
    torch_in_ours = container(cp, tp.RandomStructured(1, 1)).compute_mask(t, default_mask.clone())
    assert_same_tensor(expected, ours_in_torch)
    assert_same_tensor(expected, torch_in_ours)


# --- the container's own behaviour -------------------------------------------------------


def test_history_len_indexing_iteration() -> None:
    a, b, c = cp.L1Unstructured(1), cp.Identity(), cp.RandomStructured(1, 0)
    box = container(cp, a, b, c)
    assert len(box) == 3
    assert box[0] is a and box[-1] is c
    assert box[1:] == (b, c)
    assert list(box) == [a, b, c]
    assert box._tensor_name == "w"


@pytest.mark.parametrize(
    "bad", [10, "ugh", torch.ones(2)], ids=["int", "str", "tensor"]
)
def test_add_rejects_non_methods_like_torch(bad: object) -> None:
    ours = outcome(lambda: container(cp).add_pruning_method(bad))
    theirs = outcome(lambda: container(tp).add_pruning_method(bad))
    assert ours == theirs and ours[0] == "TypeError"


def test_add_rejects_other_tensor_names_like_torch() -> None:
    def add(lib: types.ModuleType) -> None:
        other = lib.L1Unstructured(2)
        other._tensor_name = "another_test"
        container(lib, name="test").add_pruning_method(other)

    ours, theirs = outcome(lambda: add(cp)), outcome(lambda: add(tp))
    assert ours[0] == theirs[0] == "ValueError"
    assert ours[1] == theirs[1]


def test_add_accepts_torch_methods_and_none_like_torch() -> None:
    box = container(cp)
    box.add_pruning_method(None)
    method = tp.L1Unstructured(1)
    method._tensor_name = "w"
    box.add_pruning_method(method)
    assert list(box) == [None, method]


@pytest.mark.parametrize(
    "args",
    [
        lambda lib: (),
        lambda lib: (None,),
        lambda lib: (lib.Identity(), lib.Identity()),
        lambda lib: (_named(lib.Identity()),),
        lambda lib: (_named(lib.Identity()), _named(lib.L1Unstructured(1))),
    ],
    ids=["empty", "none", "two-unnamed", "one", "two-named"],
)
def test_constructor_quirks_like_torch(args: Callable[[types.ModuleType], tuple[Any, ...]]) -> None:
    def build(lib: types.ModuleType) -> Any:
        box = lib.PruningContainer(*args(lib))
        return (len(box), getattr(box, "_tensor_name", None))

    assert normalize(str(outcome(lambda: build(cp)))) == normalize(str(outcome(lambda: build(tp))))


def _named(method: Any) -> Any:
    method._tensor_name = "w"
    return method


def test_empty_container_compute_mask_fails_like_torch() -> None:
    ours = outcome(lambda: container(cp).compute_mask(torch.ones(2), torch.ones(2)))
    theirs = outcome(lambda: container(tp).compute_mask(torch.ones(2), torch.ones(2)))
    assert ours == theirs and ours[0] == "IndexError"


def test_unknown_pruning_type_fails_like_torch() -> None:
    def run(lib: types.ModuleType) -> Any:
        method = lib.L1Unstructured(1)
        method.PRUNING_TYPE = "diagonal"
        return container(lib, method).compute_mask(torch.ones(2), torch.ones(2))

    assert outcome(lambda: run(cp)) == outcome(lambda: run(tp))
    assert outcome(lambda: run(cp))[0] == "ValueError"
