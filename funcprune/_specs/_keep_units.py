"""Units ranked together: one exact selection over the keys of units of several groups (``keep_units``).

The plans over units (``funcprune._plans``: ``structured``, and
``global_structured``, whose units are the channels of each tensor) key
every unit by a norm (or draw it at random), optionally scale each group's
keys (:func:`normalized`, how :data:`NORMALIZE` says), and rank all keys
as one vector here: ``L1Unstructured`` on the norms, which are
non-negative, or ``RandomUnstructured``, with each group keeping its
``least`` units where asked. :func:`check_channels` holds torch's checks of
one tensor whose channels are ranked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, Optional, Union, get_args

import torch

from .._select import keep, resolve_count
from .._types import Count, Tensor
from .._validate import validate_dim_range, validate_structured
from ._kernels import _rand, check_matrix_norm, unpruned_count
from ._spec import Spec, checked_mask
from ._torch_specs import (
    L1Unstructured,
    LnStructured,
    RandomStructured,
    RandomUnstructured,
)

__all__ = ["NORMALIZE", "Normalize", "StructuredSpec", "check_channels", "check_normalize", "keep_units", "normalized"]

#: How each group's unit norms are scaled before they compete (``None``: raw).
Normalize = Optional[Literal["mean", "max"]]
#: Every value ``normalize`` takes.
NORMALIZE: tuple[Normalize, ...] = (None, *get_args(get_args(Normalize)[0]))
#: The specs whose units can be ranked across groups.
StructuredSpec = Union[LnStructured, RandomStructured]


def check_normalize(fn: str, normalize: object, spec: StructuredSpec, units: str = "units") -> None:
    """Refuse a ``normalize`` that is not one of :data:`NORMALIZE`, or any with a random spec.

    Raises:
        TypeError: if ``normalize`` is neither ``None`` nor a string.
        ValueError: if it is another string, or given with ``RandomStructured``
            (which draws its ``units`` without norms).
    """
    if normalize is not None and not isinstance(normalize, str):
        raise TypeError(
            f"{fn}: normalize must be None, 'mean' or 'max', got {normalize!r} of type {type(normalize).__name__}"
        )
    if normalize not in NORMALIZE:
        raise ValueError(f"{fn}: normalize must be None, 'mean' or 'max', got {normalize!r}")
    if normalize is not None and isinstance(spec, RandomStructured):
        raise ValueError(
            f"{fn}: normalize={normalize!r} scales {units[:-1]} norms, but {spec!r} draws {units} "
            "at random without norms; leave normalize=None"
        )


def check_channels(spec: StructuredSpec, scores: Tensor) -> None:
    """One tensor's checks (torch's first): floating scores, 2 dims or more, ``dim`` in range, the norm.

    A tensor of no entries is normed as torch norms it, for torch's errors
    (an ``inf`` norm over an empty dim has no identity).
    """
    if not scores.is_floating_point():
        raise TypeError(
            f"scores must be a floating-point tensor, got dtype {scores.dtype}; convert them with .float()"
        )
    validate_structured(scores)
    validate_dim_range(scores, spec.dim)
    if isinstance(spec, LnStructured):
        check_matrix_norm(spec.n, scores)
        if math.prod(scores.shape) == 0:
            d = spec.dim % scores.dim()
            empty = torch.zeros(scores.shape, dtype=scores.dtype)
            torch.norm(empty, p=spec.n, dim=[i for i in range(scores.dim()) if i != d])


def normalized(norms: Tensor, eligible: Tensor | None, normalize: Normalize) -> Tensor:
    """``norms`` divided by the mean or max of the finite ones of unpruned units.

    Where that is not positive (all zero, or no such unit) they stay as they are.
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
    *, least: Sequence[int] | None = None, protect: Sequence[Tensor | None] | None = None,
) -> Tensor:  # fmt: skip
    """One exact selection over units' keys (non-negative norms, or NaN), joined: which units stay.

    ``eligible`` (per part, ``None``: all) says which units an earlier mask
    left. Norms are >= 0 (or NaN), so L1's ranking is theirs: an exact
    count, ties to the lower unit, NaN pruned last; ``RandomStructured``
    draws units. With ``least`` (one count per part), each part keeps that
    many of the units it has left, or all of them where it has fewer
    (:func:`_keep_leaving`); with ``protect`` (one ``bool`` flag per unit
    per part, or ``None``), flagged units never go and count toward it.
    """
    if protect is not None and any(p is not None for p in protect):
        least = list(least) if least is not None else [0] * len(keys)
    if least is not None and (any(least) or protect is not None):
        return _keep_leaving(spec, keys, eligible, generator, least, protect)
    joined = torch.cat(list(keys)) if keys else torch.zeros(0, dtype=torch.float64)
    alive = None
    if any(e is not None for e in eligible):
        alive = torch.cat([
            torch.ones(k.shape, dtype=torch.bool, device=k.device) if e is None else e
            for k, e in zip(keys, eligible, strict=True)
        ])  # fmt: skip
    flat: Spec
    if isinstance(spec, RandomStructured):  # one draw per unit left, of torch's default dtype, as torch draws
        flat = RandomUnstructured(spec.amount, sparsity=spec.sparsity)
        joined = torch.zeros(joined.shape, device=joined.device)
    else:
        flat = L1Unstructured(spec.amount, sparsity=spec.sparsity)
    return checked_mask(flat, joined.detach(), alive, generator)


def _keep_leaving(
    spec: StructuredSpec, keys: Sequence[Tensor], eligible: Sequence[Tensor | None], generator: torch.Generator | None,
    least: Sequence[int], protect: Sequence[Tensor | None] | None = None,
) -> Tensor:  # fmt: skip
    """:func:`keep_units`, but no part keeps fewer than its ``least`` units (of those left): the count stays exact.

    The amount counts every unit left, as without the rule; each part's
    ``least`` units that the selection would prune last (the largest keys,
    NaN above all, ties to the later unit) are set aside, and the count goes
    among the others: the same units as the plain selection, except that
    where it would leave a part too few, that part's best units stay and the
    next units in the order go instead; its ``protect``ed units left are
    set aside too, first (they count toward ``least``). ``RandomStructured`` draws one number per unit
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
    shields = [None] * len(parts) if protect is None else protect
    last = torch.cat([_last_to_go(k, e, n, p) for k, e, n, p in zip(parts, eligible, least, shields, strict=True)], -1)
    total = joined.shape[-1]
    unpruned = unpruned_count(joined, alive, total)
    count: Count = resolve_count(spec.target, unpruned, total)
    free = alive & ~last
    available = unpruned_count(joined, free, total)
    if isinstance(count, int) and isinstance(available, int):
        if count > available:
            raise ValueError(
                f"{count} of the {unpruned} units left would go, but each group keeps one of its units at "
                "least (shrink keeps a channel on each side of a layer, and a router its top_k experts)"
                f"{', and the protected units stay' if protect is not None else ''}: at most {available} can go"
            )
    else:
        count = torch.clamp(torch.as_tensor(count), max=available)
    return keep(joined, count, free) | last


def _last_to_go(keys: Tensor, eligible: Tensor | None, count: int = 1, protect: Tensor | None = None) -> Tensor:
    """Flags the ``count`` units left (``eligible``) that a selection would prune last: the largest keys, NaN
    above all, ties to the later unit; all of them where fewer are left. ``protect``ed units left are flagged
    all, and count first (above NaN)."""
    ranked = keys if eligible is None else torch.where(eligible, keys, torch.full_like(keys, -math.inf))
    n = keys.shape[-1]
    order = torch.sort(ranked, dim=-1, stable=True).indices
    if protect is not None:  # the protected last of all, in the keys' order among them
        shield = protect.to(keys.device).expand(keys.shape)
        order = order.gather(-1, torch.sort(shield.gather(-1, order).to(torch.int8), dim=-1, stable=True).indices)
    last = order.narrow(-1, n - min(count, n), min(count, n))
    flags = (torch.arange(n, device=keys.device).unsqueeze(-1) == last.unsqueeze(-2)).any(-1)
    if protect is not None:
        flags = flags | protect.to(keys.device)
    return flags if eligible is None else flags & eligible
