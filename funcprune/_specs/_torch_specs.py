"""The built-in specs: torch.nn.utils.prune's methods as frozen dataclasses.

A spec holds hyper-parameters only and validates them when it is built;
nothing mutates it (make variants with :func:`dataclasses.replace`). Each
computes its own mask with the pure method ``compute_mask``, which calls its
kernel in ``_kernels.py``; they go through the same mechanism as a
user-defined :class:`~funcprune.Spec`. The checked entry point for users is
:func:`funcprune.compute_mask`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, final

import torch

from .._types import Mask, NormOrder, PruningType, Tensor
from .._validate import (
    check_dim,
    check_norm_order,
    non_binary,
)
from . import _kernels as kernels
from ._spec import AmountSpec, Spec, named

__all__ = [
    "Identity",
    "RandomUnstructured",
    "L1Unstructured",
    "RandomStructured",
    "LnStructured",
    "CustomFromMask",
]


@final
@dataclass(frozen=True, slots=True)
class Identity(Spec):
    """Prunes nothing: the mask is the default mask (all ones without one).

    >>> Identity().pruning_type
    'unstructured'
    """

    @property
    def pruning_type(self) -> PruningType:
        return "unstructured"

    def compute_mask(
        self, scores: Tensor, default_mask: Mask = None, *, generator: torch.Generator | None = None
    ) -> Tensor:
        return kernels.keep_all(scores, default_mask)


@final
@dataclass(frozen=True, slots=True, repr=False)
class RandomUnstructured(AmountSpec):
    """Prunes ``amount`` of the unpruned entries, chosen at random.

    Args:
        amount: an ``int`` count, or a ``float`` fraction in [0, 1] of the
            entries still unpruned.
        sparsity: keyword-only, instead of ``amount``: the fraction of all
            units pruned after the call, counting those pruned before.

    Raises:
        TypeError: if ``amount`` is not a real number.
        ValueError: if ``amount`` is a negative int or a float outside [0, 1].

    >>> RandomUnstructured(0.3)
    RandomUnstructured(amount=0.3)
    """

    @property
    def pruning_type(self) -> PruningType:
        return "unstructured"

    def compute_mask(
        self, scores: Tensor, default_mask: Mask = None, *, generator: torch.Generator | None = None
    ) -> Tensor:
        return kernels.random_unstructured(self.target, scores, default_mask, generator)


@final
@dataclass(frozen=True, slots=True, repr=False)
class L1Unstructured(AmountSpec):
    """Prunes the ``amount`` unpruned entries of smallest absolute score.

    Args:
        amount: an ``int`` count, or a ``float`` fraction in [0, 1] of the
            entries still unpruned.
        sparsity: keyword-only, instead of ``amount``: the fraction of all
            units pruned after the call, counting those pruned before.

    Raises:
        TypeError: if ``amount`` is not a real number.
        ValueError: if ``amount`` is a negative int or a float outside [0, 1].

    >>> L1Unstructured(amount=2).amount
    2
    """

    @property
    def pruning_type(self) -> PruningType:
        return "unstructured"

    def compute_mask(
        self, scores: Tensor, default_mask: Mask = None, *, generator: torch.Generator | None = None
    ) -> Tensor:
        return kernels.l1_unstructured(self.target, scores, default_mask)

    def compute_joint_masks(
        self,
        scores: Sequence[Tensor],
        default_masks: Sequence[Mask],
        *,
        generator: torch.Generator | None = None,
    ) -> list[Tensor]:
        """Ranks the group part by part, never concatenating it (eager, large)."""
        return kernels.l1_unstructured_jointly(self.target, scores, default_masks)


@final
@dataclass(frozen=True, slots=True, repr=False)
class RandomStructured(AmountSpec):
    """Prunes ``amount`` of the remaining channels along ``dim`` at random.

    Args:
        amount: an ``int`` count, or a ``float`` fraction in [0, 1] of the
            channels not yet entirely pruned.
        sparsity: keyword-only, instead of ``amount``: the fraction of all
            units pruned after the call, counting those pruned before.
        dim: the dimension whose slices are the channels (default ``-1``).

    Raises:
        TypeError: if ``amount`` is not a real number or ``dim`` not an int.
        ValueError: if ``amount`` is a negative int or a float outside [0, 1].

    >>> RandomStructured(0.5, dim=0).pruning_type
    'structured'
    """

    dim: int = -1
    _extra_fields: ClassVar[tuple[str, ...]] = ("dim",)

    def __post_init__(self) -> None:
        AmountSpec.__post_init__(self)
        with named(self):
            check_dim(self.dim)

    @property
    def pruning_type(self) -> PruningType:
        return "structured"

    def compute_mask(
        self, scores: Tensor, default_mask: Mask = None, *, generator: torch.Generator | None = None
    ) -> Tensor:
        return kernels.random_structured(self.target, self.dim, scores, default_mask, generator)


@final
@dataclass(frozen=True, slots=True, repr=False)
class LnStructured(AmountSpec):
    """Prunes the ``amount`` remaining channels of smallest L``n`` norm.

    Args:
        amount: an ``int`` count, or a ``float`` fraction in [0, 1] of the
            channels not yet entirely pruned.
        sparsity: keyword-only, instead of ``amount``: the fraction of all
            units pruned after the call, counting those pruned before.
        n: the norm order, as ``p`` of :func:`torch.norm`: a number,
            ``inf``, ``-inf``, ``'fro'`` or ``'nuc'``.
        dim: the dimension whose slices are the channels (default ``-1``).

    Raises:
        TypeError: if ``amount`` or ``n`` is not a number (``n`` may also be
            ``'fro'``/``'nuc'``), or ``dim`` is not an int.
        ValueError: if ``amount`` is out of range or ``n`` is not a norm order.

    >>> LnStructured(0.5, n=2, dim=0)
    LnStructured(amount=0.5, n=2, dim=0)
    """

    n: NormOrder = None  # type: ignore[assignment]  # required: a default only so that amount may have one
    dim: int = -1
    _extra_fields: ClassVar[tuple[str, ...]] = ("n", "dim")

    def __post_init__(self) -> None:
        AmountSpec.__post_init__(self)
        with named(self):
            if self.n is None:
                raise TypeError("n (the norm order: a number, inf, -inf, 'fro' or 'nuc') is required")
            check_norm_order(self.n)
            check_dim(self.dim)

    @property
    def pruning_type(self) -> PruningType:
        return "structured"

    def compute_mask(
        self, scores: Tensor, default_mask: Mask = None, *, generator: torch.Generator | None = None
    ) -> Tensor:
        return kernels.ln_structured(self.target, self.n, self.dim, scores, default_mask)


@final
@dataclass(frozen=True, slots=True, eq=False)
class CustomFromMask(Spec):
    """Prunes the entries where a given mask is 0 (on top of earlier masks).

    The mask is checked and stored as a private ``torch.bool`` copy, so later
    changes to the tensor passed in do not affect the spec. Two such specs
    are equal when their masks are (same shape, device and values), so a
    copied or unpickled spec equals its original.

    Args:
        mask: a tensor of 0/1 (or ``False``/``True``) values with the shape
            of the tensors it will prune.

    Raises:
        TypeError: if ``mask`` is not a tensor.
        ValueError: if ``mask`` holds values other than 0 and 1.

    >>> CustomFromMask(torch.tensor([0, 1, 1])).mask
    tensor([False,  True,  True])
    """

    mask: torch.Tensor = field(repr=False)

    def __post_init__(self) -> None:
        mask = self.mask
        if not isinstance(mask, torch.Tensor):
            raise TypeError(
                f"CustomFromMask: mask must be a torch.Tensor of 0/1 values, got {type(mask).__name__}"
            )
        bad = non_binary(mask, 5)
        if bad:
            raise ValueError(
                f"CustomFromMask: mask must hold only 0 and 1, got other values such as {bad}; "
                "convert it with `mask != 0` if nonzero means kept"
            )
        object.__setattr__(self, "mask", mask.detach().to(torch.bool, copy=True))

    def __repr__(self) -> str:
        return f"CustomFromMask(mask=<{tuple(self.mask.shape)} bool>)"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CustomFromMask):
            return NotImplemented
        a, b = self.mask, other.mask
        return a is b or (a.shape == b.shape and a.device == b.device and bool(torch.equal(a, b)))

    def __hash__(self) -> int:
        return hash((CustomFromMask, tuple(self.mask.shape)))

    @property
    def pruning_type(self) -> PruningType:
        return "global"

    def compute_mask(
        self, scores: Tensor, default_mask: Mask = None, *, generator: torch.Generator | None = None
    ) -> Tensor:
        return kernels.custom_from_mask(self.mask, scores, default_mask)
