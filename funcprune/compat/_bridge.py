"""The bridge between funcprune's mask dicts and modules in hook mode.

:func:`install_masks_` puts a mask dict onto a module in hook mode,
:func:`masks_from_module` reads one off any hooked module, :func:`unprune_`
turns a hooked module back into plain parameters and returns its masks;
tied weights have one key (``README.md``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from .._types import Masks
from .._validate import check_same_shape, non_binary
from ._base import parents_to_sync
from ._methods import CustomFromMask
from ._reparam import unreparametrize
from ._state import TorchBase, batch, pruning_hooks, rollback
from ._tying import User, check_local, one_key_per_parameter, parameter_users, remember_ties

__all__ = ["install_masks_", "masks_from_module", "unprune_"]

Tensor = torch.Tensor


def _check_module(fn: str, module: object) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"{fn}: module must be a torch.nn.Module, got {type(module).__name__}")


def _hooked(module: nn.Module) -> list[tuple[str, nn.Module, str, int]]:
    """``(key, submodule, name, hook key)`` of every pruned tensor in ``module``."""
    found: list[tuple[str, nn.Module, str, int]] = []
    seen: set[str] = set()
    for prefix, submodule in module.named_modules():
        for hook_key, hook in submodule._forward_pre_hooks.items():
            if not isinstance(hook, TorchBase):
                continue
            name = hook._tensor_name
            key = f"{prefix}.{name}" if prefix else name
            if key in seen:
                raise ValueError(
                    f"{key!r} has several pruning hooks; torch.nn.utils.prune keeps one "
                    "per tensor (a PruningContainer), so this module cannot be read"
                )
            seen.add(key)
            found.append((key, submodule, name, hook_key))
    return found


def _bool_mask(fn: str, key: str, submodule: nn.Module, name: str) -> Tensor:
    mask = submodule._buffers.get(name + "_mask")
    if not isinstance(mask, Tensor):
        raise ValueError(
            f"{fn}: {key!r} has a pruning hook but no buffer {name + '_mask'!r}; "
            "the module's pruning state is incomplete"
        )
    if mask.dtype == torch.bool:
        return mask.detach().clone()
    bad = non_binary(mask, 5)
    if bad:
        raise ValueError(
            f"{fn}: the mask of {key!r} holds values other than 0 and 1, such as {bad}; "
            "a torch.bool mask dict cannot represent it"
        )
    return mask.detach() != 0


def masks_from_module(module: nn.Module) -> Masks:
    """Read the mask dict of a module in hook mode.

    Works on modules pruned by ``funcprune.compat`` or by
    ``torch.nn.utils.prune``. The masks are new ``torch.bool`` tensors
    (``True`` = kept), keyed by the plain parameter names; unpruned
    parameters have no key. The module is not changed.

    Args:
        module: any module.

    Returns:
        ``{"conv1.weight": mask, ...}``: submodules in ``named_modules()``
        order, the tensors of one in the order their hooks were installed.

    Raises:
        TypeError: if ``module`` is not a :class:`torch.nn.Module`.
        ValueError: if a mask holds values other than 0 and 1, a hooked
            tensor has no mask buffer, or two users of one tied Parameter
            carry different masks (an unpruned user counts as ones).

    >>> import torch, funcprune.compat as prune
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 2))
    >>> net[0].bias.data = torch.tensor([0.5, -2.0])
    >>> _ = prune.l1_unstructured(net[0], "bias", amount=1)
    >>> prune.masks_from_module(net)
    {'0.bias': tensor([False,  True])}
    """
    _check_module("masks_from_module", module)
    return _read_masks("masks_from_module", module, _hooked(module))


def _read_masks(
    fn: str, module: nn.Module, hooked: list[tuple[str, nn.Module, str, int]]
) -> Masks:
    """The mask dict of the ``hooked`` tensors: one key per (tied) Parameter."""
    masks = {key: _bool_mask(fn, key, submodule, name) for key, submodule, name, _ in hooked}
    return one_key_per_parameter(fn, module, masks)


def _target(module: nn.Module, key: object) -> tuple[nn.Module, str, nn.Parameter]:
    """The submodule and tensor name that ``key`` denotes, and its Parameter."""
    if not isinstance(key, str):
        raise TypeError(
            f"install_masks_: masks must be keyed by parameter names (str), "
            f"got the key {key!r} of type {type(key).__name__}"
        )
    prefix, _, name = key.rpartition(".")
    try:
        submodule = module.get_submodule(prefix) if prefix else module
    except AttributeError:
        submodule = None
    param = None if submodule is None else submodule._parameters.get(name)
    if submodule is not None and param is None and pruning_hooks(submodule, name):
        param = submodule._parameters.get(name + "_orig")  # already pruned
    if submodule is not None and name.endswith("_orig") and pruning_hooks(submodule, name[:-5]):
        raise ValueError(
            f"install_masks_: masks has the key {key!r}, the reparametrized original of "
            f"a pruned tensor; key its mask by the plain name {key[:-5]!r} instead"
        )
    if submodule is None or param is None:
        known = sorted(
            {n for n, _ in module.named_parameters()}
            | {f"{p}.{n}" if p else n for p, n in _plain_pruned(module)}
        )
        raise ValueError(
            f"install_masks_: masks has the key {key!r}, which names no parameter of "
            f"the module; expected names like those of named_parameters() of the "
            f"unpruned module, e.g. {known[:6]}"
        )
    return submodule, name, param


def _plain_pruned(module: nn.Module) -> list[tuple[str, str]]:
    return [(key.rpartition(".")[0], name) for key, _, name, _ in _hooked(module)]


def install_masks_(module: nn.Module, masks: Mapping[str, Tensor]) -> nn.Module:
    """Install a mask dict onto ``module`` in hook mode.

    Each ``masks[name]`` is applied as :func:`~funcprune.compat.custom_from_mask`
    would: the parameter becomes ``name_orig`` (same object, same values), the
    mask a float buffer ``name_mask`` and a forward pre-hook recomputes
    ``name``. On a tensor already pruned, the mask is combined with the
    existing one (nothing pruned is revived). Parameters without a key are
    left alone. A tied Parameter is hooked in every module that holds it, all
    sharing the same ``name_orig`` Parameter, with the same mask values.
    All-or-nothing: on error the module is left as it was.

    Args:
        module: the module to prune in place.
        masks: ``torch.bool`` masks keyed like ``named_parameters()`` of the
            unpruned module (plain names such as ``"conv1.weight"``).

    Returns:
        ``module``.

    Raises:
        TypeError: if ``module`` is not a :class:`torch.nn.Module`, or
            ``masks`` not a mapping of names to ``torch.bool`` tensors.
        ValueError: if a key names no parameter, a mask's shape differs
            from its parameter's, two keys name one tied Parameter with
            different masks, or the users of a tied Parameter would end up
            with different masks (pruned differently before).

    >>> import torch, funcprune.compat as prune
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 2))
    >>> _ = prune.install_masks_(net, {"0.bias": torch.tensor([True, False])})
    >>> net[0].bias_mask, prune.is_pruned(net)
    (tensor([1., 0.]), True)
    """
    _check_module("install_masks_", module)
    if not isinstance(masks, Mapping):
        raise TypeError(
            f"install_masks_: masks must be a dict of parameter names to torch.bool "
            f"tensors, got {type(masks).__name__}"
        )
    groups = _targets(module, masks)
    pairs = [(user.module, user.name) for users, _ in groups for user in users]
    check_local("install_masks_", pairs)
    with rollback(pairs, lambda child: parents_to_sync(child, [module])):
        with batch():  # no tying check: every user of a tied Parameter, on purpose
            for users, mask in groups:
                for user in users:
                    device = getattr(user.module, user.name).device
                    CustomFromMask.apply(user.module, user.name, mask.to(device=device))
        for users, _ in groups:
            _check_tied_installed(users)
            if len(users) > 1:  # later calls on one user see the others (check_untied)
                remember_ties(
                    users[0].module._parameters[users[0].name + "_orig"],
                    [(user.module, user.name + "_orig") for user in users],
                )
    return module


def _targets(module: nn.Module, masks: Mapping[str, Tensor]) -> list[tuple[list[User], Tensor]]:
    """The users to hook with each mask: every user of a tied Parameter."""
    users = parameter_users(module)
    chosen: dict[int, tuple[str, Tensor]] = {}
    groups: list[tuple[list[User], Tensor]] = []
    for key, mask in masks.items():
        submodule, name, param = _target(module, key)
        _check_mask(key, mask, param.shape)
        if id(param) in chosen:
            first, first_mask = chosen[id(param)]
            if not torch.equal(first_mask, mask):
                raise ValueError(
                    f"install_masks_: masks has the keys {first!r} and {key!r}, which name the "
                    "same (tied) Parameter, with different masks; give one mask per Parameter"
                )
            continue
        chosen[id(param)] = (key, mask)
        groups.append((users.get(id(param), [User(key, submodule, name, False)]), mask))
    return groups


def _check_mask(key: str, mask: object, shape: torch.Size) -> None:
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = f"dtype {mask.dtype}" if isinstance(mask, Tensor) else type(mask).__name__
        raise TypeError(
            f"install_masks_: masks[{key!r}] must be a torch.bool tensor, got {got}; "
            "convert it with `mask != 0` if nonzero means kept"
        )
    check_same_shape("install_masks_", f"masks[{key!r}]", mask.shape, "the parameter", shape)


def _check_tied_installed(users: list[User]) -> None:
    """The users of one tied Parameter must end up with the same mask."""
    masks = [user.module._buffers.get(user.name + "_mask") for user in users]
    for user, mask in zip(users[1:], masks[1:]):
        if not (isinstance(mask, Tensor) and isinstance(masks[0], Tensor)
                and torch.equal(mask, masks[0])):
            raise ValueError(
                f"install_masks_: {users[0].key!r} and {user.key!r} are one (tied) Parameter "
                "but would end up with different masks, as they were pruned differently "
                "before (torch.nn.utils.prune prunes one user only); a tied Parameter needs "
                "one mask for all its users"
            )


def unprune_(module: nn.Module) -> Masks:
    """Turn a hooked module back into plain parameters; return its mask dict.

    Every pruned tensor (by ``funcprune.compat`` or ``torch.nn.utils.prune``)
    gets its :class:`~torch.nn.Parameter` back under its plain name: the same
    object as ``name_orig``, with its unpruned values; ``name_mask`` and the
    hook go away. The masks come back as :func:`masks_from_module` reads
    them, so ``install_masks_(module, unprune_(module))`` restores the pruned
    state (masks, values, outputs). To bake the zeros into the values, use
    :func:`~funcprune.compat.remove` instead.

    Args:
        module: the module to turn back, in place.

    Returns:
        The ``torch.bool`` mask dict keyed by plain parameter names.

    Raises:
        TypeError: if ``module`` is not a :class:`torch.nn.Module`.
        ValueError: as :func:`masks_from_module`, or if a hooked tensor has no
            ``name_orig`` parameter. The module is then left unchanged.

    >>> import torch, funcprune.compat as prune
    >>> fc = torch.nn.Linear(3, 2)
    >>> _ = prune.l1_unstructured(fc, "weight", amount=2)
    >>> masks = prune.unprune_(fc)
    >>> sorted(masks), prune.is_pruned(fc), sorted(n for n, _ in fc.named_parameters())
    (['weight'], False, ['bias', 'weight'])
    """
    _check_module("unprune_", module)
    hooked = _hooked(module)
    masks = _read_masks("unprune_", module, hooked)
    for key, submodule, name, _ in hooked:
        if not isinstance(submodule._parameters.get(name + "_orig"), nn.Parameter):
            raise ValueError(
                f"unprune_: {key!r} has a pruning hook but no parameter {name + '_orig'!r}; "
                "the module's pruning state is incomplete"
            )
    with rollback((submodule, name) for _, submodule, name, _ in hooked):
        for _, submodule, name, hook_key in hooked:
            del submodule._forward_pre_hooks[hook_key]
            unreparametrize(submodule, name)
    return masks
