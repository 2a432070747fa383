"""Masks at rest in safetensors files: :func:`save_masks` and :func:`load_masks`.

A file holds each mask's packed bytes (``_masks_bits.py``) and a JSON
record of its shape, counts and checksum (and, for a DTensor's block, where
it sits: ``_masks_blocks.py``), which let a damaged file be refused rather
than read wrong. The record is read as untrusted (``_masks_untrusted.py``);
the masks read back are laid out as ``like=`` says (``_masks_layout.py``)
or, from a list of files, merged (``_masks_merge.py``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, final

from .._types import Tensor
from ._masks_bits import bits_checksum, checked_masks, pack_bits, unpack_checked
from ._masks_blocks import Entry, Sharding, parsed_sharding
from ._masks_layout import arranged, checked_like
from ._masks_untrusted import Corrupt, bad, checked_shape, checked_size, compact_json, shown

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["FORMAT", "VERSION", "PackedMasks", "load_masks", "save_masks"]

#: The format tag, and the newest version of the files :func:`save_masks` writes:
#: 2 where a mask is a DTensor's block, else 1 (as before DTensor masks were saved).
FORMAT, VERSION = "funcprune.masks", 2

#: The safetensors metadata key that holds the JSON record.
_METADATA_KEY = "funcprune.masks"

#: The keys of a mask's record in the file; a DTensor's block adds ``"dtensor"`` (version 2).
_RECORD_KEYS = frozenset({"name", "shape", "numel", "kept", "checksum"})


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
    checked = checked_masks(fn, masks)
    where = _path(fn, path)
    if "__metadata__" in checked:
        raise ValueError(
            f"{fn}: masks['__metadata__']: safetensors keeps that name for its metadata; rename it"
        )
    _safetensors(fn)  # a clear ImportError before any mask is packed
    packed = PackedMasks()
    for name, (mask, sharding) in checked.items():
        packed.add(name, mask, sharding)
    packed.save(fn, where)


@final
class PackedMasks:
    """Masks packed as :func:`save_masks` writes them, added a few at a time and saved in one file.

    What a run that never holds every mask at once (the streamed one-shot of
    a checkpoint) keeps: one bit per entry, and each mask's record.
    """

    def __init__(self) -> None:
        self.tensors: dict[str, Tensor] = {}
        self.records: list[dict[str, Any]] = []

    def add(self, name: str, mask: Tensor, sharding: Sharding | None = None) -> None:
        """Pack ``mask`` (a ``torch.bool`` tensor, checked by the caller) under ``name``."""
        data = pack_bits(mask).cpu()
        self.tensors[name] = data
        self.records.append({
            "name": name, "shape": list(mask.shape), "numel": mask.numel(),
            "kept": int(mask.sum()), "checksum": bits_checksum(data),
        })  # fmt: skip
        if sharding is not None:
            self.records[-1]["dtensor"] = sharding.record()

    def save(self, fn: str, path: str) -> None:
        """Write the masks added to ``path``, as :func:`save_masks` does."""
        _, st_torch = _safetensors(fn)
        version = VERSION if any("dtensor" in r for r in self.records) else 1
        record = compact_json({"format": FORMAT, "version": version, "masks": self.records})
        st_torch.save_file(self.tensors, path, metadata={_METADATA_KEY: record})


def _records(metadata: object) -> list[tuple[str, tuple[int, ...], int, int, Sharding | None]]:
    """The ``(name, shape, kept, checksum, sharding)`` of each mask that the file's metadata records."""
    if not isinstance(metadata, dict) or _METADATA_KEY not in metadata:
        bad(f"no {_METADATA_KEY!r} metadata entry (not written by save_masks)")
    try:
        record = json.loads(metadata[_METADATA_KEY])
    except (TypeError, ValueError, RecursionError) as err:  # RecursionError: nested too deep
        bad(f"the {_METADATA_KEY!r} metadata is not JSON ({err})")
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        bad(f"the metadata's format is not {FORMAT!r}")
    version = record.get("version")
    if type(version) is not int or not 1 <= version <= VERSION:
        bad(f"format version {shown(version)}; this funcprune reads versions 1 to {VERSION}")
    items = record.get("masks")
    if not isinstance(items, list):
        bad("the metadata has no list of masks")
    out: list[tuple[str, tuple[int, ...], int, int, Sharding | None]] = []
    for item in items:
        keys = frozenset(item) if isinstance(item, dict) else None
        if keys != _RECORD_KEYS and not (version >= 2 and keys == _RECORD_KEYS | {"dtensor"}):
            bad(f"a metadata item is not a mask record: {shown(item)}")
        name, shape = item["name"], item["shape"]
        if not isinstance(name, str) or not isinstance(shape, list):
            bad(f"a metadata item has a bad name or shape: {shown(item)}")
        sizes = checked_shape(shape)
        if math.prod(sizes) != checked_size(item["numel"]) or checked_size(item["kept"]) > item["numel"]:
            bad(f"the mask {name!r}: its shape, numel and kept disagree: {shown(item)}")
        sharding = None
        if "dtensor" in item:
            try:
                sharding = parsed_sharding(item["dtensor"], sizes)
            except Corrupt as err:
                bad(f"the mask {name!r}: its block's record: {err}")
        out.append((name, sizes, item["kept"], checked_size(item["checksum"]), sharding))
    if len({name for name, *_ in out}) != len(out):
        bad("the metadata names a mask twice")
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
    like = checked_like(fn, like)
    safetensors, _ = _safetensors(fn)
    return arranged(fn, [_read(fn, safetensors, where) for where in paths], like, merge=merge)


def _read(fn: str, safetensors: ModuleType, where: str) -> list[Entry]:
    """The masks of the file ``where``, as they were saved; a damaged file refused with a message naming it."""
    try:
        return _load(safetensors, where)
    except Corrupt as err:
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


def _load(safetensors: ModuleType, path: str) -> list[Entry]:
    with safetensors.safe_open(path, framework="pt", device="cpu") as file:
        records = _records(file.metadata())
        keys = set(file.keys())
        names = {name for name, *_ in records}
        if keys != names:
            bad(
                f"its tensors {sorted(keys - names)} are not in its record, or its record's "
                f"masks {sorted(names - keys)} are not in the file"
            )
        entries: list[Entry] = []
        for name, shape, kept, checksum, sharding in records:
            data = file.get_tensor(name)
            try:
                mask = unpack_checked(f"the mask {name!r}", data, shape)
            except ValueError as err:
                bad(str(err))
            if bits_checksum(data) != checksum or int(mask.sum()) != kept:
                bad(f"the mask {name!r}: its bytes do not match their checksum and count")
            entries.append(Entry(name, mask, sharding, repr(path)))
    return entries
