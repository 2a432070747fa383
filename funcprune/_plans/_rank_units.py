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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
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
    units: str, what: str, given: Mapping[str, Tensor] | None = None, protect: Mapping[str, Tensor] | None = None,
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
        protect: each named group's ``bool`` flags of the units that never go
            (with ``floors``; they count toward the group's ``least``).

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
    shields = [None if not protect or name not in protect else protect[name] for name in groups] if floors else None
    if floors and any(g.parts > 1 for g in groups.values()):
        kept = _evenly(fn, spec, groups, keys, eligible, shields or [None] * len(keys), generator, scope, what)
    elif scope == "global" or not groups:
        kept = _select(fn, spec, keys, eligible, least, shields, generator, what)
    else:
        kept = torch.cat([
            _select(fn, spec, [k], [e], [g.least] if floors else None, None if shields is None else [shields[i]],
                    generator, f"the {g.size} {g.kind} of {name!r}")
            for i, ((name, g), k, e) in enumerate(zip(groups.items(), keys, eligible, strict=True))
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


def _evenly(
    fn: str, spec: StructuredSpec, groups: Mapping[str, UnitGroup], keys: Sequence[Tensor],
    eligible: Sequence[Tensor | None], protect: Sequence[Tensor | None], generator: torch.Generator | None,
    scope: Scope, what: str,
) -> Tensor:  # fmt: skip
    """:func:`_select` where groups lose units evenly from their ``parts`` (a router's expert groups).

    Each part's units are ranked (units an earlier mask pruned first, protected
    ones last); the ``r``-th of every part form one *run*, keyed by the mean of
    their keys, which goes or stays whole. The selection is over runs: an
    ``int`` amount of units is that many runs' worth, a fraction one of the
    runs. Groups selected together must have as many parts each.
    """
    counts = {g.parts for g in groups.values()}
    if scope == "global" and len(counts) > 1:
        shown = ", ".join(f"{name!r}: {g.parts}" for name, g in list(groups.items())[:4])
        raise ValueError(
            f"{fn}: cannot rank {what}: their groups lose units evenly from different numbers of parts ({shown}); "
            "rank them with scope='group', or in separate plans (kinds='experts' alone)"
        )
    runs = [_runs(g, k, e, p) for g, k, e, p in zip(groups.values(), keys, eligible, protect, strict=True)]
    selections = (
        [(what, list(groups.values()), runs)] if scope == "global"
        else [(f"the {g.size} {g.kind} of {name!r}", [g], [run]) for (name, g), run in zip(groups.items(), runs, strict=True)]
    )  # fmt: skip
    chosen: list[Tensor] = []
    for named, chosen_groups, chosen_runs in selections:
        n = chosen_groups[0].parts
        amount = spec.amount
        if isinstance(amount, int) and not isinstance(amount, bool) and amount % n:
            raise ValueError(
                f"{fn}: cannot prune {named} with {spec!r}: they lose units evenly from {n} parts (expert "
                f"groups), so the count must be a multiple of {n}"
            )
        per_run = replace(spec, amount=amount // n) if isinstance(amount, int) and not isinstance(amount, bool) else spec
        try:
            flags = keep_units(per_run, [r.keys for r in chosen_runs], [r.alive for r in chosen_runs], generator,
                               least=[g.least // n for g in chosen_groups], protect=[r.shield for r in chosen_runs])  # fmt: skip
        except (TypeError, ValueError) as e:
            raise type(e)(
                f"{fn}: cannot prune {named} with {spec!r}, in runs of one unit from each of {n} parts (expert "
                f"groups, which lose units evenly): {e} (runs, not units)"
            ) from e
        chosen.extend(torch.split(flags, [r.keys.shape[-1] for r in chosen_runs], -1))
    out = []
    for g, run, flags in zip(groups.values(), runs, chosen, strict=True):
        slots = flags.unsqueeze(-2).expand(*flags.shape[:-1], g.parts, flags.shape[-1]).flatten(-2)
        out.append(torch.zeros(run.at.shape, dtype=torch.bool, device=run.at.device).scatter(-1, run.at, slots))
    return torch.cat(out, -1)


@dataclass(frozen=True)
class _Runs:
    """A group's runs: their keys, which are left (``None``: all), which are protected, and each slot's unit."""

    keys: Tensor
    alive: Tensor | None
    shield: Tensor | None
    at: Tensor  # (parts * each,): slot r of part p (at p * each + r) is unit at[p * each + r]


def _runs(g: UnitGroup, k: Tensor, e: Tensor | None, p: Tensor | None) -> _Runs:
    each = g.size // g.parts
    ranked = k if e is None else torch.where(e, k, torch.full_like(k, -math.inf))
    order = torch.sort(ranked.reshape(*k.shape[:-1], g.parts, each), dim=-1, stable=True).indices
    shield = None if p is None else p.to(k.device).expand(k.shape)
    if shield is not None:  # protected units last in their part
        flags = shield.reshape(*k.shape[:-1], g.parts, each).gather(-1, order)
        order = order.gather(-1, torch.sort(flags.to(torch.int8), dim=-1, stable=True).indices)
    at = (order + torch.arange(g.parts, device=k.device).unsqueeze(-1) * each).flatten(-2)

    def by_run(x: Tensor) -> Tensor:
        return x.gather(-1, at).reshape(*x.shape[:-1], g.parts, each)

    return _Runs(
        by_run(k).mean(-2),
        None if e is None else by_run(e).any(-2),
        None if shield is None else by_run(shield).any(-2),
        at,
    )


def _select(
    fn: str, spec: StructuredSpec, keys: Sequence[Tensor], eligible: Sequence[Tensor | None],
    least: Sequence[int] | None, protect: Sequence[Tensor | None] | None, generator: torch.Generator | None, what: str,
) -> Tensor:  # fmt: skip
    """One exact selection over the units' keys: which units stay (each group keeps its ``least``, if given,
    and its ``protect``ed units)."""
    if protect is not None and all(p is None for p in protect):
        protect = None
    try:
        return keep_units(spec, keys, eligible, generator, least=least, protect=protect)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{fn}: cannot prune {what} with {spec!r}: {e}") from e


def order_of(spec: StructuredSpec) -> Order:
    """The norm units are ranked by (``None``: drawn at random)."""
    if not isinstance(spec, LnStructured):
        return None
    if spec.n == "nuc":
        return "nuc"
    return 2.0 if spec.n == "fro" else float(spec.n)
