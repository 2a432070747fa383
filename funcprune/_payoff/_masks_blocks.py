"""Where a DTensor mask's block sits, as files and packed dicts record it.

A DTensor mask is kept block by block: each process packs its own block
(``mask.to_local()``) with a record of where it sits (:class:`Sharding`:
the whole shape, the placements, the mesh's shape, the process's coordinate
and rank, the block's offsets). :func:`sharding_of` makes the record of
this process's block; :func:`parsed_sharding` reads one back, untrusted:
the block must be the one its placements give its coordinate (``box`` of
``funcprune/_dtensor``), and the check follows at most
:data:`MAX_STRIDED_PIECES` strided pieces. :class:`Entry` is a mask read
back, with its record, whichever way it is then laid out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from .._dtensor import Layout, box, cut_dim, strided
from .._torch_private import strided_shard
from .._types import Tensor
from ._masks_untrusted import bad, checked_shape, checked_size, checked_sizes, shown

if TYPE_CHECKING:
    from torch.distributed.tensor.placement_types import Placement

__all__ = [
    "MAX_STRIDED_PIECES", "Entry", "Sharding", "parsed_sharding", "placements_of", "sharding_of", "strided_pieces",
]  # fmt: skip

#: The keys of a ``"dtensor"`` record.
_SHARDING_KEYS = frozenset({"shape", "offsets", "placements", "mesh", "coordinate", "rank"})

#: A placement as a record writes it.
_PLACEMENT = re.compile(
    r"Replicate\(\)|Shard\((0|[1-9]\d{0,17})\)|_StridedShard\((0|[1-9]\d{0,17}), split_factor=([1-9]\d{0,17})\)"
)  # at most 18 digits: every number fits torch's int64

#: The most pieces a block's record may have its ``_StridedShard`` placements cut (their split factors, or the
#: entries of the dims they cut, whichever is fewer, summed): checking where the block sits follows each piece.
#: FSDP2's split factor is the number of tensor-parallel processes; 65,536 leaves room for any real mesh.
MAX_STRIDED_PIECES = 2**16


@dataclass(frozen=True, slots=True)
class Sharding:
    """Where a DTensor mask's block sits in the whole mask, as files and packed dicts record it."""

    shape: tuple[int, ...]  # the whole mask's
    offsets: tuple[int, ...]  # where the block starts, along each dim
    placements: tuple[str, ...]  # one per mesh dim, as _placement_name writes them
    mesh: tuple[int, ...]  # the device mesh's shape
    coordinate: tuple[int, ...]  # the process's that held the block, in the mesh
    rank: int  # and its global rank (for the messages)

    @property
    def laid_out(self) -> tuple[object, ...]:
        """What the blocks of one DTensor share: the whole shape, the placements, the mesh's shape."""
        return self.shape, self.placements, self.mesh

    def record(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape), "offsets": list(self.offsets), "placements": list(self.placements),
            "mesh": list(self.mesh), "coordinate": list(self.coordinate), "rank": self.rank,
        }  # fmt: skip

    def described(self, what: str = "mask") -> str:
        return (
            f"the block at mesh coordinate {self.coordinate} (rank {self.rank}) of a {what} of shape "
            f"{self.shape} laid out as [{', '.join(self.placements)}] on a mesh of shape {self.mesh}"
        )


class Entry(NamedTuple):
    """A mask read back: its ``torch.bool`` values (a DTensor's: one process's block), and from where."""

    name: str
    mask: Tensor
    sharding: Sharding | None  # None: a whole mask
    source: str  # the file or packed dict, for the messages


def _placement_name(placement: Placement, ndim: int) -> str:
    """``placement`` (``Replicate``, ``Shard`` or ``_StridedShard``, as ``layout_of`` admits) as a record writes it."""
    dim = cut_dim(placement, ndim) if ndim else None
    if dim is None:
        return "Replicate()"
    factor = strided(placement)
    return f"Shard({dim})" if factor is None else f"_StridedShard({dim}, split_factor={factor})"


def _placement(name: object, ndim: int) -> Placement:
    """The placement a record names (see :func:`_placement_name`), for a mask of ``ndim`` dims."""
    from torch.distributed.tensor import Replicate, Shard

    match = _PLACEMENT.fullmatch(name) if isinstance(name, str) else None
    if match is None:
        bad(f"expected a placement Replicate(), Shard(d) or _StridedShard(d, split_factor=f), got {shown(name)}")
    if match[1] is None and match[2] is None:
        return Replicate()
    dim = int(match[1] or match[2])
    if dim >= ndim:
        bad(f"the placement {name!r} cuts dim {dim} of a mask of {ndim} dims")
    return Shard(dim) if match[1] is not None else strided_shard(dim, int(match[3]))


def placements_of(sharding: Sharding) -> tuple[Placement, ...]:
    return tuple(_placement(p, len(sharding.shape)) for p in sharding.placements)


def sharding_of(layout: Layout) -> Sharding:
    """What a record says of the block that ``layout`` describes (this process's)."""
    ndim = len(layout.shape)
    return Sharding(
        layout.shape, layout.offsets, tuple(_placement_name(p, ndim) for p in layout.placements),
        tuple(layout.mesh.shape), layout.coordinate, layout.mesh.get_rank(),
    )  # fmt: skip


def strided_pieces(shape: tuple[int, ...], placements: Sequence[Placement]) -> int:
    """How many pieces the ``_StridedShard`` placements cut (at most as many as the entries of their dims)."""
    pieces = 0
    for p in placements:
        factor, dim = strided(p), cut_dim(p, len(shape)) if shape else None
        if factor is not None and dim is not None:
            pieces += min(factor, shape[dim])
    return pieces


def parsed_sharding(value: object, size: tuple[int, ...]) -> Sharding:
    """The ``"dtensor"`` record ``value`` of a block of shape ``size``, checked: the block must be where it says."""
    if not isinstance(value, dict) or set(value) != _SHARDING_KEYS:
        bad(f"expected a record with the keys {sorted(_SHARDING_KEYS)}, got {shown(value)}")
    shape = checked_shape(value["shape"])
    offsets, mesh, coordinate = (checked_sizes(value[k]) for k in ("offsets", "mesh", "coordinate"))
    placements = value["placements"]
    if not isinstance(placements, list) or not (
        len(shape) == len(offsets) == len(size) and len(mesh) == len(coordinate) == len(placements)
    ):
        bad(f"its shape, offsets, mesh, coordinate and placements do not fit one another: {shown(value)}")
    if any(c >= n for c, n in zip(coordinate, mesh, strict=True)):
        bad(f"the coordinate {list(coordinate)} is not in a mesh of shape {list(mesh)}")
    sharding = Sharding(shape, offsets, tuple(placements), mesh, coordinate, checked_size(value["rank"]))
    cuts = placements_of(sharding)
    if strided_pieces(shape, cuts) > MAX_STRIDED_PIECES:
        bad(
            f"its placements {shown(placements)} cut a mask of shape {list(shape)} into more than {MAX_STRIDED_PIECES} "
            "strided pieces (split factors that large are no process mesh's)"
        )
    if box(shape, mesh, coordinate, cuts) != (offsets, size):
        bad(
            f"a block of shape {size} at offsets {offsets} is not the one its placements {shown(placements)} of shape "
            f"{shape} on a mesh of shape {mesh} give the coordinate {coordinate}"
        )
    return sharding
