"""The built-in specs: torch.nn.utils.prune's methods as frozen dataclasses.

A spec holds hyper-parameters only and validates them when it is built;
nothing mutates it (make variants with :func:`dataclasses.replace`). Each
computes its own mask with the pure method ``compute_mask``, which calls its
kernel in :mod:`funcprune._kernels`; they go through the same mechanism as a
user-defined :class:`~funcprune.Spec`. The checked entry point for users is
:func:`funcprune.compute_mask`.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, final

import torch

from . import _kernels as kernels
from ._select import Sparsity, Target
from ._spec import Spec
from ._types import Amount, Mask, NormOrder, PruningType, Tensor
from ._validate import check_dim, check_norm_order, check_sparsity, non_binary, validate_amount_init

__all__ = [
    "Identity",
    "RandomUnstructured",
    "L1Unstructured",
    "RandomStructured",
    "LnStructured",
    "CustomFromMask",
]


@contextlib.contextmanager
def _named(spec: object) -> Iterator[None]:
    """Start a validation error's message with the spec's name."""
    try:
        yield
    except (TypeError, ValueError) as e:
        if type(e) not in (TypeError, ValueError):
            raise
        raise type(e)(f"{type(spec).__name__}: {e}") from None


def _check_amount(amount: object) -> bool:
    """torch's amount rules, plus: no ``bool``, no NaN. Returns "is a count"."""
    if amount is None:
        raise TypeError(
            "Invalid type for amount: None. Must be int or float "
            "(or give sparsity=, the fraction pruned after the call)"
        )
    if isinstance(amount, bool):
        raise TypeError(
            f"amount must be an int count or a float fraction, got the bool {amount!r}; "
            "write 1 or 0 (a count) or 1.0 or 0.0 (a fraction)"
        )
    validate_amount_init(amount)
    if isinstance(amount, numbers.Integral):
        return True  # a count of any size (float() of a huge int would overflow)
    if isinstance(amount, numbers.Real) and math.isnan(float(amount)):
        raise ValueError("amount=nan should either be a float in the range [0, 1] or a non-negative integer")
    return isinstance(amount, numbers.Integral)


@dataclass(frozen=True, slots=True)
class _AmountSpec(Spec):
    """Abstract base of the specs that prune an ``amount`` or to a ``sparsity``.

    Exactly one is given: ``amount`` (torch's: a count, or a fraction of what
    is left) or ``sparsity=`` (keyword-only: the fraction of all units pruned
    after the call, counting what was pruned before; nothing is pruned if
    that many already are, nothing is ever revived). A count and a fraction
    never compare equal (``1`` prunes one unit, ``1.0`` all of them), though
    Python says ``1 == 1.0``.
    """

    amount: Amount | None = None
    _is_count: bool = field(init=False, repr=False)
    sparsity: float | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.sparsity is not None:
            check_sparsity(type(self).__name__, "sparsity", self.sparsity)
        with _named(self):
            if self.amount is not None and self.sparsity is not None:
                raise TypeError(
                    "give either amount (a count, or a fraction of what is left) or sparsity= "
                    "(the fraction pruned after the call), not both"
                )
            if self.sparsity is not None:
                object.__setattr__(self, "_is_count", False)
            else:
                object.__setattr__(self, "_is_count", _check_amount(self.amount))

    @property
    def target(self) -> Target:
        """What the kernels prune: ``amount``, or a cumulative :class:`Sparsity`."""
        if self.amount is None:
            assert self.sparsity is not None
            return Sparsity(float(self.sparsity))
        return self.amount

    def __repr__(self) -> str:
        fields = [f"amount={self.amount!r}" if self.sparsity is None else f"sparsity={self.sparsity!r}"]
        fields += [f"{name}={getattr(self, name)!r}" for name in self._extra_fields]
        return f"{type(self).__name__}({', '.join(fields)})"

    #: The fields after ``amount``, in the order the constructor takes them.
    _extra_fields: ClassVar[tuple[str, ...]] = ()


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
class RandomUnstructured(_AmountSpec):
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
class L1Unstructured(_AmountSpec):
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
class RandomStructured(_AmountSpec):
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
        _AmountSpec.__post_init__(self)
        with _named(self):
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
class LnStructured(_AmountSpec):
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
        _AmountSpec.__post_init__(self)
        with _named(self):
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
