"""The public mask functions: checked entry points over every spec's ``compute_mask``.

:func:`compute_mask` (one tensor), :func:`compute_joint_masks` (several
tensors ranked together, as a global group) and :func:`prune` check their
inputs once and call the spec's own method; built-in and user-defined specs
go through the same path, and their results are checked alike.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import torch

from .. import _dtensor as dtensor
from .._dtensor import check_like
from .._specs import Spec, checked_mask
from .._types import Mask, Tensor, is_dtensor
from .._validate import check_fits, check_generator, check_same_shape

__all__ = ["compute_joint_masks", "compute_mask", "prune"]


def _check_tensor(fn: str, name: str, value: object) -> Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _check_scores(fn: str, name: str, scores: object) -> Tensor:
    scores = _check_tensor(fn, name, scores)
    if not scores.is_floating_point():
        raise TypeError(
            f"{fn}: {name} must be a floating-point tensor, got dtype {scores.dtype}; "
            f"convert it with {name.split('[')[0]}.float()"
        )
    return scores


def _check_mask(fn: str, name: str, mask: object, scores: Tensor) -> Tensor:
    mask = _check_tensor(fn, name, mask)
    check_fits(fn, name, mask, "the scores", scores, plural=True)
    return mask if mask.dtype == torch.bool else mask != 0


def _check_spec(fn: str, spec: object) -> Spec:
    if not isinstance(spec, Spec):
        raise TypeError(
            f"{fn}: spec must be a funcprune spec, got {spec!r} of type "
            f"{type(spec).__name__}; a spec is an instance of a funcprune.Spec subclass"
        )
    return spec


def compute_mask(
    spec: Spec,
    scores: Tensor,
    default_mask: Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Compute the ``torch.bool`` mask that ``spec`` gives for ``scores``.

    Args:
        spec: what to prune (any funcprune spec, chains and your own included).
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

    ``scores`` may be a DTensor (an FSDP2 parameter, say) laid out as
    ``Shard(dim)`` or ``Replicate()`` on each dim of its device mesh, with a
    ``default_mask`` of the same mesh and placements. Every process of the
    mesh calls this on its DTensor and gets its block of the mask, a
    ``torch.bool`` DTensor of the scores' layout; together the blocks are
    exactly the mask of the whole tensor. Only counts cross processes (a
    few fixed-size all-reduces); nothing is gathered. The specs computed on
    DTensors (this list is read from their registry when funcprune is
    imported): {dtensor_specs}. See the guide's "Distributed" page.

    Raises:
        TypeError: if ``spec`` is not a spec, ``scores`` is not a floating
            tensor or ``generator`` not a :class:`torch.Generator`; if one
            of ``scores`` and ``default_mask`` is a DTensor and the other not.
        ValueError: if ``default_mask`` does not have the scores' shape,
            device (or DTensor mesh and placements), an integer amount
            exceeds the units available, a structured spec meets a tensor
            with fewer than 2 dims, or a spec returns something other than a
            mask of the scores' shape.
        IndexError: if a structured spec's ``dim`` does not index ``scores``.
        NotImplementedError: for DTensors, if the spec or the layout is not
            supported yet (other specs, ``Partial``, a lone
            ``_StridedShard`` whose blocks are no boxes).

    >>> import torch, funcprune as fp
    >>> w = torch.tensor([[0.5, -0.1], [2.0, 0.3]])
    >>> fp.compute_mask(fp.L1Unstructured(amount=2), w)
    tensor([[ True, False],
            [ True, False]])
    >>> fp.compute_mask(fp.LnStructured(amount=1, n=1, dim=0), w)
    tensor([[False, False],
            [ True,  True]])
    """
    spec = _check_spec("compute_mask", spec)
    scores = _check_scores("compute_mask", "scores", scores)
    mask = None if default_mask is None else _check_mask("compute_mask", "default_mask", default_mask, scores)
    check_generator("compute_mask", generator)
    if is_dtensor(scores) or is_dtensor(mask):
        return dtensor.compute_mask("compute_mask", spec, scores.detach(), mask, generator=generator)
    return checked_mask(spec, scores.detach(), mask, generator)


def compute_joint_masks(
    spec: Spec,
    scores: Sequence[Tensor],
    default_masks: Sequence[Tensor | None] | None = None,
    *,
    generator: torch.Generator | None = None,
) -> list[Tensor]:
    """The masks of several tensors ranked together by one unstructured spec.

    The functional core of global pruning: the result equals
    :func:`compute_mask` on the scores (and earlier masks) flattened into one
    vector, split back per tensor; tensors of different dtypes are ranked in
    their promoted dtype, as a concatenation would. ``L1Unstructured`` never
    builds that vector in eager mode.

    The scores may be DTensors, all on one device mesh, each laid out
    as ``Shard(dim)`` or ``Replicate()`` on each mesh dim (its earlier mask likewise), as
    for :func:`compute_mask`: ranked jointly across processes, nothing
    gathered, with the unstructured specs :func:`compute_mask` runs on
    DTensors.

    Args:
        spec: an unstructured spec (``pruning_type == "unstructured"``).
        scores: floating-point scores, one tensor per member of the group.
        default_masks: earlier masks, one per tensor (``None`` for a tensor
            not pruned yet); ``None`` for none at all.
        generator: a :class:`torch.Generator` for random specs.

    Returns:
        One new ``torch.bool`` mask per tensor, in order.

    Raises:
        TypeError: as :func:`compute_mask`, if the spec is not unstructured,
            or the group mixes DTensors and plain tensors.
        ValueError: as :func:`compute_mask`, if the lists differ in length
            or DTensors of the group are on different meshes.
        NotImplementedError: as :func:`compute_mask`.

    >>> import torch, funcprune as fp
    >>> fp.compute_joint_masks(fp.L1Unstructured(2), [torch.tensor([1.0, 6.0]), torch.tensor([3.0, 0.5])])
    [tensor([False,  True]), tensor([ True, False])]
    """
    fn = "compute_joint_masks"
    spec = _check_spec(fn, spec)
    if spec.pruning_type != "unstructured":
        raise TypeError(
            f"{fn}: spec must be unstructured to rank entries of several tensors together, "
            f"got {spec!r} whose pruning_type is {spec.pruning_type!r}"
        )
    if isinstance(scores, torch.Tensor) or not isinstance(scores, Sequence) or not scores:
        raise TypeError(f"{fn}: scores must be a non-empty list of tensors, got {scores!r}")
    each = [_check_scores(fn, f"scores[{i}]", s).detach() for i, s in enumerate(scores)]
    defaults: list[Mask] = [None] * len(each)
    if default_masks is not None:
        if len(default_masks) != len(each):
            raise ValueError(
                f"{fn}: got {len(each)} score tensors but {len(default_masks)} default masks; "
                "give one per tensor (None for a tensor not pruned yet)"
            )
        defaults = [None if d is None else _check_mask(fn, f"default_masks[{i}]", d, s)
                    for i, (d, s) in enumerate(zip(default_masks, each))]  # fmt: skip
    check_generator(fn, generator)
    if any(map(is_dtensor, [*each, *defaults])):
        return dtensor.compute_joint_masks(fn, spec, each, defaults, generator=generator)
    masks = spec.compute_joint_masks(each, defaults, generator=generator)
    for i, (mask, s) in enumerate(zip(masks, each, strict=True)):
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != s.shape:
            raise ValueError(
                f"{type(spec).__name__}.compute_joint_masks returned {mask!r:.60} for tensor "
                f"{i}; it must return one torch.bool mask of each scores' shape"
            )
    return masks


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
        check_same_shape("prune", "importance_scores", scores.shape, "t", t.shape)
    spec = _check_spec("prune", spec)
    mask = None if default_mask is None else _check_mask("prune", "default_mask", default_mask, t)
    check_generator("prune", generator)
    if any(map(is_dtensor, (t, scores, mask))):
        names = ("t" if scores is t else "importance_scores", "default_mask")
        check_like("prune", names[0], scores, "t", t)
        return t * dtensor.compute_mask("prune", spec, scores.detach(), mask, names, generator=generator).to(t.dtype)
    return t * checked_mask(spec, scores.detach(), mask, generator).to(t.dtype)


# The DTensor specs compute_mask lists are read from their one registry (and so is the guide's list).
compute_mask.__doc__ = (compute_mask.__doc__ or "").replace(
    "{dtensor_specs}", textwrap.fill(dtensor.described(), 76, subsequent_indent="    ")
)
