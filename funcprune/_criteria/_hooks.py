"""The weights whose inputs are observed, and the forward pre-hooks that sum a statistic of them.

A :class:`Statistic` says what to sum of each input's ``(tokens, features)``
rows; :func:`target_of` resolves a weight name to the module whose inputs
carry its features (a Linear, transformers' ``Conv1D``, a Conv with
``groups=1``); :func:`collector` is the hook that adds each input's
statistic to the sums, padding left out, shared by modules fed the same
unchanged tensor (:class:`Running`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, final

import torch
from torch import nn

from .._names import not_a_parameter
from .._types import Tensor, is_conv1d

__all__ = ["Running", "Statistic", "Target", "check_names", "collector", "holder", "target_of"]


@final
@dataclass(frozen=True, slots=True)
class Statistic:
    """What is summed over the tokens reaching a weight's module.

    ``part(x)`` maps an input's ``(tokens, features)`` rows (in the summing
    dtype) to this call's contribution; ``shape(features)`` is the sum's
    shape. ``linear_only``: defined for Linear and ``Conv1D`` weights only.
    ``narrow_in_float64``: the sums of inputs narrower than ``float32`` are
    returned in ``float64`` (in ``float32`` otherwise). ``finish``, if
    given, maps each total before that cast (the norms' square root, taken
    while a ``bfloat16`` input's large sums still fit).
    """

    part: Callable[[Tensor], Tensor]
    shape: Callable[[int], tuple[int, ...]]
    linear_only: bool
    narrow_in_float64: bool
    finish: Callable[[Tensor], Tensor] | None = None


@final
@dataclass(frozen=True, slots=True)
class Target:
    """A weight whose inputs are collected: its name, its module, where its features are and how many."""

    name: str
    path: str
    owner: nn.Module
    #: The dim of an input that holds the features, counted from the end
    #: (so that unbatched inputs work too): -1 for Linear and Conv1D, -(k + 1)
    #: for a Conv with a k-dim kernel.
    feature_dim: int
    #: How many input features the module has.
    features: int
    #: The shape of a per-feature result (norms): ``(features,)``, or ``(features, 1)``
    #: for a weight stored ``(in, out)`` (Conv1D), so that they broadcast
    #: against the weight as stored.
    shape: tuple[int, ...]


def holder(path: str) -> str:
    """A module by its path, for messages: ``'blocks.0.fc'``, or the module itself."""
    return f"the module {path!r}" if path else "the module itself"


def check_names(fn: str, names: object) -> list[str]:
    """``names`` as a list of str, refusing a bare str or anything else with an error naming the argument."""
    if isinstance(names, str):
        raise TypeError(f"{fn}: names must be a list of parameter names, got the str {names!r}; "
                        f"write [{names!r}]")  # fmt: skip
    if not isinstance(names, Iterable):
        raise TypeError(
            f"{fn}: names must be a list of parameter names, got {type(names).__name__}"
        )
    checked = list(names)
    for i, name in enumerate(checked):
        if not isinstance(name, str):
            raise TypeError(f"{fn}: names[{i}] must be a str, got {type(name).__name__}")
    return checked


def target_of(fn: str, module: nn.Module, name: str, statistic: Statistic) -> Target:
    """Resolve ``name`` to its owner and check that ``statistic`` is defined on its inputs."""
    params = dict(module.named_parameters())
    if name not in params:
        raise not_a_parameter(fn, module, name, params)
    path, _, attr = name.rpartition(".")
    owner = module.get_submodule(path)
    where = f"{name!r} belongs to {holder(path)}, of type {type(owner).__name__}"
    supported = (
        f"{fn} supports the weight of nn.Linear and of transformers' Conv1D"
        if statistic.linear_only
        else f"{fn} supports the weight of nn.Linear and of nn.Conv1d/2d/3d with groups=1, "
        "and of transformers' Conv1D"
    )
    if attr == "weight" and is_conv1d(owner):  # x @ W, W stored (in, out)
        features = params[name].shape[0]
        return Target(name, path, owner, -1, features, (features, 1))
    if attr == "weight" and isinstance(owner, nn.Linear):
        return Target(name, path, owner, -1, owner.in_features, (owner.in_features,))
    if attr != "weight" or statistic.linear_only or not isinstance(owner, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        raise ValueError(f"{fn}: {where}; {supported}")
    if owner.groups != 1:
        raise ValueError(
            f"{fn}: {where} with groups={owner.groups}: its weight's dim 1 counts the input "
            f"channels of one group, not all {owner.in_channels}; {supported}"
        )
    features = owner.in_channels
    return Target(name, path, owner, -(len(owner.kernel_size) + 1), features, (features,))


@dataclass(slots=True)
class Running:
    """The call running: its real tokens, and the last input a hook summed with what it gave.

    Modules fed the same input tensor in one call (a block's query, key and
    value projections) share its statistic instead of computing it again,
    as long as the tensor was not changed in place in between (``x +=
    fc1(x)``, ``relu_()``, through a view of it): its version counter,
    recorded with the statistic, tells (:meth:`reuses`).
    """

    tokens: Tensor | None = None
    seen: Tensor | None = None
    version: int = 0
    dim: int = 0
    part: Tensor | None = None

    def forget(self) -> None:
        self.seen = self.part = None

    def reuses(self, x: Tensor, dim: int) -> Tensor | None:
        """The statistic summed for ``x`` (features in ``dim``) if ``x`` is unchanged since, else ``None``."""
        if self.seen is not x or self.dim != dim or self.part is None:
            return None
        version = _version(x)
        return self.part if version is not None and version == self.version else None

    def record(self, x: Tensor, dim: int, part: Tensor) -> None:
        """Remember ``part`` as the statistic of ``x`` as it is now, if its changes can be told (:func:`_version`)."""
        version = _version(x)
        if version is None:
            self.forget()
        else:
            self.seen, self.version, self.dim, self.part = x, version, dim, part


def _version(x: Tensor) -> int | None:
    """``x``'s version counter, which every in-place change to it or to a view of it bumps.

    ``None`` for an inference tensor (made under ``inference_mode``), which
    has no counter: its statistic is never reused. A write that bypasses
    the counter (through ``x.data``, or NumPy's view of the memory) is not
    seen, as autograd does not see it either.
    """
    return None if x.is_inference() else x._version


def collector(
    fn: str,
    target: Target,
    sums: dict[str, Tensor],
    wide: set[str],
    statistic: Statistic,
    current: Running,
) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], None]:
    """A forward pre-hook adding ``statistic`` of each input of ``target``'s module to ``sums``."""

    def hook(owner: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            got = f"dtype {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(f"{fn}: the input of {holder(target.path)} must be a floating-point "
                            f"tensor, got {got}")  # fmt: skip
        features = target.features
        if x.dim() < -target.feature_dim or x.shape[target.feature_dim] != features:
            raise ValueError(
                f"{fn}: {holder(target.path)} received an input of shape {tuple(x.shape)}; "
                f"expected its {features} input features in dim {target.feature_dim}"
            )
        part = current.reuses(x, target.feature_dim)  # the same input as the module before, unchanged
        if part is None:  # (q, k and v; gate and up share theirs: summed once)
            part = statistic.part(_rows(fn, target, x, current.tokens))
            current.record(x, target.feature_dim, part)
        sums[target.name] = sums[target.name] + part if target.name in sums else part
        if x.dtype == torch.float64:
            wide.add(target.name)

    return hook


def _rows(fn: str, target: Target, x: Tensor, tokens: Tensor | None) -> Tensor:
    """``x`` as ``(tokens, features)`` rows in the summing dtype, padding left out.

    Inputs narrower than ``float32`` are summed in ``float64`` (a
    ``float16`` square overflows past 255), the others in their dtype.
    """
    dtype = torch.float64 if x.dtype.itemsize < 4 else x.dtype
    x = x.detach()
    if x.dim() + target.feature_dim != x.dim() - 1:  # a Conv's channels: moved last
        x = x.movedim(x.dim() + target.feature_dim, -1)
    rows = x.reshape(-1, target.features)
    if tokens is not None:
        if _squeezed(x.shape[:-1]) == _squeezed(tokens.shape) and rows.shape[0] == tokens.numel():
            rows = rows[tokens.reshape(-1).to(rows.device)]  # dims of size 1 apart (MLA's (batch, 1, tokens, ...))
        elif x.dim() == 2 and rows.shape[0] == tokens.numel():  # a flattened (batch * tokens, features) input
            rows = rows[tokens.reshape(-1).to(rows.device)]
        elif tuple(x.shape[:-1]) == tuple(tokens.shape[:1]):  # one row per sequence (a pooler's): all count
            pass
        else:
            raise ValueError(
                f"{fn}: {holder(target.path)} received an input of shape {tuple(x.shape)}, whose "
                f"tokens do not match the batch's attention_mask of shape {tuple(tokens.shape)}, so "
                "its padding cannot be left out; leave this weight out of names, or pass batches "
                "without an attention_mask (every token then counts)"
            )
    return rows.to(dtype)


def _squeezed(shape: Sequence[int]) -> tuple[int, ...]:
    """A shape without its dims of size 1 (they do not change the order of the entries)."""
    return tuple(n for n in shape if n != 1)
