"""``global_unstructured``: several parameters pruned together, all their entries ranked at once.

Same signature, behaviour and exceptions as torch's. Fixes over torch: a
failing call leaves every module exactly as it was; any iterable of
parameters is accepted (torch's silently needs a re-iterable one); a tied
Parameter listed under every holder is ranked once and every holder gets
its slice, where torch ranks it once per holder (see :mod:`._tying`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from .._types import Tensor
from ._base import PruningContainer, parents_to_sync
from ._functions import custom_from_mask
from ._state import ParentsOf, batch, rollback
from ._tying import check_untied

__all__ = ["global_unstructured"]


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
