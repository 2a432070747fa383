"""Whole units ranked: the one ranking behind ``structured`` and ``global_structured``.

A unit is a run of slices of one or more parameters (:class:`~funcprune.UnitGroup`'s
members): a head, a KV group, an MLP channel, an expert, or one channel of
one tensor, which is what ``global_structured`` ranks (one-member groups
of width 1). Each unit is keyed by the ``n``-norm of all of its entries
(``_unit_keys.py``: float64 and order-free, so the keys are the same bit
for bit however the entries are split over members and processes), or
drawn at random; each group's keys may be normalized; one exact selection
(``keep_units`` of ``funcprune._specs``) picks the units that go, over all
groups at once or within each group; each member's mask is its earlier
mask with the pruned units' slices cleared. Members are held whole, or as
this process's blocks of DTensors (``_held_members.py``), and the masks
come back laid out as their parameters. Everything is tensor arithmetic on
the parameters' shapes, so the ranking runs under ``vmap`` and
``torch.compile`` as the other plans do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch

from .._specs import LnStructured, Normalize, StructuredSpec, keep_units, normalized
from .._types import Params, Scores, Tensor
from .._units import UnitGroup
from ._held_members import HeldMembers, sharded_members
from ._unit_keys import FailedElsewhere, Order, unit_keys

__all__ = ["SCOPES", "Scope", "order_of", "rank_units"]

#: Where units compete: all selected groups at once, or each group on its own.
Scope = Literal["global", "group"]
SCOPES: tuple[Scope, ...] = ("global", "group")


def rank_units(
    fn: str, spec: StructuredSpec, groups: Mapping[str, UnitGroup], params: Params, masks: Mapping[str, Tensor],
    scores: Scores, generator: torch.Generator | None, *, scope: Scope, normalize: Normalize, floors: bool,
    units: str, what: str, given: Mapping[str, Tensor] | None = None,
) -> dict[str, Tensor]:  # fmt: skip
    """The new masks of the groups' members: ``spec`` over their units, on top of ``masks``.

    Args:
        fn: the plan's name, which starts the errors.
        spec: ``LnStructured`` (ranks by the ``n``-norm) or ``RandomStructured``.
        groups: the unit groups by name (members checked against ``params`` by the caller).
        params, masks, scores, generator: the plan call's (checked).
        scope: ``"global"`` (one selection) or ``"group"`` (one per group).
        normalize: how each group's keys are scaled before they compete.
        floors: whether each group keeps its ``least`` units (``structured``:
            what ``shrink`` keeps); ``False``: any unit may go.
        units: what the units are called in errors (``"units"``, ``"channels"``).
        what: the whole selection as errors name it (``"the 8 units of 2 groups jointly"``).
        given: each named group's keys, one per unit (checked: float64, on the
            members' device), which replace the norms; which units an earlier
            mask left is read off the members all the same.

    Returns:
        Each member's mask by parameter name: a new ``torch.bool`` tensor,
        or a DTensor of its parameter's layout.
    """
    names = list(dict.fromkeys(m.name for g in groups.values() for m in g.members))
    if sharded_members(names, params):
        held = HeldMembers.of(fn, names, params, masks, scores)
    else:
        held = HeldMembers.whole(names, params, masks, scores)
    try:
        keyed = unit_keys([(g, [held.piece(m) for m in g.members]) for g in groups.values()], order_of(spec), held.reduce)
    except FailedElsewhere:
        raise RuntimeError(
            f"{spec!r}: another process of the mesh failed to compute its {units}' norms (its own error says "
            "why); no process computed a mask"
        ) from None
    if given:
        keyed = [
            (given[name].to(k.device), e) if name in given else (k, e)
            for name, (k, e) in zip(groups, keyed, strict=True)
        ]  # fmt: skip
    keys = [normalized(k, e, normalize) for k, e in keyed]
    eligible = [e for _, e in keyed]
    least = [g.least for g in groups.values()] if floors else None
    if scope == "global" or not groups:
        kept = _select(fn, spec, keys, eligible, least, generator, what)
    else:
        kept = torch.cat([
            _select(fn, spec, [k], [e], [g.least] if floors else None, generator, f"the {g.size} {g.kind} of {name!r}")
            for (name, g), k, e in zip(groups.items(), keys, eligible, strict=True)
        ])  # fmt: skip
    if not groups:
        return {}
    split = torch.split(held.agreed(kept, spec), [g.size for g in groups.values()])
    local: dict[str, Tensor] = {}
    for group, flags in zip(groups.values(), split, strict=True):
        for member in group.members:
            keep = held.keep(member, group.size, flags)
            mask = local.get(member.name, held.mask(member.name))
            local[member.name] = keep if mask is None else mask & keep
    return {name: held.wrapped(name, mask.contiguous()) for name, mask in local.items()}


def _select(
    fn: str, spec: StructuredSpec, keys: Sequence[Tensor], eligible: Sequence[Tensor | None],
    least: Sequence[int] | None, generator: torch.Generator | None, what: str,
) -> Tensor:  # fmt: skip
    """One exact selection over the units' keys: which units stay (each group keeps its ``least``, if given)."""
    try:
        return keep_units(spec, keys, eligible, generator, least=least)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{fn}: cannot prune {what} with {spec!r}: {e}") from e


def order_of(spec: StructuredSpec) -> Order:
    """The norm units are ranked by (``None``: drawn at random)."""
    if not isinstance(spec, LnStructured):
        return None
    if spec.n == "nuc":
        return "nuc"
    return 2.0 if spec.n == "fro" else float(spec.n)
