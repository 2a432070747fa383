"""The public mask functions and the fold that chains specs.

:func:`compute_mask` checks its inputs once, then either runs one kernel or
folds a :class:`Chain`: each step acts on what the steps before it left
unpruned and scores the tensor as they left it (``scores * mask``), which is
what repeated ``torch.nn.utils.prune`` calls on one module do.
"""

from __future__ import annotations

import torch

from ._kernels import keep_all, leaf_mask
from ._specs import Chain, Spec
from ._validate import check_generator

Tensor = torch.Tensor


def _check_tensor(fn: str, name: str, value: object) -> Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _check_scores(fn: str, name: str, scores: object) -> Tensor:
    scores = _check_tensor(fn, name, scores)
    if not scores.is_floating_point():
        raise TypeError(
            f"{fn}: {name} must be a floating-point tensor, got dtype {scores.dtype}; "
            f"convert it with {name}.float()"
        )
    return scores


def _check_mask(fn: str, mask: object, scores: Tensor) -> Tensor:
    mask = _check_tensor(fn, "default_mask", mask)
    if mask.shape != scores.shape:
        raise ValueError(
            f"{fn}: default_mask has shape {tuple(mask.shape)} but the scores have "
            f"shape {tuple(scores.shape)}; they must be equal"
        )
    if mask.device != scores.device:
        raise ValueError(
            f"{fn}: default_mask is on {mask.device} but the scores are on {scores.device}; "
            f"move it with .to({str(scores.device)!r})"
        )
    return mask if mask.dtype == torch.bool else mask != 0


def _fold(
    spec: Spec, scores: Tensor, mask: Tensor | None, generator: torch.Generator | None
) -> Tensor:
    if not isinstance(spec, Chain):
        return leaf_mask(spec, scores, mask, generator)
    result = keep_all(scores, mask)  # an empty chain prunes nothing
    current = scores
    for i, step in enumerate(spec.specs):
        if i > 0 and mask is not None:
            current = scores * mask.to(scores.dtype)
        mask = result = leaf_mask(step, current, mask, generator)
    return result


def compute_mask(
    spec: Spec,
    scores: Tensor,
    default_mask: Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Compute the ``torch.bool`` mask that ``spec`` gives for ``scores``.

    Args:
        spec: what to prune (any funcprune spec, chains included).
        scores: floating-point importance scores; usually the parameter.
        default_mask: an earlier mask of the scores' shape (``bool``, or
            numbers where nonzero means kept). The spec then acts only on the
            part still unpruned, as torch's ``PruningContainer`` does, and a
            float amount is a fraction of that part. ``None`` means all kept.
        generator: a :class:`torch.Generator` for random specs; by default
            they draw from torch's global RNG exactly as torch's methods do.

    Returns:
        A new mask (``True`` = kept) with the shape of ``scores``. Entries
        pruned by ``default_mask`` stay pruned. Exactly the requested count
        is pruned: among equal scores the lower flat index goes first, and
        NaN scores count as the most important (torch never prunes a NaN
        before a number either).

    Raises:
        TypeError: if ``spec`` is not a spec, ``scores`` is not a floating
            tensor or ``generator`` not a :class:`torch.Generator`.
        ValueError: if ``default_mask`` does not have the scores' shape or
            device, an integer amount exceeds the units available, or a
            structured spec meets a tensor with fewer than 2 dims.
        IndexError: if a structured spec's ``dim`` does not index ``scores``.

    >>> import torch, funcprune as fp
    >>> w = torch.tensor([[0.5, -0.1], [2.0, 0.3]])
    >>> fp.compute_mask(fp.L1Unstructured(amount=2), w)
    tensor([[ True, False],
            [ True, False]])
    >>> fp.compute_mask(fp.LnStructured(amount=1, n=1, dim=0), w)
    tensor([[False, False],
            [ True,  True]])
    """
    if not isinstance(spec, Spec):
        raise TypeError(f"compute_mask: spec must be a funcprune spec, got {spec!r}")
    scores = _check_scores("compute_mask", "scores", scores)
    mask = None if default_mask is None else _check_mask("compute_mask", default_mask, scores)
    check_generator("compute_mask", generator)
    return _fold(spec, scores.detach(), mask, generator)


def prune(
    spec: Spec,
    t: Tensor,
    default_mask: Tensor | None = None,
    importance_scores: Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Return ``t`` pruned by ``spec``: ``t * mask``, as torch's ``prune`` does.

    Args:
        spec: what to prune.
        t: the tensor to prune.
        default_mask: an earlier mask, as in :func:`compute_mask`.
        importance_scores: scores of ``t``'s shape; ``t`` itself by default.
        generator: a :class:`torch.Generator` for random specs.

    Raises:
        ValueError: if ``importance_scores`` does not have ``t``'s shape; see
            :func:`compute_mask` for the rest.

    >>> import torch, funcprune as fp
    >>> fp.prune(fp.L1Unstructured(1), torch.tensor([3.0, -1.0, 2.0]))
    tensor([3., -0., 2.])
    """
    t = _check_scores("prune", "t", t)
    if importance_scores is None:
        scores = t
    else:
        scores = _check_scores("prune", "importance_scores", importance_scores)
        if scores.shape != t.shape:
            raise ValueError(
                f"prune: importance_scores has shape {tuple(scores.shape)} but t has "
                f"shape {tuple(t.shape)}; they must be equal"
            )
    if not isinstance(spec, Spec):
        raise TypeError(f"prune: spec must be a funcprune spec, got {spec!r}")
    mask = None if default_mask is None else _check_mask("prune", default_mask, t)
    check_generator("prune", generator)
    return t * _fold(spec, scores.detach(), mask, generator).to(t.dtype)
