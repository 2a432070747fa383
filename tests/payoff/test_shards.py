"""A checkpoint's shards (funcprune._payoff._shards): laid out up front, written a tensor at a time, read back.

The reference is safetensors itself: what :class:`ShardLayout` writes must
load with ``safetensors.torch.load_file`` (which checks the header, the
offsets and the size) equal to what was given, and what :class:`Shards`
reads must equal ``load_file``'s tensors of a file safetensors wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

from funcprune._payoff._shards import INDEX, ShardLayout, Shards


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(5, 7, generator=g),
        "b.odd": torch.randn(3, generator=g).to(torch.bfloat16),  # 6 bytes: the next offsets must stay aligned
        "c.ids": torch.arange(9, dtype=torch.int64).reshape(3, 3),
        "d.flags": torch.tensor([True, False, True]),
        "e.scalar": torch.tensor(2.5, dtype=torch.float64),
        "f.empty": torch.empty(0, 4),
        "g.half": torch.randn(4, 4, generator=g).to(torch.float16),
    }


def test_shards_written_a_tensor_at_a_time_load_with_safetensors(tmp_path: Path) -> None:
    tensors = _tensors()
    layout = ShardLayout(str(tmp_path), 150, ((n, t.shape, t.dtype) for n, t in tensors.items()))
    for name in reversed(list(tensors)):  # any order: each tensor has its place
        layout.write(name, tensors[name])
    weight_map = layout.close()
    files = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(files) > 1 and files == layout.files and set(weight_map.values()) == set(files)
    index = json.loads((tmp_path / INDEX).read_text(encoding="utf-8"))
    assert index["weight_map"] == weight_map
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    for file in files:
        loaded = safetensors.torch.load_file(tmp_path / file)
        assert loaded and all(weight_map[n] == file for n in loaded)
        for name, t in loaded.items():
            assert t.dtype == tensors[name].dtype and torch.equal(t, tensors[name]), name
        with safetensors.safe_open(tmp_path / file, framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
    shards = Shards("test", str(tmp_path))
    back = shards.read(tensors)
    assert all(torch.equal(back[n], t) and back[n].dtype == t.dtype for n, t in tensors.items())


def test_a_tensor_larger_than_a_shard_gets_one_alone_and_what_is_laid_out_must_be_given(tmp_path: Path) -> None:
    layout = ShardLayout(str(tmp_path), 10, [("big", (4, 4), torch.float32), ("small", (1,), torch.float32)])
    assert layout.files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    with pytest.raises(ValueError, match=r"'big' was laid out as F32 \[4, 4\] on the CPU, given torch.float16"):
        layout.write("big", torch.zeros(4, 4, dtype=torch.float16))
    layout.write("big", torch.ones(4, 4))
    with pytest.raises(ValueError, match="'big' was written already"):
        layout.write("big", torch.ones(4, 4))
    with pytest.raises(ValueError, match="1 tensor.s. laid out were never written, 'small' first"):
        layout.close()


def test_shards_read_what_safetensors_wrote_and_refuse_a_damaged_file(tmp_path: Path) -> None:
    tensors = _tensors()
    safetensors.torch.save_file(tensors, tmp_path / "model.safetensors")
    shards = Shards("test", str(tmp_path))
    assert shards.shape["a.weight"] == (5, 7) and shards.dtype["b.odd"] == torch.bfloat16
    back = shards.read(["g.half", "a.weight"])
    assert list(back) == ["g.half", "a.weight"] and torch.equal(back["a.weight"], tensors["a.weight"])
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:-4])
    with pytest.raises(ValueError, match=r"test: .*model.safetensors' is not a readable safetensors file: .*bytes"):
        Shards("test", str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ValueError, match="is not a readable safetensors file: a header of"):
        Shards("test", str(tmp_path))
