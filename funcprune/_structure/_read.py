"""Units read off a channel analysis: which of its groups are units, and their members (:func:`units_of`).

Each group of the analysis (coupled channels: one MLP channel, the heads of
one KV group...) that can go is a *unit*; its *footprint* is the parameter
indices that belong to it alone (those shared with other units, such as a
per-head-dim norm shared by every head, go only when all of them go and
belong to none). Units with the same kind and the same parameters form a
:class:`~funcprune.UnitGroup`, whose members are read off the footprints:
each unit's indices along a parameter's dim must be runs of one width, one
run per member, unit after unit. What is read here is unchecked:
:func:`~funcprune.structure` (``_find.py``) tries it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import final

from .. import _graph as graph
from .._units import Kind, Member, Structure, UnitGroup

__all__ = ["Found", "found_units", "units_of"]

#: For each unit (analysis group), for each (parameter, dim), the indices that are its alone.
_Footprints = dict[int, dict[tuple[str, int], list[int]]]


def units_of(
    analysis: graph.Analysis, shapes: Mapping[str, tuple[int, ...]], excluded: Set[str] = frozenset()
) -> Structure:
    """The unit groups of an analysis (``shapes``: each parameter's, by first name, in order), unchecked.

    Units made by a parameter of ``excluded`` (output layers) are left out.
    """
    return Structure({name: group for name, (group, _) in found_units(analysis, shapes, excluded).groups.items()})


@final
@dataclass(frozen=True, slots=True)
class Found:
    """What an analysis offers as units.

    Attributes:
        groups: by name, each unit group with its analysis groups (one per unit, in order).
        left_out: each analysis group that is no unit, with why (the groups of layers' rows only).
    """

    groups: dict[str, tuple[UnitGroup, tuple[int, ...]]]
    left_out: dict[int, str]


def found_units(analysis: graph.Analysis, shapes: Mapping[str, tuple[int, ...]], excluded: Set[str]) -> Found:
    """The unit groups of an analysis with their analysis groups, and why each other group made by layers' rows is
    no unit (``shapes``: each parameter's, by first name, in order; ``excluded``: output layers' parameters)."""
    footprints = _footprints(analysis, shapes)
    kinds = _kinds(analysis)
    stacked = {name for layer in analysis.experts for name in layer.router.parameters}  # experts' hidden channels
    order = {name: i for i, name in enumerate(shapes)}
    alike: dict[tuple[Kind, tuple[tuple[str, int], ...]], list[int]] = {}
    left_out: dict[int, str] = {}
    shared = {g: a.kv_heads for a in analysis.attention for g in a.heads}
    keys: dict[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]] = {}  # footprints' dims, in the model's order
    made_by = analysis.made
    outputs = _made_in(analysis, excluded)
    for unit in sorted(made_by):
        if stacked and any(m.tensor in stacked for m in made_by[unit]):
            continue
        why = _not_a_unit(analysis, unit, footprints.get(unit), shapes, outputs, kinds, shared)
        if why is not None:
            left_out[unit] = why
            continue
        feet = tuple(footprints[unit])
        key = keys.get(feet)
        if key is None:
            key = keys[feet] = tuple(sorted(feet, key=lambda nd: (order[nd[0]], nd[1])))
        alike.setdefault((kinds[unit], key), []).append(unit)
    found: list[tuple[tuple[int, int], str, UnitGroup, tuple[int, ...]]] = []
    for (kind, key), units in alike.items():
        units.sort(key=lambda u: min(footprints[u][key[0]]))
        members = _members(key, [footprints[u] for u in units])
        if members is None:
            for unit in units:
                left_out[unit] = "its parameter slices are not laid out evenly, unit after unit"
            continue
        first = members[0]
        least = max((analysis.least.get((m.tensor, m.dim), 1) for u in units for m in analysis.made[u]),
                    default=1) if analysis.least else 1  # fmt: skip
        parts = next((e.router.groups for e in analysis.experts if set(e.groups) == set(units)), 1)
        if least >= len(units):  # a router that routes each token to all of its experts, or keeps them all
            why = f"each token goes to {least}" if parts == 1 else f"{parts} expert groups keep {least // parts} each"
            for unit in units:
                left_out[unit] = f"all {len(units)} of them stay ({why})"
            continue
        group = UnitGroup(kind, len(units), members, least, parts)
        found.append(((order[first.name], first.start), _module_of(members), group, tuple(units)))
    found.sort(key=lambda item: item[0])
    named = _named([(module, group) for _, module, group, _ in found])
    return Found({name: (group, item[3]) for (name, group), item in zip(named.items(), found, strict=True)}, left_out)


def _not_a_unit(
    analysis: graph.Analysis, unit: int, feet: Mapping[tuple[str, int], list[int]] | None,
    shapes: Mapping[str, tuple[int, ...]], outputs: Set[int], kinds: Mapping[int, Kind], shared: Mapping[int, int],
) -> str | None:  # fmt: skip
    """Why an analysis group made by layers' rows is no unit, or ``None`` if it is one.

    ``outputs``: the groups an output layer makes. ``shared``: for the heads of an attention, how many groups its
    heads form.
    """
    if unit in analysis.blocked:
        return analysis.blocked[unit]
    if unit in analysis.refused:
        return f"{analysis.refused[unit]} reads them, and funcprune cannot tell how"
    if unit in outputs:
        return "an output layer makes them (structure(..., outputs=True) lists them)"
    if not feet:
        return "no parameter index is theirs alone"
    whole = next(((name, dim) for (name, dim), indices in feet.items() if len(indices) == shapes[name][dim]), None)
    if whole is not None:
        coupled = analysis.coupled.get(unit)
        if coupled is not None and shared.get(unit, 1) == 1:
            return f"they go all together or not at all ({coupled}), and {whole[0]!r} keeps one at least"
        return (
            f"{whole[0]!r} is theirs entirely (shrink cuts slices of parameters; it removes no whole "
            "parameter, nor the module holding it)"
        )
    if unit not in kinds:
        return "no layer reads them as channels, and they are no head, KV group or expert"
    return None


def _made_in(analysis: graph.Analysis, tensors: Set[str]) -> set[int]:
    """The groups a slice of ``tensors`` makes: those related to their indices (a group made by a slice is related
    to its index), whose slices are then read; not every group's slices."""
    near = {g for t in tensors for by in analysis.related.get(t, {}).values() for groups in by.values() for g in groups}
    return {g for g in near if any(s.tensor in tensors for s in analysis.made.get(g, ()))}


def _footprints(analysis: graph.Analysis, shapes: Mapping[str, tuple[int, ...]]) -> _Footprints:
    """Each group's own indices (:func:`~funcprune._graph.own_indices`) of parameters: buffers (shrink cuts them,
    plans do not mask them) left out (read-only: most groups' are the analysis' own)."""
    own = graph.own_indices(analysis)
    buffers = [t for t in analysis.related if t not in shapes]
    touched = {g for t in buffers for by in analysis.related[t].values() for groups in by.values() for g in groups}
    out: _Footprints = {}
    for group, feet in own.items():
        if group not in touched:
            out[group] = feet
            continue
        kept = {(name, dim): indices for (name, dim), indices in feet.items() if name in shapes}
        if kept:
            out[group] = kept
    return out


def _kinds(analysis: graph.Analysis) -> dict[int, Kind]:
    """The kind of each group that is one: an expert, a head or KV group of an attention op, or channels that a
    layer reads (an MLP's hidden channels, a conv's); any other group is of no kind."""
    kinds: dict[int, Kind] = {group: "experts" for layer in analysis.experts for group in layer.groups}
    for attention in analysis.attention:
        kind: Kind = "heads" if attention.kv_heads == len(attention.heads) else "kv_groups"
        for group in attention.heads:
            if group >= 0:
                kinds.setdefault(group, kind)
    for group in analysis.read:
        kinds.setdefault(group, "channels")
    return kinds


def _members(key: Sequence[tuple[str, int]], feet: Sequence[Mapping[tuple[str, int], list[int]]]) -> tuple[Member, ...] | None:
    """The members that describe every unit's footprint, or ``None`` if they are not evenly laid out."""
    members: list[Member] = []
    for name, dim in key:
        first = _runs(feet[0][(name, dim)])
        if len(first) == 1:  # one run: unit u's indices (ascending, distinct) are the w from start + u * w
            ((start, width),) = first
            for u, f in enumerate(feet):
                indices = f[(name, dim)]
                at = start + u * width
                if len(indices) != width or indices[0] != at or indices[-1] != at + width - 1:
                    return None
        else:
            runs = [_runs(f[(name, dim)]) for f in feet]
            if any(len(r) != len(first) for r in runs):
                return None
            for part, (start, width) in enumerate(first):
                if any(r[part] != (start + u * width, width) for u, r in enumerate(runs)):
                    return None
        members.extend(Member(name, dim, width, start) for start, width in first)
    return tuple(members)


def _runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted indices as runs of consecutive ones: (start, length) each."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def _module_of(members: Sequence[Member]) -> str:
    """The innermost module that holds every member's parameter (the model itself: ``""``)."""
    paths = [m.name.split(".")[:-1] for m in members]
    common: list[str] = []
    for parts in zip(*paths):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return ".".join(common)


def _named(groups: Sequence[tuple[str, UnitGroup]]) -> dict[str, UnitGroup]:
    """Each group under its module's name; where several share one, under the module of its first member."""
    counts: dict[str, int] = {}
    for module, _ in groups:
        counts[module] = counts.get(module, 0) + 1
    out: dict[str, UnitGroup] = {}
    for module, group in groups:
        name = module if module and counts[module] == 1 else group.members[0].name.rpartition(".")[0]
        base, n = name, 2
        while name in out:
            name, n = f"{base}#{n}", n + 1
        out[name] = group
    return out
