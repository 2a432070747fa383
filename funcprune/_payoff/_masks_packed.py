"""Masks at rest in memory: :func:`pack_masks` and :func:`unpack_masks`.

A packed dict is plain tensors: per mask, its bits (``_masks_bits.py``),
its shape, and, for a DTensor's block, the JSON record of where it sits
(``_masks_blocks.py``). Given ``like=``, :func:`unpack_masks` lays the
masks out (``_masks_layout.py``); given every process's dict (a list), it
merges them into whole masks (``_masks_merge.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from .._types import Tensor
from ._masks_bits import checked_masks, pack_bits, unpack_checked
from ._masks_blocks import Entry, parsed_sharding
from ._masks_layout import arranged, checked_like
from ._masks_untrusted import MAX_NUMEL, Corrupt, bad, compact_json

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["DTENSOR_SUFFIX", "SHAPE_SUFFIX", "pack_masks", "unpack_masks"]

#: The key suffix under which :func:`pack_masks` stores each mask's shape.
SHAPE_SUFFIX = "::shape"

#: The key suffix under which :func:`pack_masks` stores where a DTensor mask's block sits.
DTENSOR_SUFFIX = "::dtensor"


def pack_masks(masks: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Bit-pack masks: one bit per entry, 8 entries a byte.

    Entries are taken in row-major (``reshape(-1)``) order; entry ``k`` is
    bit ``k % 8`` (little-endian: weight ``2 ** (k % 8)``) of byte
    ``k // 8``, and the bits after the last entry are 0. The result is a
    plain dict of tensors (``torch.save`` or ``safetensors`` take it as it
    is); for each mask ``name``:

    - ``name``: the packed bytes, ``torch.uint8`` of shape
      ``(ceil(numel / 8),)``, on the mask's device;
    - ``name + "::shape"``: the mask's shape, ``torch.int64`` of shape
      ``(mask.dim(),)`` (empty for a 0-d mask), on the CPU.

    A DTensor mask (FSDP2's, tensor parallelism's) is packed where it lies:
    ``name`` holds the bits of this process's block (``mask.to_local()``),
    ``name + "::shape"`` the block's shape, and ``name + "::dtensor"``
    where the block sits, as a ``torch.uint8`` CPU tensor of the UTF-8
    bytes of the JSON record that :func:`save_masks` writes for it (the
    whole shape, the block's offsets, the placements, the mesh's shape, and
    this process's coordinate and rank). Nothing is communicated.
    :func:`unpack_masks` with ``like=`` rebuilds the DTensor; given every
    process's dict, it merges them into the whole mask.

    Args:
        masks: masks keyed by name: ``torch.bool`` (``True`` = kept), or
            integer or floating-point 0/1 masks (as torch's float
            ``weight_mask`` buffers), converted exactly; plain tensors, or
            DTensors placed ``Shard``, ``Replicate`` or FSDP2's
            ``_StridedShard`` on each mesh dim.

    Returns:
        A new dict, in the order of ``masks``: per mask, its packed bytes
        and its shape (and, for a DTensor, where its block sits).
        :func:`unpack_masks` returns the masks.

    Raises:
        TypeError: if ``masks`` is not a mapping of str names to dense tensors.
        ValueError: if a mask holds values other than 0 and 1 (the message
            names it and shows the values), has no values (meta, or inside
            a transform), or its name ends with ``"::shape"`` or
            ``"::dtensor"``.
        NotImplementedError: for a DTensor placed otherwise (``Partial``).

    >>> import torch, funcprune as fp
    >>> packed = fp.pack_masks({"w": torch.tensor([[True, False, True], [True, True, False]])})
    >>> packed["w"], packed["w::shape"]  # entries 0, 2, 3, 4 kept: 1 + 4 + 8 + 16
    (tensor([29], dtype=torch.uint8), tensor([2, 3]))
    >>> fp.unpack_masks(packed)["w"]
    tensor([[ True, False,  True],
            [ True,  True, False]])
    """
    fn = "pack_masks"
    checked = checked_masks(fn, masks)
    packed: dict[str, Tensor] = {}
    for name, (mask, sharding) in checked.items():
        if name.endswith((SHAPE_SUFFIX, DTENSOR_SUFFIX)):
            raise ValueError(
                f"{fn}: masks[{name!r}]: mask names must not end with {SHAPE_SUFFIX!r} or {DTENSOR_SUFFIX!r}, "
                "the suffixes of the packed dict's shape and DTensor entries; rename it"
            )
        packed[name] = pack_bits(mask)
        packed[name + SHAPE_SUFFIX] = torch.tensor(mask.shape, dtype=torch.int64)
        if sharding is not None:
            record = compact_json(sharding.record()).encode()
            packed[name + DTENSOR_SUFFIX] = torch.tensor(list(record), dtype=torch.uint8)
    return packed


def unpack_masks(
    packed: Mapping[str, Tensor] | Sequence[Mapping[str, Tensor]],
    *,
    like: Mapping[str, Tensor] | DeviceMesh | None = None,
) -> dict[str, Tensor]:
    """The ``torch.bool`` masks that :func:`pack_masks` packed into ``packed``.

    A DTensor mask's entry unpacks to this process's block as a plain
    tensor, unless ``like`` says how to lay it out (as for
    :func:`load_masks`, which documents ``like`` and merging); a list of
    every process's packed dicts (gathered with ``all_gather_object``, say)
    merges them into whole masks.

    Args:
        packed: a dict as :func:`pack_masks` returns it (any device), or a
            non-empty list of them to merge.
        like: ``None``; or the tensors (parameters, or masks) the masks
            should be laid out as, by name; or the ``DeviceMesh`` to wrap
            the DTensor masks' blocks on. See :func:`load_masks`.

    Returns:
        A new dict of ``torch.bool`` masks of the packed shapes, each on its
        packed bytes' device, in the order of ``packed``; equal, bit for
        bit, to the masks packed (a DTensor's block, or with ``like`` the
        DTensor; merged, the whole masks).

    Raises:
        TypeError: if ``packed`` is not a mapping of tensors (or a list of
            them), or ``like`` not a mapping of tensors or a ``DeviceMesh``.
        ValueError: if an entry lacks its shape entry (or a shape its
            bytes), a shape is not a 1-D integer tensor of sizes >= 0, the
            bytes are not a 1-D ``torch.uint8`` tensor of ``ceil(numel / 8)``
            entries, the bits after the last entry are not 0, or a
            ``"::dtensor"`` entry is not a block's record; or the masks do
            not fit ``like``, or the dicts do not merge (see
            :func:`load_masks`).

    >>> import torch, funcprune as fp
    >>> packed = {"w": torch.tensor([5], dtype=torch.uint8), "w::shape": torch.tensor([3])}
    >>> fp.unpack_masks(packed)
    {'w': tensor([ True, False,  True])}
    """
    fn = "unpack_masks"
    like = checked_like(fn, like)
    if isinstance(packed, Mapping):
        return arranged(fn, [_unpacked(fn, "packed", packed)], like, merge=False)
    if isinstance(packed, (list, tuple)) and packed and all(isinstance(p, Mapping) for p in packed):
        sources = [_unpacked(fn, f"packed[{i}]", p) for i, p in enumerate(packed)]
        return arranged(fn, sources, like, merge=True)
    raise TypeError(
        f"{fn}: packed must be a mapping of names to tensors (or a non-empty list of them, to merge), got "
        f"{type(packed).__name__}"
    )


def _unpacked(fn: str, label: str, packed: Mapping[str, Tensor]) -> list[Entry]:
    """The masks of one packed dict (``label`` in the messages), each as it was packed."""
    for key, value in packed.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{fn}: {label}[{key!r}] must be a tensor, got {type(value).__name__}")
    suffixes = (SHAPE_SUFFIX, DTENSOR_SUFFIX)
    names = [k for k in packed if isinstance(k, str) and not k.endswith(suffixes)]
    for key in packed:
        if not isinstance(key, str):
            raise TypeError(f"{fn}: keys must be str, got {key!r} of type {type(key).__name__}")
        for suffix, what in ((SHAPE_SUFFIX, "a shape"), (DTENSOR_SUFFIX, "where a DTensor's block sits")):
            if key.endswith(suffix) and key[: -len(suffix)] not in packed:
                raise ValueError(
                    f"{fn}: {label}[{key!r}] is {what} with no packed bytes (no key "
                    f"{key[: -len(suffix)]!r}); pass the whole dict pack_masks returned"
                )
    entries: list[Entry] = []
    for name in names:
        if name + SHAPE_SUFFIX not in packed:
            raise ValueError(
                f"{fn}: {label}[{name!r}] has no shape entry {name + SHAPE_SUFFIX!r}; pass the "
                "whole dict pack_masks returned"
            )
        shape_t = packed[name + SHAPE_SUFFIX]
        if shape_t.dim() != 1 or shape_t.dtype.is_floating_point or shape_t.dtype.is_complex or (
            shape_t.dtype == torch.bool
        ):
            raise ValueError(
                f"{fn}: {label}[{name + SHAPE_SUFFIX!r}] must be a 1-D integer tensor (a "
                f"shape), got dtype {shape_t.dtype} and shape {tuple(shape_t.shape)}"
            )
        shape = tuple(int(s) for s in shape_t.tolist())
        if any(s < 0 for s in shape):
            raise ValueError(f"{fn}: {label}[{name + SHAPE_SUFFIX!r}] holds a negative size: {shape}")
        if math.prod(max(s, 1) for s in shape) > MAX_NUMEL:
            raise ValueError(
                f"{fn}: {label}[{name + SHAPE_SUFFIX!r}] is a shape larger than torch can hold (its sizes multiply "
                f"past 2**63 - 1): {shape}"
            )
        mask = unpack_checked(f"{fn}: {label}[{name!r}]", packed[name], shape)
        sharding = None
        if name + DTENSOR_SUFFIX in packed:
            key = name + DTENSOR_SUFFIX
            record = packed[key]
            try:
                if record.dtype != torch.uint8 or record.dim() != 1:
                    bad(f"expected a 1-D torch.uint8 tensor, got dtype {record.dtype} and shape {tuple(record.shape)}")
                try:
                    value = json.loads(bytes(record.tolist()).decode())
                except (ValueError, RecursionError) as err:  # UnicodeDecodeError included; nested too deep
                    bad(f"its bytes are not a JSON record ({err})")
                sharding = parsed_sharding(value, shape)
            except Corrupt as err:
                raise ValueError(
                    f"{fn}: {label}[{key!r}] is not where a block sits as pack_masks records it: {err}"
                ) from None
        entries.append(Entry(name, mask, sharding, label))
    return entries
