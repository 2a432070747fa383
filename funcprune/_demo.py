"""The demo run by ``python -m funcprune``: the pruning tutorial, functionally.

It tells the story of the official ``torch.nn.utils.prune`` tutorial on its
LeNet without touching a module: plans compute masks from parameter dicts,
``torch.func`` runs the model on masked parameters. Then it trains with
iterative magnitude pruning to about 90% sparsity and prunes an ensemble of
8 LeNets in one ``vmap`` call. The data are synthetic (nothing is
downloaded); the whole run takes a few seconds on 2 CPU cores.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.nn.functional as F
import torch.nn.utils.prune as torch_prune
from torch import nn

from ._apply import functional_call_masked
from ._global import global_unstructured
from ._plan import Plan, compose
from ._report import sparsity_report
from ._specs import CustomFromMask, L1Unstructured, LnStructured, RandomUnstructured
from ._types import Masks, Params, Tensor

WEIGHTS = ["conv*.weight", "fc*.weight"]
WEIGHT_NAMES = ["conv1.weight", "conv2.weight", "fc1.weight", "fc2.weight", "fc3.weight"]


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
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        out: Tensor = self.fc3(x)
        return out


def synthetic_data(n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``n`` noisy 28x28 images of 10 smooth random prototypes, and labels."""
    protos = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    protos = F.avg_pool2d(protos, 5, stride=1, padding=2) * 3
    labels = torch.randint(0, 10, (n,), generator=generator)
    noise = torch.randn(n, 1, 28, 28, generator=generator) * 3.0
    return protos[labels] + noise, labels


def _params(module: nn.Module) -> dict[str, Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def _same_as_torch(masks: Masks, module: nn.Module) -> bool:
    """Whether ``masks`` equal the ``<name>_mask`` buffers torch left."""
    buffers = dict(module.named_buffers())
    return all(bool((mask == buffers[f"{name}_mask"].bool()).all()) for name, mask in masks.items())


def _indent(text: str) -> str:
    return "\n".join("     " + line for line in text.splitlines())


def tutorial() -> None:
    """Steps 1-4: the tutorial's pruning calls as plans, checked against torch."""
    torch.manual_seed(0)
    model = LeNet()
    reference = copy.deepcopy(model)
    params = _params(model)
    print("1. Pruning conv1 (random 30% of the weight, the 3 smallest biases, then Ln on top)")
    first = Plan({"conv1.weight": RandomUnstructured(0.3), "conv1.bias": L1Unstructured(3)})
    torch.manual_seed(1)
    masks = first(params)
    print(f"   {first}\n{_indent(str(sparsity_report(masks)))}")
    print(f"   conv1.bias kept: {masks['conv1.bias'].tolist()}")
    second = Plan({"conv1.weight": LnStructured(0.5, n=2, dim=0)})
    masks = second(params, masks)
    kept = masks["conv1.weight"].flatten(1).any(1).tolist()
    print(f"   then {second}: channels kept {kept}")
    torch.manual_seed(1)
    torch_prune.random_unstructured(reference.conv1, "weight", amount=0.3)
    torch_prune.l1_unstructured(reference.conv1, "bias", amount=3)
    torch_prune.ln_structured(reference.conv1, "weight", amount=0.5, n=2, dim=0)
    print(f"   same masks as torch.nn.utils.prune: {_same_as_torch(masks, reference)}")

    print("2. Pruning many parameters: 20% of conv weights, 40% of linear weights")
    per_layer = Plan({"conv*.weight": L1Unstructured(0.2), "fc*.weight": L1Unstructured(0.4)})
    print(f"   {per_layer}\n{_indent(str(sparsity_report(per_layer(params))))}")

    print("3. Global pruning: the 20% smallest weights of the whole model")
    global20 = global_unstructured(WEIGHTS, L1Unstructured(0.2))
    masks = global20(params)
    print(f"   {global20}\n{_indent(str(sparsity_report(masks)))}")
    reference = copy.deepcopy(model)
    targets = [(reference.get_submodule(n.split(".")[0]), "weight") for n in WEIGHT_NAMES]
    torch_prune.global_unstructured(targets, torch_prune.L1Unstructured, amount=0.2)
    same = _same_as_torch(masks, reference)
    print(f"   same masks as torch.nn.utils.prune.global_unstructured: {same}")

    print("4. A custom spec: prune every other entry of fc3.bias")
    every_other = torch.ones(10, dtype=torch.bool)
    every_other[::2] = False
    masks = Plan({"fc3.bias": CustomFromMask(every_other)})(params)
    print(f"   fc3.bias kept: {masks['fc3.bias'].int().tolist()}")


def _evaluate(
    model: nn.Module, params: Params, masks: Masks, data: tuple[Tensor, Tensor]
) -> tuple[float, float]:
    with torch.no_grad():
        logits = functional_call_masked(model, params, masks, data[0])
        loss = F.cross_entropy(logits, data[1])
        return float(loss), float((logits.argmax(1) == data[1]).float().mean())


def train(rounds: int = 5, steps: int = 60, lr: float = 0.05) -> tuple[float, float]:
    """Step 5: functional SGD with iterative magnitude pruning.

    Returns the final weight sparsity and test accuracy.
    """
    print(f"5. Training with iterative magnitude pruning to ~90% sparsity in {rounds} rounds")
    g = torch.Generator().manual_seed(0)
    train_x, train_y = synthetic_data(4096, g)
    test = synthetic_data(1024, g)
    torch.manual_seed(0)
    model = LeNet()
    params: dict[str, Tensor] = _params(model)
    masks: Masks = {}
    prune_round = global_unstructured(WEIGHTS, L1Unstructured(round(1 - 0.1 ** (1 / rounds), 3)))
    print(f"   round 0 trains the dense model for {2 * steps} SGD steps (lr={lr}, batch 128);")
    print(f"   each later round prunes with {prune_round}")
    print(f"   on top of the masks so far, then fine-tunes for {steps} steps")

    def loss_fn(p: Params, x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(functional_call_masked(model, p, masks, x), y)

    grad_fn = torch.func.grad(loss_fn)
    start = time.perf_counter()
    sparsity = accuracy = 0.0
    print("   round  weight sparsity  accuracy once pruned  test loss  test accuracy    time")
    for r in range(rounds + 1):
        once_pruned = "-"
        if r > 0:
            masks = prune_round(params, masks)
            once_pruned = f"{100 * _evaluate(model, params, masks, test)[1]:.1f}%"
        for _ in range(2 * steps if r == 0 else steps):
            idx = torch.randint(0, len(train_y), (128,), generator=g)
            grads = grad_fn(params, train_x[idx], train_y[idx])  # 0 where pruned
            params = {n: p - lr * grads[n] for n, p in params.items()}
        loss, accuracy = _evaluate(model, params, masks, test)
        sparsity = sparsity_report(masks, params={n: params[n] for n in WEIGHT_NAMES}).fraction
        print(
            f"   {r:>3}/{rounds}  {100 * sparsity:14.1f}%  {once_pruned:>20}  {loss:9.3f}"
            f"  {100 * accuracy:12.1f}%  {time.perf_counter() - start:5.1f} s",
            flush=True,
        )
    return sparsity, accuracy


def ensemble(n_models: int = 8) -> None:
    """Step 6: prune an ensemble of LeNets in one vmapped call, then run it."""
    print(f"6. vmap: pruning an ensemble of {n_models} LeNets in one call")
    torch.manual_seed(0)
    models = [LeNet() for _ in range(n_models)]
    stacked, buffers = torch.func.stack_module_state(models)
    plan = compose(
        Plan({"conv*.weight": RandomUnstructured(0.3), "fc*.weight": L1Unstructured(0.4)}),
        global_unstructured(WEIGHTS, L1Unstructured(0.5)),
    )
    print(
        f"   masks = torch.func.vmap(plan, randomness='different')(stacked) with\n   plan = {plan}"
    )
    masks = torch.func.vmap(lambda p: plan(p), randomness="different")(stacked)
    reports = [sparsity_report({n: m[i] for n, m in masks.items()}) for i in range(n_models)]
    print("   model           " + " ".join(f"{i:>6}" for i in range(n_models)))
    for name in ("conv1.weight", "conv2.weight"):
        print(f"   {name:<15} " + " ".join(f"{100 * r[name].fraction:5.1f}%" for r in reports))
    print("   all weights     " + " ".join(f"{100 * r.fraction:5.1f}%" for r in reports))
    x = synthetic_data(16, torch.Generator().manual_seed(1))[0]
    logits = torch.func.vmap(lambda p, b, m: functional_call_masked(models[0], p, m, x, buffers=b))(
        stacked, buffers, masks
    )
    print(
        f"   the pruned ensemble's logits for 16 images, in one vmapped call: {tuple(logits.shape)}"
    )


def main() -> None:
    """Run the demo: the tutorial's story, training, and an ensemble."""
    start = time.perf_counter()
    # LeNet's ops are too small to gain from a second thread, and they slow
    # down badly when the other core is busy: one thread keeps the run steady.
    torch.set_num_threads(1)
    print("funcprune demo: the PyTorch pruning tutorial, functionally (masks = plan(params))")
    tutorial()
    train()
    ensemble()
    print(f"done in {time.perf_counter() - start:.1f} s")
