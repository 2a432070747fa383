"""Tied weights (one :class:`~torch.nn.Parameter` held by several modules).

The pruning functions refuse, before changing anything, to prune a
Parameter another module also holds (:func:`check_untied`), where torch
silently unties it; a cheap exact reference count decides whether a heap
scan is needed (``README.md``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn

from .._types import is_dtensor
from ._holders import holders
from ._pruned import PrunedDeepcopy
from ._state import TorchBase

__all__ = ["User", "check_local", "check_untied", "one_key_per_parameter", "parameter_users"]

Tensor = torch.Tensor


def _count(module: nn.Module, key: str) -> int:
    """The reference count of ``module._parameters[key]``, as seen from here."""
    return sys.getrefcount(module._parameters[key])


@functools.cache
def _baseline(graph: bool) -> int:
    """:func:`_count` of a Parameter that only its own module references.

    Measured once on a throwaway module; with ``graph``, while an autograd
    graph holds the Parameter (torch may then keep one more reference to its
    Python object), as the graph of a pruned attribute ``mask * orig`` does.
    """
    probe = nn.Module()  # not an nn.Linear: its initialization would draw random numbers
    with torch.inference_mode(False), torch.enable_grad():
        weight = nn.Parameter(torch.empty(1))
        probe.register_parameter("weight", weight)
        held = weight * 1.0 if graph else None
        del weight
    count = _count(probe, "weight")
    del held
    return count


def _expected(module: nn.Module, name: str, key: str) -> int:
    """:func:`_count` of ``module._parameters[key]`` if nothing else references it.

    Besides ``module._parameters``, the module itself may reference its
    Parameter: an RNN in its ``_flat_weights`` list, and the pruned attribute
    ``module.<name>`` through its ``__deepcopy__`` and its graph.
    """
    param = module._parameters[key]
    flat = module.__dict__.get("_flat_weights")
    own = sum(weight is param for weight in flat) if isinstance(flat, list) else 0
    pruned = module.__dict__.get(name)
    if not isinstance(pruned, Tensor):
        return _baseline(False) + own
    copier = pruned.__dict__.get("__deepcopy__")
    own += isinstance(copier, PrunedDeepcopy) and copier.orig is param
    grad_fn = pruned.grad_fn
    graph = grad_fn is not None and any(
        getattr(node, "variable", None) is param for node, _ in grad_fn.next_functions
    )
    return _baseline(graph) + own


def _parameter_key(module: nn.Module, name: str) -> str | None:
    """Where ``module`` holds the Parameter called ``name``: ``name`` or ``name_orig``."""
    params = getattr(module, "_parameters", None)
    if not (isinstance(params, dict) and isinstance(name, str)):
        return None  # not a module: the pruning call reports it as torch does
    for key in (name, name + "_orig"):
        if params.get(key) is not None:
            return key
    return None


def check_untied(context: str, pairs: Sequence[tuple[nn.Module, str]]) -> None:
    """Refuse to prune a Parameter that another module (or key) also holds, or a DTensor.

    Args:
        context: the function or method, for the message.
        pairs: the ``(module, name)`` pairs about to be pruned.

    Raises:
        ValueError: if a Parameter of ``pairs`` is tied.
        TypeError: if one is a DTensor (FSDP2, tensor parallelism): hook
            mode's ``name_orig`` and forward pre-hook would fight FSDP2's
            own handling of the parameter (its forward puts the gathered
            parameter back, the mask unapplied).
    """
    check_local(context, pairs)
    suspects: list[tuple[nn.Module, str, str]] = []
    for module, name in pairs:
        key = _parameter_key(module, name)
        if key is None:
            continue  # nothing to prune: the pruning call reports it
        other = _other_key(module, key)
        if other is not None:
            raise _tied_error(context, module, name, module, other)
        if _count(module, key) > _expected(module, name, key):
            suspects.append((module, name, key))
    found = holders([module._parameters[key] for module, _, key in suspects], "_parameters")
    for (module, name, _), held_by in zip(suspects, found):
        for other_module, other_key in held_by:
            if other_module is not module:
                raise _tied_error(context, module, name, other_module, other_key)


def check_local(context: str, pairs: Sequence[tuple[nn.Module, str]]) -> None:
    """Refuse to hook a DTensor parameter (FSDP2, tensor parallelism).

    Hook mode's ``name_orig`` and forward pre-hook would fight FSDP2's own
    handling of the parameter (its forward puts the gathered parameter
    back, the mask unapplied); the functional API prunes DTensors.

    Raises:
        TypeError: if a parameter of ``pairs`` is a DTensor.
    """
    for module, name in pairs:
        key = _parameter_key(module, name)
        if key is not None and is_dtensor(module._parameters[key]):
            raise TypeError(
                f"{context}: {type(module).__name__}.{key} is a DTensor (FSDP2 or tensor parallelism); "
                "funcprune.compat's hook mode does not prune DTensors (FSDP2 manages the parameter "
                "itself and would put it back unmasked); use the functional API, which does: "
                "params = dict(model.named_parameters()); masks = plan(params); "
                "fp.apply_masks_(params, masks), and fp.mask_gradients_(params, masks) after backward()"
            )


def _other_key(module: nn.Module, key: str) -> str | None:
    """Another key under which ``module`` holds its Parameter ``key``, if any."""
    param = module._parameters[key]
    return next((k for k, v in module._parameters.items() if v is param and k != key), None)


def _tied_error(
    context: str, module: nn.Module, name: str, other: nn.Module, other_key: str
) -> ValueError:
    return ValueError(
        f"{context}: cannot prune {name!r} of {type(module).__name__}: the Parameter is "
        f"tied: also held by a module of type {type(other).__name__} (as {other_key!r}). "
        "Hook mode prunes one module at a time, so the other user would keep the unpruned "
        "weight (torch.nn.utils.prune silently unties it). Prune every user alike instead: "
        "with the functional API (funcprune.Plan + funcprune.functional_call_masked, which "
        "masks every user), or with funcprune.compat.install_masks_(root_module, masks), "
        "which hooks every user."
    )


class User(NamedTuple):
    """One place where a Parameter is used, under the root given to :func:`parameter_users`."""

    key: str  #: the plain name from the root, as ``"lm_head.weight"``
    module: nn.Module  #: the submodule holding the Parameter
    name: str  #: the plain tensor name in it (``"weight"``, also when pruned)
    hooked: bool  #: whether it is pruned (held as ``name + "_orig"``, with a hook)


def parameter_users(root: nn.Module) -> dict[int, list[User]]:
    """Every user of every Parameter under ``root``, by ``id`` of the Parameter.

    Users come in ``named_modules()`` order, so the first one's key is the
    name ``named_parameters()`` of the unpruned module gives the Parameter.
    """
    users: dict[int, list[User]] = {}
    for prefix, submodule in root.named_modules():
        pruned = {
            hook._tensor_name
            for hook in submodule._forward_pre_hooks.values()
            if isinstance(hook, TorchBase)
        }
        for key, param in submodule._parameters.items():
            if param is None:
                continue
            hooked = key.endswith("_orig") and key[:-5] in pruned
            name = key[:-5] if hooked else key
            full = f"{prefix}.{name}" if prefix else name
            users.setdefault(id(param), []).append(User(full, submodule, name, hooked))
    return users


def one_key_per_parameter(fn: str, root: nn.Module, masks: dict[str, Tensor]) -> dict[str, Tensor]:
    """``masks`` (one entry per hooked tensor) with one key per tied Parameter.

    The users of a tied Parameter must carry the same mask (a user that is not
    pruned counts as a mask of ones); their entries become one, keyed by the
    name ``named_parameters()`` gives the Parameter, at the first's place.

    Raises:
        ValueError: naming two users of one Parameter with different masks.
    """
    canonical: dict[str, str] = {}
    for users in parameter_users(root).values():
        if len(users) > 1 and any(user.key in masks for user in users):
            _check_same_masks(fn, users, masks)
            canonical.update((user.key, users[0].key) for user in users)
    merged: dict[str, Tensor] = {}
    for key, mask in masks.items():
        merged.setdefault(canonical.get(key, key), mask)
    return merged


def _check_same_masks(fn: str, users: list[User], masks: dict[str, Tensor]) -> None:
    """Raise unless every user of one Parameter has the first pruned user's mask."""
    first = next(user for user in users if user.key in masks)
    reference = masks[first.key]
    for user in users:
        if user.key in masks:
            if torch.equal(masks[user.key], reference):
                continue
            problem = (
                f"{first.key!r} and {user.key!r} are one (tied) Parameter with different masks"
            )
        elif bool(reference.all()):
            continue  # not pruned: a mask of ones
        else:
            problem = (
                f"{first.key!r} is pruned but {user.key!r}, the same (tied) Parameter, is not "
                "(torch.nn.utils.prune unties a tied weight when it prunes one user)"
            )
        raise ValueError(
            f"{fn}: {problem}; a mask dict holds one mask per Parameter (the functional API "
            "masks every user of a tied weight alike), so it cannot describe this module. "
            "Give every user the same mask (install_masks_ does) or untie the weights."
        )
