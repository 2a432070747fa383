"""Tied weights (one :class:`~torch.nn.Parameter` held by several modules).

The pruning functions refuse, before changing anything, to prune a
Parameter that another module of the call also holds (:func:`check_untied`),
where torch silently unties it; ``global_unstructured`` prunes every holder
alike when all of them are in the call, and ``remove`` removes them together
(:func:`removed_together`). Holders are found in the call's module trees,
never on the heap (``README.md``).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn

from .._types import is_dtensor
from ._holders import known_holders, modules_under, remember_ties, tree_holders
from ._state import TorchBase, pruning_hooks

__all__ = [
    "User",
    "check_local",
    "check_untied",
    "forget_removal",
    "one_key_per_parameter",
    "parameter_users",
    "remember_removal",
    "remember_ties",
    "removed_before",
    "removed_together",
]

Tensor = torch.Tensor


def _parameter_key(module: nn.Module, name: str) -> str | None:
    """Where ``module`` holds the Parameter called ``name``: ``name`` or ``name_orig``."""
    params = getattr(module, "_parameters", None)
    if not (isinstance(params, dict) and isinstance(name, str)):
        return None  # not a module: the pruning call reports it as torch does
    for key in (name, name + "_orig"):
        if params.get(key) is not None:
            return key
    return None


def check_untied(context: str, pairs: Sequence[tuple[nn.Module, str]]) -> list[list[int]]:
    """Refuse to prune a Parameter held by a module (or key) not pruned with it; refuse DTensors.

    The holders of each Parameter are looked for in the trees of the call's
    modules (``modules()`` of each), and among the holders of a tie compat
    saw before in a whole model (``install_masks_``, a global call): no heap
    scan, so the cost does not grow with the process's objects. A holder
    outside these trees, never seen by compat, is not found: pruning one
    holder then unties the weight, as ``torch.nn.utils.prune`` does.

    Args:
        context: the function or method, for the message.
        pairs: the ``(module, name)`` pairs about to be pruned together
            (one for the pruning functions, several for global pruning).

    Returns:
        The indices of ``pairs`` grouped by Parameter, in order of first
        appearance (a pair naming no parameter is a group of its own).

    Raises:
        ValueError: if a Parameter of ``pairs`` is also held by a module, or
            under a key, that ``pairs`` do not list.
        TypeError: if one is a DTensor (FSDP2, tensor parallelism): hook
            mode's ``name_orig`` and forward pre-hook would fight FSDP2's
            own handling of the parameter (its forward puts the gathered
            parameter back, the mask unapplied).
    """
    check_local(context, pairs)
    groups: dict[int, list[int]] = {}
    params: dict[int, Tensor] = {}
    listed: set[tuple[int, str]] = set()
    for index, (module, name) in enumerate(pairs):
        key = _parameter_key(module, name)
        if key is None:
            groups[-1 - index] = [index]  # nothing to prune: the pruning call reports it
            continue
        param = module._parameters[key]
        assert param is not None  # _parameter_key found it
        params[id(param)] = param
        groups.setdefault(id(param), []).append(index)
        listed.add((id(module), key))
    found = tree_holders(list(params.values()), "_parameters", modules_under(m for m, _ in pairs))
    for (ident, tensor), in_trees in zip(params.items(), found):
        holders = {(id(m), k): (m, k) for m, k in [*in_trees, *known_holders(tensor)]}
        for place, (other, other_key) in holders.items():
            if place not in listed:
                module, name = pairs[groups[ident][0]]
                raise _tied_error(context, module, name, other, other_key)
        if len(holders) > 1:
            remember_ties(tensor, list(holders.values()))
    return list(groups.values())


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


def _tied_error(
    context: str, module: nn.Module, name: str, other: nn.Module, other_key: str
) -> ValueError:
    plain = other_key.removesuffix("_orig")
    if plain != other_key and any(
        isinstance(hook, TorchBase) and hook._tensor_name == plain
        for hook in other._forward_pre_hooks.values()
    ):
        other_key = plain  # a pruned holder: its tensor's name
    return ValueError(
        f"{context}: cannot prune {name!r} of {type(module).__name__}: the Parameter is "
        f"tied: also held by a module of type {type(other).__name__} (as {other_key!r}). "
        "Hook mode prunes one module at a time, so the other user would keep the unpruned "
        "weight (torch.nn.utils.prune silently unties it). Prune every user alike instead: "
        "with the functional API (funcprune.Plan + funcprune.functional_call_masked, which "
        "masks every user), or with funcprune.compat.install_masks_(root_module, masks), "
        "which hooks every user."
    )


def removed_together(context: str, module: nn.Module, name: str) -> list[tuple[nn.Module, str]]:
    """``(module, name)`` and the other holders whose pruning hook reparametrizes the same Parameter.

    A tied Parameter pruned in every holder (``global_unstructured`` over
    all of them, ``install_masks_``) is one ``name_orig`` behind several
    hooks: removing one hook alone would leave that holder reading (and
    training) every entry while the others read ``mask * orig``. So
    ``remove`` removes them together. Holders are looked for as
    :func:`check_untied` looks for them (``module``'s tree, and the ties
    compat hooked before); a holder that holds the Parameter unpruned has no
    hook to remove and reads the pruned values once it is made permanent.

    Raises:
        ValueError: if another holder's mask differs from ``module``'s (one
            Parameter cannot hold both holders' pruned values).
    """
    param = module._parameters.get(name + "_orig")
    if param is None:
        return [(module, name)]  # nothing tied to look for: the removal reports it as torch does
    found = [*tree_holders([param], "_parameters", modules_under([module]))[0], *known_holders(param)]
    pairs = {(id(module), name): (module, name)}
    for other, key in found:
        plain = key.removesuffix("_orig")
        if plain != key and (id(other), plain) not in pairs and pruning_hooks(other, plain):
            _check_same_mask(context, (module, name), (other, plain))
            pairs[(id(other), plain)] = (other, plain)
    return list(pairs.values())


def _check_same_mask(context: str, pruned: tuple[nn.Module, str], other: tuple[nn.Module, str]) -> None:
    """Raise unless the two hooked holders of one Parameter have equal masks."""
    (module, name), (holder, plain) = pruned, other
    mask, theirs = module._buffers.get(name + "_mask"), holder._buffers.get(plain + "_mask")
    if mask is None or theirs is None or torch.equal(mask != 0, theirs != 0):
        return  # a missing mask: the removal fails as torch's does, and is rolled back
    raise ValueError(
        f"{context}: cannot remove the pruning of {name!r} of {type(module).__name__}: the Parameter is "
        f"tied: also pruned in a module of type {type(holder).__name__} (as {plain!r}), with another mask "
        "(pruned apart, by torch.nn.utils.prune?). remove makes every holder of a tied Parameter permanent "
        "together, and one Parameter cannot hold both holders' pruned values. torch.nn.utils.prune.remove "
        "removes one holder at a time, untying them until the last is removed (the Parameter then holds "
        "the values both masks keep)"
    )


#: Holders whose pruning ``remove`` made permanent together with another holder's: holder -> {name:
#: the Parameter, weakly}; their own ``remove`` then finds nothing left to do (:func:`removed_before`).
_REMOVED: weakref.WeakKeyDictionary[nn.Module, dict[str, weakref.ref[Tensor]]] = weakref.WeakKeyDictionary()


def remember_removal(pairs: Sequence[tuple[nn.Module, str]]) -> None:
    """Record that ``pairs`` had their pruning removed with another holder's (by its ``remove``)."""
    for module, name in pairs:
        param = module._parameters[name]
        assert param is not None  # just put back by the removal
        _REMOVED.setdefault(module, {})[name] = weakref.ref(param)


def forget_removal(pairs: Sequence[tuple[nn.Module, str]]) -> None:
    """Forget the records of :func:`remember_removal` for ``pairs`` (pruned again, or removed now)."""
    for module, name in pairs:
        names = _REMOVED.get(module)
        if names is not None:
            names.pop(name, None)


def removed_before(module: nn.Module, name: str) -> bool:
    """Whether ``remove`` of another holder of ``module.<name>``'s Parameter made it permanent, once.

    True once per such removal, while ``module`` still holds that Parameter
    under ``name`` (a loop calling ``remove`` on every holder then works, as
    with torch); the record is consumed.
    """
    names = _REMOVED.get(module)
    ref = names.pop(name, None) if names is not None else None
    return ref is not None and ref() is not None and module._parameters.get(name) is ref()


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
