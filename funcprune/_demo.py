"""The demo run by ``python -m funcprune``: the tutorial's conv1, functionally."""

from __future__ import annotations

import torch
from torch import nn

from ._fold import compute_mask
from ._specs import L1Unstructured, LnStructured, RandomUnstructured, chain


def _sparsity(mask: torch.Tensor) -> str:
    return f"{100.0 * float((~mask).sum()) / mask.numel():5.1f}% pruned"


def main() -> None:
    """Prune the tutorial LeNet's ``conv1`` with the kernels and the fold."""
    torch.manual_seed(0)
    conv1 = nn.Conv2d(1, 6, 3)
    weight, bias = conv1.weight.detach(), conv1.bias.detach()
    print("funcprune demo: the pruning tutorial's conv1, without touching the module")
    w_mask = compute_mask(RandomUnstructured(amount=0.3), weight)
    print(f"  RandomUnstructured(0.3)   conv1.weight {_sparsity(w_mask)}")
    b_mask = compute_mask(L1Unstructured(amount=3), bias)
    print(f"  L1Unstructured(3)         conv1.bias   {_sparsity(b_mask)}  kept: {b_mask.tolist()}")
    w_mask = compute_mask(LnStructured(amount=0.5, n=2, dim=0), weight * w_mask, w_mask)
    kept = w_mask.flatten(1).any(1).tolist()
    print(f"  + LnStructured(0.5, n=2)  conv1.weight {_sparsity(w_mask)}  channels kept: {kept}")
    steps = chain(RandomUnstructured(0.3), LnStructured(0.5, n=2, dim=0))
    torch.manual_seed(0)
    nn.Conv2d(1, 6, 3)  # replay the RNG to the same state
    same = bool((compute_mask(steps, weight) == w_mask).all())
    print(f"  the same two steps as one chain give the same mask: {same}")
