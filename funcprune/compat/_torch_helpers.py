"""torch.nn.utils.prune's module-level helpers, with torch's signatures.

Existing code and test suites call these underscore helpers on
``torch.nn.utils.prune``; here they keep the same names, parameter names,
behaviour, exception types and messages. The checks themselves live once, in
:mod:`funcprune._validate`; this module only adapts the signatures.
"""

from __future__ import annotations

import numbers

import torch

from .._types import Amount, NormOrder
from .._validate import (
    count_to_prune,
    validate_amount_init,
    validate_count,
    validate_dim,
    validate_structured,
)

__all__ = [
    "_validate_pruning_amount_init",
    "_validate_pruning_amount",
    "_validate_structured_pruning",
    "_compute_nparams_toprune",
    "_validate_pruning_dim",
    "_compute_norm",
]


def _validate_pruning_amount_init(amount: object) -> None:
    """Check ``amount`` before the tensor to prune is known.

    Args:
        amount: an ``int`` count (at least 0) or a ``float`` fraction in [0, 1].

    Raises:
        TypeError: if ``amount`` is not a real number.
        ValueError: if it is a negative integer or a float outside [0, 1].

    >>> _validate_pruning_amount_init(0.3)
    >>> _validate_pruning_amount_init(-1)
    Traceback (most recent call last):
    ...
    ValueError: amount=-1 should either be a float in the range [0, 1] or a non-negative integer
    """
    validate_amount_init(amount)


def _validate_pruning_amount(amount: object, tensor_size: int) -> None:
    """Refuse an integer ``amount`` larger than the ``tensor_size`` units.

    >>> _validate_pruning_amount(3, tensor_size=2)
    Traceback (most recent call last):
    ...
    ValueError: amount=3 should be smaller than the number of parameters to prune=2
    """
    validate_count(amount, tensor_size)


def _validate_structured_pruning(t: torch.Tensor) -> None:
    """Refuse structured pruning of a tensor with fewer than 2 dims.

    Raises:
        ValueError: if ``t`` has 0 or 1 dims.
    """
    validate_structured(t)


def _compute_nparams_toprune(amount: Amount, tensor_size: int) -> int:
    """The number of units to prune: ``amount`` itself if an integer, else
    ``round(amount * tensor_size)`` (Python's round, half to even).

    As in torch, an integer ``amount`` is returned unchanged (same object).

    >>> _compute_nparams_toprune(0.5, 5), _compute_nparams_toprune(7, 10)
    (2, 7)
    """
    if isinstance(amount, numbers.Integral):
        return amount  # torch returns an integer amount as given
    return count_to_prune(amount, tensor_size)


def _validate_pruning_dim(t: torch.Tensor, dim: int) -> None:
    """Refuse a ``dim`` at or past ``t.dim()`` (torch does not check negatives).

    Raises:
        IndexError: if ``dim >= t.dim()``.
    """
    validate_dim(t, dim)


def _compute_norm(t: torch.Tensor, n: NormOrder, dim: int) -> torch.Tensor:
    """The L``n`` norm of each slice of ``t`` along ``dim`` (over all other dims).

    Args:
        t: the tensor.
        n: a norm order, as ``p`` of :func:`torch.norm`.
        dim: the dimension whose slices (channels) get one norm each.

    Returns:
        A tensor of shape ``(t.shape[dim],)``.

    >>> _compute_norm(torch.tensor([[3.0, 4.0], [0.0, 1.0]]), 2, 0)
    tensor([5., 1.])
    """
    dims = list(range(t.dim()))
    if dim < 0:
        dim = dims[dim]
    dims.remove(dim)
    norm: torch.Tensor = torch.norm(t, p=n, dim=dims)
    return norm
