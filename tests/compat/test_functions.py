"""The functional API on modules: parity with torch, rollback, RNNs, pickling."""

from __future__ import annotations

import io
import math
import pickle
import types
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
import torch
import torch.nn.utils.prune as tp
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import funcprune.compat as cp
from _differential import one_thread

from ._helpers import (
    LIBS,
    Small,
    assert_same_fingerprint,
    assert_same_state,
    assert_same_tensor,
    distinct,
    fingerprint,
    outcome,
    twins,
)

Tensor = torch.Tensor
Step = Callable[[types.ModuleType, nn.Module], Any]
TARGETS = ["conv.weight", "conv.bias", "fc.weight", "fc.bias"]
X = torch.randn(3, 2, 4, 4, generator=torch.Generator().manual_seed(0))


def split(model: nn.Module, target: str) -> tuple[nn.Module, str]:
    prefix, _, name = target.rpartition(".")
    return model.get_submodule(prefix), name


def shape_of(model: nn.Module, target: str) -> torch.Size:
    module, name = split(model, target)
    value = getattr(module, name)
    assert isinstance(value, Tensor)
    return value.shape


@st.composite
def steps(draw: st.DrawFn) -> tuple[str, Step]:
    """One pruning call, described and ready to run with either library."""
    target = draw(st.sampled_from(TARGETS))
    kind = draw(st.sampled_from(
        ["identity", "random_unstructured", "l1_unstructured", "random_structured",
         "ln_structured", "custom_from_mask", "remove", "global"]))
    amount: float | int = draw(st.one_of(st.floats(0.0, 1.0), st.integers(0, 6)))
    dim = draw(st.integers(-2, 1))
    n = draw(st.sampled_from([1, 2, math.inf, -math.inf, "fro"]))
    seed = draw(st.integers(0, 1000))
    scored = draw(st.booleans())

    def run(lib: types.ModuleType, model: nn.Module) -> Any:
        module, name = split(model, target)
        shape = shape_of(model, target)
        scores = distinct(tuple(shape), seed) if scored else None
        if kind == "identity":
            return lib.identity(module, name)
        if kind == "random_unstructured":
            return lib.random_unstructured(module, name, amount)
        if kind == "l1_unstructured":
            return lib.l1_unstructured(module, name, amount, importance_scores=scores)
        if kind == "random_structured":
            return lib.random_structured(module, name, amount, dim)
        if kind == "ln_structured":
            return lib.ln_structured(module, name, amount, n, dim, importance_scores=scores)
        if kind == "custom_from_mask":
            g = torch.Generator().manual_seed(seed)
            return lib.custom_from_mask(module, name, (torch.rand(shape, generator=g) > 0.3))
        if kind == "remove":
            return lib.remove(module, name)
        pairs = [split(model, t) for t in TARGETS if t != target or scored]
        method = lib.L1Unstructured if scored else lib.RandomUnstructured
        return lib.global_unstructured(pairs, pruning_method=method, amount=amount)

    return f"{kind}({target}, amount={amount}, dim={dim}, n={n}, scored={scored})", run


def assert_same_outputs(a: nn.Module, b: nn.Module) -> None:
    ya, yb = a(X), b(X)
    assert_same_tensor(ya, yb)
    ya.sum().backward()
    yb.sum().backward()
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert_same_tensor(pa.grad, pb.grad, name)
    a.zero_grad()
    b.zero_grad()


def returned(model: nn.Module, value: object) -> str | None:
    """Which submodule a call returned (by name), or None."""
    if value is None:
        return None
    found: str = next(name for name, module in model.named_modules() if module is value)
    return found


@given(st.lists(steps(), min_size=1, max_size=5), st.integers(0, 2**16))
# Small's tensors (at most 80 entries) take funcprune's one-thread paths at any thread count;
# torch's tiny convs on two threads only wait for each other, for seconds when the other core is busy
@one_thread()
def test_sequences_of_calls_match_torch(calls: list[tuple[str, Step]], seed: int) -> None:
    ours, theirs = twins(Small)
    for i, (_, run) in enumerate(calls):
        before = fingerprint(ours)
        torch.manual_seed(seed + i)
        a = outcome(lambda: run(tp, theirs))
        torch.manual_seed(seed + i)
        b = outcome(lambda: run(cp, ours))
        assert a[0] == b[0], (a, b)
        if a[0] != "ok":
            assert a[1] == b[1]
            assert_same_fingerprint(before, fingerprint(ours))  # ours rolled back
            return  # torch may be left half-pruned here: stop comparing
        assert returned(theirs, a[1]) == returned(ours, b[1])
        assert_same_state(theirs, ours)
        assert_same_outputs(theirs, ours)


def test_apply_returns_the_hook_like_torch() -> None:
    for lib in LIBS.values():
        fc: Any = nn.Linear(3, 2)
        first = lib.L1Unstructured.apply(fc, "weight", 2)
        assert type(first) is lib.L1Unstructured and first._tensor_name == "weight"
        second = lib.RandomStructured.apply(fc, "weight", 1, dim=0)
        assert type(second) is lib.PruningContainer and list(second)[0] is first
        third = lib.Identity.apply(fc, "weight")
        assert third is second and len(third) == 3
        assert next(iter(fc._forward_pre_hooks.values())) is second


def test_keyword_and_positional_calls() -> None:
    ours, theirs = twins(Small)
    for lib, model in ((tp, theirs), (cp, ours)):
        torch.manual_seed(0)
        lib.random_unstructured(module=model.conv, name="weight", amount=0.3)
        lib.l1_unstructured(model.conv, "bias", 1, None)
        lib.ln_structured(module=model.fc, name="weight", amount=1, n=2, dim=0,
                          importance_scores=None)
        lib.random_structured(model.fc, "weight", amount=0.5, dim=-1)
        lib.custom_from_mask(module=model.fc, name="bias", mask=torch.tensor([1, 0, 1, 1, 0]))
        lib.identity(module=model.conv, name="weight")
        lib.global_unstructured(parameters=[(model.conv, "weight"), (model.fc, "weight")],
                                pruning_method=lib.L1Unstructured, importance_scores=None,
                                amount=5)
        lib.remove(module=model.conv, name="bias")
        assert lib.is_pruned(module=model)
    assert_same_state(theirs, ours)


def test_global_unstructured_with_importance_scores_like_torch() -> None:
    ours, theirs = twins(Small)
    for lib, model in ((tp, theirs), (cp, ours)):
        lib.l1_unstructured(model.fc, "weight", 10)
        scores = {(model.conv, "weight"): distinct((4, 2, 3, 3), 1),
                  (model.fc, "weight"): distinct((5, 16), 2)}
        lib.global_unstructured([(model.conv, "weight"), (model.fc, "weight")],
                                lib.L1Unstructured, importance_scores=scores, amount=0.3)
    assert_same_state(theirs, ours)


@pytest.mark.parametrize(
    "call",
    [
        lambda lib, m: lib.global_unstructured(5, lib.L1Unstructured, amount=1),
        lambda lib, m: lib.global_unstructured([(m.fc, "weight")], lib.L1Unstructured,
                                               importance_scores=[1], amount=1),
        lambda lib, m: lib.global_unstructured([(m.fc, "weight")], lib.LnStructured, amount=1,
                                               n=2, dim=0),
        lambda lib, m: lib.global_unstructured([(m.fc, "weight")], lib.L1Unstructured,
                                               amount=500),
        lambda lib, m: lib.global_unstructured([(m.fc, "nope")], lib.L1Unstructured, amount=1),
        lambda lib, m: lib.global_unstructured([(m.fc, "weight")], lib.L1Unstructured,
                                               amount=-1),
    ],
    ids=["not-iterable", "scores-not-dict", "structured", "too-many", "no-such-name",
         "bad-amount"],
)
def test_global_unstructured_errors_like_torch(call: Callable[[Any, nn.Module], Any]) -> None:
    ours, theirs = twins(Small)
    before = fingerprint(ours)
    a, b = outcome(lambda: call(tp, theirs)), outcome(lambda: call(cp, ours))
    assert a[0] == b[0] != "ok"
    assert a[1] == b[1]
    assert_same_fingerprint(before, fingerprint(ours))


def test_global_unstructured_takes_a_generator() -> None:
    model: Any = Small()
    cp.global_unstructured(((m, "weight") for m in (model.conv, model.fc)),
                           pruning_method=cp.L1Unstructured, amount=10)
    assert int((model.conv.weight_mask == 0).sum() + (model.fc.weight_mask == 0).sum()) == 10


def test_global_unstructured_rolls_back_every_module() -> None:
    model: Any = Small()
    model.fc.weight_mask = torch.ones(5, 16)  # a plain attribute: registering the buffer fails
    before = fingerprint(model)
    with pytest.raises(KeyError, match="already exists"):
        cp.global_unstructured([(model.conv, "weight"), (model.fc, "weight")],
                               pruning_method=cp.L1Unstructured, amount=10)
    assert_same_fingerprint(before, fingerprint(model))
    assert not cp.is_pruned(model)


# --- remove and is_pruned --------------------------------------------------------------


@pytest.mark.parametrize("factory", [lambda: nn.Linear(5, 7), lambda: nn.Conv3d(2, 2, 2)])
@pytest.mark.parametrize("name", ["weight", "bias"])
def test_remove_like_torch(factory: Callable[[], nn.Module], name: str) -> None:
    ours, theirs = twins(factory)
    originals = []
    for lib, m in ((tp, theirs), (cp, ours)):
        original = getattr(m, name)
        torch.manual_seed(1)
        lib.random_unstructured(m, name, amount=0.5)
        pruned = getattr(m, name).detach().clone()
        assert lib.remove(m, name) is m
        assert getattr(m, name) is original  # the same Parameter object
        assert torch.equal(getattr(m, name), pruned)
        assert not lib.is_pruned(m)
        originals.append(original)
    assert_same_state(theirs, ours)
    for lib, m in ((tp, theirs), (cp, ours)):
        a = outcome(lambda: lib.remove(m, name))
        assert a[0] == "ValueError"


def test_remove_error_message_like_torch() -> None:
    ours, theirs = twins(lambda: nn.Linear(2, 2))
    ours_failure = outcome(lambda: cp.remove(ours, "weight"))
    assert ours_failure == outcome(lambda: tp.remove(theirs, "weight"))


def test_remove_rolls_back_when_the_hook_fails() -> None:
    fc: Any = nn.Linear(3, 2)
    cp.l1_unstructured(fc, "weight", 2)
    cp.l1_unstructured(fc, "weight", 1)
    before = fingerprint(fc)
    data_before = fc.weight_orig.data
    with mock.patch("funcprune.compat.PruningContainer.remove", side_effect=RuntimeError("boom")):
        with pytest.raises(RuntimeError, match="boom"):
            cp.remove(fc, "weight")
    assert_same_fingerprint(before, fingerprint(fc))
    assert fc.weight_orig.data is data_before or torch.equal(fc.weight_orig.data, data_before)


def test_is_pruned_looks_into_submodules_like_torch() -> None:
    ours, theirs = twins(Small)
    assert tp.is_pruned(theirs) is cp.is_pruned(ours) is False
    tp.identity(theirs.fc, "bias")
    cp.identity(ours.fc, "bias")
    assert tp.is_pruned(theirs) is cp.is_pruned(ours) is True


# --- rollback (all-or-nothing) ---------------------------------------------------------


def pruned_twice() -> Any:
    model: Any = Small()
    cp.l1_unstructured(model.fc, "weight", 3)
    cp.identity(model.fc, "bias")
    cp.ln_structured(model.fc, "weight", 1, n=2, dim=0)
    model.fc.register_forward_pre_hook(lambda module, inputs: None)
    return model


FAILURES: list[tuple[str, Callable[[Any], Any], type[BaseException]]] = [
    ("bad-amount", lambda m: cp.l1_unstructured(m.fc, "weight", -1), ValueError),
    ("amount-too-large", lambda m: cp.l1_unstructured(m.fc, "weight", 500), ValueError),
    ("bad-scores-shape", lambda m: cp.l1_unstructured(m.fc, "weight", 1,
                                                      importance_scores=torch.ones(3)),
     AssertionError),
    ("bad-dim", lambda m: cp.ln_structured(m.fc, "weight", 1, n=2, dim=5), IndexError),
    ("bad-n", lambda m: cp.ln_structured(m.fc, "weight", 1, n="bad", dim=0), RuntimeError),
    ("structured-1d", lambda m: cp.random_structured(m.conv, "bias", 1, dim=0), ValueError),
    ("custom-shape", lambda m: cp.custom_from_mask(m.fc, "weight", torch.ones(2)),
     AssertionError),
    ("no-such-name", lambda m: cp.identity(m.fc, "nope"), AttributeError),
    ("first-time-bad-amount", lambda m: cp.l1_unstructured(m.conv, "weight", 10**6), ValueError),
]


@pytest.mark.parametrize("case", FAILURES, ids=[c[0] for c in FAILURES])
def test_failing_call_leaves_module_exactly_as_it_was(
    case: tuple[str, Callable[[Any], Any], type[BaseException]],
) -> None:
    _, call, error = case
    model = pruned_twice()
    before = fingerprint(model)
    with pytest.raises(error):
        call(model)
    assert_same_fingerprint(before, fingerprint(model))
    y = model(X)  # and it still works
    assert y.shape == (3, 5)


@pytest.mark.parametrize("name", ["weight", "bias"])
def test_failing_mask_computation_rolls_back(name: str) -> None:
    model = pruned_twice()
    before = fingerprint(model)
    with mock.patch("funcprune.compat.L1Unstructured.compute_mask",
                    side_effect=Exception("HA!")):
        for module in (model.conv, model.fc):
            with pytest.raises(Exception, match="HA!"):
                cp.l1_unstructured(module, name=name, amount=0.9)
    assert_same_fingerprint(before, fingerprint(model))
    assert name in dict(model.conv.named_parameters())


def test_failing_mask_computation_on_first_prune_like_torch() -> None:
    ours, theirs = twins(Small)
    before = fingerprint(ours)
    for lib, model in ((tp, theirs), (cp, ours)):
        with mock.patch(f"{lib.__name__}.L1Unstructured.compute_mask",
                        side_effect=Exception("HA!")):
            with pytest.raises(Exception, match="HA!"):
                lib.l1_unstructured(model.fc, name="weight", amount=0.9)
        assert not lib.is_pruned(model)
        assert sorted(dict(model.named_parameters())) == sorted(dict(Small().named_parameters()))
        assert "weight_mask" not in dict(model.named_buffers())
    # torch re-registers the parameter last; ours keeps its place too
    assert_same_fingerprint(before, fingerprint(ours))


def test_two_hooks_on_one_tensor_fail_like_torch() -> None:
    ours, theirs = twins(lambda: nn.Linear(3, 2))
    for lib, m in ((tp, theirs), (cp, ours)):
        lib.identity(m, "weight")
        extra = lib.Identity()
        extra._tensor_name = "weight"
        m.register_forward_pre_hook(extra)
    before = fingerprint(ours)
    a = outcome(lambda: tp.l1_unstructured(theirs, "weight", 1))
    b = outcome(lambda: cp.l1_unstructured(ours, "weight", 1))
    assert a[0] == b[0] == "AssertionError" and a[1] == b[1]
    assert_same_fingerprint(before, fingerprint(ours))


# --- RNNs, pickling ----------------------------------------------------------------------


def test_rnn_pruning_and_remove_like_torch() -> None:
    ours, theirs = twins(lambda: nn.LSTM(6, 5))
    x = torch.randn(4, 2, 6)
    for lib, lstm in ((tp, theirs), (cp, ours)):
        lib.l1_unstructured(lstm, "weight_ih_l0", 0.5)
        assert sum(isinstance(p, nn.Parameter) for p in lstm._flat_weights) == 3
        assert lstm._flat_weights[0] is lstm.weight_ih_l0
    assert_same_tensor(theirs(x)[0], ours(x)[0])
    assert ours._flat_weights[0] is ours.weight_ih_l0  # refreshed by the hook
    for lib, lstm in ((tp, theirs), (cp, ours)):
        lib.remove(lstm, "weight_ih_l0")
        assert sum(isinstance(p, nn.Parameter) for p in lstm._flat_weights) == 4
        assert lstm._parameters["weight_ih_l0"] is lstm._flat_weights[0]
        assert "weight_ih_l0_orig" not in dict(lstm.named_parameters())
    assert_same_state(theirs, ours)
    assert_same_tensor(theirs(x)[0], ours(x)[0])


def test_pickle_and_torch_save_like_torch() -> None:
    ours, theirs = twins(Small)
    for lib, model in ((tp, theirs), (cp, ours)):
        torch.manual_seed(0)
        lib.random_unstructured(model.conv, "weight", 0.3)
        lib.ln_structured(model.conv, "weight", 1, n=2, dim=0)
        lib.l1_unstructured(model.fc, "bias", 2)
    for lib, model in ((tp, theirs), (cp, ours)):
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        unpickled = pickle.loads(pickle.dumps(model))
        for copy_ in (loaded, unpickled):
            assert_same_state(model, copy_)
            assert_same_tensor(model(X), copy_(X))
            hook = next(iter(copy_.conv._forward_pre_hooks.values()))
            assert type(hook) is lib.PruningContainer
    assert list(ours.state_dict()) == list(theirs.state_dict())
    buffer = io.BytesIO()
    torch.save(ours.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert list(state) == list(theirs.state_dict())


def test_pruned_attribute_is_recomputed_before_each_forward() -> None:
    fc: Any = nn.Linear(3, 2)
    cp.l1_unstructured(fc, "weight", 2)
    hook = next(iter(fc._forward_pre_hooks.values()))
    assert isinstance(hook, cp.L1Unstructured) and hook._tensor_name == "weight"
    assert "weight" not in fc._parameters and "weight" in vars(fc)
    assert isinstance(fc._buffers["weight_mask"], Tensor)
    with torch.no_grad():
        fc.weight_orig.mul_(2)
    fc(torch.ones(1, 3))
    assert torch.equal(fc.weight, fc.weight_orig * fc.weight_mask)


def test_torch_func_transforms_like_torch() -> None:
    ours, theirs = twins(lambda: nn.Linear(3, 2))
    for lib, model in ((tp, theirs), (cp, ours)):
        lib.l1_unstructured(model, "weight", 2)
    x = torch.randn(4, 3)
    grads = []
    for model in (theirs, ours):
        params, buffers = dict(model.named_parameters()), dict(model.named_buffers())

        def loss(p: dict[str, Tensor], model: nn.Module = model) -> Tensor:
            out: Tensor = torch.func.functional_call(model, {**p, **buffers}, (x,))
            return out.square().sum()

        grads.append(torch.func.grad(loss)(params))
    for name in grads[0]:
        assert_same_tensor(grads[0][name], grads[1][name], name)
    stacked = torch.func.stack_module_state([ours, ours])
    out = torch.func.vmap(lambda p, b: torch.func.functional_call(ours, {**p, **b}, (x,)))(
        *stacked
    )
    assert torch.equal(out[0], theirs(x)) and torch.equal(out[1], theirs(x))


@pytest.mark.parametrize("method", ["l1_unstructured", "random_unstructured"])
def test_large_parameters_prune_without_warnings(method: str) -> None:
    fc: Any = nn.Linear(1024, 1024)  # warnings are errors in this suite
    getattr(cp, method)(fc, "weight", amount=0.5)
    getattr(cp, method)(fc, "weight", amount=0.5)
    assert int((fc.weight_mask == 0).sum()) == 3 * 1024 * 1024 // 4


BOOL_AMOUNT_CALLS = [
    ("l1_unstructured", {}),
    ("random_unstructured", {}),
    ("ln_structured", {"n": 2, "dim": 0}),
    ("random_structured", {"dim": 0}),
]


@pytest.mark.parametrize("amount", [True, False])
@pytest.mark.parametrize("twice", [False, True], ids=["first", "repeated"])
@pytest.mark.parametrize(("fn", "kwargs"), BOOL_AMOUNT_CALLS, ids=[c[0] for c in BOOL_AMOUNT_CALLS])
def test_bool_amounts_behave_like_torch(fn: str, kwargs: dict[str, Any], twice: bool, amount: bool) -> None:
    """torch takes True as 1 where it only counts with it (Ln), and fails in topk/kthvalue elsewhere."""
    results = []
    for lib in (tp, cp):
        torch.manual_seed(0)
        layer = nn.Linear(5, 4)
        try:
            for _ in range(2 if twice else 1):
                getattr(lib, fn)(layer, "weight", amount=amount, **kwargs)
            results.append(("ok", getattr(layer, "weight_mask").tolist()))
        except TypeError as e:
            results.append(("TypeError", str(e)))
    assert results[0] == results[1]
