"""The value types of selection: groups, parts, shards and targets; nothing above them is imported.

A :class:`KeyPart` is one part of the keys ranked jointly on this process;
its :class:`LocalShard`, where it has one, says where the block sits in a
tensor that several processes hold (``README.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union, final

import torch

from .._types import Amount, Mask, Tensor

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "WHOLE", "CountOf", "Group", "KeyPart", "LocalShard", "Runs", "Slices", "Sparsity", "Target", "Whole",
    "identity", "magnitude_of",
]  # fmt: skip


@final
@dataclass(frozen=True, slots=True)
class LocalShard:
    """A block of a larger tensor; other processes of ``groups`` hold the rest.

    Attributes:
        shape: the whole tensor's shape.
        offsets: the index, along each dim, where this block starts.
        size: this block's shape.
        counted: ``False`` where another process holds the same block and
            counts it (a replicated tensor is counted on one process only).
        groups: the process groups over which the parts are ranked: counts
            are reduced over each in turn, so over the processes they span
            together (the mesh dims of a DTensor's mesh that shard it);
            ``None`` is the default group.
    """

    shape: tuple[int, ...]
    offsets: tuple[int, ...]
    size: tuple[int, ...]
    counted: bool = True
    groups: tuple[ProcessGroup | None, ...] = (None,)

    def __post_init__(self) -> None:
        if not len(self.shape) == len(self.offsets) == len(self.size):
            raise ValueError(
                f"LocalShard: shape {self.shape}, offsets {self.offsets} and size {self.size} "
                "must have one entry per dim"
            )
        for d, (n, o, s) in enumerate(zip(self.shape, self.offsets, self.size, strict=True)):
            if not (0 <= o and 0 <= s and o + s <= n):
                raise ValueError(
                    f"LocalShard: along dim {d} a block of {s} entries at offset {o} does not fit "
                    f"in the whole length {n}"
                )

    @property
    def numel(self) -> int:
        """How many entries the whole tensor has."""
        return math.prod(self.shape)

    def positions(self, local: Tensor) -> Tensor:
        """The whole tensor's flat indices of the block's flat indices ``local``."""
        position = torch.zeros_like(local)
        if not self.size:
            return position
        coords = torch.unravel_index(local, self.size)
        for c, o, n in zip(coords, self.offsets, self.shape, strict=True):
            position.mul_(n).add_(c + o)
        return position


#: How many to prune, from how many are eligible over all processes (``resolve_count`` for an amount).
CountOf = Callable[[int], int]


@final
@dataclass(frozen=True, slots=True)
class Whole:
    """One group: every entry of the tensor."""


@final
@dataclass(frozen=True, slots=True)
class Slices:
    """One group per index along ``dim``: each slice selects on its own."""

    dim: int


@final
@dataclass(frozen=True, slots=True)
class Runs:
    """One group per run of ``size`` consecutive entries along ``dim`` (an N:M group, a block row).

    Not the ``Block`` spec's blocks, which may span several dims: a run lies along one.
    """

    size: int
    dim: int = -1


Group = Union[Whole, Slices, Runs, LocalShard]
#: The default group.
WHOLE = Whole()


@final
@dataclass(frozen=True, slots=True)
class Sparsity:
    """A cumulative target: this fraction of all units pruned after the call."""

    value: float


#: How much a spec prunes: an ``int`` count or a ``float`` fraction of what is
#: left (torch's ``amount``), or a cumulative :class:`Sparsity`.
Target = Union[Amount, Sparsity]


def identity(t: Tensor) -> Tensor:
    return t


def magnitude_of(t: Tensor) -> Tensor:
    """``|t|``: as a :class:`KeyPart`'s key, the part's keys are its magnitudes."""
    return t.abs()


@final
@dataclass(frozen=True, slots=True)
class KeyPart:
    """One part of keys ranked jointly, computed slice by slice (never all at once).

    Attributes:
        source: the 1-D tensor the keys come from (its size, device, and
            whether its values can be read: eager or traced).
        key: maps any slice of ``source`` to the slice's keys, entry by
            entry, in the group's common dtype (the identity where
            ``source`` holds the keys).
        eligible: 1-D ``torch.bool`` flags; ``None`` means all.
        shard: where the part sits in a larger tensor whose other blocks
            other processes hold; ``None`` when this process holds it all.
    """

    source: Tensor
    key: Callable[[Tensor], Tensor] = identity
    eligible: Mask = None
    shard: LocalShard | None = None

    @property
    def numel(self) -> int:
        """How many keys the part has."""
        return self.source.numel()

    def keys(self) -> Tensor:
        """All the part's keys."""
        return self.key(self.source)
