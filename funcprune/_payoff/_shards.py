"""A transformers checkpoint's safetensors shards, read a few tensors at a time and written tensor by tensor.

:class:`Shards` maps each tensor of a checkpoint directory
(``model.safetensors``, or the shards ``model.safetensors.index.json``
lists) to its file, place, shape and dtype from the files' headers, and
reads the tensors asked for straight into tensors of their own
(``readinto`` at their offsets: no mapping of the file, no copy beside the
tensor). :class:`ShardLayout` lays out every tensor of an output checkpoint
before anything is written, from the names, shapes and dtypes alone, into
shards of at most ``max_shard_size`` bytes named as ``save_pretrained``
names them (``model-00001-of-00003.safetensors``); it writes each shard's
header up front and each tensor's bytes into its place as soon as it is
given, so no shard is ever held in memory, then the index. The files are
the safetensors format: an 8-byte little-endian header length, the JSON
header (padded with spaces to a multiple of 8), then the tensors' bytes
back to back, each tensor's offset a multiple of its element size.
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
import sys
from collections.abc import Iterable, Sequence
from typing import final

import torch

from .._types import Tensor

__all__ = ["INDEX", "SINGLE", "ShardLayout", "Shards", "size_in_bytes"]

#: The file names of a sharded checkpoint's index and of an unsharded checkpoint.
INDEX, SINGLE = "model.safetensors.index.json", "model.safetensors"

#: safetensors' dtype names and torch's dtypes.
_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip
_NAMES = {d: n for n, d in _DTYPES.items()}
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
#: The largest header read (safetensors' own limit).
_MAX_HEADER = 100 * 2**20


def size_in_bytes(fn: str, size: object) -> int:
    """``max_shard_size`` in bytes: a positive int, or a string as transformers takes it (``"500MB"``, ``"2GiB"``)."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    if isinstance(size, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", size)
        if match is not None and match.group(2).upper() in _UNITS and float(match.group(1)) > 0:
            return max(1, int(float(match.group(1)) * _UNITS[match.group(2).upper()]))
    raise ValueError(f"{fn}: max_shard_size must be a positive number of bytes or a size such as '500MB' or '2GiB' "
                     f"(units B, KB, MB, GB, KiB, MiB, GiB), got {size!r}")  # fmt: skip


def _nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    count = 1
    for n in shape:
        count *= n
    return count * dtype.itemsize


def _bytes_of(tensor: Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy."""
    flat = tensor.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    # numpy's arrays have the buffer protocol; its stubs declare it from Python 3.12 only
    return memoryview(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]


@final
class Shards:
    """The safetensors tensors of a checkpoint directory: where each one is, its shape and dtype, and reads.

    Raises (on construction):
        ValueError: if the directory has neither ``model.safetensors`` nor
            ``model.safetensors.index.json``, the index is not one, it names
            a file outside the directory or one that is missing, or a file is
            not a safetensors file (its header unreadable, a dtype unknown,
            a tensor's bytes not where the header puts them).
    """

    def __init__(self, fn: str, where: str) -> None:
        self.fn, self.where = fn, where
        index, single = os.path.join(where, INDEX), os.path.join(where, SINGLE)
        if os.path.isfile(index):
            files = self._index(index)
        elif os.path.isfile(single):
            files = [SINGLE]
        else:
            raise ValueError(f"{fn}: {where!r} holds neither {SINGLE!r} nor {INDEX!r}: not a safetensors checkpoint "
                             "(save the model with save_pretrained)")  # fmt: skip
        self.file_of: dict[str, str] = {}
        self.shape: dict[str, tuple[int, ...]] = {}
        self.dtype: dict[str, torch.dtype] = {}
        self._at: dict[str, int] = {}  # each tensor's first byte in its file
        for name in files:
            self._header(os.path.join(where, name))

    def _index(self, index: str) -> list[str]:
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
            files = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
            raise ValueError(f"{self.fn}: {index!r} is not a safetensors index (a JSON object with a 'weight_map' of "
                             f"tensor names to file names): {err!r:.200}") from None  # fmt: skip
        for name in files:
            if not isinstance(name, str) or os.path.basename(name) != name:
                raise ValueError(f"{self.fn}: {index!r} lists {name!r:.200}, not a file name in {self.where!r}")
            if not os.path.isfile(os.path.join(self.where, name)):
                raise ValueError(f"{self.fn}: {index!r} lists {name!r}, which is not in {self.where!r}")
        return files

    def _header(self, path: str) -> None:
        """Record the tensors of the safetensors file ``path`` from its header, checked against its size."""
        problem = f"{self.fn}: {path!r} is not a readable safetensors file"
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8).rjust(8, b"\0"))
                if size < 8 or length > min(_MAX_HEADER, size - 8):
                    raise ValueError(f"{problem}: a header of {length} bytes in a file of {size}")
                header = json.loads(f.read(length))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
            raise ValueError(f"{problem}: {err!r:.200}") from None
        if not isinstance(header, dict):
            raise ValueError(f"{problem}: its header is not a JSON object")
        data = size - 8 - length
        for key, entry in header.items():
            if key == "__metadata__":
                continue
            try:
                dtype, shape = _DTYPES.get(entry["dtype"]), tuple(int(n) for n in entry["shape"])
                begin, end = (int(n) for n in entry["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{problem}: {key!r:.200} has no dtype, shape and data_offsets") from None
            if dtype is None:
                raise ValueError(f"{self.fn}: {path!r} holds {key!r} in the dtype {entry['dtype']!r:.50}, which is "
                                 f"not read here (known: {', '.join(_DTYPES)})")  # fmt: skip
            if min(shape, default=0) < 0 or not 0 <= begin <= end <= data or end - begin != _nbytes(shape, dtype):
                raise ValueError(f"{problem}: {key!r:.200}'s bytes {begin}..{end} do not hold a {entry['dtype']} "
                                 f"tensor of shape {list(shape)} within its {data} bytes of data")  # fmt: skip
            self.file_of[key], self.shape[key], self.dtype[key] = path, shape, dtype
            self._at[key] = 8 + length + begin

    def nbytes(self, name: str) -> int:
        """The bytes tensor ``name`` takes."""
        return _nbytes(self.shape[name], self.dtype[name])

    def read(self, names: Iterable[str]) -> dict[str, Tensor]:
        """The tensors ``names``, as stored (dtype included), on the CPU, each in memory of its own.

        Each file is opened once and read with ``readinto`` straight into
        the tensors (no mapping of the file, no second copy).
        """
        wanted = list(names)
        by_file: dict[str, list[str]] = {}
        for name in wanted:
            by_file.setdefault(self.file_of[name], []).append(name)
        got: dict[str, Tensor] = {}
        for path, keys in by_file.items():
            with open(path, "rb", buffering=0) as f:
                for key in keys:
                    tensor = torch.empty(self.shape[key], dtype=self.dtype[key])
                    f.seek(self._at[key])
                    _read_into(f, _bytes_of(tensor), path, key)
                    got[key] = tensor
        return {name: got[name] for name in wanted}


def _read_into(f: io.FileIO, view: memoryview, path: str, key: str) -> None:
    """Fill ``view`` from ``f`` (``readinto`` may return fewer bytes than asked)."""
    done = 0
    while done < len(view):
        count = f.readinto(view[done:])
        if not count:
            raise ValueError(f"{path!r} ended while {key!r} was read: the file changed or is truncated")
        done += count


@final
class ShardLayout:
    """An output checkpoint laid out in shards before anything is written; each tensor is written as it comes.

    ``tensors``: ``(name, shape, dtype)`` of every tensor the checkpoint
    will hold, in the order they fill shards of at most ``max_shard_size``
    bytes (a tensor larger than that gets a shard alone). The shards are
    named ``model-0000k-of-0000n.safetensors`` (indexed even when there is
    one, as ``save_pretrained`` does for a sharded save). A shard's file is
    created, its header written, on the first :meth:`write` into it;
    :meth:`close` checks that every tensor was written and writes the
    index. Nothing is held but the open file being written.
    """

    def __init__(self, directory: str, max_shard_size: int,
                 tensors: Iterable[tuple[str, Sequence[int], torch.dtype]]) -> None:  # fmt: skip
        if sys.byteorder != "little":  # pragma: no cover
            raise RuntimeError("ShardLayout writes the bytes as they are in memory: a little-endian machine only")
        self.directory = directory
        groups: list[list[tuple[str, tuple[int, ...], torch.dtype]]] = []
        held = 0
        for name, shape, dtype in tensors:
            size = _nbytes(shape, dtype)
            if not groups or (groups[-1] and held + size > max_shard_size):
                groups.append([])
                held = 0
            groups[-1].append((name, tuple(shape), dtype))
            held += size
        groups = groups or [[]]
        self._file_of: dict[str, str] = {}
        self._at: dict[str, int] = {}
        self._shape: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        self._headers: dict[str, bytes] = {}
        self._total = 0
        for k, group in enumerate(groups):
            file = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
            # widest elements first, so that every tensor's offset is a multiple of its element size
            placed = sorted(group, key=lambda t: -t[2].itemsize)
            header: dict[str, object] = {"__metadata__": {"format": "pt"}}
            offset = 0
            for name, shape, dtype in placed:
                size = _nbytes(shape, dtype)
                header[name] = {"dtype": _NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
                self._file_of[name], self._at[name], self._shape[name] = file, offset, (shape, dtype)
                offset += size
            encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
            encoded += b" " * (-len(encoded) % 8)
            self._headers[file] = struct.pack("<Q", len(encoded)) + encoded
            for name, _, _ in placed:
                self._at[name] += len(self._headers[file])
            self._total += offset
        self._sizes = {f: len(h) for f, h in self._headers.items()}
        for name, (shape, dtype) in self._shape.items():
            self._sizes[self._file_of[name]] += _nbytes(shape, dtype)
        self._written: set[str] = set()
        self._open: tuple[str, io.FileIO] | None = None

    @property
    def files(self) -> list[str]:
        """The shards' file names, in order."""
        return list(self._headers)

    def write(self, name: str, tensor: Tensor) -> None:
        """Write ``tensor`` (of the shape and dtype laid out for ``name``, on the CPU) into its place, now."""
        shape, dtype = self._shape[name]
        if tuple(tensor.shape) != shape or tensor.dtype != dtype or tensor.device.type != "cpu":
            raise ValueError(f"ShardLayout: {name!r} was laid out as {_NAMES[dtype]} {list(shape)} on the CPU, given "
                             f"{tensor.dtype} {list(tensor.shape)} on {tensor.device}")  # fmt: skip
        if name in self._written:
            raise ValueError(f"ShardLayout: {name!r} was written already")
        f = self._file(self._file_of[name])
        f.seek(self._at[name])
        f.write(_bytes_of(tensor.contiguous()))
        self._written.add(name)

    def _file(self, file: str) -> io.FileIO:
        """The open shard ``file``, created (header written, full size) on first use; the one open before closed."""
        if self._open is not None and self._open[0] == file:
            return self._open[1]
        self._close_open()
        path = os.path.join(self.directory, file)
        if os.path.exists(path):
            f = open(path, "r+b", buffering=0)  # noqa: SIM115  # kept open across writes, closed in _close_open
        else:
            f = open(path, "w+b", buffering=0)  # noqa: SIM115
            f.write(self._headers[file])
            f.truncate(self._sizes[file])
        self._open = (file, f)
        return f

    def _close_open(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None

    def close(self) -> dict[str, str]:
        """Check every tensor was written, write the index; the index's weight map (name to shard)."""
        self._close_open()
        missing = [n for n in self._shape if n not in self._written]
        if missing:
            raise ValueError(f"ShardLayout: {len(missing)} tensor(s) laid out were never written, {missing[0]!r} first")
        for file in self._headers:  # a shard of no tensor at all (an empty checkpoint) is still a file
            if not os.path.exists(os.path.join(self.directory, file)):
                self._file(file)
        self._close_open()
        weight_map = dict(sorted(self._file_of.items()))
        index = {"metadata": {"total_size": self._total}, "weight_map": weight_map}
        with open(os.path.join(self.directory, INDEX), "w", encoding="utf-8") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
        return weight_map

    def abort(self) -> None:
        """Close the file being written (the caller removes the directory)."""
        self._close_open()
