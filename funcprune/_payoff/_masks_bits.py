"""One bit per entry: a mask's packed bytes, their checksum, and the masks a caller may pack.

Entry ``k`` of a mask, taken in row-major (``reshape(-1)``) order, is bit
``k % 8`` of byte ``k // 8`` (:func:`pack_bits`); the bits after the last
entry are 0, which :func:`unpack_checked` checks, with the number of
bytes, before it unpacks. :func:`bits_checksum` weighs each byte by its
position, so that any one changed byte changes it. :func:`checked_masks`
admits the masks ``pack_masks`` and ``save_masks`` are given: 0/1 tensors
with values to read (a DTensor's: this process's block, and its record).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping

import torch

from .._dtensor import layout_of
from .._names import check_binary
from .._types import Tensor, is_dtensor
from .._validate import is_concrete
from ._masks_blocks import Sharding, sharding_of

__all__ = ["bits_checksum", "checked_masks", "pack_bits", "unpack_checked"]

#: The bit weights of the entries of a byte: entry ``k`` is bit ``k % 8``.
_BIT_WEIGHTS = tuple(1 << b for b in range(8))

#: The modulus of the position weights of :func:`bits_checksum` (as Adler-32's).
_MOD = 65521


#: Whether an ``int64``'s bytes lie least significant first (the bit tricks below assume it).
_LITTLE = sys.byteorder == "little"

#: ``sum(2 ** (56 - 7 i))``: byte ``i`` (0 or 1, at bit ``8 i``) times its term lands on bit ``56 + i``; byte
#: ``j``'s other products land on distinct bits below 56 (``j < i``) or at 64 and past (``j > i``, dropped: the
#: ``int64`` product wraps), so none carries into the top byte.
_GATHER = sum(1 << (56 - 7 * i) for i in range(8))

#: For each byte value, its 8 bits as 0/1 bytes (bit ``i``: byte ``i``), read as one ``int64``.
_SPREAD = ((torch.arange(256)[:, None] >> torch.arange(8)) & 1).to(torch.uint8).view(torch.int64).reshape(256)


def pack_bits(mask: Tensor) -> Tensor:
    """The bits of a bool mask, 8 entries a byte (entry ``k``: bit ``k % 8`` of byte ``k // 8``).

    Each 8 entries, read as one little-endian ``int64`` of 0/1 bytes, are gathered into its top byte by one
    multiplication (:data:`_GATHER`: byte ``i`` lands on bit ``56 + i``, no two products overlap): two
    passes over the mask, where weighing and summing its bytes took ten times as long.
    """
    flat = mask.reshape(-1)
    flat = flat.view(torch.uint8) if flat.dtype == torch.bool else flat.to(torch.uint8)
    pad = -flat.numel() % 8
    if pad or flat.storage_offset() % 8:  # (an int64 view needs whole, aligned groups of 8)
        flat = torch.cat([flat, flat.new_zeros(pad)])
    if not _LITTLE:
        weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=mask.device)
        return (flat.view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)
    return ((flat.view(torch.int64) * _GATHER) >> 56).to(torch.uint8)


def _unpack(packed: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The bool mask of ``shape`` whose bits ``packed`` holds (see :func:`pack_bits`): each byte looked up in
    :data:`_SPREAD`, its 8 entries as one ``int64``."""
    numel = math.prod(shape)
    if not _LITTLE:
        weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=packed.device)
        bits = (packed.unsqueeze(1) & weights) != 0
        return bits.reshape(-1)[:numel].reshape(shape)
    spread = _SPREAD.to(packed.device)
    return spread.index_select(0, packed.to(torch.int32)).view(torch.bool)[:numel].reshape(shape)


def _padding_ok(packed: Tensor, numel: int) -> bool:
    """Whether the bits after the last entry (in the last byte) are all 0."""
    used = numel % 8
    return used == 0 or int(packed[-1]) >> used == 0


def bits_checksum(packed: Tensor) -> int:
    """``sum(byte_i * (i % 65521 + 1))``: any one changed byte changes it."""
    position = torch.arange(packed.numel(), dtype=torch.int64, device=packed.device) % _MOD + 1
    return int((packed.to(torch.int64) * position).sum())


def unpack_checked(where: str, data: Tensor, shape: tuple[int, ...]) -> Tensor:
    """:func:`_unpack`, after checking that ``data`` (named ``where``) holds exactly the bits of ``shape``."""
    numel = math.prod(shape)
    if data.dtype != torch.uint8 or data.dim() != 1 or data.numel() != -(-numel // 8):
        raise ValueError(
            f"{where} must be a 1-D torch.uint8 tensor of {-(-numel // 8)} bytes (the "
            f"{numel} bits of shape {shape}), got dtype {data.dtype} and shape "
            f"{tuple(data.shape)}"
        )
    if not _padding_ok(data, numel):
        raise ValueError(
            f"{where}: the bits after entry {numel} of its last byte must be 0, got "
            f"{int(data[-1])}"
        )
    return _unpack(data, shape)


def _checked_mask(fn: str, name: str, mask: object) -> tuple[Tensor, Sharding | None]:
    """``mask`` as a ``torch.bool`` tensor (a DTensor's: this process's block, and where it sits), after refusing
    what is not a 0/1 mask."""
    where = f"{fn}: masks[{name!r}]"
    sharding = None
    if is_dtensor(mask):
        sharding = sharding_of(layout_of(fn, f"masks[{name!r}]", mask))
        mask = mask.to_local()
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{where} must be a tensor, got {type(mask).__name__}")
    if mask.layout != torch.strided:
        raise TypeError(f"{where} must be a dense tensor, got layout {mask.layout}")
    if not is_concrete(mask):
        raise ValueError(
            f"{where} has no values to read (a meta tensor, or inside torch.compile or a "
            f"torch.func transform); call {fn} on concrete masks"
        )
    if mask.dtype != torch.bool:
        check_binary(fn, name, mask)
        mask = mask != 0
    return mask, sharding


def checked_masks(fn: str, masks: object) -> dict[str, tuple[Tensor, Sharding | None]]:
    if not isinstance(masks, Mapping):
        raise TypeError(
            f"{fn}: masks must be a mapping of names to masks, got {type(masks).__name__}"
        )
    checked: dict[str, tuple[Tensor, Sharding | None]] = {}
    for name, mask in masks.items():
        if not isinstance(name, str):
            raise TypeError(f"{fn}: mask names must be str, got {name!r} of type {type(name).__name__}")
        checked[name] = _checked_mask(fn, name, mask)
    return checked
