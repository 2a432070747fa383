"""Random small float64 models for the units fuzzers (issue 36): MLPs and CNNs with residual adds,
concatenations, channel shuffles, ``chunk`` into halves, depthwise convolutions and BatchNorm.

:func:`random_net` draws a :class:`NetPlan` from a :class:`random.Random` and builds it; the plan's
``repr`` describes the model, so that a failing case can be read and rebuilt from its seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Tensor = torch.Tensor

ACTS = ("relu", "tanh", "none")


def act(kind: str, h: Tensor) -> Tensor:
    return F.relu(h) if kind == "relu" else torch.tanh(h) if kind == "tanh" else h


def shuffle(h: Tensor, groups: int, conv: bool) -> Tensor:
    """torchvision's ``channel_shuffle`` along the channels (dim 1 of a conv net, the last dim of an MLP)."""
    if conv:
        b, c, height, width = h.size()
        h = h.view(b, groups, c // groups, height, width).transpose(1, 2).contiguous()
        return h.view(b, c, height, width)
    b, c = h.size()
    return h.view(b, groups, c // groups).transpose(1, 2).reshape(b, c)


@dataclass(frozen=True)
class NetPlan:
    """What :class:`RandomNet` builds.

    Attributes:
        conv: a conv net (inputs ``(B, C, S, S)``), else an MLP (``(B, F)``).
        input_shape: the inputs' shape.
        layers: ``(name, cin, cout, kernel, bias, groups)``; ``kernel == 0``: a Linear.
        norms: ``(name, channels, conv)``: BatchNorm2d or BatchNorm1d.
        ops: what ``forward`` does, in order: ``("layer", name, act)``,
            ``("residual", name, act)`` (``act(h + layer(h))``), ``("cat", a, b)``,
            ``("norm", name)``, ``("shuffle", groups)``, ``("chunk", name, act)``
            (ShuffleNet's block: ``x1, x2 = h.chunk(2)``, ``cat(x1, act(layer(x2)))``),
            ``("pool",)`` and ``("flatten",)`` (a conv net's features into a Linear).
        seed: the seed of the parameters.
    """

    conv: bool
    input_shape: tuple[int, ...]
    layers: tuple[tuple[str, int, int, int, bool, int], ...]
    norms: tuple[tuple[str, int, bool], ...]
    ops: tuple[tuple[Any, ...], ...]
    seed: int

    def __repr__(self) -> str:
        def layer(spec: tuple[str, int, int, int, bool, int]) -> str:
            name, cin, cout, kernel, bias, groups = spec
            kind = "lin" if kernel == 0 else f"conv{kernel}" + (f"g{groups}" if groups > 1 else "")
            return f"{name}:{kind}({cin}->{cout}{'' if bias else ',nobias'})"

        ops = " ".join(":".join(str(p) for p in op) for op in self.ops)
        return f"{'conv' if self.conv else 'mlp'} in={self.input_shape} layers=[{', '.join(map(layer, self.layers))}] ops=[{ops}]"


class RandomNet(nn.Module):
    """The model of a :class:`NetPlan` (float64, eval mode, BatchNorm away from its defaults)."""

    def __init__(self, plan: NetPlan) -> None:
        super().__init__()
        self.plan = plan
        self.layers = nn.ModuleDict()
        for name, cin, cout, kernel, bias, groups in plan.layers:
            if kernel == 0:
                self.layers[name] = nn.Linear(cin, cout, bias=bias, dtype=torch.float64)
            else:
                self.layers[name] = nn.Conv2d(cin, cout, kernel, padding=kernel // 2, bias=bias, groups=groups,
                                              dtype=torch.float64)  # fmt: skip
        self.norms = nn.ModuleDict()
        for name, channels, conv in plan.norms:
            norm = (nn.BatchNorm2d if conv else nn.BatchNorm1d)(channels, dtype=torch.float64)
            with torch.no_grad():
                for t, low, high in ((norm.weight, 0.5, 1.5), (norm.bias, -0.5, 0.5),
                                     (norm.running_mean, -0.5, 0.5), (norm.running_var, 0.5, 2.0)):  # fmt: skip
                    assert t is not None
                    t.uniform_(low, high)
            self.norms[name] = norm

    def forward(self, x: Tensor) -> Tensor:
        conv, h = self.plan.conv, x
        dim = 1 if conv else -1
        for op in self.plan.ops:
            kind = op[0]
            if kind == "layer":
                h = act(op[2], self.layers[op[1]](h))
            elif kind == "residual":
                h = act(op[2], h + self.layers[op[1]](h))
            elif kind == "cat":
                h = torch.cat([self.layers[op[1]](h), self.layers[op[2]](h)], dim=dim)
            elif kind == "norm":
                h = self.norms[op[1]](h)
            elif kind == "shuffle":
                h = shuffle(h, op[1], conv)
            elif kind == "chunk":
                x1, x2 = h.chunk(2, dim=dim)
                h = torch.cat([x1, act(op[2], self.layers[op[1]](x2))], dim=dim)
            elif kind == "pool":
                h, conv, dim = h.mean((2, 3)), False, -1
            elif kind == "flatten":
                h, conv, dim = h.flatten(1), False, -1
            else:
                raise AssertionError(op)
        return h


def random_plan(rng: random.Random, *, shuffles: bool = True) -> NetPlan:
    """A random small :class:`NetPlan` (``shuffles``: with channel shuffles and chunks)."""
    conv = rng.random() < 0.5
    c = rng.randint(1, 4) if conv else rng.randint(2, 6)
    size = rng.randint(2, 4)
    input_shape = (2, c, size, size) if conv else (2, c)
    layers: list[tuple[str, int, int, int, bool, int]] = []
    norms: list[tuple[str, int, bool]] = []
    ops: list[tuple[Any, ...]] = []
    is_conv = conv

    def new(cin: int, cout: int, groups: int = 1) -> str:
        kernel = 3 if groups > 1 else rng.choice([1, 3]) if is_conv else 0
        name = f"l{len(layers)}"
        layers.append((name, cin, cout, kernel, rng.random() < 0.7, groups))
        return name

    def block() -> None:
        nonlocal c
        even = c % 2 == 0
        divisors = [g for g in range(2, c + 1) if c % g == 0 and g < c]
        what = rng.choices(
            ["layer", "residual", "cat", "norm", "depthwise", "shuffle", "chunk"],
            weights=[30, 12, 14, 10, 8 if is_conv else 0, 14 if shuffles and divisors else 0,
                     14 if shuffles and even else 0],
        )[0]  # fmt: skip
        if what == "layer":
            cout = rng.randint(2, 8)
            ops.append(("layer", new(c, cout), rng.choice(ACTS)))
            c = cout
        elif what == "residual":
            ops.append(("residual", new(c, c), rng.choice(ACTS)))
        elif what == "cat":
            a, b = rng.randint(1, 4), rng.randint(1, 4)
            ops.append(("cat", new(c, a), new(c, b)))
            c = a + b
        elif what == "norm":
            name = f"n{len(norms)}"
            norms.append((name, c, is_conv))
            ops.append(("norm", name))
        elif what == "depthwise":
            ops.append(("layer", new(c, c, groups=c), rng.choice(ACTS)))
        elif what == "shuffle":
            ops.append(("shuffle", rng.choice(divisors)))
        else:
            ops.append(("chunk", new(c // 2, c // 2), rng.choice(ACTS)))

    for _ in range(rng.randint(2, 5)):
        block()
    if conv and rng.random() < 0.7:
        if rng.random() < 0.5:
            ops.append(("flatten",))
            c *= size * size
        else:
            ops.append(("pool",))
        is_conv = False
        for _ in range(rng.randint(0, 2)):
            block()
    ops.append(("layer", new(c, rng.randint(1, 3)), "none"))
    return NetPlan(conv, input_shape, tuple(layers), tuple(norms), tuple(ops), rng.randrange(2**31))


def build(plan: NetPlan) -> RandomNet:
    """The model of ``plan``, in eval mode."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(plan.seed)
        return RandomNet(plan).eval()


def random_net(rng: random.Random, *, shuffles: bool = True) -> tuple[NetPlan, RandomNet, Tensor, Tensor]:
    """A random model, its plan, example inputs and other inputs of the same shape (float64)."""
    plan = random_plan(rng, shuffles=shuffles)
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    x, other = (torch.randn(plan.input_shape, generator=g, dtype=torch.float64) for _ in range(2))
    return plan, build(plan), x, other
