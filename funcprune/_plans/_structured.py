"""Plans over a model's units: :func:`structured` ranks whole units (channels, heads, KV groups, experts).

:class:`UnitPlan` checks its structure against the parameters and hands
the groups of the kinds it prunes to the one ranking of units
(``_rank_units.py``), each group keeping its ``least`` units as ``shrink``
does. ``README.md`` in this folder has the design.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import ClassVar, final

import torch

from .._specs import LnStructured, Normalize, RandomStructured, StructuredSpec, check_normalize
from .._types import Params, Scores, Tensor
from .._units import KINDS, WIDTH_KINDS, Kind, Structure, UnitGroup
from ._plan import AbstractPlan
from ._rank_units import SCOPES, Scope, rank_units

__all__ = ["Scope", "UnitPlan", "structured"]


@final
@dataclass(frozen=True, slots=True)
class UnitPlan(AbstractPlan):
    """A structured spec over the units of a :class:`~funcprune.Structure`.

    Build it with :func:`structured`, which documents the semantics.
    """

    _FN: ClassVar[str] = "structured"
    structure: Structure
    spec: StructuredSpec
    kinds: tuple[Kind, ...] = WIDTH_KINDS
    scope: Scope = "global"
    normalize: Normalize = None
    #: Units that never go: group name -> unit indices (sorted, checked by :func:`structured`).
    protect: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: One call's ``unit_scores``, checked (float64): set on a copy by :meth:`with_unit_scores` only.
    given: Mapping[str, Tensor] = field(default_factory=dict, repr=False, compare=False)

    def with_unit_scores(self, unit_scores: Mapping[str, object]) -> tuple[UnitPlan, set[str]]:
        """This plan ranking its groups named in ``unit_scores`` by them (checked), and the names it used."""
        fn, groups = self._FN, self.groups()
        used = {name for name in unit_scores if name in groups}
        if not used:
            return self, set()
        if isinstance(self.spec, RandomStructured):
            raise ValueError(f"{fn}: unit_scores rank units, but {self.spec!r} draws them at random; use LnStructured")
        given: dict[str, Tensor] = {}
        for name in used:
            values, size = unit_scores[name], groups[name].size
            if not isinstance(values, torch.Tensor) or values.shape != (size,):
                got = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
                raise ValueError(f"{fn}: unit_scores[{name!r}] must be a 1-D tensor of {size} scores (one per unit), got {got}")
            if values.is_complex() or values.dtype == torch.bool:
                raise TypeError(f"{fn}: unit_scores[{name!r}] must be real numbers, got dtype {values.dtype}")
            given[name] = values.detach().to(torch.float64)
        return replace(self, given=given), used

    def __post_init__(self) -> None:
        fn = self._FN
        if not isinstance(self.structure, Structure):
            raise TypeError(
                f"{fn}: structure must be a funcprune.Structure (from fp.structure(model, example_inputs)), "
                f"got {type(self.structure).__name__}"
            )
        if not isinstance(self.spec, (LnStructured, RandomStructured)):
            raise TypeError(
                f"{fn}: spec must be an LnStructured or RandomStructured spec (whole units ranked), "
                f"got {self.spec!r}"
            )
        if isinstance(self.spec, LnStructured) and self.spec.n == "nuc":
            raise ValueError(f"{fn}: the nuclear norm ranks matrices, not units; use n=2, 1 or another vector norm")
        if self.scope not in SCOPES:
            raise ValueError(f"{fn}: scope must be 'global' or 'group', got {self.scope!r}")
        check_normalize(fn, self.normalize, self.spec)
        if not self.groups():
            present = sorted({g.kind for g in self.structure.values()})
            why = "".join(f"; no {k!r} group: {v}" for k, v in self.structure.left_out.items() if k in self.kinds)
            raise ValueError(
                f"{fn}: the structure has no unit group of kinds {list(self.kinds)}; it has "
                f"{present or 'no groups'}{why}"
            )

    def __repr__(self) -> str:
        extra = "" if self.kinds == WIDTH_KINDS else f", kinds={list(self.kinds)!r}"
        extra += "" if self.scope == "global" else f", scope={self.scope!r}"
        extra += "" if self.normalize is None else f", normalize={self.normalize!r}"
        extra += "" if not self.protect else f", protect={dict(self.protect)!r}"
        return f"structured({self.structure!r}, {self.spec!r}{extra})"

    def groups(self) -> dict[str, UnitGroup]:
        """The groups this plan ranks."""
        return {name: g for name, g in self.structure.items() if g.kind in self.kinds}

    def masks_for(
        self,
        params: Params,
        masks: dict[str, Tensor],
        scores: Scores,
        generator: torch.Generator | None,
    ) -> dict[str, Tensor]:
        fn, groups = self._FN, self.groups()
        for name, group in groups.items():
            _check_members(fn, name, group, params)
        what = f"the {sum(g.size for g in groups.values())} units of {len(groups)} groups jointly"
        device = next(iter(params.values())).device if params else None
        shields = {
            name: torch.isin(torch.arange(groups[name].size, device=device), torch.tensor(units, device=device))
            for name, units in self.protect.items()
        }  # fmt: skip
        new = rank_units(
            fn, self.spec, groups, params, masks, scores, generator, scope=self.scope, normalize=self.normalize,
            floors=True, units="units", what=what, given=self.given, protect=shields,
        )  # fmt: skip
        return {**masks, **new}


def _check_members(fn: str, name: str, group: UnitGroup, params: Params) -> None:
    for member in group.members:
        param = params.get(member.name)
        if param is None:
            raise KeyError(
                f"{fn}: group {name!r} spans {member.name!r}, which params do not hold; pass the parameters "
                "of the model the structure was read from"
            )
        if member.dim >= param.dim() or member.end(group.size) > param.shape[member.dim]:
            units = f"{group.size} units" if member.unit is None else f"unit {member.unit}"
            raise ValueError(
                f"{fn}: group {name!r} spans {units} of {member.width} along dim {member.dim} "
                f"of {member.name!r} from {member.start}, but its shape is {tuple(param.shape)}"
            )
        if not param.is_floating_point():
            raise TypeError(f"{fn}: {member.name!r} must be floating-point to be ranked, got {param.dtype}")


def structured(
    structure: Structure, spec: StructuredSpec, *, kinds: Kind | Collection[Kind] | None = None,
    scope: Scope = "global", normalize: Normalize = None, protect: Mapping[str, object] | None = None,
) -> UnitPlan:  # fmt: skip
    """A plan that prunes whole units of a model: MLP channels, heads, KV groups, experts.

    The units come from :func:`~funcprune.structure`; each pruned unit has
    every entry of every member slice pruned (a KV group: its query heads'
    rows, its key and value rows, and the output projection's columns), the
    shape :func:`~funcprune.shrink` removes.

    - ``LnStructured(amount, n)`` ranks units by the ``n``-norm of all their
      entries (``spec.dim`` is not used: the members say where units lie).
      ``RandomStructured(amount)`` draws units uniformly.
    - Scores are the plan call's ``scores`` (Taylor scores, say), else each
      parameter as currently pruned (``param * mask``), as for every plan.
    - The amount counts units: an ``int`` is a number of units, a ``float``
      a fraction of the units not yet entirely pruned, and ``sparsity=``
      the fraction of all units pruned after the call (earlier ones
      included). A unit is entirely pruned when every member's earlier
      mask prunes all of its slice; a member without an earlier mask leaves
      it unpruned. Nothing pruned earlier is revived.
    - ``scope="global"`` ranks the units of every selected group together
      (budgets differ per layer: non-uniform); ``scope="group"`` applies
      the amount within each group (uniform).
    - Each group keeps one of its units (``shrink`` keeps a channel on each
      side of every layer): the unit it would lose last stays, and the next
      unit in the order goes instead. So the masks are exactly what
      ``shrink`` removes (given no earlier masks, or those of units plans
      over the same structure): ``propagate`` adds nothing to them.
    - Exactly the count asked for goes; ties go to the earlier unit (groups
      in order, then units); NaN scores are pruned last. A count larger
      than the units that can go raises ``ValueError`` (under ``vmap`` it
      is capped). Under ``vmap`` it runs per sample, as the other plans do.
    - Norms are float64, and each unit's sum of ``|x| ** n`` is added up
      order-free (every term rounded to a quantum of the unit's largest
      term times its entry count over ``2**50``), so they are the same
      bit for bit however the entries are split.
    - Sharded models: on DTensor parameters (``fully_shard``,
      ``parallelize_module``, both on a 2-D mesh) every process calls the
      plan on its own ``dict(model.named_parameters())`` and gets DTensor
      masks of each parameter's layout that equal, bit for bit, the masks
      one process computes on the whole model. Only two ``all_reduce``
      calls of a few float64 numbers per unit cross processes (per mesh
      dim that cuts a member), never a weight; ``RandomStructured`` keeps
      the units the mesh's first process draws (one more). Plain tensors
      beside DTensors (a module tensor parallelism leaves whole) are copies
      every process holds alike.

    Args:
        structure: the model's structure (or any :class:`~funcprune.Structure`).
        spec: an ``LnStructured`` or ``RandomStructured`` spec.
        kinds: the kinds of units to prune (``"channels"``, ``"heads"``,
            ``"kv_groups"``, ``"experts"``, ``"layers"``, ``"hidden"``);
            ``None``: the widths inside the blocks (channels, heads, KV
            groups, experts). Whole layers and the hidden size are pruned
            only where named: a block's norm is no match for a channel's.
        scope: ``"global"`` or ``"group"``.
        normalize: how each group's unit norms are scaled before they
            compete (``scope="global"``): ``None`` (raw), ``"mean"`` (the
            group's mean unit norm scores 1) or ``"max"``, as in
            :func:`~funcprune.global_structured`. Units of different sizes
            (a KV group against an MLP channel) compete fairly only
            normalized, or in separate plans.
        protect: units that never go, by group name: a collection of unit
            indices, or a ``bool`` tensor of one flag per unit (reap's super
            experts: :func:`~funcprune.super_experts`). They count in the
            amount's base as any unit does, and toward the group's
            ``least``; a count that cannot be met without them raises.

    Returns:
        A plan; ``plan(params, masks=None, scores=None, generator=None)``
        returns the masks.

    Raises:
        TypeError: if ``structure`` is not a Structure, ``spec`` not
            ``LnStructured`` or ``RandomStructured``, or ``kinds`` not kinds.
        ValueError: for an unknown kind, scope or ``normalize``, the nuclear
            norm, ``normalize`` with a random spec, or a structure with no
            group of those kinds. When the plan is called: a ``KeyError`` if a
            member names no parameter, a ``ValueError`` if a member does not
            fit its parameter, an ``int`` amount exceeds the unpruned
            units, or the count exceeds the units that can go (each group
            keeps one); ``NotImplementedError`` for DTensor members on different
            meshes or in a layout funcprune does not support (``Partial``).

    >>> import torch, funcprune as fp
    >>> s = fp.Structure({
    ...     "mlp": fp.UnitGroup("channels", 3, (fp.Member("up", 0, 1), fp.Member("down", 1, 1))),
    ...     "attn": fp.UnitGroup("heads", 2, (fp.Member("qkv", 0, 2), fp.Member("qkv", 0, 2, start=4))),
    ... })
    >>> params = {"up": torch.tensor([[3.0], [0.1], [2.0]]), "down": torch.tensor([[1.0, 0.0, 1.0]]),
    ...           "qkv": torch.ones(8, 1)}
    >>> masks = fp.structured(s, fp.LnStructured(1, n=2), kinds="channels")(params)
    >>> masks["up"].flatten().tolist(), masks["down"].flatten().tolist()
    ([True, False, True], [True, False, True])
    >>> masks = fp.structured(s, fp.LnStructured(0.5, n=2), scope="group")(params)
    >>> masks["qkv"].flatten().tolist()
    [False, False, True, True, False, False, True, True]
    """
    if kinds is None:
        chosen: tuple[Kind, ...] = WIDTH_KINDS
    elif isinstance(kinds, str):
        chosen = (kinds,)
    elif isinstance(kinds, Collection):
        chosen = tuple(kinds)
    else:
        raise TypeError(f"structured: kinds must be a kind, a collection of kinds or None, got {kinds!r}")
    for kind in chosen:
        if kind not in KINDS:
            raise ValueError(f"structured: kinds must be among {list(KINDS)}, got {kind!r}")
    plan = UnitPlan(structure, spec, chosen, scope, normalize)
    return plan if protect is None else replace(plan, protect=_protected(plan.groups(), protect))


def _protected(groups: Mapping[str, UnitGroup], protect: object) -> dict[str, tuple[int, ...]]:
    """``protect`` checked against the plan's groups: group name -> sorted unit indices."""
    fn = "structured"
    if not isinstance(protect, Mapping):
        raise TypeError(f"structured: protect must be a mapping of group names to unit indices, got {type(protect).__name__}")
    out: dict[str, tuple[int, ...]] = {}
    for name, units in protect.items():
        group = groups.get(name)
        if group is None:
            raise ValueError(f"{fn}: protect names {name!r}, which is no group this plan prunes; its groups are "
                             f"{sorted(groups)[:6]}{' ...' if len(groups) > 6 else ''}")  # fmt: skip
        if isinstance(units, torch.Tensor) and units.dtype == torch.bool:
            if units.shape != (group.size,):
                raise ValueError(f"{fn}: protect[{name!r}] as flags must be a bool tensor of {group.size} "
                                 f"(one per unit), got shape {tuple(units.shape)}")  # fmt: skip
            indices = units.nonzero().flatten().tolist()
        elif isinstance(units, torch.Tensor) or isinstance(units, Collection) and not isinstance(units, str):
            indices = units.flatten().tolist() if isinstance(units, torch.Tensor) else list(units)
        else:
            raise TypeError(f"{fn}: protect[{name!r}] must be unit indices or a bool tensor, got {units!r}")
        for i in indices:
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < group.size:
                raise ValueError(f"{fn}: protect[{name!r}] must hold unit indices from 0 to {group.size - 1}, got {i!r}")
        out[name] = tuple(sorted(set(indices)))
    return out
