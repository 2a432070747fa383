"""Shared models and comparisons for the compat tests.

Parity tests run the same steps with ``torch.nn.utils.prune`` and with
``funcprune.compat`` on twin modules under the same seed, then compare what a
user can observe with the helpers below.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
import torch.nn.utils.prune as tp
from torch import nn

import funcprune.compat as cp
from _models import LeNet as LeNet

Tensor = torch.Tensor

#: The two implementations, by a short name used in test ids.
LIBS: dict[str, types.ModuleType] = {"torch": tp, "compat": cp}


class Small(nn.Module):
    """A small model with conv, linear and 1-D parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.fc = nn.Linear(4 * 2 * 2, 5)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc(F.relu(self.conv(x)).flatten(1))
        return out


class TiedLM(nn.Module):
    """A tiny language model whose output layer is tied to its embedding:
    embedding -> linear -> lm_head, with ``lm_head.weight = embedding.weight``."""

    def __init__(self, vocab: int = 11, dim: int = 6) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.linear = nn.Linear(dim, dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embedding.weight

    def forward(self, tokens: Tensor) -> Tensor:
        out: Tensor = self.lm_head(torch.tanh(self.linear(self.embedding(tokens))))
        return out


def twins(factory: Callable[[], nn.Module], seed: int = 0) -> tuple[Any, Any]:
    """Two modules with identical parameters.

    Typed ``Any``: pruning adds attributes (``weight_orig``, ...) at run time.
    """
    torch.manual_seed(seed)
    first = factory()
    torch.manual_seed(seed)
    second = factory()
    return first, second


def distinct(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """A tensor of ``shape`` whose magnitudes are all distinct (no ties), and
    (almost surely) so are the norms of its slices: torch's ``topk`` order on
    ties is unspecified, funcprune prunes the lowest index first."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for size in shape:
        n *= size
    jitter = torch.rand(n, generator=g, dtype=torch.float64) / 2
    values = ((torch.randperm(n, generator=g) + 1 + jitter) / (n + 1)).to(dtype)
    signs = torch.randint(0, 2, (n,), generator=g).to(dtype) * 2 - 1
    return (values * signs).reshape(shape)


def describe_hook(hook: Any) -> Any:
    """The observable description of a pruning hook: type name, tensor name,
    public attributes, and the history of a container."""
    if hook is None:
        return None
    name = type(hook).__name__
    attrs: dict[str, Any] = {}
    for attr in ("amount", "n", "dim"):
        if hasattr(hook, attr):
            attrs[attr] = getattr(hook, attr)
    if hasattr(hook, "mask"):
        attrs["mask"] = hook.mask.tolist()
    history = tuple(describe_hook(m) for m in hook) if isinstance(hook, tp.PruningContainer) else ()
    return (name, getattr(hook, "_tensor_name", None), attrs, history)


def pruning_hooks_by_name(module: nn.Module) -> dict[str, Any]:
    """``{prefix.tensor_name: description}`` of every pruning hook."""
    found: dict[str, Any] = {}
    for prefix, sub in module.named_modules():
        for hook in sub._forward_pre_hooks.values():
            if isinstance(hook, tp.BasePruningMethod):
                key = f"{prefix}.{hook._tensor_name}" if prefix else hook._tensor_name
                found[key] = describe_hook(hook)
    return found


def assert_same_tensor(a: Any, b: Any, what: str = "") -> None:
    assert isinstance(a, Tensor) and isinstance(b, Tensor), (what, type(a), type(b))
    assert a.dtype == b.dtype, (what, a.dtype, b.dtype)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    assert torch.equal(a, b), (what, a, b)


def assert_same_state(a: nn.Module, b: nn.Module) -> None:
    """Everything the tutorial and the API reference let a user observe."""
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert list(pa) == list(pb)
    for name in pa:
        assert_same_tensor(pa[name], pb[name], name)
        assert type(pa[name]) is type(pb[name]), name
    ba, bb = dict(a.named_buffers()), dict(b.named_buffers())
    assert list(ba) == list(bb)
    for name in ba:
        assert_same_tensor(ba[name], bb[name], name)
    assert list(a.state_dict()) == list(b.state_dict())
    assert pruning_hooks_by_name(a) == pruning_hooks_by_name(b)
    for prefix, sub_a in a.named_modules():
        sub_b = b.get_submodule(prefix)
        for hook in sub_a._forward_pre_hooks.values():
            if isinstance(hook, tp.BasePruningMethod):
                name = hook._tensor_name
                assert_same_tensor(getattr(sub_a, name), getattr(sub_b, name), name)
                assert name not in sub_a._parameters and name not in sub_b._parameters
    assert tp.is_pruned(a) == cp.is_pruned(b)


def fingerprint(module: nn.Module) -> list[Any]:
    """Identities and values of everything a pruning call may change."""
    out: list[Any] = []
    for prefix, sub in module.named_modules():
        out.append(prefix)
        out.append([(k, id(p), None if p is None else p.detach().clone()) for k, p in
                    sub._parameters.items()])
        out.append([(k, id(b), None if b is None else b.clone()) for k, b in
                    sub._buffers.items()])
        out.append(sorted(sub._non_persistent_buffers_set))
        out.append([(k, id(h)) for k, h in sub._forward_pre_hooks.items()])
        out.append([tuple(id(m) for m in h) for h in sub._forward_pre_hooks.values()
                    if isinstance(h, tp.PruningContainer)])
        out.append(sorted((k, id(v)) for k, v in vars(sub).items() if isinstance(v, Tensor)))
        flat = vars(sub).get("_flat_weights")
        if isinstance(flat, list):
            out.append([id(w) for w in flat])
    return out


def assert_same_fingerprint(before: list[Any], after: list[Any]) -> None:
    assert len(before) == len(after)
    for x, y in zip(before, after):
        _assert_equal_nested(x, y)


def _assert_equal_nested(x: Any, y: Any) -> None:
    if isinstance(x, Tensor):
        assert isinstance(y, Tensor) and torch.equal(x, y)
    elif isinstance(x, (list, tuple)):
        assert isinstance(y, (list, tuple)) and len(x) == len(y), (x, y)
        for u, v in zip(x, y):
            _assert_equal_nested(u, v)
    else:
        assert x == y, (x, y)


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """``("ok", result)`` or ``(exception type name, normalized message)``."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001 - the point is to compare any failure
        return type(e).__name__, normalize(str(e))


def normalize(message: str) -> str:
    """A message without object addresses and with one name for both modules."""
    message = re.sub(r"0x[0-9a-fA-F]+", "0x?", message)
    return message.replace("funcprune.compat", "torch.nn.utils.prune")
