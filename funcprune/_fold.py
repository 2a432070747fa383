"""The fold: specs applied one after another, each on what the ones before left.

This is the one loop behind :class:`~funcprune.Chain` and behind a
:class:`~funcprune.Plan` rule with a list of specs, which differ only in how
a later step scores the tensor (a chain multiplies its scores by the current
mask; a plan scores the parameter as it currently is, or takes the scores
given). Every step's mask comes from the spec's own ``compute_mask``, built
in or user-defined alike, and is checked here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from ._kernels import keep_all
from ._types import Mask, Tensor

if TYPE_CHECKING:
    from ._spec import Spec

__all__ = ["Step", "checked_mask", "fold"]

#: Scores for step ``i`` given the mask the steps before it left.
ScoresOf = Callable[[int, Mask], Tensor]
#: One step's mask from its spec, scores, the mask so far and the generator (:func:`checked_mask`'s signature).
Step = Callable[["Spec", Tensor, Mask, "torch.Generator | None"], Tensor]


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


def fold(
    steps: Sequence[Spec],
    scores_of: ScoresOf,
    mask: Mask,
    generator: torch.Generator | None,
    *,
    step: Step = checked_mask,
) -> Tensor:
    """Apply ``steps`` in turn, each on the mask the steps before it left.

    Args:
        steps: the specs, first to last; none prunes nothing.
        scores_of: the scores of step ``i``, given the current mask.
        mask: the earlier mask (``torch.bool``), or ``None``.
        generator: for the random specs.
        step: computes one step's mask (:func:`checked_mask`; DTensors'
            block by block, :func:`._dtensor_masks.fold_step`).

    Returns:
        The last step's mask (a new tensor).
    """
    if not steps:
        return keep_all(scores_of(0, mask), mask)
    for i, spec in enumerate(steps):
        mask = step(spec, scores_of(i, mask), mask, generator)
    assert mask is not None
    return mask
