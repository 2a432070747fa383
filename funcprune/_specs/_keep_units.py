"""Channels of several tensors ranked together: the one-process kernel of ``global_structured``.

Each tensor is scored per channel (:func:`channel_keys`: the L``n`` norm of
each slice along ``dim``, optionally normalized per tensor; zeros for the
random spec), the channel scores of all tensors are ranked as one vector by
one exact selection (:func:`keep_channels`: ``L1Unstructured`` on the norms,
which are non-negative, or ``RandomUnstructured``), and the kept channels
are expanded back to each tensor's shape on top of its earlier mask.
``funcprune._dtensor`` ranks DTensors' channels across processes with the
same checks, normalization and expansion.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple, Optional, Union

import torch

from .._select import keep, resolve_count
from .._types import Count, Mask, Tensor
from .._validate import validate_dim_range, validate_structured
from ._kernels import _rand, check_matrix_norm, unpruned_count, unpruned_units
from ._spec import Spec, checked_mask
from ._torch_specs import (
    L1Unstructured,
    LnStructured,
    RandomStructured,
    RandomUnstructured,
)

__all__ = [
    "ChannelKeys", "Normalize", "StructuredSpec", "channel_keys", "check_channels", "expand_channels",
    "keep_channels", "keep_units", "normalized",
]  # fmt: skip

#: How each tensor's channel norms are scaled before they compete (``None``: raw).
Normalize = Optional[Literal["mean", "max"]]
#: The specs whose channels can be ranked across tensors.
StructuredSpec = Union[LnStructured, RandomStructured]


class ChannelKeys(NamedTuple):
    """One tensor of the group, seen channel by channel."""

    keys: Tensor  # one score per channel (zeros for RandomStructured)
    eligible: Mask  # the channels not entirely pruned earlier; None: all
    dim: int  # the channels' dim, non-negative
    shape: torch.Size  # the tensor's shape
    mask: Mask  # its earlier mask


def check_channels(spec: StructuredSpec, scores: Tensor) -> None:
    """One tensor's checks (torch's first): floating scores, 2 dims or more, ``dim`` in range, the norm."""
    if not scores.is_floating_point():
        raise TypeError(
            f"scores must be a floating-point tensor, got dtype {scores.dtype}; convert them with .float()"
        )
    validate_structured(scores)
    validate_dim_range(scores, spec.dim)
    if isinstance(spec, LnStructured):
        check_matrix_norm(spec.n, scores)


def channel_keys(spec: StructuredSpec, scores: Tensor, mask: Mask, normalize: Normalize) -> ChannelKeys:
    """The channel scores of one tensor and its still-unpruned channels (torch's checks first)."""
    check_channels(spec, scores)
    d = spec.dim % scores.dim()
    eligible = None if mask is None else unpruned_units("structured", mask, d)
    if isinstance(spec, RandomStructured):
        keys = torch.zeros(scores.shape[d], device=scores.device)
    else:
        others = [i for i in range(scores.dim()) if i != d]
        keys = normalized(torch.norm(scores, p=spec.n, dim=others), eligible, normalize)
    return ChannelKeys(keys, eligible, d, scores.shape, mask)


def normalized(norms: Tensor, eligible: Mask, normalize: Normalize) -> Tensor:
    """``norms`` divided by the mean or max of the finite ones of unpruned channels.

    Where that is not positive (all zero, or no such channel) they stay as they are.
    """
    if normalize is None or norms.numel() == 0:
        return norms
    counted = norms.isfinite() if eligible is None else norms.isfinite() & eligible
    values = torch.where(counted, norms, torch.zeros_like(norms))
    if normalize == "mean":
        scale = values.sum() / counted.sum().clamp(min=1).to(norms.dtype)
    else:
        scale = values.amax()
    return norms / torch.where(scale > 0, scale, torch.ones_like(scale))


def keep_units(
    spec: StructuredSpec, keys: Sequence[Tensor], eligible: Sequence[Tensor | None], generator: torch.Generator | None,
    *, least: Sequence[int] | None = None,
) -> Tensor:  # fmt: skip
    """One exact selection over units' keys (non-negative norms, or NaN), joined: which units stay.

    ``eligible`` (per part, ``None``: all) says which units an earlier mask
    left. Norms are >= 0 (or NaN), so L1's ranking is theirs: an exact
    count, ties to the lower unit, NaN pruned last; ``RandomStructured``
    draws units. With ``least`` (one count per part), each part keeps that
    many of the units it has left, or all of them where it has fewer
    (:func:`_keep_leaving`).
    """
    if least is not None:
        return _keep_leaving(spec, keys, eligible, generator, least)
    joined = torch.cat(list(keys))
    alive = None
    if any(e is not None for e in eligible):
        alive = torch.cat([
            torch.ones(k.shape, dtype=torch.bool, device=k.device) if e is None else e
            for k, e in zip(keys, eligible, strict=True)
        ])  # fmt: skip
    flat: Spec
    if isinstance(spec, RandomStructured):
        flat = RandomUnstructured(spec.amount, sparsity=spec.sparsity)
    else:
        flat = L1Unstructured(spec.amount, sparsity=spec.sparsity)
    return checked_mask(flat, joined.detach(), alive, generator)


def _keep_leaving(
    spec: StructuredSpec, keys: Sequence[Tensor], eligible: Sequence[Tensor | None], generator: torch.Generator | None,
    least: Sequence[int],
) -> Tensor:  # fmt: skip
    """:func:`keep_units`, but no part keeps fewer than its ``least`` units (of those left): the count stays exact.

    The amount counts every unit left, as without the rule; each part's
    ``least`` units that the selection would prune last (the largest keys,
    NaN above all, ties to the later unit) are set aside, and the count goes
    among the others: the same units as the plain selection, except that
    where it would leave a part too few, that part's best units stay and the
    next units in the order go instead. ``RandomStructured`` draws one number per unit
    (a random order) and ranks by it. A count larger than the units that
    can go raises ``ValueError`` (eagerly; under a transform it is capped).
    """
    sizes = [k.shape[-1] for k in keys]
    joined = torch.cat(list(keys)).detach()
    if isinstance(spec, RandomStructured):
        joined = _rand(joined.shape[-1], generator, torch.float64, joined.device)
    parts = torch.split(joined, sizes, -1)
    alive = torch.cat([
        torch.ones(k.shape, dtype=torch.bool, device=k.device) if e is None else e
        for k, e in zip(parts, eligible, strict=True)
    ], -1)  # fmt: skip
    last = torch.cat([_last_to_go(k, e, n) for k, e, n in zip(parts, eligible, least, strict=True)], -1)
    total = joined.shape[-1]
    unpruned = unpruned_count(joined, alive, total)
    count: Count = resolve_count(spec.target, unpruned, total)
    free = alive & ~last
    available = unpruned_count(joined, free, total)
    if isinstance(count, int) and isinstance(available, int):
        if count > available:
            raise ValueError(
                f"{count} of the {unpruned} units left would go, but each group keeps one of its units at "
                "least (shrink keeps a channel on each side of a layer, and a router its top_k experts): at "
                f"most {available} can go"
            )
    else:
        count = torch.clamp(torch.as_tensor(count), max=available)
    return keep(joined, count, free) | last


def _last_to_go(keys: Tensor, eligible: Tensor | None, count: int = 1) -> Tensor:
    """Flags the ``count`` units left (``eligible``) that a selection would prune last: the largest keys, NaN
    above all, ties to the later unit; all of them where fewer are left."""
    ranked = keys if eligible is None else torch.where(eligible, keys, torch.full_like(keys, -math.inf))
    n = keys.shape[-1]
    last = torch.sort(ranked, dim=-1, stable=True).indices.narrow(-1, n - min(count, n), min(count, n))
    flags = (torch.arange(n, device=keys.device).unsqueeze(-1) == last.unsqueeze(-2)).any(-1)
    return flags if eligible is None else flags & eligible


def keep_channels(
    spec: StructuredSpec, parts: Sequence[ChannelKeys], generator: torch.Generator | None
) -> list[Tensor]:
    """One exact selection over the group's channel vector, expanded back per tensor."""
    kept = keep_units(spec, [part.keys for part in parts], [part.eligible for part in parts], generator)
    pieces = torch.split(kept, [part.keys.shape[0] for part in parts])
    return [expand_channels(piece, part) for piece, part in zip(pieces, parts, strict=True)]


def expand_channels(kept: Tensor, part: ChannelKeys) -> Tensor:
    """Kept channels as a mask of the tensor's shape, on top of its earlier mask."""
    shape = [1] * len(part.shape)
    shape[part.dim] = part.shape[part.dim]
    full = kept.reshape(shape).expand(part.shape)
    return full.contiguous() if part.mask is None else full & part.mask
