"""Masks at rest: bit-packed masks, in memory and in safetensors files.

:func:`pack_masks` and :func:`unpack_masks` turn masks into one bit per
entry and back; :func:`save_masks` and :func:`load_masks` write and read
them as a safetensors file, with the shapes, counts and checksums that
let a damaged file be refused rather than read wrong.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from types import ModuleType
from typing import Any, NoReturn

import torch

from .._types import Masks, Tensor, is_dtensor
from .._names import check_binary
from .._validate import is_concrete

__all__ = ["SHAPE_SUFFIX", "load_masks", "pack_masks", "save_masks", "unpack_masks"]

#: The key suffix under which :func:`pack_masks` stores each mask's shape.
SHAPE_SUFFIX = "::shape"
#: The format tag and version of the files :func:`save_masks` writes.
FORMAT, VERSION = "funcprune.masks", 1
#: The safetensors metadata key that holds the JSON record.
_METADATA_KEY = "funcprune.masks"
#: The bit weights of the entries of a byte: entry ``k`` is bit ``k % 8``.
_BIT_WEIGHTS = tuple(1 << b for b in range(8))
#: The modulus of the position weights of :func:`_checksum` (as Adler-32's).
_MOD = 65521


def _refuse_mask(fn: str, name: str, mask: object) -> Tensor:
    """``mask`` as a ``torch.bool`` tensor, after refusing what is not a 0/1 mask."""
    where = f"{fn}: masks[{name!r}]"
    if is_dtensor(mask):
        raise ValueError(
            f"{where} is a DTensor; {fn} packs whole masks: gather it first with "
            "mask.full_tensor() (on every process), then pack the full mask"
        )
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{where} must be a tensor, got {type(mask).__name__}")
    if mask.layout != torch.strided:
        raise TypeError(f"{where} must be a dense tensor, got layout {mask.layout}")
    if not is_concrete(mask):
        raise ValueError(
            f"{where} has no values to read (a meta tensor, or inside torch.compile or a "
            f"torch.func transform); call {fn} on concrete masks"
        )
    if mask.dtype == torch.bool:
        return mask
    check_binary(fn, name, mask)
    return mask != 0


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


def _checked_masks(fn: str, masks: object) -> dict[str, Tensor]:
    if not isinstance(masks, Mapping):
        raise TypeError(
            f"{fn}: masks must be a mapping of names to masks, got {type(masks).__name__}"
        )
    checked: dict[str, Tensor] = {}
    for name, mask in masks.items():
        if not isinstance(name, str):
            raise TypeError(f"{fn}: mask names must be str, got {name!r} of type {type(name).__name__}")
        checked[name] = _refuse_mask(fn, name, mask)
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

    DTensor masks are refused: gather each with ``mask.full_tensor()``
    first (packing each process's block is not supported).

    Args:
        masks: masks keyed by name: ``torch.bool`` (``True`` = kept), or
            integer or floating-point 0/1 masks (as torch's float
            ``weight_mask`` buffers), converted exactly.

    Returns:
        A new dict, in the order of ``masks``: per mask, its packed bytes
        and its shape. :func:`unpack_masks` returns the masks.

    Raises:
        TypeError: if ``masks`` is not a mapping of str names to dense tensors.
        ValueError: if a mask holds values other than 0 and 1 (the message
            names it and shows the values), has no values (meta, or inside
            a transform), is a DTensor, or its name ends with ``"::shape"``.

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
    for name, mask in checked.items():
        if name.endswith(SHAPE_SUFFIX):
            raise ValueError(
                f"{fn}: masks[{name!r}]: mask names must not end with {SHAPE_SUFFIX!r}, the "
                "suffix of the shape entries of the packed dict; rename it"
            )
        packed[name] = _pack(mask)
        packed[name + SHAPE_SUFFIX] = torch.tensor(mask.shape, dtype=torch.int64)
    return packed


def unpack_masks(packed: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The ``torch.bool`` masks that :func:`pack_masks` packed into ``packed``.

    Args:
        packed: a dict as :func:`pack_masks` returns it (any device).

    Returns:
        A new dict of ``torch.bool`` masks of the packed shapes, each on its
        packed bytes' device, in the order of ``packed``; equal, bit for
        bit, to the masks packed.

    Raises:
        TypeError: if ``packed`` is not a mapping of tensors.
        ValueError: if an entry lacks its shape entry (or a shape its
            bytes), a shape is not a 1-D integer tensor of sizes >= 0, the
            bytes are not a 1-D ``torch.uint8`` tensor of ``ceil(numel / 8)``
            entries, or the bits after the last entry are not 0.

    >>> import torch, funcprune as fp
    >>> packed = {"w": torch.tensor([5], dtype=torch.uint8), "w::shape": torch.tensor([3])}
    >>> fp.unpack_masks(packed)
    {'w': tensor([ True, False,  True])}
    """
    fn = "unpack_masks"
    if not isinstance(packed, Mapping):
        raise TypeError(
            f"{fn}: packed must be a mapping of names to tensors, got {type(packed).__name__}"
        )
    for key, value in packed.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{fn}: packed[{key!r}] must be a tensor, got {type(value).__name__}")
    names = [k for k in packed if isinstance(k, str) and not k.endswith(SHAPE_SUFFIX)]
    for key in packed:
        if not isinstance(key, str):
            raise TypeError(f"{fn}: keys must be str, got {key!r} of type {type(key).__name__}")
        if key.endswith(SHAPE_SUFFIX) and key[: -len(SHAPE_SUFFIX)] not in packed:
            raise ValueError(
                f"{fn}: packed[{key!r}] is a shape with no packed bytes (no key "
                f"{key[: -len(SHAPE_SUFFIX)]!r}); pass the whole dict pack_masks returned"
            )
    masks: Masks = {}
    for name in names:
        if name + SHAPE_SUFFIX not in packed:
            raise ValueError(
                f"{fn}: packed[{name!r}] has no shape entry {name + SHAPE_SUFFIX!r}; pass the "
                "whole dict pack_masks returned"
            )
        shape_t = packed[name + SHAPE_SUFFIX]
        if shape_t.dim() != 1 or shape_t.dtype.is_floating_point or shape_t.dtype.is_complex or (
            shape_t.dtype == torch.bool
        ):
            raise ValueError(
                f"{fn}: packed[{name + SHAPE_SUFFIX!r}] must be a 1-D integer tensor (a "
                f"shape), got dtype {shape_t.dtype} and shape {tuple(shape_t.shape)}"
            )
        shape = tuple(int(s) for s in shape_t.tolist())
        if any(s < 0 for s in shape):
            raise ValueError(f"{fn}: packed[{name + SHAPE_SUFFIX!r}] holds a negative size: {shape}")
        masks[name] = _unpack_checked(f"{fn}: packed[{name!r}]", packed[name], shape)
    return masks


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
        raise TypeError(f"{fn}: path must be a str or os.PathLike, got {type(path).__name__}")
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

    A file takes ``ceil(numel / 8)`` bytes per mask plus its header: 8
    bytes, about 150 for the record and safetensors' own keys, and about
    ``170 + 2 * len(name) + 12 * mask.dim()`` bytes per mask (the tests
    check ``8 + 256 + sum(256 + 2 * len(name) + 24 * mask.dim())``, for
    ASCII names).

    Args:
        masks: as for :func:`pack_masks`, on any device; any name but
            ``"__metadata__"`` (safetensors' own key).
        path: the file to write (replaced if it exists).

    Raises:
        TypeError, ValueError: as :func:`pack_masks` for the masks; a
            TypeError if ``path`` is not a str or ``os.PathLike``.
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
    for name, mask in checked.items():
        data = _pack(mask).cpu()
        tensors[name] = data
        records.append({
            "name": name, "shape": list(mask.shape), "numel": mask.numel(),
            "kept": int(mask.sum()), "checksum": _checksum(data),
        })  # fmt: skip
    record = json.dumps({"format": FORMAT, "version": VERSION, "masks": records}, separators=(",", ":"))
    st_torch.save_file(tensors, where, metadata={_METADATA_KEY: record})


class _Corrupt(Exception):
    """A reason why a file is not a masks file as :func:`save_masks` writes it."""


def _bad(detail: str) -> NoReturn:
    raise _Corrupt(detail)


def _size(value: object) -> int:
    """``value`` if it is an int >= 0 (not a bool)."""
    if type(value) is not int or value < 0:
        _bad(f"expected an int >= 0, got {value!r}")
    return value


def _records(metadata: object) -> list[tuple[str, tuple[int, ...], int, int]]:
    """The ``(name, shape, kept, checksum)`` of each mask that the file's metadata records."""
    if not isinstance(metadata, dict) or _METADATA_KEY not in metadata:
        _bad(f"no {_METADATA_KEY!r} metadata entry (not written by save_masks)")
    try:
        record = json.loads(metadata[_METADATA_KEY])
    except (TypeError, ValueError) as err:
        _bad(f"the {_METADATA_KEY!r} metadata is not JSON ({err})")
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        _bad(f"the metadata's format is not {FORMAT!r}")
    if record.get("version") != VERSION or type(record.get("version")) is not int:
        _bad(f"format version {record.get('version')!r}; this funcprune reads version {VERSION}")
    items = record.get("masks")
    if not isinstance(items, list):
        _bad("the metadata has no list of masks")
    out: list[tuple[str, tuple[int, ...], int, int]] = []
    for item in items:
        if not isinstance(item, dict) or set(item) != {"name", "shape", "numel", "kept", "checksum"}:
            _bad(f"a metadata item is not a mask record: {item!r}")
        name, shape = item["name"], item["shape"]
        if not isinstance(name, str) or not isinstance(shape, list):
            _bad(f"a metadata item has a bad name or shape: {item!r}")
        sizes = tuple(_size(s) for s in shape)
        if math.prod(sizes) != _size(item["numel"]) or _size(item["kept"]) > item["numel"]:
            _bad(f"the mask {name!r}: its shape, numel and kept disagree: {item!r}")
        out.append((name, sizes, item["kept"], _size(item["checksum"])))
    if len({name for name, *_ in out}) != len(out):
        _bad("the metadata names a mask twice")
    return out


def load_masks(path: str | os.PathLike[str]) -> dict[str, Tensor]:
    """The masks that :func:`save_masks` wrote to ``path``.

    Everything is checked before a mask is returned: the format tag and
    version, that the file holds exactly the masks its record names, each
    packed tensor's dtype and length against its shape, the padding bits,
    and each mask's count of kept entries and checksum. A truncated or
    damaged file is refused, never read as wrong masks.

    Args:
        path: a file written by :func:`save_masks`.

    Returns:
        A new dict of ``torch.bool`` CPU masks of the saved shapes, in the
        order they were saved; equal, bit for bit, to the masks saved.

    Raises:
        TypeError: if ``path`` is not a str or ``os.PathLike``.
        ImportError: if safetensors is not installed (``pip install
            "funcprune[hf]"``).
        OSError: if the file cannot be read (``FileNotFoundError`` if it
            does not exist), with the path.
        ValueError: if the file is not a masks file as save_masks writes
            them: truncated, corrupted, another format or version, or its
            tensors and record disagree; the message names the file and
            what is wrong.

    >>> import os, tempfile, torch, funcprune as fp
    >>> path = os.path.join(tempfile.mkdtemp(), "masks.safetensors")
    >>> fp.save_masks({"b": torch.tensor([1.0, 0.0]), "a": torch.ones(2, 2)}, path)
    >>> fp.load_masks(path)
    {'b': tensor([ True, False]), 'a': tensor([[True, True],
            [True, True]])}
    """
    fn = "load_masks"
    where = _path(fn, path)
    safetensors, _ = _safetensors(fn)
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


def _load(safetensors: ModuleType, path: str) -> dict[str, Tensor]:
    with safetensors.safe_open(path, framework="pt", device="cpu") as file:
        records = _records(file.metadata())
        keys = set(file.keys())
        names = {name for name, *_ in records}
        if keys != names:
            _bad(
                f"its tensors {sorted(keys - names)} are not in its record, or its record's "
                f"masks {sorted(names - keys)} are not in the file"
            )
        masks: Masks = {}
        for name, shape, kept, checksum in records:
            data = file.get_tensor(name)
            try:
                mask = _unpack_checked(f"the mask {name!r}", data, shape)
            except ValueError as err:
                _bad(str(err))
            if _checksum(data) != checksum or int(mask.sum()) != kept:
                _bad(f"the mask {name!r}: its bytes do not match their checksum and count")
            masks[name] = mask
    return masks
