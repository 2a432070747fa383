"""The functional API of ``torch.nn.utils.prune``: prune, remove, inspect.

Same names, signatures, behaviour and exceptions as torch's functions. Each
pruning function reparametrizes ``module.<name>`` (``name_orig`` parameter,
``name_mask`` buffer, forward pre-hook) and returns the module. Fixes over
torch: a failing call leaves every module exactly as it was;
:func:`global_unstructured` accepts any iterable (torch's silently needs a
re-iterable one); :func:`remove` and :func:`is_pruned` also recognise
modules pruned by ``torch.nn.utils.prune``; pruning a tied parameter (one
that another module holds too) raises a ``ValueError`` before changing
anything, where torch silently unties it, and :func:`remove` removes every
holder of a tied parameter together (see :mod:`._tying`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, TypeVar

import torch
from torch import nn

from .._types import Amount, NormOrder
from ._base import PruningContainer, parents_to_sync
from ._methods import CustomFromMask, Identity, L1Unstructured, RandomUnstructured
from ._state import ParentsOf, TorchBase, batch, pruning_hooks, rollback
from ._structured import LnStructured, RandomStructured
from ._tying import check_untied, forget_removal, remember_removal, removed_before, removed_together

__all__ = [
    "identity",
    "random_unstructured",
    "l1_unstructured",
    "random_structured",
    "ln_structured",
    "global_unstructured",
    "custom_from_mask",
    "remove",
    "is_pruned",
]

Tensor = torch.Tensor
#: The module a pruning function is given, and returns.
M = TypeVar("M", bound=nn.Module)


def identity(module: M, name: str) -> M:
    """Reparametrize ``module.<name>`` without pruning anything (mask of ones).

    Args:
        module: the module holding the tensor.
        name: the parameter's name in ``module``.

    Returns:
        ``module``, modified in place.

    >>> import torch, funcprune.compat as prune
    >>> prune.identity(torch.nn.Linear(2, 3), "bias").bias_mask
    tensor([1., 1., 1.])
    """
    Identity.apply(module, name)
    return module


def random_unstructured(module: M, name: str, amount: Amount) -> M:
    """Prune ``amount`` random (currently unpruned) entries of ``module.<name>``.

    Args:
        module: the module holding the tensor.
        name: the parameter's name in ``module``.
        amount: an ``int`` count or a ``float`` fraction in [0, 1].

    Returns:
        ``module``, modified in place.

    >>> import torch, funcprune.compat as prune
    >>> m = prune.random_unstructured(torch.nn.Linear(2, 3), "weight", amount=1)
    >>> torch.sum(m.weight_mask == 0)
    tensor(1)
    """
    RandomUnstructured.apply(module, name, amount)
    return module


def l1_unstructured(
    module: M, name: str, amount: Amount, importance_scores: Tensor | None = None
) -> M:
    """Prune the ``amount`` (currently unpruned) entries of smallest magnitude.

    Args:
        module: the module holding the tensor.
        name: the parameter's name in ``module``.
        amount: an ``int`` count or a ``float`` fraction in [0, 1].
        importance_scores: scores of the parameter's shape to rank entries
            by, instead of the parameter.

    Returns:
        ``module``, modified in place.

    >>> import torch, funcprune.compat as prune
    >>> m = prune.l1_unstructured(torch.nn.Linear(2, 3), "weight", amount=0.2)
    >>> m.state_dict().keys()
    odict_keys(['bias', 'weight_orig', 'weight_mask'])
    """
    L1Unstructured.apply(module, name, amount=amount, importance_scores=importance_scores)
    return module


def random_structured(
    module: M, name: str, amount: Amount, dim: int
) -> M:
    """Prune ``amount`` random (currently unpruned) channels along ``dim``.

    Args:
        module: the module holding the tensor.
        name: the parameter's name in ``module``.
        amount: an ``int`` count or a ``float`` fraction in [0, 1] of channels.
        dim: the dimension indexing the channels.

    Returns:
        ``module``, modified in place.

    >>> import torch, funcprune.compat as prune
    >>> m = prune.random_structured(torch.nn.Linear(5, 3), "weight", amount=3, dim=1)
    >>> int(sum(torch.sum(m.weight, dim=0) == 0))
    3
    """
    RandomStructured.apply(module, name, amount, dim)
    return module


def ln_structured(
    module: M,
    name: str,
    amount: Amount,
    n: NormOrder,
    dim: int,
    importance_scores: Tensor | None = None,
) -> M:
    """Prune the ``amount`` (currently unpruned) channels of smallest L``n`` norm.

    Args:
        module: the module holding the tensor.
        name: the parameter's name in ``module``.
        amount: an ``int`` count or a ``float`` fraction in [0, 1] of channels.
        n: the norm order, as ``p`` of :func:`torch.norm`.
        dim: the dimension indexing the channels.
        importance_scores: scores of the parameter's shape, instead of it.

    Returns:
        ``module``, modified in place.

    >>> import torch, funcprune.compat as prune
    >>> m = prune.ln_structured(torch.nn.Conv2d(5, 3, 2), "weight", amount=0.3, dim=1,
    ...                         n=float("-inf"))
    >>> int((m.weight_mask.sum(dim=(0, 2, 3)) == 0).sum())
    2
    """
    LnStructured.apply(module, name, amount, n, dim, importance_scores=importance_scores)
    return module


def global_unstructured(
    parameters: Iterable[tuple[nn.Module, str]],
    pruning_method: Any,
    importance_scores: dict[tuple[nn.Module, str], Tensor] | None = None,
    **kwargs: Any,
) -> None:
    """Prune several parameters together, ranking all their entries at once.

    The scores of all listed tensors (masks already present respected) are
    flattened into one vector, ``pruning_method(**kwargs)`` is applied on its
    unpruned part, and each parameter gets its slice as a
    :class:`CustomFromMask` hook. A tied Parameter (one object held by
    several modules) listed under every holder is ranked once and every
    holder gets its slice, sharing one ``name_orig`` (torch ranks it once
    per holder, and may give the holders different masks).

    Args:
        parameters: ``(module, name)`` pairs (any iterable, generators too).
        pruning_method: an ``"unstructured"`` pruning method class.
        importance_scores: a dict ``{(module, name): scores}``; missing pairs
            use the parameter itself.
        kwargs: the method's arguments, e.g. ``amount``.

    Raises:
        TypeError: if ``parameters`` is not iterable, ``importance_scores`` not
            a dict, or the method's ``PRUNING_TYPE`` not ``"unstructured"``.
        ValueError: if a parameter is tied to a holder the call does not
            list, its holders were pruned differently before, or they are
            given different ``importance_scores``.

    >>> import torch, funcprune.compat as prune
    >>> net = torch.nn.Sequential(torch.nn.Linear(10, 4), torch.nn.Linear(4, 1))
    >>> prune.global_unstructured([(net[0], "weight"), (net[1], "weight")],
    ...                           pruning_method=prune.L1Unstructured, amount=10)
    >>> print(sum(torch.nn.utils.parameters_to_vector(net.buffers()) == 0))
    tensor(10)
    """
    if not isinstance(parameters, Iterable):
        raise TypeError("global_unstructured(): parameters is not an Iterable")
    importance_scores = importance_scores if importance_scores is not None else {}
    if not isinstance(importance_scores, dict):
        raise TypeError("global_unstructured(): importance_scores must be of type dict")
    pairs = list(parameters)
    groups = check_untied("global_unstructured", pairs)  # before the scores' graph holds them
    ranked = [pairs[group[0]] for group in groups]
    scores = _shared_scores(pairs, groups, importance_scores)
    _check_alike(pairs, groups)
    final_mask = _global_mask(ranked, pruning_method, scores, kwargs)
    with rollback(pairs, _parents_within(pairs)):
        pointer = 0
        for group, (module, name) in zip(groups, ranked):
            param = getattr(module, name)
            num_param = param.numel()
            param_mask = final_mask[pointer : pointer + num_param].view_as(param)
            holders = {(id(pairs[i][0]), pairs[i][1]): pairs[i] for i in group}
            for holder, holder_name in holders.values():  # a tied Parameter: every holder alike
                with batch():  # ties checked above, refreshers synced by rollback: all at once
                    custom_from_mask(holder, holder_name, mask=param_mask)
            pointer += num_param


def _or_ones(mask: object, module: nn.Module, name: str) -> Tensor:
    """``mask`` (a holder's ``name_mask``), or ones where the holder is not pruned yet."""
    return mask if isinstance(mask, Tensor) else torch.ones_like(getattr(module, name))


def _parents_within(pairs: list[tuple[nn.Module, str]]) -> ParentsOf:
    """``parents_to_sync``, looking for a parent among the call's modules first."""
    within = [module for module, _ in pairs]
    return lambda module: parents_to_sync(module, within)


def _shared_scores(
    pairs: list[tuple[nn.Module, str]],
    groups: list[list[int]],
    importance_scores: dict[tuple[nn.Module, str], Tensor],
) -> dict[tuple[nn.Module, str], Tensor]:
    """``importance_scores`` keyed by each Parameter's first pair (the one ranked).

    Raises:
        ValueError: if two holders of one tied Parameter are given different scores.
    """
    shared: dict[tuple[nn.Module, str], Tensor] = {}
    for group in groups:
        given = [(pairs[i], importance_scores[pairs[i]]) for i in group if pairs[i] in importance_scores]
        for (module, name), scores in given[1:]:
            first, first_scores = given[0]
            if scores is not first_scores and not torch.equal(scores, first_scores):
                raise ValueError(
                    f"global_unstructured: importance_scores gives {type(first[0]).__name__}."
                    f"{first[1]} and {type(module).__name__}.{name}, one tied Parameter, "
                    "different scores; a tied Parameter is ranked once: give it one score tensor"
                )
        if given:
            shared[pairs[group[0]]] = given[0][1]
    return shared


def _check_alike(pairs: list[tuple[nn.Module, str]], groups: list[list[int]]) -> None:
    """The holders of one tied Parameter must carry the same mask before they are pruned alike.

    Raises:
        ValueError: naming two holders pruned differently before (by torch,
            which prunes one holder at a time).
    """
    for group in groups:
        first_module, first_name = pairs[group[0]]
        first = getattr(first_module, first_name + "_mask", None)
        for i in group[1:]:
            module, name = pairs[i]
            mask = getattr(module, name + "_mask", None)
            if not torch.equal(_or_ones(first, module, name), _or_ones(mask, module, name)):
                raise ValueError(
                    f"global_unstructured: {type(first_module).__name__}.{first_name} and "
                    f"{type(module).__name__}.{name} are one (tied) Parameter with different "
                    "masks (pruned differently before, as torch.nn.utils.prune prunes one "
                    "holder at a time); a tied Parameter is pruned alike in every holder: "
                    "give them one mask first (funcprune.compat.install_masks_)"
                )


def _global_mask(
    pairs: list[tuple[nn.Module, str]],
    pruning_method: Any,
    importance_scores: dict[tuple[nn.Module, str], Tensor],
    kwargs: dict[str, Any],
) -> Tensor:
    """The flat mask of all ``pairs``: the method folded on their joint scores."""
    relevant_importance_scores = torch.nn.utils.parameters_to_vector(
        [importance_scores.get((module, name), getattr(module, name)) for module, name in pairs]
    )
    default_mask = torch.nn.utils.parameters_to_vector(
        [
            getattr(module, name + "_mask", torch.ones_like(getattr(module, name)))
            for module, name in pairs
        ]
    )
    container = PruningContainer()
    container._tensor_name = "temp"
    method = pruning_method(**kwargs)
    method._tensor_name = "temp"
    if method.PRUNING_TYPE != "unstructured":
        raise TypeError(
            'Only "unstructured" PRUNING_TYPE supported for '
            f"the `pruning_method`. Found method {pruning_method} of type {method.PRUNING_TYPE}"
        )
    container.add_pruning_method(method)
    mask: Tensor = container.compute_mask(relevant_importance_scores, default_mask)
    return mask


def custom_from_mask(module: M, name: str, mask: Tensor) -> M:
    """Prune ``module.<name>`` where ``mask`` is 0 (on top of earlier pruning).

    Args:
        module: the module holding the tensor.
        name: the parameter's name in ``module``.
        mask: a tensor of the parameter's shape; 0 means pruned.

    Returns:
        ``module``, modified in place.

    >>> import torch, funcprune.compat as prune
    >>> prune.custom_from_mask(torch.nn.Linear(5, 3), name="bias",
    ...                        mask=torch.tensor([0, 1, 0])).bias_mask
    tensor([0., 1., 0.])
    """
    CustomFromMask.apply(module, name, mask)
    return module


def remove(module: M, name: str) -> M:
    """Make the pruning of ``module.<name>`` permanent and drop its hook.

    The same :class:`~torch.nn.Parameter` object becomes ``module.<name>``
    again, holding the pruned values; ``name_orig``, ``name_mask`` and the
    hook go away. Works on modules pruned by ``torch.nn.utils.prune`` too.

    A tied Parameter (``lm_head.weight = embedding.weight``) pruned in
    every holder, as ``global_unstructured`` over all of them and
    ``install_masks_`` prune it, is made permanent in every holder that
    compat sees (as pruning sees them: ``module``'s tree and the ties compat
    hooked): each holds the same plain Parameter again, with the pruned
    values, where torch would leave the others hooked over the Parameter
    that this holder now trains whole. A later ``remove`` of another of
    those holders returns it unchanged, so a loop over the pairs pruned
    works as with torch.

    Raises:
        ValueError: if ``module.<name>`` is not pruned, or another holder of
            its tied Parameter is pruned with another mask (one Parameter
            cannot hold both; nothing is changed).

    >>> import torch, funcprune.compat as prune
    >>> m = prune.random_unstructured(torch.nn.Linear(5, 7), name="weight", amount=0.2)
    >>> m = prune.remove(m, name="weight")
    >>> sorted(name for name, _ in m.named_parameters())
    ['bias', 'weight']
    """
    found = pruning_hooks(module, name)
    if not found:
        if removed_before(module, name):  # made permanent by the remove of another holder of its tie
            return module
        raise ValueError(
            f"Parameter '{name}' of module {module} has to be pruned before pruning can be removed"
        )
    pairs = removed_together("remove", module, name)  # module's first, then the other holders of a tie
    going = Counter(id(holder) for holder, _ in pairs)  # how many of each module's pruning hooks go
    lasts = {
        id(holder): sum(isinstance(hook, TorchBase) for hook in holder._forward_pre_hooks.values()) == going[id(holder)]
        for holder, _ in pairs
    }
    with rollback(pairs, lambda holder: None if lasts[id(holder)] else []):  # parents: if the last
        for holder, tensor in pairs:
            key, hook = pruning_hooks(holder, tensor)[0]
            hook.remove(holder)
            del holder._forward_pre_hooks[key]
    forget_removal(pairs)
    remember_removal(pairs[1:])
    return module


def is_pruned(module: nn.Module) -> bool:
    """Whether ``module`` or a submodule has a pruning hook (torch's or ours).

    >>> import torch, funcprune.compat as prune
    >>> m = torch.nn.Linear(5, 7)
    >>> prune.is_pruned(m)
    False
    >>> _ = prune.random_unstructured(m, name="weight", amount=0.2)
    >>> prune.is_pruned(m)
    True
    """
    for _, submodule in module.named_modules():
        for hook in submodule._forward_pre_hooks.values():
            if isinstance(hook, TorchBase):
                return True
    return False
