"""The recovery loop of docs/guide/recovery.md on a tiny Llama: one module, zero gradients where pruned, learning.

The teacher is the module's own parameters through ``torch.func.functional_call``;
the student one trainable copy, run with the masks through
``fp.functional_call_masked``. The shrunk student (a module of its own) starts
from the function the masked one computes.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import funcprune as fp

sys.path.insert(0, str(Path(__file__).parents[1]))
import _hf  # noqa: E402

Tensor = torch.Tensor
STEPS = 15


def setup() -> tuple[nn.Module, Tensor, fp.Masks]:
    """The tiny Llama with its matrices 10x larger (at its init, std 0.02, the logits are nearly uniform and
    pruning barely moves them: a distillation loss of 1e-6), a batch and a quarter of its channels and heads."""
    t = _hf.tiny("llama")
    with torch.no_grad():
        for p in t.model.parameters():
            if p.dim() == 2:
                p.mul_(10)
    x = torch.randint(0, _hf.VOCAB, (4, 12), generator=torch.Generator().manual_seed(3))
    params = dict(t.model.named_parameters())
    plan = fp.structured(fp.structure(t.model, x), fp.LnStructured(0.25, n=2), kinds=("channels", "heads"))
    return t.model, x, plan(params)


def distill_step(model: nn.Module, teacher: fp.Params, masks: fp.Masks) -> Any:
    def distill(student: dict[str, Tensor], x: Tensor) -> Tensor:
        with torch.no_grad():
            t = torch.func.functional_call(model, dict(teacher), (x,)).logits
        s = fp.functional_call_masked(model, student, masks, (x,)).logits
        return fp.distill_loss(s, t, temperature=2.0)

    return torch.func.grad_and_value(distill)


def test_one_module_zero_gradients_where_pruned_and_the_loss_decreases(monkeypatch: pytest.MonkeyPatch) -> None:
    model, x, masks = setup()

    def no_copy(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the loop copied a module")

    monkeypatch.setattr(copy, "deepcopy", no_copy)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    modules = sum(1 for _ in model.modules())
    teacher = {n: p.detach() for n, p in model.named_parameters()}
    assert all(teacher[n].data_ptr() == p.data_ptr() for n, p in model.named_parameters())  # no copy of them
    student = {n: p.clone() for n, p in teacher.items()}
    step = distill_step(model, teacher, masks)
    losses = []
    for _ in range(STEPS):
        grads, loss = step(student, x)
        for n, m in masks.items():
            assert torch.equal(grads[n][~m], torch.zeros_like(grads[n][~m])), n
            assert bool((grads[n][m] != 0).any()), n  # the kept entries do learn
        student = {n: p - 0.05 * grads[n] for n, p in student.items()}
        losses.append(float(loss))
    assert losses[-1] < 0.6 * losses[0]
    assert sum(1 for _ in model.modules()) == modules
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())  # the teacher stayed frozen
    storages = {p.untyped_storage().data_ptr() for p in student.values()}
    assert storages.isdisjoint(p.untyped_storage().data_ptr() for p in model.parameters())  # one student copy


def test_perplexity_of_the_student_is_the_models_own_loss() -> None:
    model, x, masks = setup()
    student = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads, _ = distill_step(model, dict(model.named_parameters()), masks)(student, x)
    student = {n: p - 0.05 * grads[n] for n, p in student.items()}
    got = fp.perplexity(model, [x], params=student, masks=masks)
    with torch.no_grad():
        own = fp.functional_call_masked(model, student, masks, (x,), {"labels": x}).loss
    assert got.tokens == 4 * 11
    assert got.nll == pytest.approx(float(own), rel=1e-6)
    assert got.nll != pytest.approx(fp.perplexity(model, [x], masks=masks).nll, rel=1e-6)  # it is the student's


def test_hidden_states_and_lm_loss_mix_keep_pruned_gradients_zero() -> None:
    model, x, masks = setup()
    teacher = {n: p.detach() for n, p in model.named_parameters()}

    def mixed(student: dict[str, Tensor]) -> Tensor:
        with torch.no_grad():
            t = torch.func.functional_call(model, teacher, (x,), {"output_hidden_states": True})
        s = fp.functional_call_masked(model, student, masks, (x,), {"output_hidden_states": True, "labels": x})
        states = sum(F.mse_loss(a, b) for a, b in zip(s.hidden_states[1:], t.hidden_states[1:]))
        loss: Tensor = 0.5 * s.loss + 0.5 * fp.distill_loss(s.logits, t.logits) + 0.1 * states
        return loss

    grads = torch.func.grad(mixed)({n: p.clone() for n, p in teacher.items()})
    assert all(torch.equal(grads[n][~m], torch.zeros_like(grads[n][~m])) for n, m in masks.items())
    assert all(bool(g.abs().sum() > 0) for n, g in grads.items() if n in masks)


@pytest.mark.ci  # a shrink and a reload: CI runs it (the default suite's 5 minutes)
def test_a_shrunk_student_starts_as_the_masked_one_and_learns_from_the_dense_teacher() -> None:
    model, x, masks = setup()
    teacher_loss = float(distill_step(model, dict(model.named_parameters()), masks)(
        {n: p.detach().clone() for n, p in model.named_parameters()}, x)[1])  # fmt: skip
    small = fp.shrink(model, masks, x).train(False)
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in model.parameters())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(small.parameters(), lr=0.05)
    losses = []
    for _ in range(STEPS):
        with torch.no_grad():
            t = model(input_ids=x).logits
        loss = fp.distill_loss(small(input_ids=x).logits, t, temperature=2.0)
        optimizer.zero_grad()
        torch.autograd.backward(loss)
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[0] == pytest.approx(teacher_loss, rel=1e-4)  # the same student function at step 0
    assert losses[-1] < 0.6 * losses[0]
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
