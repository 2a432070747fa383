"""fp.distill_loss against a float64 transcription of NVIDIA ModelOpt's LogitsDistillationLoss, and its properties.

The reference: NVIDIA/Model-Optimizer ``modelopt/torch/distill/losses.py``,
``LogitsDistillationLoss(temperature=1.0, reduction="mean")``: ``log_softmax``
of the student's logits over ``T``, ``softmax`` of the teacher's over ``T``,
both viewed as ``(-1, vocabulary)``, ``F.kl_div(log_probs, targets.detach(),
reduction=reduction)`` times ``T ** 2``. Its default ``"mean"`` divides by
every (token, vocabulary entry) pair, so ``fp.distill_loss`` is it times the
vocabulary size; with ``"batchmean"`` (per row of the view, that is per token)
they are equal; with ``"none"`` summed over the vocabulary and averaged over
real tokens it is the masked loss. (torch 2.13's ``kl_div`` warns that its
``"mean"`` will mean ``"batchmean"`` in torch's next major release: ModelOpt's
default will then be this loss, on unpadded batches.)
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import funcprune as fp

Tensor = torch.Tensor


def modelopt_loss(logits_s: Tensor, logits_t: Tensor, temperature: float = 1.0, reduction: str = "mean") -> Tensor:
    """ModelOpt's LogitsDistillationLoss.forward, transcribed (run it in float64)."""
    soft_log_probs = F.log_softmax(logits_s / temperature, dim=-1)
    soft_targets = F.softmax(logits_t / temperature, dim=-1)
    soft_log_probs = soft_log_probs.view(-1, soft_log_probs.size(-1))
    soft_targets = soft_targets.view(-1, soft_targets.size(-1))
    with warnings.catch_warnings():  # torch 2.13 warns that kl_div's "mean" will become "batchmean" in torch 3
        warnings.filterwarnings("ignore", message="reduction: 'mean' divides the total loss", category=UserWarning)
        kd_loss = F.kl_div(soft_log_probs, soft_targets.detach(), reduction=reduction)
    return kd_loss * temperature**2


def logits(*shape: int, seed: int, scale: float = 3.0) -> Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.5])
def test_is_modelopt_mean_times_the_vocabulary_and_its_batchmean(temperature: float) -> None:
    s, t = logits(2, 5, 11, seed=0), logits(2, 5, 11, seed=1)
    ours = fp.distill_loss(s, t, temperature=temperature)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, 11 * modelopt_loss(s, t, temperature), rtol=1e-12, atol=0)
    torch.testing.assert_close(ours, modelopt_loss(s, t, temperature, "batchmean"), rtol=1e-12, atol=0)


def test_masked_is_modelopt_none_summed_over_the_vocabulary_and_averaged_over_real_tokens() -> None:
    s, t = logits(3, 4, 7, seed=2), logits(3, 4, 7, seed=3)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    per_token = modelopt_loss(s, t, 2.0, "none").sum(-1).view(3, 4)
    expected = (per_token * mask).sum() / mask.sum()
    torch.testing.assert_close(fp.distill_loss(s, t, temperature=2.0, attention_mask=mask), expected, rtol=1e-12,
                               atol=0)  # fmt: skip
    assert torch.equal(fp.distill_loss(s, t, temperature=2.0, attention_mask=mask.bool()),
                       fp.distill_loss(s, t, temperature=2.0, attention_mask=mask))  # fmt: skip
    s2 = torch.where(mask[..., None].bool(), s, 1e3)  # what padding holds does not count
    assert torch.equal(fp.distill_loss(s2, t, temperature=2.0, attention_mask=mask),
                       fp.distill_loss(s, t, temperature=2.0, attention_mask=mask))  # fmt: skip
    assert float(fp.distill_loss(s, t, attention_mask=torch.zeros(3, 4))) == 0.0  # no real token


def test_gradient_is_t_times_the_difference_of_the_distributions_per_token() -> None:
    s, t = logits(2, 3, 6, seed=4).requires_grad_(), logits(2, 3, 6, seed=5)
    (grad,) = torch.autograd.grad(fp.distill_loss(s, t, temperature=2.0), s)
    expected = 2.0 * (torch.softmax(s.detach() / 2, -1) - torch.softmax(t / 2, -1)) / 6
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-14)
    assert torch.func.grad(lambda x: fp.distill_loss(x, t, temperature=2.0))(s.detach()).shape == s.shape


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits_are_reduced_in_float32(dtype: torch.dtype) -> None:
    s, t = logits(4, 8, 50, seed=6).to(dtype), logits(4, 8, 50, seed=7).to(dtype)
    got = fp.distill_loss(s, t, temperature=2.0)
    assert got.dtype == torch.float32
    assert torch.equal(got, fp.distill_loss(s.float(), t.float(), temperature=2.0))
    expected = 50 * modelopt_loss(s.double(), t.double(), 2.0)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=0)


def test_stable_for_large_logits_and_zero_teacher_probabilities() -> None:
    s, t = logits(3, 9, seed=8), logits(3, 9, seed=9)
    big = fp.distill_loss((s + 1e4).float(), (t - 1e4).float())
    torch.testing.assert_close(big.double(), fp.distill_loss(s, t), rtol=1e-3, atol=0)
    t_inf = t.clone()
    t_inf[:, 0] = -math.inf  # the teacher gives entry 0 no probability: it contributes nothing
    expected = 9 * modelopt_loss(s[:, 1:] - torch.logsumexp(s, -1, keepdim=True) + torch.logsumexp(s[:, 1:], -1,
                                 keepdim=True), t[:, 1:])  # fmt: skip
    got = fp.distill_loss(s, t_inf)
    assert math.isfinite(float(got))
    kl = (torch.softmax(t[:, 1:], -1) * (torch.log_softmax(t[:, 1:], -1) - torch.log_softmax(s, -1)[:, 1:])).sum(-1)
    torch.testing.assert_close(got, kl.mean(), rtol=1e-12, atol=0)
    assert expected.shape == ()  # the transcription runs on the reduced vocabulary too


finite = st.floats(-3, 3, allow_nan=False, width=64)


@given(
    shape=st.tuples(st.integers(1, 3), st.integers(2, 8)),
    seed=st.integers(0, 2**16),
    shift=finite,
)
def test_zero_for_equal_distributions_whatever_the_shift(shape: tuple[int, int], seed: int, shift: float) -> None:
    s = logits(*shape, seed=seed)
    offsets = logits(shape[0], 1, seed=seed + 1) + shift  # one constant per token: the same distribution
    assert abs(float(fp.distill_loss(s, s + offsets, temperature=1.5))) < 1e-12


@given(
    shape=st.tuples(st.integers(1, 3), st.integers(2, 8)),
    seed=st.integers(0, 2**16),
    entry=st.integers(0, 7),
    delta=st.floats(0.5, 3),
)
def test_positive_when_the_distributions_differ(shape: tuple[int, int], seed: int, entry: int, delta: float) -> None:
    t = logits(*shape, seed=seed, scale=1.0)
    s = t.clone()
    s[0, entry % shape[1]] += delta  # the first token's distribution differs, the others do not
    loss = float(fp.distill_loss(s, t))
    assert loss > 1e-6
    assert float(fp.distill_loss(logits(*shape, seed=seed + 7), t)) >= 0.0


@given(
    seed=st.integers(0, 2**16),
    temperature=st.floats(0.25, 4),
    scale=st.floats(0.1, 10),
)
def test_temperature_scales_as_its_square(seed: int, temperature: float, scale: float) -> None:
    """Logits and temperature scaled together: the same distributions, the loss times the scale squared."""
    s, t = logits(2, 6, seed=seed), logits(2, 6, seed=seed + 1)
    base = fp.distill_loss(s, t, temperature=temperature)
    scaled = fp.distill_loss(scale * s, scale * t, temperature=scale * temperature)
    torch.testing.assert_close(scaled, scale**2 * base, rtol=1e-10, atol=1e-14)


@given(seed=st.integers(0, 2**16))
def test_high_temperature_is_hintons_logit_matching(seed: int) -> None:
    """``T² KL -> (1 / 2V) sum((d - mean d)²)`` per token, ``d = s - t``, as ``T`` grows (Hinton et al. 2015)."""
    s, t = logits(3, 10, seed=seed), logits(3, 10, seed=seed + 1)
    d = s - t
    limit = ((d - d.mean(-1, keepdim=True)) ** 2).sum(-1).mean() / (2 * 10)
    torch.testing.assert_close(fp.distill_loss(s, t, temperature=1e3), limit, rtol=1e-2, atol=0)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((torch.zeros(2, 3), [[0.0]]), {}, TypeError, "teacher_logits must be a floating-point tensor"),
        ((torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3)), {}, TypeError, "student_logits must be a float"),
        ((torch.zeros(2, 3), torch.zeros(2, 4)), {}, ValueError, "one shape .* got \\(2, 3\\) and \\(2, 4\\)"),
        ((torch.zeros(2, 3), torch.zeros(2, 3)), {"temperature": 0.0}, ValueError, "temperature must be positive"),
        ((torch.zeros(2, 3), torch.zeros(2, 3)), {"temperature": math.inf}, ValueError, "positive and finite"),
        ((torch.zeros(2, 3), torch.zeros(2, 3)), {"temperature": True}, TypeError, "temperature must be a real"),
        ((torch.zeros(2, 3), torch.zeros(2, 3)), {"attention_mask": [1, 1]}, TypeError, "attention_mask must be a t"),
        ((torch.zeros(2, 3), torch.zeros(2, 3)), {"attention_mask": torch.ones(3)}, ValueError, "shape .*\\(2,\\)"),
        ((torch.zeros(2, 3), torch.zeros(2, 3)), {"attention_mask": torch.tensor([0.0, -math.inf])}, ValueError,
         "additive"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_by_name(args: Any, kwargs: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=f"^distill_loss: .*{match}"):
        fp.distill_loss(*args, **kwargs)
