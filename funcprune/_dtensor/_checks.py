"""Checks before any work: DTensors laid out as their parameters, and modules whose parameters FSDP2 gathers.

Every process decides alike from layouts alone (no values read), so that
none is left waiting in a collective another one skipped.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import torch
from torch import nn

from .._types import Tensor, is_dtensor
from ._layout import shown

__all__ = ["check_layouts", "check_like", "check_not_fsdp"]


def check_layouts(
    fn: str, params: Mapping[str, Tensor], masks: object, scores: object = None, *, bool_masks: bool = True
) -> None:
    """Refuse masks and scores laid out otherwise than their parameters.

    A DTensor parameter takes masks and scores that are DTensors of its mesh
    and placements; a plain one takes plain ones. With ``bool_masks``, a
    DTensor mask must be ``torch.bool``: checking that numbers are 0 and 1
    would read this process's block only (a ``Partial`` reduction), and
    processes that decide differently hang. Entries that are not tensors,
    or name no parameter, are left to the other checks.

    Raises:
        TypeError: if a DTensor meets a plain tensor, or a DTensor mask is not ``torch.bool``.
        ValueError: if a DTensor's mesh or placements differ from its parameter's.
    """
    for kind, given in (("mask for", masks), ("scores for", scores)):
        if not isinstance(given, Mapping):
            continue
        for name, t in given.items():
            param = params.get(name) if isinstance(name, str) else None
            if isinstance(t, torch.Tensor) and isinstance(param, torch.Tensor):
                check_like(fn, f"the {kind} {name!r}", t, "the parameter", param)
                if kind == "mask for" and bool_masks and is_dtensor(t) and t.dtype != torch.bool:
                    raise TypeError(
                        f"{fn}: the mask for {name!r} is a DTensor of dtype {t.dtype}; DTensor masks "
                        "must be torch.bool (funcprune's are): checking that numbers are 0 and 1 "
                        "would read one process's block only; convert it with `mask != 0`"
                    )


def check_like(fn: str, what: str, t: Tensor, like: str, other: Tensor) -> None:
    """Refuse ``t`` unless it is laid out as ``other``: both plain, or DTensors of one mesh and placements.

    Raises:
        TypeError: if one is a DTensor and the other not.
        ValueError: if their meshes or placements differ.
    """
    if is_dtensor(other) and is_dtensor(t):
        if t.device_mesh != other.device_mesh or tuple(t.placements) != tuple(other.placements):
            raise ValueError(
                f"{fn}: {what} is laid out as {shown(t.placements, t.device_mesh)} but {like} as "
                f"{shown(other.placements, other.device_mesh)}; they must have the same mesh and "
                "placements (funcprune never redistributes: call .redistribute(mesh, placements) "
                "yourself if you mean to pay for it)"
            )
    elif is_dtensor(other) or is_dtensor(t):
        kinds = ("a DTensor", "a plain torch.Tensor") if is_dtensor(t) else ("a plain torch.Tensor", "a DTensor")
        raise TypeError(
            f"{fn}: {what} is {kinds[0]} but {like} is {kinds[1]}; give both as DTensors with the "
            "same mesh and placements (as funcprune returns masks), or neither"
        )


def check_not_fsdp(fn: str, module: nn.Module) -> None:
    """Refuse a module tree holding an FSDP2 module: ``functional_call`` cannot replace its parameters.

    FSDP2's pre-forward hook all-gathers the module's own sharded parameters
    into place, so the tensors that :func:`torch.func.functional_call`
    passes are silently ignored.
    """
    fsdp = sys.modules.get("torch.distributed.fsdp")
    kind = getattr(fsdp, "FSDPModule", None)
    if kind is None:
        return  # never imported: no module can be one
    for name, sub in module.named_modules():
        if isinstance(sub, kind):
            where = "module" if not name else f"module.{name}"
            raise TypeError(
                f"{fn}: {where} is an FSDP2 module (fully_shard): its forward gathers its own "
                "parameters and ignores those functional_call passes, so the masks would silently "
                "not apply; train it in place instead: fp.mask_gradients_(params, masks) after "
                "backward(), optimizer.step(), then fp.apply_masks_(params, masks)"
            )
