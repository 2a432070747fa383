"""Every process's masks (a list of files or packed dicts) merged into whole masks, on one machine.

A mask saved whole must be alike in every source. A DTensor mask's blocks
are assembled into the whole mask: copies of a block (along a
``Replicate`` mesh dim, or from a source given twice) must agree, and any
one of them will do. The blocks of one layout never overlap, so the
blocks held make up the whole mask when their entries add up to its
count: that is checked before the whole mask is allocated, and a missing
block is named after visiting a bounded number of the mesh's coordinates
(a mesh's shape is only what a file says).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Iterator, Sequence
from typing import NoReturn

import torch

from .._dtensor import box, cut_dim
from .._types import Tensor
from ._masks_blocks import Entry, Sharding, placements_of, strided_pieces

__all__ = ["merged"]


def merged(fn: str, sources: list[list[Entry]]) -> list[Entry]:
    """The whole masks that ``sources`` (every process's masks) hold, in the order first found."""
    by_name: dict[str, list[Entry]] = {}
    for entries in sources:
        for entry in entries:
            by_name.setdefault(entry.name, []).append(entry)
    return [_whole(fn, name, held) for name, held in by_name.items()]


def _described(entry: Entry) -> str:
    saved = entry.sharding
    if saved is None:
        return f"a whole mask of shape {tuple(entry.mask.shape)}"
    return (
        f"a block of a mask of shape {saved.shape} laid out as [{', '.join(saved.placements)}] on a mesh of "
        f"shape {saved.mesh}"
    )


def _whole(fn: str, name: str, held: list[Entry]) -> Entry:
    """The whole mask ``name`` of the entries ``held`` (its copies, or its blocks)."""
    first = held[0]
    for entry in held[1:]:
        if _described(entry) != _described(first):
            raise ValueError(
                f"{fn}: the mask {name!r} is {_described(first)} in {first.source} but {_described(entry)} in "
                f"{entry.source}; merge the files of one save, every process's"
            )
    if first.sharding is None:
        for entry in held[1:]:
            if not torch.equal(entry.mask, first.mask):
                raise ValueError(
                    f"{fn}: the mask {name!r} differs between {first.source} and {entry.source}; merge the files "
                    "of one save, every process's"
                )
        return first
    return Entry(name, _assembled(fn, name, held), None, first.source)


def _assembled(fn: str, name: str, held: list[Entry]) -> Tensor:
    """The whole mask that the blocks ``held`` (of one layout) make up, each block from one of its copies.

    Each block was checked to be the one its coordinate gets, and the blocks
    of a layout do not overlap (each mesh dim's cut is a partition): the
    blocks held make up the whole mask when their entries add up to its
    count. That is checked first, so nothing is allocated, nor any of the
    mesh's coordinates visited, that the files do not hold.
    """
    saved = held[0].sharding
    assert saved is not None
    copies: dict[tuple[tuple[int, ...], tuple[int, ...]], list[Entry]] = {}  # by block: its copies
    for entry in held:
        assert entry.sharding is not None
        copies.setdefault((entry.sharding.offsets, tuple(entry.mask.shape)), []).append(entry)
    for (offsets, size), found in copies.items():
        for entry in found[1:]:
            if not torch.equal(entry.mask, found[0].mask):
                raise ValueError(
                    f"{fn}: the mask {name!r}: the copies of its block [{_entries(offsets, size)}] differ between "
                    f"{found[0].source} and {entry.source}; merge the files of one save, every process's"
                )
    if sum(math.prod(size) for _, size in copies) != math.prod(saved.shape):
        _missing(fn, name, saved, {e.sharding.coordinate for e in held if e.sharding is not None}, copies.keys())
    whole = torch.zeros(saved.shape, dtype=torch.bool)
    for (offsets, size), found in copies.items():
        if 0 not in size:
            whole[tuple(slice(o, o + n) for o, n in zip(offsets, size, strict=True))] = found[0].mask
    return whole


def _entries(offsets: tuple[int, ...], size: tuple[int, ...]) -> str:
    return ", ".join(f"{o}:{o + n}" for o, n in zip(offsets, size, strict=True))


#: How many of a mesh's coordinates :func:`_missing` visits, at most, to name a block no file holds.
_VISITED = 2**12


def _missing(
    fn: str, name: str, saved: Sharding, coordinates: set[tuple[int, ...]],
    held: Collection[tuple[tuple[int, ...], tuple[int, ...]]],
) -> NoReturn:  # fmt: skip
    """Refuse the merge of the blocks ``held`` (at ``coordinates``) of a mask that they do not make up.

    Names the first block that no file holds, in the mesh's order, among
    the first coordinates (a bounded number: the mesh's shape is only what a
    file says) of the mesh dims that cut; the copies along the others share it.
    """
    placements = placements_of(saved)
    ndim = len(saved.shape)
    span = [i for i, p in enumerate(placements) if ndim and cut_dim(p, ndim) is not None]
    budget = max(16, _VISITED // (1 + strided_pieces(saved.shape, placements)))
    hint = f"give every process's file (these hold coordinates {', '.join(map(str, sorted(coordinates)))})"
    for cut in itertools.islice(_odometer([saved.mesh[i] for i in span]), budget):
        coordinate = [0] * len(saved.mesh)
        for i, c in zip(span, cut, strict=True):
            coordinate[i] = c
        where = box(saved.shape, saved.mesh, coordinate, placements)
        if where is None:
            raise ValueError(
                f"{fn}: the mask {name!r}: its placements {list(saved.placements)} leave the process at mesh "
                f"coordinate {tuple(coordinate)} entries that are no box; such masks are not saved by save_masks"
            )
        if 0 in where[1] or where in held:
            continue
        copies = _copies(saved.mesh, span, tuple(coordinate))
        raise ValueError(
            f"{fn}: the mask {name!r}: no file holds its block [{_entries(*where)}], that of mesh coordinate "
            f"{copies}; {hint}"
        )
    raise ValueError(
        f"{fn}: the mask {name!r}: the blocks its files hold make up {sum(math.prod(size) for _, size in held)} of "
        f"its {math.prod(saved.shape)} entries (a mask of shape {saved.shape} on a mesh of shape {saved.mesh}); {hint}"
    )


def _odometer(sizes: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """Every index of ``sizes`` in row-major order (``itertools.product`` of ranges, which would first hold every
    range as a tuple: a mesh's sizes are only what a file says)."""
    if 0 in sizes:
        return
    index = [0] * len(sizes)
    while True:
        yield tuple(index)
        d = len(sizes) - 1
        while d >= 0 and index[d] == sizes[d] - 1:
            index[d] = 0
            d -= 1
        if d < 0:
            return
        index[d] += 1


def _copies(mesh: tuple[int, ...], span: list[int], coordinate: tuple[int, ...]) -> str:
    """The coordinates that hold copies of ``coordinate``'s block (they differ along the mesh dims not in ``span``)."""
    others = [i for i in range(len(mesh)) if i not in span]
    count = math.prod(mesh[i] for i in others)
    shown = []
    for along in itertools.islice(_odometer([mesh[i] for i in others]), 4):
        copy = list(coordinate)
        for i, c in zip(others, along, strict=True):
            copy[i] = c
        shown.append(str(tuple(copy)))
    return " or ".join(shown) if count <= 4 else f"{', '.join(shown)} or any of its {count} copies"
