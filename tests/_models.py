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


# --- ShuffleNet v2, as torchvision writes it (random weights; no torchvision needed) -----------------


def channel_shuffle(x: Tensor, groups: int) -> Tensor:
    """torchvision's ``channel_shuffle``: a view into groups, a transpose, a view back."""
    batchsize, num_channels, height, width = x.size()
    channels_per_group = num_channels // groups
    x = x.view(batchsize, groups, channels_per_group, height, width)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(batchsize, num_channels, height, width)


class InvertedResidual(nn.Module):
    """torchvision's ShuffleNet v2 block: ``chunk`` (stride 1) or two branches, ``cat``, ``channel_shuffle``."""

    def __init__(self, inp: int, oup: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        branch_features = oup // 2
        assert stride > 1 or inp == branch_features << 1
        if stride > 1:
            self.branch1 = nn.Sequential(
                self.depthwise_conv(inp, inp, kernel_size=3, stride=stride, padding=1),
                nn.BatchNorm2d(inp),
                nn.Conv2d(inp, branch_features, kernel_size=1, stride=1, padding=0, bias=False),
                nn.BatchNorm2d(branch_features),
                nn.ReLU(inplace=True),
            )
        else:
            self.branch1 = nn.Sequential()
        self.branch2 = nn.Sequential(
            nn.Conv2d(inp if stride > 1 else branch_features, branch_features, kernel_size=1, stride=1, padding=0,
                      bias=False),
            nn.BatchNorm2d(branch_features),
            nn.ReLU(inplace=True),
            self.depthwise_conv(branch_features, branch_features, kernel_size=3, stride=stride, padding=1),
            nn.BatchNorm2d(branch_features),
            nn.Conv2d(branch_features, branch_features, kernel_size=1, stride=1, padding=0, bias=False),
            nn.BatchNorm2d(branch_features),
            nn.ReLU(inplace=True),
        )  # fmt: skip

    @staticmethod
    def depthwise_conv(i: int, o: int, kernel_size: int, stride: int = 1, padding: int = 0) -> nn.Conv2d:
        return nn.Conv2d(i, o, kernel_size, stride, padding, bias=False, groups=i)

    def forward(self, x: Tensor) -> Tensor:
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    """torchvision's ShuffleNet v2 (``shufflenet_v2_x0_5`` is ``([4, 8, 4], [24, 48, 96, 192, 1024])``)."""

    def __init__(self, stages_repeats: list[int], stages_out_channels: list[int], num_classes: int = 1000) -> None:
        super().__init__()
        input_channels, output_channels = 3, stages_out_channels[0]
        self.conv1 = nn.Sequential(
            nn.Conv2d(input_channels, output_channels, 3, 2, 1, bias=False),
            nn.BatchNorm2d(output_channels),
            nn.ReLU(inplace=True),
        )
        input_channels = output_channels
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.stage2: nn.Sequential
        self.stage3: nn.Sequential
        self.stage4: nn.Sequential
        for name, repeats, output_channels in zip(["stage2", "stage3", "stage4"], stages_repeats, stages_out_channels[1:]):
            seq = [InvertedResidual(input_channels, output_channels, 2)]
            seq += [InvertedResidual(output_channels, output_channels, 1) for _ in range(repeats - 1)]
            setattr(self, name, nn.Sequential(*seq))
            input_channels = output_channels
        output_channels = stages_out_channels[-1]
        self.conv5 = nn.Sequential(
            nn.Conv2d(input_channels, output_channels, 1, 1, 0, bias=False),
            nn.BatchNorm2d(output_channels),
            nn.ReLU(inplace=True),
        )
        self.fc = nn.Linear(output_channels, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.conv1(x))
        x = self.stage4(self.stage3(self.stage2(x)))
        x = self.conv5(x).mean([2, 3])  # globalpool
        out: Tensor = self.fc(x)
        return out


def shufflenet(seed: int = 0, dtype: torch.dtype = torch.float64) -> tuple[ShuffleNetV2, Tensor]:
    """A small ShuffleNet v2 in eval mode, BatchNorm statistics and affine parameters away from their
    defaults, and inputs for it (two 32x32 images)."""
    torch.manual_seed(seed)
    model = ShuffleNetV2([2, 3, 2], [8, 16, 32, 64, 128], num_classes=10).to(dtype).eval()
    x = torch.randn(2, 3, 32, 32, dtype=dtype)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                assert m.running_mean is not None and m.running_var is not None
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return model, x
