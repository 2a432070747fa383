"""The masks read back, laid out: as saved, on a device mesh, like given tensors, or merged.

``like=`` of ``load_masks`` and ``unpack_masks``: a mapping lays each mask
out as the tensor of its name (a DTensor's block wrapped back into its
DTensor, nothing communicated, or this process's block cut from a whole
mask); a ``DeviceMesh`` wraps each DTensor mask's block on it. The saved
layout must be the one asked for, else a ``ValueError`` says both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from .._dtensor import Layout, cut_dim, layout_of, wrap
from .._types import Tensor, is_dtensor
from ._masks_blocks import Entry, placements_of, sharding_of
from ._masks_merge import merged

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["arranged", "checked_like"]


def checked_like(fn: str, like: object) -> Mapping[str, Tensor] | DeviceMesh | None:
    if like is None or isinstance(like, Mapping):
        return like
    if torch.distributed.is_available():
        from torch.distributed.device_mesh import DeviceMesh

        if isinstance(like, DeviceMesh):
            return like
    raise TypeError(
        f"{fn}: like must be a mapping of names to tensors (the parameters, or masks, laid out as the masks "
        f"should be) or a DeviceMesh, got {type(like).__name__}"
    )


def arranged(
    fn: str, sources: list[list[Entry]], like: Mapping[str, Tensor] | DeviceMesh | None, *, merge: bool
) -> dict[str, Tensor]:
    """The masks of ``sources`` (one, or merged), laid out as ``like`` says."""
    entries = merged(fn, sources) if merge else sources[0]
    if like is None:
        return {e.name: e.mask for e in entries}
    if isinstance(like, Mapping):
        return {e.name: _like(fn, e, like) for e in entries}
    return {e.name: e.mask if e.sharding is None else _on_mesh(fn, e, like) for e in entries}


_HINT = (
    "load (or unpack) each process's own masks on the mesh and layout they were saved with, or merge every "
    "process's files (a list of them) into whole masks"
)


def _on_mesh(fn: str, entry: Entry, mesh: DeviceMesh) -> Tensor:
    """The DTensor on ``mesh`` whose block ``entry`` holds (this process's)."""
    saved = entry.sharding
    assert saved is not None
    coordinate = mesh.get_coordinate()
    here = (tuple(mesh.shape), None if coordinate is None else tuple(coordinate))
    if here != (saved.mesh, saved.coordinate):
        raise ValueError(
            f"{fn}: {entry.source}: the mask {entry.name!r} is {saved.described()}, but this process is at "
            f"coordinate {here[1]} of a mesh of shape {here[0]}; {_HINT}"
        )
    placements = placements_of(saved)
    ndim = len(saved.shape)
    span = tuple(i for i, p in enumerate(placements) if ndim and cut_dim(p, ndim) is not None)
    size = tuple(entry.mask.shape)
    return wrap(entry.mask, Layout(mesh, placements, saved.shape, saved.offsets, size, saved.coordinate, span))


def _like(fn: str, entry: Entry, like: Mapping[str, Tensor]) -> Tensor:
    """``entry``'s mask laid out as ``like[entry.name]``: a plain tensor, or a DTensor (this process's block)."""
    name, saved = entry.name, entry.sharding
    where = f"{fn}: {entry.source}: the mask {name!r}"
    if name not in like:
        raise ValueError(f"{where} has no tensor in like; give like a tensor for every mask (the parameters, say)")
    t = like[name]
    what = f"like[{name!r}]"
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {what} must be a tensor, got {type(t).__name__}")
    if not is_dtensor(t):
        if saved is not None:
            raise ValueError(
                f"{where} is {saved.described()}, but {what} is a plain tensor of shape {tuple(t.shape)}; {_HINT}"
            )
        if t.shape != entry.mask.shape:
            raise ValueError(f"{where} has shape {tuple(entry.mask.shape)}, but {what} has shape {tuple(t.shape)}")
        return entry.mask
    layout = layout_of(fn, what, t)
    if saved is None:  # a whole mask: this process's block of it
        if layout.shape != tuple(entry.mask.shape):
            raise ValueError(
                f"{where} has shape {tuple(entry.mask.shape)}, but {what} is a DTensor of shape {layout.shape}"
            )
        block = entry.mask[tuple(slice(o, o + n) for o, n in zip(layout.offsets, layout.size, strict=True))]
        return wrap(block.clone(), layout)
    mine = sharding_of(layout)
    if (saved.laid_out, saved.coordinate) != (mine.laid_out, mine.coordinate):
        raise ValueError(f"{where} is {saved.described()}, but {what} is {mine.described('tensor')}; {_HINT}")
    return wrap(entry.mask, layout)
