"""The values of a model's structure: :class:`Member`, :class:`UnitGroup`, :class:`Structure` (a base module).

A *unit* is what a structured plan prunes and ``shrink`` removes whole: an
MLP channel, an attention head, a KV group (a key/value head with the query
heads that read it), an expert, a whole block of a model's repeated layers,
a channel of its hidden size. Units come in groups (the units of one
layer, alike); each :class:`Member` of a group says which slice of one
parameter each unit spans: unit ``u`` spans indices ``start + u * width``
up to ``start + (u + 1) * width`` of dim ``dim``, or, for a member of one
unit only (a parameter of one block), ``start`` up to ``start + width``.
A unit is all of its members' slices.

Plain values that import nothing of funcprune: ``funcprune._structure``
reads them off a model, ``funcprune._plans`` ranks them (``structured``,
and ``global_structured``'s one-member channel groups).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, Literal, final, get_args

__all__ = ["KINDS", "WIDTH_KINDS", "Kind", "Member", "Structure", "UnitGroup"]

#: The kinds of units.
Kind = Literal["channels", "heads", "kv_groups", "experts", "layers", "hidden"]
KINDS: tuple[Kind, ...] = get_args(Kind)
#: The kinds of widths inside a model's blocks: what a structured plan prunes unless told other kinds.
WIDTH_KINDS: tuple[Kind, ...] = ("channels", "heads", "kv_groups", "experts")


def _int(fn: str, name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{fn}: {name} must be an int, got {value!r} of type {type(value).__name__}")
    if value < least:
        raise ValueError(f"{fn}: {name} must be at least {least}, got {value}")


@final
@dataclass(frozen=True, slots=True)
class Member:
    """The slice of parameter ``name`` that each unit of a group spans.

    Unit ``u`` spans indices ``start + u * width`` to ``start + (u + 1) * width``
    (excluded) of dim ``dim``: an MLP channel spans one row of the up
    projection (``Member("mlp.up_proj.weight", 0, 1)``) and one column of
    the down projection; a head of size 64 spans 64 rows of the query
    projection. A fused projection has one member per part (GPT-2's
    ``c_attn`` holds queries, keys and values: three members, ``start`` 0,
    ``hidden`` and ``2 * hidden``).

    A member with ``unit`` set belongs to that unit alone: it spans indices
    ``start`` to ``start + width`` for unit ``unit`` and nothing for the
    others. The units of a ``"layers"`` group are whole blocks, each the
    only one to span its own parameters
    (``Member("model.layers.2.mlp.up_proj.weight", 0, 64, unit=2)``).

    >>> import funcprune as fp
    >>> member = fp.Member("attn.q_proj.weight", 0, 8)
    >>> member.indices(2)
    range(16, 24)
    >>> fp.Member("layers.1.up.weight", 0, 64, unit=1).indices(0)
    range(0, 0)
    """

    name: str
    dim: int
    width: int
    start: int = 0
    unit: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"Member: name must be a parameter name (a non-empty str), got {self.name!r}")
        _int("Member", "dim", self.dim, 0)
        _int("Member", "width", self.width, 1)
        _int("Member", "start", self.start, 0)
        if self.unit is not None:
            _int("Member", "unit", self.unit, 0)

    def __repr__(self) -> str:
        unit = "" if self.unit is None else f", unit={self.unit}"
        return f"Member(name={self.name!r}, dim={self.dim}, width={self.width}, start={self.start}{unit})"

    def indices(self, unit: int) -> range:
        """The indices along ``dim`` that unit ``unit`` spans."""
        if self.unit is not None:
            return range(self.start, self.start + self.width) if unit == self.unit else range(self.start, self.start)
        first = self.start + unit * self.width
        return range(first, first + self.width)

    def end(self, size: int) -> int:
        """Where the slices of ``size`` units end along ``dim`` (excluded)."""
        return self.start + (self.width if self.unit is not None else size * self.width)


@final
@dataclass(frozen=True, slots=True)
class UnitGroup:
    """``size`` units of one ``kind`` (the heads of one attention, the channels of one MLP...).

    Attributes:
        kind: ``"channels"``, ``"heads"``, ``"kv_groups"``, ``"experts"``,
            ``"layers"`` (whole blocks of repeated layers) or ``"hidden"``
            (channels of the hidden size, the residual stream).
        size: how many units the group has.
        members: the parameter slices each unit spans (see :class:`Member`).
        least: how many units must stay (``shrink`` keeps them whatever the
            masks say): 1, since a layer keeps a channel on each side; a
            router's ``top_k`` for experts. Plans over units never prune more.
        parts: how many runs of ``size // parts`` consecutive units lose
            units evenly (a router's expert groups, DeepSeek's ``n_group``):
            plans prune as many from each, ``least // parts`` staying in each.
    """

    kind: Kind
    size: int
    members: tuple[Member, ...]
    least: int = 1
    parts: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"UnitGroup: kind must be one of {list(KINDS)}, got {self.kind!r}")
        _int("UnitGroup", "size", self.size, 1)
        if isinstance(self.members, list):
            object.__setattr__(self, "members", tuple(self.members))
        if not isinstance(self.members, tuple) or not self.members:
            raise TypeError(f"UnitGroup: members must be a non-empty tuple of Member, got {self.members!r}")
        for member in self.members:
            if not isinstance(member, Member):
                raise TypeError(f"UnitGroup: members must be Member values, got {member!r}")
            if member.unit is not None and member.unit >= self.size:
                raise ValueError(f"UnitGroup: a member's unit must be below size ({self.size}), got {member!r}")
        _int("UnitGroup", "least", self.least, 1)
        if self.least > self.size:
            raise ValueError(f"UnitGroup: least must be at most size ({self.size}), got {self.least}")
        _int("UnitGroup", "parts", self.parts, 1)
        if self.size % self.parts or self.least % self.parts:
            raise ValueError(
                f"UnitGroup: parts must divide size ({self.size}) and least ({self.least}), got {self.parts}"
            )

    def __repr__(self) -> str:
        parts = "" if self.parts == 1 else f", parts={self.parts}"
        return (
            f"UnitGroup(kind={self.kind!r}, size={self.size}, members={self.members!r}, least={self.least}{parts})"
        )

    @property
    def names(self) -> tuple[str, ...]:
        """The parameters the units span, each once, in order."""
        return tuple(dict.fromkeys(m.name for m in self.members))


@final
@dataclass(frozen=True)
class Structure(Mapping[str, UnitGroup]):
    """A model's structural unit groups by name: what :func:`structured` prunes and ``shrink`` removes.

    A read-only mapping from group names (the module the units live in,
    such as ``"model.layers.0.mlp"``) to :class:`UnitGroup`. Build one with
    :func:`~funcprune.structure`, or by hand from groups.

    >>> import funcprune as fp
    >>> s = fp.Structure({"mlp": fp.UnitGroup("channels", 4, (fp.Member("up.weight", 0, 1),
    ...                                                         fp.Member("down.weight", 1, 1)))})
    >>> s
    Structure(mlp: 4 channels)
    >>> s["mlp"].names
    ('up.weight', 'down.weight')
    """

    #: The analysis :func:`~funcprune.structure` made, for ``shrink(..., structure=)`` (not a field: never
    #: pickled, compared or shown; ``None`` on a structure built by hand or unpickled).
    _analyzed: ClassVar[object] = None

    groups: Mapping[str, UnitGroup]
    #: For a kind the model has no group of, why (``"hidden"``: a LayerNorm centres by the mean...), which a plan
    #: asked for that kind says.
    left_out: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.groups, Mapping):
            raise TypeError(f"Structure: groups must be a mapping of names to UnitGroup, got {self.groups!r}")
        for name, group in self.groups.items():
            if not isinstance(name, str) or not isinstance(group, UnitGroup):
                raise TypeError(f"Structure: groups must map names (str) to UnitGroup, got {name!r}: {group!r}")
        if not isinstance(self.left_out, Mapping) or any(
            k not in KINDS or not isinstance(v, str) for k, v in self.left_out.items()
        ):  # fmt: skip
            raise TypeError(f"Structure: left_out must map kinds to why they are left out, got {self.left_out!r}")
        object.__setattr__(self, "groups", MappingProxyType(dict(self.groups)))
        object.__setattr__(self, "left_out", MappingProxyType(dict(self.left_out)))

    def __reduce__(self) -> tuple[type[Structure], tuple[dict[str, UnitGroup], dict[str, str]]]:
        """Pickled as its groups (so one process can read a structure and send it to the others)."""
        return (Structure, (dict(self.groups), dict(self.left_out)))


    def __getitem__(self, name: str) -> UnitGroup:
        return self.groups[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.groups)

    def __len__(self) -> int:
        return len(self.groups)

    def __repr__(self) -> str:
        shown = [f"{name}: {g.size} {g.kind}" for name, g in list(self.groups.items())[:6]]
        more = f", ... ({len(self.groups)} groups)" if len(self.groups) > 6 else ""
        return f"Structure({', '.join(shown)}{more})"

    def of_kinds(self, *kinds: Kind) -> Structure:
        """The groups of these kinds (and why a kind among them is left out, where it is)."""
        return Structure(
            {n: g for n, g in self.groups.items() if g.kind in kinds}, {k: v for k, v in self.left_out.items() if k in kinds}
        )
