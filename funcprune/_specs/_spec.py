"""What a spec is: :class:`Spec`, the checked call :func:`checked_mask`, and :class:`AmountSpec`.

A spec is an immutable description of WHAT to prune and how much: a frozen
dataclass of hyper-parameters that computes its own mask with the pure
method ``compute_mask``. :func:`checked_mask` calls it and refuses a result
that is no mask of the scores (user specs); :class:`AmountSpec` is the base
of the specs that take an ``amount`` or ``sparsity=``. The built-in specs
live in ``_torch_specs.py`` and ``_shape_specs.py``; yours subclass
:class:`Spec` the same way.
"""

from __future__ import annotations

import abc
import contextlib
import math
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from .._select import Sparsity, Target
from .._types import Amount, Mask, PruningType, Tensor
from .._validate import check_sparsity, validate_amount_init

__all__ = ["AmountSpec", "Spec", "check_amount", "checked_mask", "named"]


class Spec(abc.ABC):
    """Abstract base of every pruning spec, built-in or user-defined.

    A spec is a frozen dataclass of hyper-parameters that says which part of
    a tensor it acts on (``pruning_type``) and computes its mask with a pure
    ``compute_mask``. To define one, subclass it as a frozen dataclass, set
    ``pruning_type`` and implement ``compute_mask``; the spec is then
    accepted by :func:`funcprune.compute_mask`, :func:`funcprune.prune`,
    :func:`funcprune.chain`, :class:`funcprune.Plan`,
    :func:`funcprune.global_unstructured` (unstructured specs) and, through
    :class:`funcprune.compat.SpecMethod`, by ``funcprune.compat``. It runs
    under ``vmap`` and ``torch.compile`` when its own code is
    transform-safe (no reading of tensor values).

    >>> import dataclasses, torch, funcprune as fp
    >>> @dataclasses.dataclass(frozen=True)
    ... class EveryOther(fp.Spec):
    ...     pruning_type = "unstructured"
    ...     def compute_mask(self, scores, default_mask=None, *, generator=None):
    ...         keep = torch.arange(scores.numel(), device=scores.device) % 2 == 1
    ...         mask = keep.reshape(scores.shape)
    ...         return mask if default_mask is None else mask & default_mask.bool()
    >>> fp.compute_mask(EveryOther(), torch.ones(4))
    tensor([False,  True, False,  True])
    """

    __slots__ = ()

    @abc.abstractmethod
    def compute_mask(
        self,
        scores: Tensor,
        default_mask: Mask = None,
        *,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Compute this spec's mask of ``scores`` (pure; inputs untouched).

        Args:
            scores: floating-point importance scores.
            default_mask: an earlier mask of the scores' shape (``True`` =
                kept), or ``None``. The result must never keep an entry it
                pruned; a float amount is a fraction of the unpruned part.
            generator: a :class:`torch.Generator` for random choices.

        Returns:
            A new ``torch.bool`` mask of the scores' shape.
        """

    def compute_joint_masks(
        self,
        scores: Sequence[Tensor],
        default_masks: Sequence[Mask],
        *,
        generator: torch.Generator | None = None,
    ) -> list[Tensor]:
        """The masks of several tensors ranked together (a global group).

        By default the scores (and earlier masks) are flattened into one
        vector, as :func:`torch.nn.utils.parameters_to_vector` does,
        ``compute_mask`` runs on it, and the mask is split back. A spec may
        override this with a way that does not concatenate.
        """
        flat = torch.cat([s.reshape(-1) for s in scores])
        flat_default = None
        if any(d is not None for d in default_masks):
            flat_default = torch.cat([
                torch.ones(s.numel(), dtype=torch.bool, device=s.device) if d is None
                else d.reshape(-1) for s, d in zip(scores, default_masks, strict=True)
            ])  # fmt: skip
        mask = checked_mask(self, flat, flat_default, generator)
        pieces = torch.split(mask, [s.numel() for s in scores])
        return [p.reshape(s.shape) for p, s in zip(pieces, scores, strict=True)]

    @property
    @abc.abstractmethod
    def pruning_type(self) -> PruningType:
        """The part of a tensor this spec acts on when folded on a mask.

        ``"unstructured"``: the entries still unpruned; ``"structured"``: the
        channels along ``dim`` not entirely pruned; ``"global"``: everything.
        """


def checked_mask(
    spec: Spec, scores: Tensor, default_mask: Mask, generator: torch.Generator | None
) -> Tensor:
    """``spec.compute_mask(...)`` on floating scores, refusing a result that is
    not a mask of ``scores``.

    Built-in specs always pass; the result check is for user-defined ones.
    Both read only shapes and dtypes (free under every transform).
    """
    name = type(spec).__name__
    if not scores.is_floating_point():
        raise TypeError(
            f"{name}: scores must be a floating-point tensor, got dtype {scores.dtype}; "
            "convert them with .float()"
        )
    mask = spec.compute_mask(scores, default_mask, generator=generator)
    if not isinstance(mask, torch.Tensor):
        raise TypeError(
            f"{name}.compute_mask must return a tensor, got {type(mask).__name__}; "
            "return a torch.bool mask of the scores' shape"
        )
    if mask.dtype != torch.bool or mask.shape != scores.shape:
        raise ValueError(
            f"{name}.compute_mask returned a {mask.dtype} tensor of shape "
            f"{tuple(mask.shape)}; a spec must return a torch.bool mask of the scores' "
            f"shape {tuple(scores.shape)}"
        )
    return mask


@contextlib.contextmanager
def named(spec: object) -> Iterator[None]:
    """Start a validation error's message with the spec's name."""
    try:
        yield
    except (TypeError, ValueError) as e:
        if type(e) not in (TypeError, ValueError):
            raise
        raise type(e)(f"{type(spec).__name__}: {e}") from None


def check_amount(amount: object) -> bool:
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
class AmountSpec(Spec):
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
        with named(self):
            if self.amount is not None and self.sparsity is not None:
                raise TypeError(
                    "give either amount (a count, or a fraction of what is left) or sparsity= "
                    "(the fraction pruned after the call), not both"
                )
            if self.sparsity is not None:
                object.__setattr__(self, "_is_count", False)
            else:
                object.__setattr__(self, "_is_count", check_amount(self.amount))

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
