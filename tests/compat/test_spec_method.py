"""SpecMethod: any funcprune spec, a user's included, as a compat pruning method.

Masks in hook mode must be those of the functional API (``funcprune.compute_mask``
and ``funcprune.compute_joint_masks``), in torch's dtypes, through ``apply``,
iterative pruning, ``global_unstructured``, state dicts, copies and pickles.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import pickle
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as tp
from torch import nn

import funcprune as fp
import funcprune.compat as cp

from ._helpers import assert_same_fingerprint, assert_same_tensor, distinct, fingerprint, outcome

Tensor = torch.Tensor


@dataclasses.dataclass(frozen=True)
class SquaredMagnitude(fp.Spec):
    """A user's spec: prune the ``amount`` unpruned entries of smallest square."""

    amount: float | int
    pruning_type = "unstructured"

    def compute_mask(
        self, scores: Tensor, default_mask: Tensor | None = None, *,
        generator: torch.Generator | None = None,
    ) -> Tensor:  # fmt: skip
        return fp.compute_mask(fp.L1Unstructured(self.amount), scores * scores, default_mask)


@dataclasses.dataclass(frozen=True)
class Broken(fp.Spec):
    """A user's spec that returns something other than a mask."""

    pruning_type = "unstructured"

    def compute_mask(
        self, scores: Tensor, default_mask: Tensor | None = None, *,
        generator: torch.Generator | None = None,
    ) -> Tensor:  # fmt: skip
        return torch.ones(3)


def linear(seed: int = 0, shape: tuple[int, int] = (5, 6)) -> Any:
    """A Linear layer with distinct weights (no ties). Typed ``Any``: pruning adds attributes."""
    fc = nn.Linear(shape[1], shape[0])
    with torch.no_grad():
        fc.weight.copy_(distinct(shape, seed))
        fc.bias.copy_(distinct((shape[0],), seed + 1))
    return fc


def test_apply_gives_the_functional_mask_in_torch_dtype() -> None:
    fc = linear()
    w = fc.weight.detach().clone()
    spec = SquaredMagnitude(0.4)
    hook = cp.SpecMethod.apply(fc, "weight", spec=spec)
    assert isinstance(hook, cp.SpecMethod) and isinstance(hook, tp.BasePruningMethod)
    assert hook.PRUNING_TYPE == "unstructured" and hook.spec == spec
    assert_same_tensor(fc.weight_mask, fp.compute_mask(spec, w).to(torch.float32))
    assert_same_tensor(fc.weight, w * fc.weight_mask)
    assert fc.weight_orig is dict(fc.named_parameters())["weight_orig"]


def test_importance_scores_are_ranked_instead_of_the_parameter() -> None:
    fc = linear()
    scores = distinct((5, 6), 7)
    cp.SpecMethod.apply(fc, "weight", spec=SquaredMagnitude(9), importance_scores=scores)
    assert_same_tensor(fc.weight_mask, fp.compute_mask(SquaredMagnitude(9), scores).float())


def test_twice_in_a_row_folds_in_a_container_like_the_functional_api() -> None:
    fc = linear(1)
    w = fc.weight.detach().clone()
    spec = SquaredMagnitude(0.5)
    cp.SpecMethod.apply(fc, "weight", spec=spec)
    first = fc.weight_mask.clone()
    hook = cp.SpecMethod.apply(fc, "weight", spec=spec)
    assert isinstance(hook, cp.PruningContainer)
    assert [type(method) for method in hook] == [cp.SpecMethod, cp.SpecMethod]
    expected = fp.compute_mask(spec, w * first, first)  # scores: the currently pruned tensor
    assert_same_tensor(fc.weight_mask, expected.float())
    assert_same_tensor(fc.weight_mask, fp.compute_mask(fp.chain(spec, spec), w).float())
    assert int((fc.weight_mask == 0).sum()) == 15 + 8  # half of what was left each time


@pytest.mark.parametrize(
    "spec, torch_call",
    [
        (fp.L1Unstructured(0.3), lambda m: tp.l1_unstructured(m, "weight", amount=0.3)),
        (fp.LnStructured(2, n=1, dim=0), lambda m: tp.ln_structured(m, "weight", 2, n=1, dim=0)),
        (fp.RandomUnstructured(7), lambda m: tp.random_unstructured(m, "weight", amount=7)),
        (fp.RandomStructured(0.5, dim=1),
         lambda m: tp.random_structured(m, "weight", amount=0.5, dim=1)),
    ],
    ids=["l1", "ln", "random", "random-structured"],
)
def test_built_in_specs_prune_as_torch_does_after_an_earlier_pruning(
    spec: fp.Spec, torch_call: Any
) -> None:
    ours, theirs = linear(2), linear(2)
    cp.l1_unstructured(ours, "weight", amount=6)
    tp.l1_unstructured(theirs, "weight", amount=6)
    states = []
    for call in (lambda: cp.SpecMethod.apply(ours, "weight", spec=spec),
                 lambda: torch_call(theirs)):  # fmt: skip
        torch.manual_seed(3)
        call()
        states.append(torch.get_rng_state())
    assert_same_tensor(ours.weight_mask, theirs.weight_mask)
    assert torch.equal(states[0], states[1])  # random specs draw what torch draws
    assert list(ours.state_dict()) == list(theirs.state_dict())


def test_global_unstructured_ranks_all_tensors_like_compute_joint_masks() -> None:
    a, b = linear(4, (4, 6)), linear(5, (3, 4))
    cp.l1_unstructured(b, "weight", amount=5)  # an earlier mask, respected
    wa, wb, mb = a.weight.detach().clone(), b.weight.detach().clone(), b.weight_mask.clone()
    spec = SquaredMagnitude(0.4)
    cp.global_unstructured([(a, "weight"), (b, "weight")], cp.SpecMethod, spec=spec)
    expected = fp.compute_joint_masks(spec, [wa, wb], [None, mb])
    assert_same_tensor(a.weight_mask, expected[0].float())
    assert_same_tensor(b.weight_mask, expected[1].float())
    twin_a, twin_b = linear(4, (4, 6)), linear(5, (3, 4))
    tp.l1_unstructured(twin_b, "weight", amount=5)
    tp.global_unstructured([(twin_a, "weight"), (twin_b, "weight")], cp.SpecMethod, spec=spec)
    assert_same_tensor(twin_a.weight_mask, a.weight_mask)  # torch's own slicing agrees
    assert_same_tensor(twin_b.weight_mask, b.weight_mask)


def test_global_unstructured_refuses_a_structured_spec_like_torch() -> None:
    def run(lib: Any) -> None:
        lib.global_unstructured([(linear(), "weight")], cp.SpecMethod,
                                spec=fp.LnStructured(1, n=2, dim=0))

    ours, theirs = outcome(lambda: run(cp)), outcome(lambda: run(tp))
    assert ours[0] == theirs[0] == "TypeError"
    assert ours[1] == theirs[1] and "structured" in ours[1]


def test_state_dict_keys_and_loading_across_libraries() -> None:
    fc, reference = linear(6), linear(6)
    cp.SpecMethod.apply(fc, "bias", spec=SquaredMagnitude(2))
    tp.l1_unstructured(reference, "bias", amount=2)
    assert list(fc.state_dict()) == list(reference.state_dict()) == [
        "weight", "bias_orig", "bias_mask"
    ]
    assert_same_tensor(fc.bias_mask, reference.bias_mask)  # |b|^2 ranks as |b|
    twin = linear(9)
    cp.SpecMethod.apply(twin, "bias", spec=SquaredMagnitude(0))
    twin.load_state_dict(fc.state_dict())
    assert_same_tensor(twin(torch.ones(2, 6)), fc(torch.ones(2, 6)))


def test_deepcopy_and_pickle_keep_the_spec_and_the_masks() -> None:
    fc = linear(7)
    cp.SpecMethod.apply(fc, "weight", spec=SquaredMagnitude(0.5))
    cp.SpecMethod.apply(fc, "weight", spec=fp.LnStructured(1, n=2, dim=0))
    x = torch.randn(2, 6)
    for clone in (copy.deepcopy(fc), pickle.loads(pickle.dumps(fc))):
        assert clone.weight_orig is not fc.weight_orig
        assert_same_tensor(clone.weight_mask, fc.weight_mask)
        assert_same_tensor(clone(x), fc(x))
        hook = next(iter(clone._forward_pre_hooks.values()))
        assert [m.spec for m in hook] == [SquaredMagnitude(0.5), fp.LnStructured(1, n=2, dim=0)]
    buffer = io.BytesIO()
    torch.save(fc.weight, buffer)  # the pruned attribute is a plain tensor
    buffer.seek(0)
    assert_same_tensor(torch.load(buffer, weights_only=True), fc.weight)


def test_remove_bakes_the_mask_in() -> None:
    fc = linear(8)
    cp.SpecMethod.apply(fc, "weight", spec=SquaredMagnitude(10))
    pruned = fc.weight.detach().clone()
    cp.remove(fc, "weight")
    assert sorted(name for name, _ in fc.named_parameters()) == ["bias", "weight"]
    assert_same_tensor(fc.weight.detach(), pruned)
    assert int((fc.weight == 0).sum()) == 10


def test_compute_mask_acts_on_the_unpruned_part_in_the_mask_dtype() -> None:
    t = distinct((4, 5), 9)
    default = (torch.arange(20).reshape(4, 5) % 3 != 0).to(torch.float64)
    mask = cp.SpecMethod(SquaredMagnitude(0.5)).compute_mask(t, default)
    assert mask.dtype == torch.float64
    assert_same_tensor(mask, fp.compute_mask(SquaredMagnitude(0.5), t, default).double())
    assert int((mask == 0).sum()) == 6 + 7  # half of the 13 left, rounded to even, pruned


def test_a_non_spec_is_refused() -> None:
    with pytest.raises(TypeError, match=r"SpecMethod: spec must be a funcprune spec.*L1Unstr"):
        cp.SpecMethod(cp.L1Unstructured(0.5))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "spec, error",
    [(SquaredMagnitude(100), ValueError), (Broken(), ValueError)],
    ids=["amount-too-large", "not-a-mask"],
)
def test_a_failing_spec_leaves_the_module_as_it_was(spec: fp.Spec, error: type) -> None:
    fc = linear(10)
    cp.l1_unstructured(fc, "weight", amount=3)
    before = fingerprint(fc)
    with pytest.raises(error):
        cp.SpecMethod.apply(fc, "weight", spec=spec)
    assert_same_fingerprint(before, fingerprint(fc))
