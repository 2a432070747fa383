"""Part 6 of the demo: the PyTorch pruning tutorial's calls, functionally and in hook mode.

On the tutorial's LeNet (no training): plans compute the tutorial's masks
from a parameter dict, and the same calls run in hook mode through
``funcprune.compat``; both are checked against ``torch.nn.utils.prune``.
"""

from __future__ import annotations

import copy
import types

import torch
import torch.nn.functional as F
import torch.nn.utils.prune as torch_prune
from torch import nn

from .. import compat
from .._apply import sparsity_report
from .._plans import Plan, global_unstructured
from .._specs import CustomFromMask, L1Unstructured, LnStructured, RandomUnstructured
from .._types import Masks, Tensor

__all__ = ["LeNet", "tutorial"]


def _params(module: nn.Module) -> dict[str, Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


class LeNet(nn.Module):
    """The tutorial's LeNet (LeCun et al., 1998) for 1x28x28 images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3)
        self.conv2 = nn.Conv2d(6, 16, 3)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), (2, 2))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc2(F.relu(self.fc1(x.flatten(1)))))
        out: Tensor = self.fc3(x)
        return out


LENET_WEIGHTS = ["conv1.weight", "conv2.weight", "fc1.weight", "fc2.weight", "fc3.weight"]


def _same_as_torch(masks: Masks, module: nn.Module) -> bool:
    """Whether ``masks`` equal the ``<name>_mask`` buffers torch left."""
    buffers = dict(module.named_buffers())
    return all(bool((mask == buffers[f"{name}_mask"].bool()).all()) for name, mask in masks.items())


def _indent(text: str) -> str:
    return "\n".join("     " + line for line in text.splitlines())


def _tutorial_steps(prune: types.ModuleType, model: LeNet) -> None:
    """The tutorial's calls in hook mode, with ``prune`` torch's module or funcprune.compat."""
    torch.manual_seed(1)
    prune.random_unstructured(model.conv1, "weight", amount=0.3)
    prune.l1_unstructured(model.conv1, "bias", amount=3)
    prune.ln_structured(model.conv1, "weight", amount=0.5, n=2, dim=0)
    targets = [(model.get_submodule(n.split(".")[0]), "weight") for n in LENET_WEIGHTS[1:]]
    prune.global_unstructured(targets, pruning_method=prune.L1Unstructured, amount=0.2)


def tutorial() -> None:
    """Part 6: the tutorial's pruning calls as plans and in hook mode, checked against torch."""
    print("6. compat: the PyTorch pruning tutorial on its LeNet (no training), functionally and in hook mode")
    torch.manual_seed(0)
    model = LeNet()
    reference = copy.deepcopy(model)
    params = _params(model)
    print("6.1 Pruning conv1 (random 30% of the weight, the 3 smallest biases, then Ln on top)")
    first = Plan({"conv1.weight": RandomUnstructured(0.3), "conv1.bias": L1Unstructured(3)})
    torch.manual_seed(1)
    masks = first(params)
    print(f"   {first}\n{_indent(str(sparsity_report(masks)))}")
    print(f"   conv1.bias kept: {masks['conv1.bias'].tolist()}")
    second = Plan({"conv1.weight": LnStructured(0.5, n=2, dim=0)})
    masks = second(params, masks)
    print(f"   then {second}: channels kept {masks['conv1.weight'].flatten(1).any(1).tolist()}")
    torch.manual_seed(1)
    torch_prune.random_unstructured(reference.conv1, "weight", amount=0.3)
    torch_prune.l1_unstructured(reference.conv1, "bias", amount=3)
    torch_prune.ln_structured(reference.conv1, "weight", amount=0.5, n=2, dim=0)
    print(f"   same masks as torch.nn.utils.prune: {_same_as_torch(masks, reference)}")

    print("6.2 Pruning many parameters: 20% of conv weights, 40% of linear weights")
    per_layer = Plan({"conv*.weight": L1Unstructured(0.2), "fc*.weight": L1Unstructured(0.4)})
    print(f"   {per_layer}\n{_indent(str(sparsity_report(per_layer(params))))}")

    print("6.3 Global pruning: the 20% smallest weights of the whole model")
    global20 = global_unstructured(["conv*.weight", "fc*.weight"], L1Unstructured(0.2))
    masks = global20(params)
    print(f"   {global20}\n{_indent(str(sparsity_report(masks)))}")
    reference = copy.deepcopy(model)
    targets = [(reference.get_submodule(n.split(".")[0]), "weight") for n in LENET_WEIGHTS]
    torch_prune.global_unstructured(targets, torch_prune.L1Unstructured, amount=0.2)
    same = _same_as_torch(masks, reference)
    print(f"   same masks as torch.nn.utils.prune.global_unstructured: {same}")

    print("6.4 A custom spec: prune every other entry of fc3.bias")
    every_other = torch.ones(10, dtype=torch.bool)
    every_other[::2] = False
    masks = Plan({"fc3.bias": CustomFromMask(every_other)})(params)
    print(f"   fc3.bias kept: {masks['fc3.bias'].int().tolist()}")

    print("6.5 Hook mode: the same calls through funcprune.compat (import funcprune.compat as prune)")
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    _tutorial_steps(compat, ours)
    _tutorial_steps(torch_prune, theirs)
    hooked = compat.masks_from_module(ours)
    print(f"   compat.masks_from_module(model) reads back its masks:\n{_indent(str(sparsity_report(hooked)))}")
    print(f"   compat hook-mode masks equal torch.nn.utils.prune's: {_same_as_torch(hooked, theirs)}")
