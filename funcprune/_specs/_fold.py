"""The fold: specs applied one after another, each on what the ones before left.

:func:`fold` is the one loop behind :class:`Chain` (built by :func:`chain`:
composition is closed) and behind a :class:`~funcprune.Plan` rule with a
list of specs, which differ only in how a later step scores the tensor (a
chain multiplies its scores by the current mask; a plan scores the
parameter as it currently is, or takes the scores given). Every step's mask
comes from the spec's own ``compute_mask``, built in or user-defined alike,
checked by :func:`~._spec.checked_mask` (or, for DTensors, computed block
by block by the step ``funcprune._dtensor`` gives).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar, final

import torch

from .._types import Mask, PruningType, Tensor
from ._kernels import as_bool
from ._spec import Spec, checked_mask
from ._torch_specs import Identity

__all__ = ["Chain", "RuleItem", "ScoresOf", "Step", "chain", "fold"]

#: Scores for step ``i`` given the mask the steps before it left.
ScoresOf = Callable[[int, Mask], Tensor]
#: One step's mask from its spec, scores, the mask so far and the generator (:func:`checked_mask`'s signature).
Step = Callable[[Spec, Tensor, Mask, "torch.Generator | None"], Tensor]


class RuleItem(NamedTuple):
    """One parameter a plan's rule folds its specs on: its name, the parameter, its scores for each step
    (:data:`ScoresOf`), its earlier mask. Plain or DTensor alike (``funcprune._dtensor`` folds the latter)."""

    name: str
    param: Tensor
    scores_of: ScoresOf
    mask: Mask

#: What a step scores, and the mask it leaves: a tensor and its mask (or, for a group of DTensor
#: blocks, the blocks and their masks).
S = TypeVar("S")
M = TypeVar("M")
_NOTHING = Identity()


def fold(
    steps: Sequence[Spec],
    scores_of: Callable[[int, M | None], S],
    mask: M | None,
    generator: torch.Generator | None,
    *,
    step: Callable[[Spec, S, M | None, torch.Generator | None], M],
) -> M:
    """Apply ``steps`` in turn, each on the mask the steps before it left.

    Args:
        steps: the specs, first to last; none runs :class:`~funcprune.Identity`
            (nothing pruned).
        scores_of: what step ``i`` scores, given the current mask.
        mask: the earlier mask, or ``None``.
        generator: for the random specs.
        step: computes one step's mask: :func:`checked_mask` for a tensor;
            for DTensors, ``funcprune._dtensor``'s step, block by block.

    Returns:
        The last step's mask (a new one).
    """
    for i, spec in enumerate(steps or (_NOTHING,)):
        mask = step(spec, scores_of(i, mask), mask, generator)
    assert mask is not None  # one step at least
    return mask


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

        return fold(self.specs, scores_of, default_mask, generator, step=checked_mask)


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
