"""The demo's task: scikit-learn's digits, a small CNN, functional training.

The data are scikit-learn's handwritten digits (1797 8x8 images shipped in
its wheel), or a synthetic stand-in without scikit-learn (the name returned
says which). Training is functional: a parameter dict, a mask dict,
``torch.func.grad`` through :func:`~funcprune.functional_call_masked`, and
Adam written out on dicts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .._apply import apply_masks, functional_call_masked
from .._types import Masks, Params, Tensor

Data = tuple[Tensor, Tensor]


class DigitsCNN(nn.Module):
    """A small CNN for 1x8x8 digits: two 3x3 convs, a 2x2 max-pool, two linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        out: Tensor = self.fc2(F.relu(self.fc1(x.flatten(1))))
        return out


def synthetic_data(n: int, generator: torch.Generator) -> Data:
    """``n`` noisy 8x8 images of 10 smooth random prototypes, and labels."""
    protos = torch.randn(10, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    protos = F.avg_pool2d(protos, 3, stride=1, padding=1) * 2
    labels = torch.randint(0, 10, (n,), generator=generator)
    return protos[labels] + torch.randn(n, 1, 8, 8, generator=generator) * 1.5, labels


def load_data(seed: int = 0) -> tuple[str, Data, Data]:
    """The digits split 75/25 (fixed seed): a description, the train and the test set."""
    try:
        from sklearn.datasets import load_digits  # type: ignore[import-untyped]
    except ImportError:
        name = (
            "synthetic 8x8 digits: scikit-learn is not installed, so the demo falls back to "
            "noisy random prototypes (pip install \".[demo]\" for the real digits)"
        )
        x, y = synthetic_data(1797, torch.Generator().manual_seed(seed))
    else:
        name = "scikit-learn's handwritten digits (load_digits: 1797 8x8 images, 10 classes)"
        digits = load_digits()
        x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    test, train = order[: len(y) // 4], order[len(y) // 4 :]
    return name, (x[train], y[train]), (x[test], y[test])


def params_of(module: nn.Module) -> dict[str, Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def accuracy(model: nn.Module, params: Params, masks: Masks, data: Data) -> float:
    """The accuracy of the masked model on ``data``, in percent."""
    with torch.no_grad():
        logits = functional_call_masked(model, params, masks, data[0])
        return 100.0 * float((logits.argmax(1) == data[1]).float().mean())


def loss_of(model: nn.Module) -> Callable[[Params, Masks, Tensor, Tensor], Tensor]:
    def loss(params: Params, masks: Masks, x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(functional_call_masked(model, params, masks, x), y)

    return loss


Adam = tuple[dict[str, Tensor], dict[str, Tensor], int]


def adam_step(
    params: Params, grads: Params, state: Adam, lr: float = 3e-3
) -> tuple[dict[str, Tensor], Adam]:
    """One Adam step (Kingma & Ba), functionally; a zero gradient leaves an entry where it is."""
    first, second, t = state
    first = {n: 0.9 * first[n] + 0.1 * g for n, g in grads.items()}
    second = {n: 0.999 * second[n] + 0.001 * g * g for n, g in grads.items()}
    t += 1
    scale = lr * (1 - 0.999**t) ** 0.5 / (1 - 0.9**t)
    new = {n: p - scale * first[n] / (second[n].sqrt() + 1e-8) for n, p in params.items()}
    return new, (first, second, t)


def train_steps(
    model: nn.Module,
    params: Params,
    masks: Masks,
    data: Data,
    steps: int,
    *,
    seed: int,
    prune_at: Callable[[int, Params, Masks], Masks] | None = None,
) -> tuple[Params, Masks]:
    """``steps`` of Adam on batches of 64 with ``torch.func.grad``; returns masked params and masks.

    ``prune_at(step, params, masks)``, if given, returns the masks to train
    with from that step on. Pruned entries get zero gradient.
    """
    grad_fn = torch.func.grad(loss_of(model))
    generator = torch.Generator().manual_seed(seed)
    zeros = {n: torch.zeros_like(p) for n, p in params.items()}
    state: Adam = (zeros, dict(zeros), 0)
    for step in range(steps):
        if prune_at is not None:
            masks = prune_at(step, params, masks)
        idx = torch.randint(0, len(data[1]), (64,), generator=generator)
        params, state = adam_step(params, grad_fn(params, masks, data[0][idx], data[1][idx]), state)
    return apply_masks(params, masks), masks
