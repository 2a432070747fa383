"""Masks at rest: bit-packed masks, in memory and in safetensors files.

:func:`pack_masks` and :func:`unpack_masks` turn masks into one bit per
entry and back; :func:`save_masks` and :func:`load_masks` write and read
them as a safetensors file, with the shapes, counts and checksums that
let a damaged file be refused rather than read wrong.

A DTensor mask is kept block by block: each process packs its own block
(``mask.to_local()``) with a record of where it sits (:class:`_Sharding`:
the whole shape, the placements, the mesh's shape, the process's coordinate
and rank, the block's offsets). Given ``like=`` (the parameters, or the
device mesh), :func:`unpack_masks` and :func:`load_masks` wrap each block
back into its DTensor, nothing communicated; given every process's packed
dict or file (a list), they merge the blocks into whole masks on one
machine. No process ever holds a whole sharded mask.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

import torch

from .._dtensor import Layout, box, cut_dim, layout_of, strided, wrap
from .._names import check_binary
from .._torch_private import strided_shard
from .._types import Tensor, is_dtensor
from .._validate import is_concrete

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.placement_types import Placement

__all__ = ["DTENSOR_SUFFIX", "MAX_STRIDED_PIECES", "SHAPE_SUFFIX", "load_masks", "pack_masks", "save_masks", "unpack_masks"]

#: The key suffix under which :func:`pack_masks` stores each mask's shape.
SHAPE_SUFFIX = "::shape"
#: The key suffix under which :func:`pack_masks` stores where a DTensor mask's block sits.
DTENSOR_SUFFIX = "::dtensor"
#: The format tag, and the newest version of the files :func:`save_masks` writes:
#: 2 where a mask is a DTensor's block, else 1 (as before DTensor masks were saved).
FORMAT, VERSION = "funcprune.masks", 2
#: The safetensors metadata key that holds the JSON record.
_METADATA_KEY = "funcprune.masks"
#: The keys of a mask's record in the file; a DTensor's block adds ``"dtensor"`` (version 2).
_RECORD_KEYS = frozenset({"name", "shape", "numel", "kept", "checksum"})
#: The keys of a ``"dtensor"`` record.
_SHARDING_KEYS = frozenset({"shape", "offsets", "placements", "mesh", "coordinate", "rank"})
#: A placement as a record writes it.
_PLACEMENT = re.compile(
    r"Replicate\(\)|Shard\((0|[1-9]\d{0,17})\)|_StridedShard\((0|[1-9]\d{0,17}), split_factor=([1-9]\d{0,17})\)"
)  # at most 18 digits: every number fits torch's int64
#: The bit weights of the entries of a byte: entry ``k`` is bit ``k % 8``.
_BIT_WEIGHTS = tuple(1 << b for b in range(8))
#: The modulus of the position weights of :func:`_checksum` (as Adler-32's).
_MOD = 65521
#: The most a size, and the product of a shape's nonzero sizes, may be: torch's int64 (a shape torch can hold).
_MAX_NUMEL = 2**63 - 1
#: The most pieces a block's record may have its ``_StridedShard`` placements cut (their split factors, or the
#: entries of the dims they cut, whichever is fewer, summed): checking where the block sits follows each piece.
#: FSDP2's split factor is the number of tensor-parallel processes; 65,536 leaves room for any real mesh.
MAX_STRIDED_PIECES = 2**16
#: How many characters of a value an error message shows.
_SHOWN = 200


class _Corrupt(Exception):
    """A reason why a file, or a packed dict's entry, is not as :func:`save_masks` or :func:`pack_masks` writes it."""


def _bad(detail: str) -> NoReturn:
    raise _Corrupt(detail)


@dataclass(frozen=True, slots=True)
class _Sharding:
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


class _Entry(NamedTuple):
    """A mask read back: its ``torch.bool`` values (a DTensor's: one process's block), and from where."""

    name: str
    mask: Tensor
    sharding: _Sharding | None  # None: a whole mask
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
        _bad(f"expected a placement Replicate(), Shard(d) or _StridedShard(d, split_factor=f), got {_shown(name)}")
    if match[1] is None and match[2] is None:
        return Replicate()
    dim = int(match[1] or match[2])
    if dim >= ndim:
        _bad(f"the placement {name!r} cuts dim {dim} of a mask of {ndim} dims")
    return Shard(dim) if match[1] is not None else strided_shard(dim, int(match[3]))


def _placements(sharding: _Sharding) -> tuple[Placement, ...]:
    return tuple(_placement(p, len(sharding.shape)) for p in sharding.placements)


def _sharding_of(layout: Layout) -> _Sharding:
    """What a record says of the block that ``layout`` describes (this process's)."""
    ndim = len(layout.shape)
    return _Sharding(
        layout.shape, layout.offsets, tuple(_placement_name(p, ndim) for p in layout.placements),
        tuple(layout.mesh.shape), layout.coordinate, layout.mesh.get_rank(),
    )  # fmt: skip


def _shown(value: object) -> str:
    """``repr(value)``, cut to a length a message can show (and safe on values nested too deep to show)."""
    try:
        shown = repr(value)
    except RecursionError:
        return f"a {type(value).__name__} nested too deep to show"
    return shown if len(shown) <= _SHOWN else shown[:_SHOWN] + "..."


def _size(value: object) -> int:
    """``value`` if it is an int from 0 to 2**63 - 1 (not a bool)."""
    if type(value) is not int or not 0 <= value <= _MAX_NUMEL:
        _bad(f"expected an int from 0 to 2**63 - 1, got {_shown(value)}")
    return value


def _sizes(value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        _bad(f"expected a list of ints >= 0, got {_shown(value)}")
    return tuple(_size(v) for v in value)


def _shape(value: object) -> tuple[int, ...]:
    """``value`` as a shape torch can hold: sizes >= 0 whose nonzero ones multiply to at most 2**63 - 1."""
    shape = _sizes(value)
    if math.prod(max(n, 1) for n in shape) > _MAX_NUMEL:
        _bad(f"the shape {list(shape)} is larger than torch can hold (its sizes multiply past 2**63 - 1)")
    return shape


def _strided_pieces(shape: tuple[int, ...], placements: Sequence[Placement]) -> int:
    """How many pieces the ``_StridedShard`` placements cut (at most as many as the entries of their dims)."""
    pieces = 0
    for p in placements:
        factor, dim = strided(p), cut_dim(p, len(shape)) if shape else None
        if factor is not None and dim is not None:
            pieces += min(factor, shape[dim])
    return pieces


def _parsed_sharding(value: object, size: tuple[int, ...]) -> _Sharding:
    """The ``"dtensor"`` record ``value`` of a block of shape ``size``, checked: the block must be where it says."""
    if not isinstance(value, dict) or set(value) != _SHARDING_KEYS:
        _bad(f"expected a record with the keys {sorted(_SHARDING_KEYS)}, got {_shown(value)}")
    shape = _shape(value["shape"])
    offsets, mesh, coordinate = (_sizes(value[k]) for k in ("offsets", "mesh", "coordinate"))
    placements = value["placements"]
    if not isinstance(placements, list) or not (
        len(shape) == len(offsets) == len(size) and len(mesh) == len(coordinate) == len(placements)
    ):
        _bad(f"its shape, offsets, mesh, coordinate and placements do not fit one another: {_shown(value)}")
    if any(c >= n for c, n in zip(coordinate, mesh, strict=True)):
        _bad(f"the coordinate {list(coordinate)} is not in a mesh of shape {list(mesh)}")
    sharding = _Sharding(shape, offsets, tuple(placements), mesh, coordinate, _size(value["rank"]))
    cuts = _placements(sharding)
    if _strided_pieces(shape, cuts) > MAX_STRIDED_PIECES:
        _bad(
            f"its placements {_shown(placements)} cut a mask of shape {list(shape)} into more than {MAX_STRIDED_PIECES} "
            "strided pieces (split factors that large are no process mesh's)"
        )
    if box(shape, mesh, coordinate, cuts) != (offsets, size):
        _bad(
            f"a block of shape {size} at offsets {offsets} is not the one its placements {_shown(placements)} of shape "
            f"{shape} on a mesh of shape {mesh} give the coordinate {coordinate}"
        )
    return sharding


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def _pack(mask: Tensor) -> Tensor:
    """The bits of a bool mask, 8 entries a byte (entry ``k``: bit ``k % 8`` of byte ``k // 8``)."""
    flat = mask.reshape(-1).to(torch.uint8)
    pad = -flat.numel() % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=mask.device)
    return (flat.view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)


def _unpack(packed: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The bool mask of ``shape`` whose bits ``packed`` holds (see :func:`_pack`)."""
    weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=packed.device)
    bits = (packed.unsqueeze(1) & weights) != 0
    return bits.reshape(-1)[: math.prod(shape)].reshape(shape)


def _padding_ok(packed: Tensor, numel: int) -> bool:
    """Whether the bits after the last entry (in the last byte) are all 0."""
    used = numel % 8
    return used == 0 or int(packed[-1]) >> used == 0


def _checksum(packed: Tensor) -> int:
    """``sum(byte_i * (i % 65521 + 1))``: any one changed byte changes it."""
    position = torch.arange(packed.numel(), dtype=torch.int64, device=packed.device) % _MOD + 1
    return int((packed.to(torch.int64) * position).sum())


def _checked_mask(fn: str, name: str, mask: object) -> tuple[Tensor, _Sharding | None]:
    """``mask`` as a ``torch.bool`` tensor (a DTensor's: this process's block, and where it sits), after refusing
    what is not a 0/1 mask."""
    where = f"{fn}: masks[{name!r}]"
    sharding = None
    if is_dtensor(mask):
        sharding = _sharding_of(layout_of(fn, f"masks[{name!r}]", mask))
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


def _checked_masks(fn: str, masks: object) -> dict[str, tuple[Tensor, _Sharding | None]]:
    if not isinstance(masks, Mapping):
        raise TypeError(
            f"{fn}: masks must be a mapping of names to masks, got {type(masks).__name__}"
        )
    checked: dict[str, tuple[Tensor, _Sharding | None]] = {}
    for name, mask in masks.items():
        if not isinstance(name, str):
            raise TypeError(f"{fn}: mask names must be str, got {name!r} of type {type(name).__name__}")
        checked[name] = _checked_mask(fn, name, mask)
    return checked


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
    checked = _checked_masks(fn, masks)
    packed: dict[str, Tensor] = {}
    for name, (mask, sharding) in checked.items():
        if name.endswith((SHAPE_SUFFIX, DTENSOR_SUFFIX)):
            raise ValueError(
                f"{fn}: masks[{name!r}]: mask names must not end with {SHAPE_SUFFIX!r} or {DTENSOR_SUFFIX!r}, "
                "the suffixes of the packed dict's shape and DTensor entries; rename it"
            )
        packed[name] = _pack(mask)
        packed[name + SHAPE_SUFFIX] = torch.tensor(mask.shape, dtype=torch.int64)
        if sharding is not None:
            packed[name + DTENSOR_SUFFIX] = torch.tensor(list(_json(sharding.record()).encode()), dtype=torch.uint8)
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
    checked_like = _checked_like(fn, like)
    if isinstance(packed, Mapping):
        return _arranged(fn, [_unpacked(fn, "packed", packed)], checked_like, merge=False)
    if isinstance(packed, (list, tuple)) and packed and all(isinstance(p, Mapping) for p in packed):
        sources = [_unpacked(fn, f"packed[{i}]", p) for i, p in enumerate(packed)]
        return _arranged(fn, sources, checked_like, merge=True)
    raise TypeError(
        f"{fn}: packed must be a mapping of names to tensors (or a non-empty list of them, to merge), got "
        f"{type(packed).__name__}"
    )


def _unpacked(fn: str, label: str, packed: Mapping[str, Tensor]) -> list[_Entry]:
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
    entries: list[_Entry] = []
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
        if math.prod(max(s, 1) for s in shape) > _MAX_NUMEL:
            raise ValueError(
                f"{fn}: {label}[{name + SHAPE_SUFFIX!r}] is a shape larger than torch can hold (its sizes multiply "
                f"past 2**63 - 1): {shape}"
            )
        mask = _unpack_checked(f"{fn}: {label}[{name!r}]", packed[name], shape)
        sharding = None
        if name + DTENSOR_SUFFIX in packed:
            key = name + DTENSOR_SUFFIX
            record = packed[key]
            try:
                if record.dtype != torch.uint8 or record.dim() != 1:
                    _bad(f"expected a 1-D torch.uint8 tensor, got dtype {record.dtype} and shape {tuple(record.shape)}")
                try:
                    value = json.loads(bytes(record.tolist()).decode())
                except (ValueError, RecursionError) as err:  # UnicodeDecodeError included; nested too deep
                    _bad(f"its bytes are not a JSON record ({err})")
                sharding = _parsed_sharding(value, shape)
            except _Corrupt as err:
                raise ValueError(
                    f"{fn}: {label}[{key!r}] is not where a block sits as pack_masks records it: {err}"
                ) from None
        entries.append(_Entry(name, mask, sharding, label))
    return entries


def _unpack_checked(where: str, data: Tensor, shape: tuple[int, ...]) -> Tensor:
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


def _safetensors(fn: str) -> tuple[ModuleType, ModuleType]:
    """``safetensors`` and ``safetensors.torch``, imported now, or a clear ImportError."""
    try:
        import safetensors
        import safetensors.torch
    except ImportError as err:
        raise ImportError(
            f'{fn} needs the safetensors package: pip install "funcprune[hf]" '
            "(or pip install safetensors)"
        ) from err
    return safetensors, safetensors.torch


def _path(fn: str, path: object) -> str:
    if not isinstance(path, (str, os.PathLike)):
        also = " (or a list of them, to merge)" if fn == "load_masks" else ""
        raise TypeError(f"{fn}: path must be a str or os.PathLike{also}, got {type(path).__name__}")
    fspath = os.fspath(path)
    if not isinstance(fspath, str):
        raise TypeError(f"{fn}: path must name a file as str, got {type(fspath).__name__}")
    return fspath


def save_masks(masks: Mapping[str, Tensor], path: str | os.PathLike[str]) -> None:
    """Write masks, bit-packed, to a safetensors file at ``path``.

    The file holds, for each mask, a ``torch.uint8`` tensor under the mask's
    name: its bits as :func:`pack_masks` packs them (row-major, entry ``k``
    is bit ``k % 8`` of byte ``k // 8``). The safetensors metadata key
    ``"funcprune.masks"`` holds a JSON record: ``{"format":
    "funcprune.masks", "version": 1, "masks": [...]}``, one item per mask in
    the order of ``masks``: its ``name``, ``shape``, ``numel`` (entries),
    ``kept`` (``True`` entries) and ``checksum`` (``sum(byte_i * (i % 65521
    + 1))`` over its bytes), which :func:`load_masks` checks.

    DTensor masks (FSDP2's, tensor parallelism's) are saved where they lie:
    call ``save_masks`` on every process, each with a path of its own
    (``f"masks.{dist.get_rank()}.safetensors"``, say); each file holds that
    process's blocks (``mask.to_local()``: ``shape``, ``numel``, ``kept``
    and ``checksum`` are the block's) and, per DTensor mask, a
    ``"dtensor"`` item: the whole mask's ``shape``, the block's
    ``offsets``, the ``placements`` (``"Shard(0)"``, ``"Replicate()"``,
    ``"_StridedShard(0, split_factor=2)"``), the ``mesh``'s shape and this
    process's ``coordinate`` in it and ``rank``. Nothing is communicated
    and no process holds more than its blocks. Such a file is version 2
    (one with no DTensor mask stays version 1). :func:`load_masks` wraps
    the blocks back into DTensors (``like=``), or merges every process's
    file into whole masks.

    A file takes ``ceil(numel / 8)`` bytes per mask (per block) plus its
    header: 8 bytes, about 150 for the record and safetensors' own keys,
    and about ``170 + 2 * len(name) + 12 * mask.dim()`` bytes per mask
    (the tests check ``8 + 256 + sum(256 + 2 * len(name) + 24 *
    mask.dim())``, for ASCII names), and per DTensor mask about ``100 + 12
    * mask.dim() + 30 * mesh.ndim`` more (the tests check ``192 + 24 *
    mask.dim() + 64 * mesh.ndim``).

    Args:
        masks: as for :func:`pack_masks`, on any device; any name but
            ``"__metadata__"`` (safetensors' own key).
        path: the file to write (replaced if it exists).

    Raises:
        TypeError, ValueError, NotImplementedError: as :func:`pack_masks`
            for the masks; a TypeError if ``path`` is not a str or
            ``os.PathLike``.
        ImportError: if safetensors is not installed (``pip install
            "funcprune[hf]"``).
        OSError: if the file cannot be written.

    >>> import os, tempfile, torch, funcprune as fp
    >>> masks = {"w": torch.rand(100, 100) > 0.5}
    >>> path = os.path.join(tempfile.mkdtemp(), "masks.safetensors")
    >>> fp.save_masks(masks, path)
    >>> os.path.getsize(path) <= 10_000 // 8 + 500
    True
    >>> torch.equal(fp.load_masks(path)["w"], masks["w"])
    True
    """
    fn = "save_masks"
    checked = _checked_masks(fn, masks)
    where = _path(fn, path)
    if "__metadata__" in checked:
        raise ValueError(
            f"{fn}: masks['__metadata__']: safetensors keeps that name for its metadata; rename it"
        )
    _, st_torch = _safetensors(fn)
    tensors: dict[str, Tensor] = {}
    records: list[dict[str, Any]] = []
    for name, (mask, sharding) in checked.items():
        data = _pack(mask).cpu()
        tensors[name] = data
        records.append({
            "name": name, "shape": list(mask.shape), "numel": mask.numel(),
            "kept": int(mask.sum()), "checksum": _checksum(data),
        })  # fmt: skip
        if sharding is not None:
            records[-1]["dtensor"] = sharding.record()
    version = VERSION if any(sharding is not None for _, sharding in checked.values()) else 1
    record = _json({"format": FORMAT, "version": version, "masks": records})
    st_torch.save_file(tensors, where, metadata={_METADATA_KEY: record})


def _records(metadata: object) -> list[tuple[str, tuple[int, ...], int, int, _Sharding | None]]:
    """The ``(name, shape, kept, checksum, sharding)`` of each mask that the file's metadata records."""
    if not isinstance(metadata, dict) or _METADATA_KEY not in metadata:
        _bad(f"no {_METADATA_KEY!r} metadata entry (not written by save_masks)")
    try:
        record = json.loads(metadata[_METADATA_KEY])
    except (TypeError, ValueError, RecursionError) as err:  # RecursionError: nested too deep
        _bad(f"the {_METADATA_KEY!r} metadata is not JSON ({err})")
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        _bad(f"the metadata's format is not {FORMAT!r}")
    version = record.get("version")
    if type(version) is not int or not 1 <= version <= VERSION:
        _bad(f"format version {_shown(version)}; this funcprune reads versions 1 to {VERSION}")
    items = record.get("masks")
    if not isinstance(items, list):
        _bad("the metadata has no list of masks")
    out: list[tuple[str, tuple[int, ...], int, int, _Sharding | None]] = []
    for item in items:
        keys = frozenset(item) if isinstance(item, dict) else None
        if keys != _RECORD_KEYS and not (version >= 2 and keys == _RECORD_KEYS | {"dtensor"}):
            _bad(f"a metadata item is not a mask record: {_shown(item)}")
        name, shape = item["name"], item["shape"]
        if not isinstance(name, str) or not isinstance(shape, list):
            _bad(f"a metadata item has a bad name or shape: {_shown(item)}")
        sizes = _shape(shape)
        if math.prod(sizes) != _size(item["numel"]) or _size(item["kept"]) > item["numel"]:
            _bad(f"the mask {name!r}: its shape, numel and kept disagree: {_shown(item)}")
        sharding = None
        if "dtensor" in item:
            try:
                sharding = _parsed_sharding(item["dtensor"], sizes)
            except _Corrupt as err:
                _bad(f"the mask {name!r}: its block's record: {err}")
        out.append((name, sizes, item["kept"], _size(item["checksum"]), sharding))
    if len({name for name, *_ in out}) != len(out):
        _bad("the metadata names a mask twice")
    return out


def load_masks(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    like: Mapping[str, Tensor] | DeviceMesh | None = None,
) -> dict[str, Tensor]:
    """The masks that :func:`save_masks` wrote to ``path``.

    Everything is checked before a mask is returned: the format tag and
    version, that the file holds exactly the masks its record names, each
    packed tensor's dtype and length against its shape, the padding bits,
    each mask's count of kept entries and checksum, and where a DTensor's
    block says it sits. A truncated or damaged file is refused, never read
    as wrong masks.

    DTensor masks, saved by each process to its own file (see
    :func:`save_masks`), come back three ways:

    - ``load_masks(my_path, like=params)`` (or ``like=mesh``), on each
      process with the file it saved: each DTensor mask's block wrapped
      back into its DTensor (``DTensor.from_local``, nothing
      communicated), on the mesh of ``like[name]`` (or on ``mesh``), with
      the placements saved, equal bit for bit to the mask saved. The
      layout must match: the whole shape, the placements, the mesh's shape
      and this process's coordinate in it, else a ``ValueError`` names the
      file, the mask, what was saved and what ``like`` holds. With a
      mapping, ``like[name]`` may be a DTensor where the file holds a
      whole mask: each process then takes its block of it (a merged file
      resumes a run on another number of processes); a plain tensor must
      have the mask's shape. Masks that were saved whole stay whole with
      ``like=mesh``.
    - ``load_masks(my_path)``: every mask as saved, a DTensor's block as a
      plain tensor (its shape is the block's).
    - ``load_masks([path_0, path_1, ...])``, on any one machine: the whole
      masks, each DTensor's blocks assembled from every process's file
      (copies of a block, along a ``Replicate`` mesh dim or from a file
      given twice, must agree and any one of them will do; a block no file
      holds is refused), for
      :func:`funcprune.shrink` on the full model, say;
      ``fp.save_masks(fp.load_masks(paths), "masks.safetensors")`` writes
      them as one file. Masks saved whole must agree between the files.

    Args:
        path: a file written by :func:`save_masks`, or a non-empty list of
            them (every process's) to merge into whole masks.
        like: ``None``; or the tensors (parameters, or masks), by name, that
            the masks should be laid out as, a name for every mask in the
            file; or the ``DeviceMesh`` to wrap the DTensor masks' blocks on.

    Returns:
        A new dict of ``torch.bool`` CPU masks of the saved shapes, in the
        order they were saved (merged: in the order first found); equal, bit
        for bit, to the masks saved. DTensor masks rebuilt with ``like``
        are on their mesh's device.

    Raises:
        TypeError: if ``path`` is not a str or ``os.PathLike`` (or a list
            of them), or ``like`` not a mapping of tensors or a ``DeviceMesh``.
        ImportError: if safetensors is not installed (``pip install
            "funcprune[hf]"``).
        OSError: if the file cannot be read (``FileNotFoundError`` if it
            does not exist), with the path.
        ValueError: if the file is not a masks file as save_masks writes
            them: truncated, corrupted, another format or version, or its
            tensors and record disagree; the message names the file and
            what is wrong. Numbers no file holds are refused so, at once,
            before anything proportional to them is visited or allocated:
            a size past ``2**63 - 1`` (or sizes whose product is), a
            negative one, a bool for an int, a block whose placements cut
            more than ``MAX_STRIDED_PIECES`` (65,536) strided pieces, JSON
            nested too deep to read. Also if the masks do not fit ``like`` (a name
            missing, another shape or layout), or the files do not merge
            (a mask laid out otherwise in one, copies of a block that
            differ, or a block in none).

    >>> import os, tempfile, torch, funcprune as fp
    >>> path = os.path.join(tempfile.mkdtemp(), "masks.safetensors")
    >>> fp.save_masks({"b": torch.tensor([1.0, 0.0]), "a": torch.ones(2, 2)}, path)
    >>> fp.load_masks(path)
    {'b': tensor([ True, False]), 'a': tensor([[True, True],
            [True, True]])}
    """
    fn = "load_masks"
    merge = isinstance(path, (list, tuple))
    if merge and not path:
        raise ValueError(f"{fn}: path is an empty list: no file to merge")
    paths = [_path(fn, p) for p in path] if isinstance(path, (list, tuple)) else [_path(fn, path)]
    checked_like = _checked_like(fn, like)
    safetensors, _ = _safetensors(fn)
    return _arranged(fn, [_read(fn, safetensors, where) for where in paths], checked_like, merge=merge)


def _read(fn: str, safetensors: ModuleType, where: str) -> list[_Entry]:
    """The masks of the file ``where``, as they were saved; a damaged file refused with a message naming it."""
    try:
        return _load(safetensors, where)
    except _Corrupt as err:
        raise ValueError(
            f"{fn}: {where!r} is not a masks file as save_masks writes them (truncated, "
            f"corrupted or another format): {err}"
        ) from None
    except safetensors.SafetensorError as err:
        raise ValueError(
            f"{fn}: {where!r} is not a valid safetensors file (truncated or corrupted): {err}"
        ) from None
    except OSError as err:
        if err.filename is None:
            err.filename = where
        raise


def _load(safetensors: ModuleType, path: str) -> list[_Entry]:
    with safetensors.safe_open(path, framework="pt", device="cpu") as file:
        records = _records(file.metadata())
        keys = set(file.keys())
        names = {name for name, *_ in records}
        if keys != names:
            _bad(
                f"its tensors {sorted(keys - names)} are not in its record, or its record's "
                f"masks {sorted(names - keys)} are not in the file"
            )
        entries: list[_Entry] = []
        for name, shape, kept, checksum, sharding in records:
            data = file.get_tensor(name)
            try:
                mask = _unpack_checked(f"the mask {name!r}", data, shape)
            except ValueError as err:
                _bad(str(err))
            if _checksum(data) != checksum or int(mask.sum()) != kept:
                _bad(f"the mask {name!r}: its bytes do not match their checksum and count")
            entries.append(_Entry(name, mask, sharding, repr(path)))
    return entries


# Laying the masks out: as saved, on a mesh, like given tensors, or merged


def _checked_like(fn: str, like: object) -> Mapping[str, Tensor] | DeviceMesh | None:
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


def _arranged(
    fn: str, sources: list[list[_Entry]], like: Mapping[str, Tensor] | DeviceMesh | None, *, merge: bool
) -> dict[str, Tensor]:
    """The masks of ``sources`` (one, or merged), laid out as ``like`` says."""
    entries = _merged(fn, sources) if merge else sources[0]
    if like is None:
        return {e.name: e.mask for e in entries}
    if isinstance(like, Mapping):
        return {e.name: _like(fn, e, like) for e in entries}
    return {e.name: e.mask if e.sharding is None else _on_mesh(fn, e, like) for e in entries}


_HINT = (
    "load (or unpack) each process's own masks on the mesh and layout they were saved with, or merge every "
    "process's files (a list of them) into whole masks"
)


def _on_mesh(fn: str, entry: _Entry, mesh: DeviceMesh) -> Tensor:
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
    placements = _placements(saved)
    ndim = len(saved.shape)
    span = tuple(i for i, p in enumerate(placements) if ndim and cut_dim(p, ndim) is not None)
    size = tuple(entry.mask.shape)
    return wrap(entry.mask, Layout(mesh, placements, saved.shape, saved.offsets, size, saved.coordinate, span))


def _like(fn: str, entry: _Entry, like: Mapping[str, Tensor]) -> Tensor:
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
    mine = _sharding_of(layout)
    if (saved.laid_out, saved.coordinate) != (mine.laid_out, mine.coordinate):
        raise ValueError(f"{where} is {saved.described()}, but {what} is {mine.described('tensor')}; {_HINT}")
    return wrap(entry.mask, layout)


def _merged(fn: str, sources: list[list[_Entry]]) -> list[_Entry]:
    """The whole masks that ``sources`` (every process's masks) hold, in the order first found."""
    by_name: dict[str, list[_Entry]] = {}
    for entries in sources:
        for entry in entries:
            by_name.setdefault(entry.name, []).append(entry)
    return [_whole(fn, name, held) for name, held in by_name.items()]


def _described(entry: _Entry) -> str:
    saved = entry.sharding
    if saved is None:
        return f"a whole mask of shape {tuple(entry.mask.shape)}"
    return (
        f"a block of a mask of shape {saved.shape} laid out as [{', '.join(saved.placements)}] on a mesh of "
        f"shape {saved.mesh}"
    )


def _whole(fn: str, name: str, held: list[_Entry]) -> _Entry:
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
    return _Entry(name, _assembled(fn, name, held), None, first.source)


def _assembled(fn: str, name: str, held: list[_Entry]) -> Tensor:
    """The whole mask that the blocks ``held`` (of one layout) make up, each block from one of its copies.

    Each block was checked to be the one its coordinate gets, and the blocks
    of a layout do not overlap (each mesh dim's cut is a partition): the
    blocks held make up the whole mask when their entries add up to its
    count. That is checked first, so nothing is allocated, nor any of the
    mesh's coordinates visited, that the files do not hold.
    """
    saved = held[0].sharding
    assert saved is not None
    copies: dict[tuple[tuple[int, ...], tuple[int, ...]], list[_Entry]] = {}  # by block: its copies
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
    fn: str, name: str, saved: _Sharding, coordinates: set[tuple[int, ...]],
    held: Collection[tuple[tuple[int, ...], tuple[int, ...]]],
) -> NoReturn:  # fmt: skip
    """Refuse the merge of the blocks ``held`` (at ``coordinates``) of a mask that they do not make up.

    Names the first block that no file holds, in the mesh's order, among
    the first coordinates (a bounded number: the mesh's shape is only what a
    file says) of the mesh dims that cut; the copies along the others share it.
    """
    placements = _placements(saved)
    ndim = len(saved.shape)
    span = [i for i, p in enumerate(placements) if ndim and cut_dim(p, ndim) is not None]
    budget = max(16, _VISITED // (1 + _strided_pieces(saved.shape, placements)))
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
