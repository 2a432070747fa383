"""A transformers checkpoint's safetensors shards, read a few tensors at a time and written shard by shard.

:class:`Shards` maps each tensor of a checkpoint directory
(``model.safetensors``, or the shards ``model.safetensors.index.json``
lists) to its file from the index or the headers, and reads the tensors
asked for (``safe_open``, ``get_tensor`` per name; each file is opened for
one read and closed, so that no mapping of the files outlives it).
:class:`ShardWriter` writes tensors as they come into shards of at most
``max_shard_size`` bytes (a tensor larger than that gets a shard of its
own), named as ``save_pretrained`` names them once their count is known
(``model-00001-of-00003.safetensors``), with ``model.safetensors.index.json``.
It holds at most one shard's tensors at a time.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from typing import final

import torch

from .._types import Tensor

__all__ = ["INDEX", "SINGLE", "ShardWriter", "Shards", "size_in_bytes"]

#: The file names of a sharded checkpoint's index and of an unsharded checkpoint.
INDEX, SINGLE = "model.safetensors.index.json", "model.safetensors"

#: safetensors' dtype names, as ``get_slice(name).get_dtype()`` gives them.
_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}  # fmt: skip
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


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


@final
class Shards:
    """The safetensors tensors of a checkpoint directory: where each one is, its shape and dtype, and reads.

    Raises (on construction):
        ValueError: if the directory has neither ``model.safetensors`` nor
            ``model.safetensors.index.json``, the index is not one, it names
            a file outside the directory or one that is missing, or a file is
            not a safetensors file.
    """

    def __init__(self, fn: str, where: str) -> None:
        import safetensors

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
        for name in files:
            path = os.path.join(where, name)
            try:
                with safetensors.safe_open(path, framework="pt") as f:
                    for key in f.keys():
                        piece = f.get_slice(key)
                        self.file_of[key], self.shape[key] = path, tuple(piece.get_shape())
                        self.dtype[key] = _DTYPES.get(piece.get_dtype(), torch.uint8)
            except (safetensors.SafetensorError, OSError) as err:
                raise ValueError(f"{fn}: {path!r} is not a readable safetensors file: {err}") from None

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

    def nbytes(self, name: str) -> int:
        """The bytes tensor ``name`` takes."""
        count = 1
        for n in self.shape[name]:
            count *= n
        return count * torch.empty((), dtype=self.dtype[name]).element_size()

    def read(self, names: Iterable[str]) -> dict[str, Tensor]:
        """The tensors ``names``, as stored (dtype included), on the CPU, each file opened once and closed."""
        import safetensors

        wanted = list(names)
        by_file: dict[str, list[str]] = {}
        for name in wanted:
            by_file.setdefault(self.file_of[name], []).append(name)
        got: dict[str, Tensor] = {}
        for path, keys in by_file.items():
            with safetensors.safe_open(path, framework="pt") as f:
                for key in keys:
                    got[key] = f.get_tensor(key)
        return {name: got[name] for name in wanted}


@final
class ShardWriter:
    """Writes tensors into ``directory`` as shards of at most ``max_shard_size`` bytes, then the index.

    :meth:`add` a tensor (by its checkpoint name), then :meth:`close` once
    every tensor is in: the shards are renamed ``model-0000k-of-0000n
    .safetensors`` and the index written (one shard alone is still indexed,
    as ``save_pretrained`` does for a sharded save). Each shard holds the
    tensors in the order they came; the one being filled is held in memory.
    """

    def __init__(self, directory: str, max_shard_size: int) -> None:
        self.directory, self.limit = directory, max_shard_size
        self._held: dict[str, Tensor] = {}
        self._held_bytes = 0
        self._written: list[list[str]] = []
        self._total = 0

    def add(self, name: str, tensor: Tensor) -> None:
        """Add ``tensor`` (a CPU copy is written, contiguous) under ``name``."""
        size = tensor.numel() * tensor.element_size()
        if self._held and self._held_bytes + size > self.limit:
            self._flush()
        self._held[name] = tensor.detach().to("cpu").contiguous()
        self._held_bytes += size
        self._total += size

    def _flush(self) -> None:
        import safetensors.torch

        path = os.path.join(self.directory, f"shard-{len(self._written):05d}.partial")
        safetensors.torch.save_file(self._held, path, metadata={"format": "pt"})
        self._written.append(list(self._held))
        self._held, self._held_bytes = {}, 0

    def close(self) -> dict[str, str]:
        """Write the last shard, name the shards and write the index; the index's weight map."""
        if self._held or not self._written:
            self._flush()
        count = len(self._written)
        weight_map: dict[str, str] = {}
        for k, names in enumerate(self._written):
            final_name = f"model-{k + 1:05d}-of-{count:05d}.safetensors"
            os.replace(os.path.join(self.directory, f"shard-{k:05d}.partial"), os.path.join(self.directory, final_name))
            weight_map.update(dict.fromkeys(names, final_name))
        index = {"metadata": {"total_size": self._total}, "weight_map": dict(sorted(weight_map.items()))}
        with open(os.path.join(self.directory, INDEX), "w", encoding="utf-8") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
        return weight_map

