"""Building a smaller copy of a model: what each tensor keeps once groups go, the masked model's outputs, the copy.

:func:`removing` turns the groups that go into the indices each tensor keeps
and the closure of the masks; :func:`masked_outputs` is what the masked
model computes on the example inputs (pruned entries ``+0.0``, removed
experts never routed to); :func:`built` makes the copy, the closure applied
and the tensors cut, and says which size attributes changed. A probe's copy
(run once and thrown away) shares the model's tensors instead of copying
them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import Any

import torch
from torch import nn

from .._experts import Router, never_routed
from .._graph import Analysis, Inputs, closure, copy_module, kept_indices
from .._types import Masks, Tensor
from ._config import Record
from ._resize import resize_modules

__all__ = [
    "built", "keeps_all", "masked_outputs", "masked_run", "removing", "tensor_shapes", "zero_pruned_", "zeroed", "zeroed_",
]  # fmt: skip


def tensor_shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    tensors = [*module.named_parameters(), *module.named_buffers()]
    return {name: tuple(t.shape) for name, t in tensors}


def removing(
    analysis: Analysis, masks: Mapping[str, Tensor], removed: Sequence[int], sizes: Mapping[str, tuple[int, ...]]
) -> tuple[dict[str, dict[int, list[int]]], Masks]:
    """What each tensor keeps once ``removed`` go, and the closure of ``masks`` that says it."""
    keep = kept_indices(analysis, removed, sizes)
    return keep, closure(masks, keep, dict(analysis.model.named_parameters()))


def masked_outputs(analysis: Analysis, closed: Masks) -> Any:
    """What the masked model (``closed``, a closure) computes on the example inputs, removed experts never routed to."""
    return masked_run(analysis.model, closed, analysis.inputs, [layer.router for layer in analysis.experts])


def masked_run(module: nn.Module, masks: Mapping[str, Tensor], inputs: Inputs, routers: Sequence[Router] = ()) -> Any:
    """What ``module`` masked by ``masks`` computes on ``inputs``, in eval mode (its modes restored after).

    Pruned entries are ``+0.0``, as the shrunk model holds them, bound through
    :func:`torch.func.functional_call` (nothing copied but the masked
    tensors); the experts of ``routers`` that the masks remove are never
    routed to.
    """
    params = dict(module.named_parameters())
    baked = {name: zeroed(params[name], mask) for name, mask in masks.items() if not keeps_all(mask)}
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad(), never_routed(module, masks, list(routers)):
            return torch.func.functional_call(module, baked, tuple(inputs.args), dict(inputs.kwargs))
    finally:
        for m, mode in modes:
            m.training = mode


def built(
    module: nn.Module, analysis: Analysis, keep: Mapping[str, Mapping[int, list[int]]], closed: Masks,
    removed: Sequence[int], *, probe: bool = False, masked: Set[str] | None = None,
) -> tuple[nn.Module, Record]:  # fmt: skip
    """A copy of ``module`` without ``removed`` (``keep``), the closure applied; and the size attributes that changed.

    A ``probe`` (a copy only run and thrown away, and checked) shares
    ``module``'s parameters and buffers instead of copying them, and gets
    new tensors where the masks zero entries that stay: only the tensors
    ``masked`` names (those of the masks the closure was made from; all of
    ``closed`` if ``None``), since the closure adds zeros only at the
    indices that go, which the copy cuts. A 1B model's trial costs what it
    changes.
    """
    sharing = [*module.parameters(), *module.buffers()] if probe else []
    result = copy_module("shrink", module, sharing=sharing)
    if probe:
        zeroed_(result, closed if masked is None else {n: m for n, m in closed.items() if n in masked})
    else:
        zero_pruned_(result, closed)
    return result, resize_modules(result, keep, analysis, set(removed))


@torch.no_grad()
def zeroed_(module: nn.Module, masks: Masks) -> None:
    """:func:`zero_pruned_` without writing into the tensors: each masked parameter of ``module`` (every name
    of a tied one) is replaced by a new one, so that tensors ``module`` shares with another are left as they are."""
    params = dict(module.named_parameters(remove_duplicate=False))
    aliases: dict[int, list[str]] = {}
    for name, param in params.items():
        aliases.setdefault(id(param), []).append(name)
    for name, mask in masks.items():
        if keeps_all(mask):  # nothing pruned: the tensor as it is (no copy of a 1B model's weights for nothing)
            continue
        old = params[name]
        new = nn.Parameter(zeroed(old, mask), old.requires_grad)
        for alias in aliases[id(old)]:
            owner, _, attr = alias.rpartition(".")
            setattr(module.get_submodule(owner), attr, new)


def keeps_all(mask: Tensor) -> bool:
    """Whether ``mask`` keeps every entry. A bool tensor's bytes are 0 or 1: its least byte, read once, tells,
    about 15x as fast as ``mask.all()`` here (on a 5632 x 2048 mask, 1 thread)."""
    if mask.dtype != torch.bool or mask.numel() == 0:
        return bool(mask.all())
    return int(mask.reshape(-1).view(torch.uint8).min()) == 1


def zeroed(tensor: Tensor, mask: Tensor) -> Tensor:
    """A new ``tensor`` with ``+0.0`` where ``mask`` prunes (also where it holds ``nan``), as ``masked_fill(~mask,
    0.0)`` gives it, without the inverted mask."""
    return torch.where(mask, tensor, torch.zeros((), dtype=tensor.dtype, device=tensor.device))


@torch.no_grad()
def zero_pruned_(module: nn.Module, masks: Masks) -> None:
    """Write ``+0.0`` into the pruned entries of ``module`` (a copy: nobody else holds it).

    As :func:`~funcprune.bake` does: ``+0.0`` even where a weight is ``nan`` or ``inf``.
    """
    params = dict(module.named_parameters())
    for name, mask in masks.items():
        params[name].masked_fill_(~mask, 0.0)
