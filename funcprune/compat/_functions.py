"""The pruning functions of ``torch.nn.utils.prune`` for one parameter.

Same names, signatures, behaviour and exceptions as torch's functions. Each
reparametrizes ``module.<name>`` (``name_orig`` parameter, ``name_mask``
buffer, forward pre-hook) through its method's ``apply`` and returns the
module; a failing call leaves the module exactly as it was, and pruning a
tied parameter (one that another module holds too) raises a ``ValueError``
before changing anything, where torch silently unties it (see
:mod:`._tying`). Several parameters ranked together: :mod:`._global`;
making pruning permanent, and asking whether a module is pruned:
:mod:`._remove`.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

from .._types import Amount, NormOrder
from ._methods import CustomFromMask, Identity, L1Unstructured, RandomUnstructured
from ._structured import LnStructured, RandomStructured

__all__ = [
    "M",
    "identity",
    "random_unstructured",
    "l1_unstructured",
    "random_structured",
    "ln_structured",
    "custom_from_mask",
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
