"""Knowledge distillation on logits: the student learns the teacher's softened distribution.

:func:`distill_loss` is Hinton et al.'s ``T² · KL(softmax(t/T) ‖ softmax(s/T))``
per token, summed over the vocabulary and averaged over real tokens, as a
pure function of two logit tensors (no module, no state): it goes in any
training loop, :func:`torch.func.grad` included.
"""

from __future__ import annotations

import math

import torch

from .._types import Tensor

__all__ = ["distill_loss"]


def distill_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    *,
    temperature: float = 1.0,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """``T² · KL(softmax(t/T) ‖ softmax(s/T))`` summed over the vocabulary, averaged over real tokens.

    For each token (each position of the leading dimensions), the
    Kullback-Leibler divergence of the student's distribution from the
    teacher's, both softened by the temperature ``T``; multiplied by ``T²``
    so that the gradients keep their size across temperatures (Hinton et
    al. 2015); averaged over the tokens ``attention_mask`` marks real (all
    of them without a mask; a batch with no real token gives 0).

    It is computed from :func:`torch.log_softmax` of both (stable for large
    logits; a teacher probability of exactly 0, from a ``-inf`` logit,
    contributes 0), in the logits' dtype promoted to at least ``float32``
    (half-precision logits are not reduced in half precision). Gradients
    flow into both arguments: detach the teacher's logits, or compute them
    under :func:`torch.no_grad`, to train the student alone.

    Relation to NVIDIA ModelOpt's ``LogitsDistillationLoss(temperature)``
    (``modelopt/torch/distill/losses.py``; ``F.kl_div`` of the same softened
    distributions, times ``T²``): with its ``reduction="batchmean"`` and no
    padding it is this loss exactly; its default ``reduction="mean"``
    averages over every (token, vocabulary entry) pair, so it is this loss
    divided by the vocabulary size (torch 2.13's ``kl_div`` warns that its
    ``"mean"`` will mean ``"batchmean"`` in torch's next major release).

    Args:
        student_logits: ``(..., vocabulary)`` logits of the model trained.
        teacher_logits: logits of the same shape from the reference model.
        temperature: ``T > 0``; 1 compares the models' own distributions.
        attention_mask: which tokens count, of the logits' shape without the
            vocabulary: bool, or 0 and 1 (1 = real, as a tokenizer returns).

    Returns:
        A scalar tensor of the promoted dtype (at least ``float32``).

    Raises:
        TypeError: logits that are not floating tensors, a temperature that is
            not a real number, an attention mask that is not a tensor.
        ValueError: logits of different shapes, a temperature that is not
            positive and finite, a mask of another shape or of values other
            than 0 and 1.

    >>> import torch, funcprune as fp
    >>> t = torch.tensor([[2.0, 0.0, -1.0]])
    >>> fp.distill_loss(t, t)
    tensor(0.)
    >>> loss = fp.distill_loss(torch.zeros(1, 3), t, temperature=2.0)
    >>> bool(loss > 0)
    True
    """
    fn = "distill_loss"
    _check_logits(fn, student_logits, teacher_logits)
    _check_temperature(fn, temperature)
    dtype = torch.promote_types(torch.promote_types(student_logits.dtype, teacher_logits.dtype), torch.float32)
    log_s = torch.log_softmax(student_logits.to(dtype) / temperature, dim=-1)
    log_t = torch.log_softmax(teacher_logits.to(dtype) / temperature, dim=-1)
    p_t = log_t.exp()
    per_token = torch.where(p_t > 0, p_t * (log_t - log_s), 0).sum(-1) * temperature**2
    if attention_mask is None:
        return per_token.mean() if per_token.numel() else per_token.sum()
    real = _real_tokens(fn, attention_mask, per_token.shape)
    return (per_token * real).sum() / real.sum().clamp(min=1)


def _check_logits(fn: str, student: Tensor, teacher: Tensor) -> None:
    for name, given in (("student_logits", student), ("teacher_logits", teacher)):
        if not isinstance(given, torch.Tensor) or not given.is_floating_point():
            kind = f"a {given.dtype} tensor" if isinstance(given, torch.Tensor) else type(given).__name__
            raise TypeError(f"{fn}: {name} must be a floating-point tensor of logits, got {kind}")
    if student.shape != teacher.shape or student.dim() == 0:
        raise ValueError(
            f"{fn}: student_logits and teacher_logits must have one shape (..., vocabulary), "
            f"got {tuple(student.shape)} and {tuple(teacher.shape)}"
        )


def _check_temperature(fn: str, temperature: object) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"{fn}: temperature must be a real number, got {type(temperature).__name__}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"{fn}: temperature must be positive and finite, got {temperature}")


def _real_tokens(fn: str, mask: object, shape: torch.Size) -> Tensor:
    """``mask`` as a bool tensor of ``shape`` (True = real), after refusing other values."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{fn}: attention_mask must be a tensor, got {type(mask).__name__}")
    if mask.shape != shape:
        raise ValueError(
            f"{fn}: attention_mask must have the logits' shape without the vocabulary, {tuple(shape)}, "
            f"got {tuple(mask.shape)}"
        )
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(
            f"{fn}: attention_mask must hold 1 at real tokens and 0 at padding (or be bool); it holds other "
            "values (an additive mask?)"
        )
    return mask != 0
