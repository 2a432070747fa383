"""The values of the channel analysis: layouts, sizes, roles, the channel graph.

Value types only; nothing here imports the rest of the analysis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Union, final

__all__ = ["ChannelGraph", "ChannelLayout", "Pieces", "Role", "RoleKind", "Sizes", "Value"]


@final
@dataclass(frozen=True, slots=True)
class ChannelLayout:
    """A tensor whose dim ``axis`` holds the channels ``atoms``, in order.

    >>> ChannelLayout(1, (0, 0, 1, 1))  # a Conv's 2 channels, each repeated twice
    ChannelLayout(axis=1, atoms=(0, 0, 1, 1))
    """

    axis: int
    atoms: tuple[int, ...]


@final
@dataclass(frozen=True, slots=True)
class Sizes:
    """``x.shape`` or ``x.size()`` of a tensor with channels, of ``ndim`` dims."""

    layout: ChannelLayout
    ndim: int


@final
@dataclass(frozen=True, slots=True)
class Pieces:
    """A tuple of tensors (``chunk``, ``split`` along another dim), each with ``layout``."""

    layout: ChannelLayout


#: What a node's result carries: channels, the sizes of a tensor with
#: channels, pieces of one, or nothing the analysis follows (``None``).
Value = Union[ChannelLayout, Sizes, Pieces, None]
#: ``linear``, ``conv``: weight rows are output atoms, columns input atoms.
#: ``norm``, ``depthwise``: per-channel entries that follow their input atoms.
RoleKind = Literal["linear", "conv", "norm", "depthwise"]


@final
@dataclass(frozen=True, slots=True)
class Role:
    """The atoms of one module: its output channels and input channels.

    ``in_atoms`` is ``None`` when its input keeps all its channels.
    """

    kind: RoleKind
    out_atoms: tuple[int, ...]
    in_atoms: tuple[int, ...] | None


@final
@dataclass(frozen=True, slots=True)
class ChannelGraph:
    """The channel dependencies of a model.

    Attributes:
        roles: each module that may shrink, by qualified name.
        roots: for each atom, the atom that names its group.
        produced: for each atom a Linear or Conv makes, ``(module, row)``.
        blocked: the groups that keep their channels, with a reason.
        unknown: the groups an op reads that shrink cannot reason about,
            with that node's description.
        fixed: the Linear and Conv layers whose output channels the
            analysis does not follow (grouped, shared...), each
            with the reason they stay whole.
    """

    roles: Mapping[str, Role]
    roots: tuple[int, ...]
    produced: Mapping[int, tuple[str, int]]
    blocked: Mapping[int, str]
    unknown: Mapping[int, str]
    fixed: Mapping[str, str]
