"""Bad input to compute_mask and prune: torch's exception types, clear messages."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as tprune

import funcprune as fp


def test_more_units_than_available_is_a_value_error_like_torch() -> None:
    t = torch.randn(2, 3)
    with pytest.raises(ValueError) as theirs:
        tprune.L1Unstructured(7).compute_mask(t, torch.ones_like(t))
    with pytest.raises(ValueError) as ours:
        fp.compute_mask(fp.L1Unstructured(7), t)
    assert str(ours.value) == str(theirs.value)
    assert "amount=7" in str(ours.value) and "=6" in str(ours.value)


def test_more_units_than_left_unpruned_is_a_value_error() -> None:
    default = torch.tensor([True, False, False, True])
    with pytest.raises(ValueError, match=r"amount=3 should be smaller than the number of parameters to prune=2"):
        fp.compute_mask(fp.RandomUnstructured(3), torch.randn(4), default)


def test_more_channels_than_left_is_a_value_error() -> None:
    default = torch.ones(4, 3, dtype=torch.bool)
    default[1:] = False
    with pytest.raises(ValueError, match=r"amount=2 .*=1"):
        fp.compute_mask(fp.LnStructured(2, n=2, dim=0), torch.randn(4, 3), default)


@pytest.mark.parametrize("dim", [2, 5, -3])
@pytest.mark.parametrize("spec_of", [lambda d: fp.LnStructured(1, 2, d), lambda d: fp.RandomStructured(1, d)])
def test_dim_out_of_range_is_an_index_error(dim: int, spec_of: object) -> None:
    with pytest.raises(IndexError, match=re.escape(str(dim))):
        fp.compute_mask(spec_of(dim), torch.randn(3, 4))  # type: ignore[operator]


@pytest.mark.parametrize("spec", [fp.LnStructured(1, 2), fp.RandomStructured(1)])
def test_structured_needs_two_dims(spec: fp.Spec) -> None:
    with pytest.raises(ValueError, match=r"Structured pruning can only be applied to multidimensional tensors.*1 dims"):
        fp.compute_mask(spec, torch.randn(5))


def test_default_mask_shape_mismatch() -> None:
    with pytest.raises(ValueError, match=r"compute_mask: default_mask has shape \(3,\) but the scores have shape \(2, 3\)"):
        fp.compute_mask(fp.L1Unstructured(1), torch.randn(2, 3), torch.ones(3, dtype=torch.bool))


def test_importance_scores_shape_mismatch() -> None:
    with pytest.raises(ValueError, match=r"prune: importance_scores has shape \(6,\) but t has shape \(2, 3\)"):
        fp.prune(fp.L1Unstructured(1), torch.randn(2, 3), importance_scores=torch.randn(6))


def test_custom_mask_shape_mismatch() -> None:
    spec = fp.CustomFromMask(torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"mask has shape \(2, 2\) but the scores have shape \(4,\)"):
        fp.compute_mask(spec, torch.randn(4))


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.int8])
def test_non_floating_scores_are_a_type_error(dtype: torch.dtype) -> None:
    with pytest.raises(TypeError, match=rf"compute_mask: scores must be a floating-point tensor, got dtype {dtype}"):
        fp.compute_mask(fp.L1Unstructured(1), torch.zeros(3, dtype=dtype))
    with pytest.raises(TypeError, match=r"prune: importance_scores must be a floating-point tensor"):
        fp.prune(fp.L1Unstructured(1), torch.zeros(3), importance_scores=torch.zeros(3, dtype=dtype))


def test_non_tensors_are_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"compute_mask: scores must be a torch.Tensor, got list"):
        fp.compute_mask(fp.L1Unstructured(1), [1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"compute_mask: default_mask must be a torch.Tensor"):
        fp.compute_mask(fp.L1Unstructured(1), torch.randn(2), [True, False])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"compute_mask: spec must be a funcprune spec, got 'l1'"):
        fp.compute_mask("l1", torch.randn(2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"prune: spec must be a funcprune spec"):
        fp.prune(tprune.L1Unstructured(1), torch.randn(2))  # type: ignore[arg-type]


@pytest.mark.parametrize("amount", [0, 1, 0.0])  # whether or not anything is pruned
@pytest.mark.parametrize(("n", "shape"), [("nuc", (4, 3)), ("nuc", (4, 3, 2, 2)), ("fro", (4, 3, 2, 2))])
def test_matrix_norms_need_matching_dims(n: str, shape: tuple[int, ...], amount: float) -> None:
    with pytest.raises(ValueError, match=rf"LnStructured: n='{n}' needs scores with .* dims"):
        fp.compute_mask(fp.LnStructured(amount, n=n, dim=0), torch.randn(shape))


@pytest.mark.parametrize("generator", ["seed", 0, torch.ones(2, dtype=torch.uint8)])
@pytest.mark.parametrize("spec", [fp.L1Unstructured(0.5), fp.RandomUnstructured(0.5)])
def test_a_generator_that_is_not_one_is_a_type_error(spec: fp.Spec, generator: object) -> None:
    bad: Any = generator  # what a user may pass despite the annotation
    calls: list[tuple[Callable[[], object], str]] = [
        (lambda: fp.compute_mask(spec, torch.randn(4), generator=bad), "compute_mask"),
        (lambda: fp.prune(spec, torch.randn(4), generator=bad), "prune"),
        (lambda: fp.Plan({"w": spec})({"w": torch.randn(4)}, generator=bad), "Plan"),
    ]
    for call, fn in calls:
        with pytest.raises(TypeError, match=rf"{fn}: generator must be a torch.Generator or None, got"):
            call()


def test_a_default_mask_on_another_device_is_refused() -> None:
    meta = torch.ones(4, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match=r"compute_mask: default_mask is on meta but the scores are on cpu"):
        fp.compute_mask(fp.L1Unstructured(1), torch.randn(4), meta)
    with pytest.raises(ValueError, match=r"prune: default_mask is on meta"):
        fp.prune(fp.L1Unstructured(1), torch.randn(4), meta)


def test_huge_numbers_are_value_errors_or_work_never_overflow_errors() -> None:
    with pytest.raises(ValueError, match=r"n=10{30} is too large for torch.norm"):
        fp.LnStructured(0.5, n=10**30)
    with pytest.raises(ValueError, match=r"n=10{400} is too large"):
        fp.LnStructured(0.5, n=10**400)
    spec = fp.L1Unstructured(10**400)  # a count: larger than any tensor
    with pytest.raises(ValueError, match=r"should be smaller than the number of parameters to prune=4"):
        fp.compute_mask(spec, torch.randn(4))
    batched = torch.func.vmap(lambda t: fp.compute_mask(spec, t, t > 0))(torch.randn(3, 4))
    assert not bool(batched.any())  # capped at what is left: everything pruned
    with pytest.raises(IndexError):
        fp.compute_mask(fp.RandomStructured(0.5, dim=10**30), torch.randn(3, 3))


def test_inputs_are_never_modified_on_error() -> None:
    t = torch.randn(2, 3)
    default = torch.ones(2, 3)
    before = (t.clone(), default.clone())
    with pytest.raises(ValueError):
        fp.compute_mask(fp.L1Unstructured(7), t, default)
    assert torch.equal(t, before[0]) and torch.equal(default, before[1])


def test_numeric_default_masks_count_nonzero_as_kept() -> None:
    t = torch.tensor([3.0, 1.0, 2.0, 4.0])
    float_mask = torch.tensor([1.0, 0.0, 1.0, 1.0])
    got = fp.compute_mask(fp.L1Unstructured(1), t, float_mask)
    assert got.tolist() == [True, False, False, True]
    assert float_mask.dtype == torch.float32


@pytest.mark.parametrize(
    ("spec", "scores", "message"),
    [
        (fp.NM(2, 4, dim=5), torch.randn(4, 8), r"NM: dim=5 does not index scores of shape \(4, 8\): expected -2 <= dim < 2"),
        (fp.PerSlice(fp.L1Unstructured(0.5), dim=3), torch.randn(4, 8), r"PerSlice: dim=3 does not index"),
        (fp.PerSlice(fp.Block(0.5, (2,)), dim=-4), torch.randn(4, 8), r"PerSlice: dim=-4 does not index"),
        (fp.PerSlice(fp.L1Unstructured(0.5)), torch.tensor(3.0), r"PerSlice: scores is 0-d .*no dim 0"),
        (fp.NM(2, 4), torch.tensor(3.0), r"NM: scores is 0-d .*no dim -1"),
    ],
    ids=["nm-dim", "per-slice-dim", "per-slice-negative-dim", "per-slice-0d", "nm-0d"],
)
def test_a_dim_that_indexes_nothing_names_the_spec_and_the_dim(spec: fp.Spec, scores: torch.Tensor, message: str) -> None:
    with pytest.raises(IndexError, match=message):
        spec.compute_mask(scores)


def test_sparsity_report_refuses_meta_tensors_naming_them() -> None:
    with pytest.raises(ValueError, match=r"sparsity_report: the mask for 'w' is on the meta device"):
        fp.sparsity_report({"w": torch.ones(2, 2, dtype=torch.bool, device="meta")})
    with pytest.raises(ValueError, match=r"sparsity_report: the parameter 'weight' is on the meta device"):
        fp.sparsity_report(torch.nn.Linear(2, 2, device="meta"))


def test_input_norms_checks_across_before_the_first_batch() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 3))
    ran: list[int] = []

    def batches() -> Any:
        ran.append(1)
        yield torch.randn(1, 2)

    with pytest.raises(TypeError, match=r"input_norms: across must be a torch.distributed process group.*'world'"):
        fp.input_norms(model, batches(), ["0.weight"], across="world")  # type: ignore[arg-type]
    assert not ran
