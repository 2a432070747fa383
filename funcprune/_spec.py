"""What a spec is, and how specs compose: :class:`Spec`, :class:`Chain`, :func:`chain`.

A spec is an immutable description of WHAT to prune and how much: a frozen
dataclass of hyper-parameters that computes its own mask with the pure
method ``compute_mask``. The built-in specs live in :mod:`funcprune._specs`;
yours subclass :class:`Spec` the same way. Composition is closed:
:func:`chain` turns specs into one spec, folded step by step by
:mod:`funcprune._fold`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import final

import torch

from ._fold import checked_mask, fold
from ._kernels import as_bool
from ._types import Mask, PruningType, Tensor

__all__ = ["Spec", "Chain", "chain"]


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


@final
@dataclass(frozen=True, slots=True)
class Chain(Spec):
    """Several specs applied one after another, each on what is still unpruned.

    Build one with :func:`chain`, which checks and flattens its arguments.
    Step ``i > 0`` scores the tensor as pruned by the steps before it (scores
    times the current mask). With the parameter itself as the scores, this is
    exactly what repeated ``torch.nn.utils.prune`` calls on one module do,
    since each call scores the currently pruned tensor; a torch call given
    ``importance_scores`` would score them unmasked instead (a
    :class:`funcprune.Plan` rule with a list of specs and explicit scores
    does that).
    """

    specs: tuple[Spec, ...]

    def __post_init__(self) -> None:
        for i, spec in enumerate(self.specs):
            if not isinstance(spec, Spec) or isinstance(spec, Chain):
                raise TypeError(
                    f"Chain.specs[{i}] must be a non-chain funcprune spec, got {spec!r}; "
                    "build chains with funcprune.chain(...), which flattens them"
                )

    @property
    def pruning_type(self) -> PruningType:
        """The steps' common type; ``"global"`` when they differ.

        An empty chain prunes nothing and is ``"unstructured"`` like
        :class:`Identity`.
        """
        kinds = {spec.pruning_type for spec in self.specs}
        if not kinds:
            return "unstructured"
        if len(kinds) == 1:
            return kinds.pop()
        return "global"

    def compute_mask(
        self, scores: Tensor, default_mask: Mask = None, *, generator: torch.Generator | None = None
    ) -> Tensor:
        """Fold the steps: step ``i > 0`` scores ``scores * mask`` (the tensor as pruned)."""
        default_mask = as_bool(default_mask)

        def scores_of(i: int, mask: Mask) -> Tensor:
            return scores if i == 0 or mask is None else scores * mask.to(scores.dtype)

        return fold(self.specs, scores_of, default_mask, generator)


def chain(*specs: Spec) -> Chain:
    """Compose specs into one :class:`Chain`; chains inside are flattened.

    Composition is closed: the result is a spec, and
    ``chain(chain(a, b), c) == chain(a, chain(b, c)) == chain(a, b, c)``.

    Raises:
        TypeError: if an argument is not a funcprune spec.

    >>> from funcprune import L1Unstructured, Identity, RandomUnstructured
    >>> chain(L1Unstructured(0.5), chain(Identity(), RandomUnstructured(2)))
    Chain(specs=(L1Unstructured(amount=0.5), Identity(), RandomUnstructured(amount=2)))
    """
    flat: list[Spec] = []
    for i, spec in enumerate(specs):
        if isinstance(spec, Chain):
            flat.extend(spec.specs)
        elif isinstance(spec, Spec):
            flat.append(spec)
        else:
            raise TypeError(
                f"chain: argument {i} must be a funcprune spec, got {spec!r} "
                f"of type {type(spec).__name__}"
            )
    return Chain(tuple(flat))
