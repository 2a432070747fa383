"""The torch.nn.utils.prune reference that the parity tests compare against."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.utils.prune as tprune
from torch import nn

import funcprune as fp


def torch_method(spec: fp.Spec) -> tprune.BasePruningMethod:
    """torch's pruning-method object equivalent to a leaf funcprune spec."""
    match spec:
        case fp.Identity():
            return tprune.Identity()
        case fp.RandomUnstructured(amount=int() | float() as amount):
            return tprune.RandomUnstructured(amount)
        case fp.L1Unstructured(amount=int() | float() as amount):
            return tprune.L1Unstructured(amount)
        case fp.RandomStructured(amount=int() | float() as amount, dim=dim):
            return tprune.RandomStructured(amount, dim)
        case fp.LnStructured(amount=int() | float() as amount, n=n, dim=dim):
            return tprune.LnStructured(amount, n, dim)
        case fp.CustomFromMask(mask=mask):
            return tprune.CustomFromMask(mask.float())
    raise TypeError(f"no torch equivalent for {spec!r}")


def torch_mask(spec: fp.Spec, scores: torch.Tensor, default_mask: torch.Tensor | None) -> torch.Tensor:
    """The mask torch computes for one leaf spec, folded on ``default_mask``.

    Without a default mask this is the method's own ``compute_mask`` on a mask
    of ones (a first pruning); with one, it is a ``PruningContainer`` folding
    the method on top (a later pruning of the same tensor).
    """
    method = torch_method(spec)
    if default_mask is None:
        first: torch.Tensor = method.compute_mask(scores, default_mask=torch.ones_like(scores))
        return first
    container = tprune.PruningContainer()
    container._tensor_name = "t"
    method._tensor_name = "t"
    container.add_pruning_method(method)
    folded: torch.Tensor = container.compute_mask(scores, default_mask=default_mask.to(scores.dtype))
    return folded


class Holder(nn.Module):
    """A module holding one parameter ``t``, for module-level torch pruning."""

    def __init__(self, t: torch.Tensor) -> None:
        super().__init__()
        self.t = nn.Parameter(t.clone())


def torch_sequential_mask(specs: tuple[fp.Spec, ...], t: torch.Tensor) -> torch.Tensor:
    """``weight_mask`` after applying each spec in turn to a module holding ``t``."""
    module = Holder(t)
    for spec in specs:
        type(torch_method(spec)).apply(module, "t", **_apply_kwargs(spec))
    mask: torch.Tensor = getattr(module, "t_mask", torch.ones_like(t))
    return mask


def _apply_kwargs(spec: fp.Spec) -> dict[str, Any]:
    match spec:
        case fp.Identity():
            return {}
        case fp.RandomUnstructured(amount=amount) | fp.L1Unstructured(amount=amount):
            return {"amount": amount}
        case fp.RandomStructured(amount=int() | float() as amount, dim=dim):
            return {"amount": amount, "dim": dim}
        case fp.LnStructured(amount=int() | float() as amount, n=n, dim=dim):
            return {"amount": amount, "n": n, "dim": dim}
        case fp.CustomFromMask(mask=mask):
            return {"mask": mask.float()}
    raise TypeError(f"no torch equivalent for {spec!r}")
