"""Models and helpers shared by the tests (the demo keeps its own LeNet)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

Tensor = torch.Tensor

WEIGHTS = ["conv1.weight", "conv2.weight", "fc1.weight", "fc2.weight", "fc3.weight"]


class LeNet(nn.Module):
    """The pruning tutorial's LeNet (LeCun et al., 1998) for 1x28x28 images."""

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


def lenet(seed: int = 0) -> LeNet:
    torch.manual_seed(seed)
    return LeNet()


def params_of(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def torch_masks(module: nn.Module) -> dict[str, torch.Tensor]:
    """The ``<name>_mask`` buffers torch left, keyed ``<name>``, as bool."""
    return {n[: -len("_mask")]: b.bool() for n, b in module.named_buffers() if n.endswith("_mask")}


def same_masks(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> bool:
    return ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def targets(module: nn.Module, names: list[str]) -> list[tuple[nn.Module, str]]:
    return [(module.get_submodule(n.rsplit(".", 1)[0]), n.rsplit(".", 1)[1]) for n in names]


# --- weights stored (in, out): transformers' Conv1D -------------------------------


class Conv1D(nn.Module):
    """transformers' ``Conv1D`` (GPT-2's Linear layers), copied so that these tests need no transformers.

    ``y = x @ weight + bias`` with ``weight`` stored ``(nx, nf)``: (in, out).
    funcprune recognizes it by its class name, ``nf`` and weight shape, as
    it recognizes transformers' own (the tests on GPT-2 check that one).
    """

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = nn.Parameter(torch.randn(nx, nf))
        self.bias = nn.Parameter(torch.randn(nf))

    def forward(self, x: Tensor) -> Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], self.nf)


def as_linear(layer: Conv1D) -> nn.Linear:
    """The Linear computing what ``layer`` computes: its weight transposed, ``(out, in)``."""
    linear = nn.Linear(layer.nx, layer.nf)
    with torch.no_grad():
        linear.weight.copy_(layer.weight.T)
        linear.bias.copy_(layer.bias)
    return linear


class MiniGPT(nn.Module):
    """A GPT-2-like language model: token embedding, a Conv1D MLP block, a head tied to the embedding."""

    def __init__(self, vocab: int = 16, width: int = 8, hidden: int = 8, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.wte = nn.Embedding(vocab, width)
        self.c_fc = Conv1D(hidden, width)  # square when hidden == width
        self.c_proj = Conv1D(width, hidden)
        self.ln = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids: Tensor) -> Tensor:
        x = self.wte(ids)
        x = x + self.c_proj(torch.relu(self.c_fc(x)))
        out: Tensor = self.lm_head(self.ln(x))
        return out
