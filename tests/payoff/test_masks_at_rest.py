"""Masks at rest (funcprune._payoff._masks_*.py): bit packing, safetensors files, damage refused."""

from __future__ import annotations

import json
import math
import os
import re
import struct
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import funcprune as fp

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

Tensor = torch.Tensor
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

shapes = st.lists(st.integers(0, 9), min_size=0, max_size=4).map(tuple)


def random_mask(shape: tuple[int, ...], seed: int, p: float = 0.5) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=gen) < p


def bit_equal(a: dict[str, Tensor], b: dict[str, Tensor]) -> bool:
    return list(a) == list(b) and all(
        b[k].dtype == torch.bool and a[k].shape == b[k].shape and torch.equal(a[k].bool(), b[k].cpu())
        for k in a
    )


def header_bound(masks: dict[str, Tensor]) -> int:
    """The header bound save_masks documents, for ASCII names."""
    return 8 + 256 + sum(256 + 2 * len(name) + 24 * m.dim() for name, m in masks.items())


def data_bytes(masks: dict[str, Tensor]) -> int:
    return sum(math.ceil(m.numel() / 8) for m in masks.values())


# Packing


def test_bit_order_on_a_known_example() -> None:
    """Row-major entries, entry k is bit k % 8 of byte k // 8, padding bits 0."""
    mask = torch.tensor([[1, 0, 0, 0, 0, 0, 0, 0, 1], [1, 0, 1, 0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    packed = fp.pack_masks({"w": mask})
    # flat: 1 0 0 0 0 0 0 0 | 1 1 0 1 0 0 0 0 | 0 0 → bytes 0b1, 0b1011, 0
    assert packed["w"].tolist() == [1, 1 + 2 + 8, 0]
    assert packed["w"].dtype == torch.uint8
    assert packed["w::shape"].tolist() == [2, 9] and packed["w::shape"].dtype == torch.int64
    assert list(packed) == ["w", "w::shape"]
    assert torch.equal(fp.unpack_masks(packed)["w"], mask)


@pytest.mark.parametrize("offset", [0, 3, 8])
def test_every_byte_packs_and_unpacks_as_its_weighted_bits(offset: int) -> None:
    """All 256 groups of 8 entries, one per byte, against the definition (entry k weighs 2 ** (k % 8)); also from
    a view that starts off a multiple of 8 entries, as a slice of a bigger mask does."""
    groups = ((torch.arange(256)[:, None] >> torch.arange(8)) & 1).bool()
    whole = torch.cat([torch.ones(offset, dtype=torch.bool), groups.reshape(-1), torch.tensor([True, False])])
    mask = whole[offset:]
    weights = torch.tensor([1 << k for k in range(8)], dtype=torch.int64)
    expected = [*(groups.long() * weights).sum(dim=1).tolist(), 1]
    packed = fp.pack_masks({"w": mask})
    assert packed["w"].tolist() == expected
    assert torch.equal(fp.unpack_masks(packed)["w"], mask)


@given(st.lists(shapes, min_size=0, max_size=4), st.integers(0, 2**16), st.floats(0, 1))
def test_pack_round_trip(mask_shapes: list[tuple[int, ...]], seed: int, p: float) -> None:
    masks = {f"m{i}.weight": random_mask(s, seed + i, p) for i, s in enumerate(mask_shapes)}
    packed = fp.pack_masks(masks)
    for name, mask in masks.items():
        assert packed[name].shape == (math.ceil(mask.numel() / 8),)
    assert bit_equal(masks, fp.unpack_masks(packed))


def test_pack_large_and_edge_shapes() -> None:
    masks = {
        "big": random_mask((1000, 1000), 0),
        "scalar_kept": torch.tensor(True),
        "scalar_pruned": torch.tensor(False),
        "empty": torch.zeros(3, 0, 5, dtype=torch.bool),
        "odd": random_mask((7, 3), 1),
        "ones": torch.ones(17, dtype=torch.bool),
    }
    packed = fp.pack_masks(masks)
    assert packed["big"].numel() == 125_000 and packed["empty"].numel() == 0
    assert packed["scalar_kept::shape"].shape == (0,) and packed["scalar_kept"].tolist() == [1]
    assert packed["ones"].tolist() == [255, 255, 1]
    assert bit_equal(masks, fp.unpack_masks(packed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.int64, torch.uint8, torch.int8])
def test_numeric_01_masks_are_converted_exactly(dtype: torch.dtype) -> None:
    mask = random_mask((5, 7), 3)
    unpacked = fp.unpack_masks(fp.pack_masks({"w": mask.to(dtype)}))
    assert torch.equal(unpacked["w"], mask)


def test_torch_weight_mask_buffers() -> None:
    lin = nn.Linear(6, 4)
    torch.nn.utils.prune.l1_unstructured(lin, "weight", amount=0.5)
    buffer = lin.get_buffer("weight_mask")
    assert buffer.dtype == torch.float32
    assert torch.equal(fp.unpack_masks(fp.pack_masks({"weight": buffer}))["weight"], buffer != 0)


@pytest.mark.parametrize("fn", ["pack_masks", "save_masks"])
@pytest.mark.parametrize("bad", [0.5, 2.0, -1.0, float("nan")])
def test_other_values_refused(fn: str, bad: float, tmp_path: Path) -> None:
    mask = torch.ones(4)
    mask[2] = bad
    with pytest.raises(ValueError, match=rf"{fn}: the mask for 'layer.weight' must hold only 0 and 1.*"):
        if fn == "pack_masks":
            fp.pack_masks({"layer.weight": mask})
        else:
            fp.save_masks({"layer.weight": mask}, tmp_path / "m.safetensors")
    assert not (tmp_path / "m.safetensors").exists()


def test_integer_values_named_in_the_error() -> None:
    with pytest.raises(ValueError, match=r"the mask for 'w' .* such as \[3\]"):
        fp.pack_masks({"w": torch.tensor([0, 1, 3])})


@pytest.mark.parametrize("fn", ["pack_masks", "save_masks"])
def test_non_tensors_refused(fn: str, tmp_path: Path) -> None:
    call = (lambda m: fp.pack_masks(m)) if fn == "pack_masks" else (lambda m: fp.save_masks(m, tmp_path / "x"))
    with pytest.raises(TypeError, match=rf"{fn}: masks\['w'\] must be a tensor, got list"):
        call({"w": [True, False]})
    with pytest.raises(TypeError, match=rf"{fn}: masks must be a mapping"):
        call([torch.ones(2)])
    with pytest.raises(TypeError, match=rf"{fn}: masks\['w'\] must be a dense tensor"):
        call({"w": torch.ones(2, 2).to_sparse()})
    with pytest.raises(ValueError, match=rf"{fn}: masks\['w'\] has no values"):
        call({"w": torch.ones(2, device="meta", dtype=torch.bool)})


def test_pack_refuses_the_shape_suffix_in_names() -> None:
    with pytest.raises(ValueError, match=r"must not end with '::shape'"):
        fp.pack_masks({"w::shape": torch.ones(2, dtype=torch.bool)})


def test_unpack_refuses_inconsistent_dicts() -> None:
    packed = fp.pack_masks({"w": torch.ones(10, dtype=torch.bool)})
    with pytest.raises(ValueError, match=r"packed\['w'\] has no shape entry 'w::shape'"):
        fp.unpack_masks({"w": packed["w"]})
    with pytest.raises(ValueError, match=r"packed\['w::shape'\] is a shape with no packed bytes"):
        fp.unpack_masks({"w::shape": packed["w::shape"]})
    with pytest.raises(ValueError, match=r"unpack_masks: packed\['w'\] must be a 1-D torch.uint8 tensor of 2 bytes"):
        fp.unpack_masks({**packed, "w": packed["w"][:1]})
    with pytest.raises(ValueError, match=r"must be a 1-D torch.uint8"):
        fp.unpack_masks({**packed, "w": packed["w"].to(torch.int32)})
    with pytest.raises(ValueError, match=r"the bits after entry 10 of its last byte must be 0"):
        fp.unpack_masks({**packed, "w": torch.tensor([255, 7], dtype=torch.uint8)})
    with pytest.raises(ValueError, match=r"must be a 1-D integer tensor"):
        fp.unpack_masks({**packed, "w::shape": torch.tensor([10.0])})
    with pytest.raises(ValueError, match=r"negative size"):
        fp.unpack_masks({**packed, "w::shape": torch.tensor([-10])})
    with pytest.raises(TypeError, match=r"packed\['w'\] must be a tensor"):
        fp.unpack_masks({**packed, "w": b"\xff\x03"})  # type: ignore[dict-item]


def test_dtensor_masks_pack_and_save_their_block(mesh: DeviceMesh, tmp_path: Path) -> None:
    """On a mesh of one process (the block is the whole mask): the block, where it sits, and the DTensor back.

    Several processes: ``tests/dtensor/test_masks_at_rest_across.py``.
    """
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    whole = random_mask((5, 3), 0)
    mask = distribute_tensor(whole, mesh, [Shard(1)])
    packed = fp.pack_masks({"w": mask})
    assert list(packed) == ["w", "w::shape", "w::dtensor"]
    assert json.loads(bytes(packed["w::dtensor"].tolist())) == {
        "shape": [5, 3], "offsets": [0, 0], "placements": ["Shard(1)"], "mesh": [1], "coordinate": [0], "rank": 0,
    }  # fmt: skip
    assert bit_equal({"w": whole}, fp.unpack_masks(packed))  # no like: the block, plainly
    for like in (mesh, {"w": mask, "other": torch.ones(2)}):
        back = fp.unpack_masks(packed, like=like)["w"]
        assert isinstance(back, DTensor) and back.placements == (Shard(1),) and back.device_mesh == mesh
        assert torch.equal(back.to_local(), mask.to_local()) and back.shape == mask.shape
    assert bit_equal({"w": whole}, fp.unpack_masks([packed]))  # merged: the whole mask
    path = tmp_path / "m.safetensors"
    fp.save_masks({"w": mask, "b": torch.tensor([True, False])}, path)
    loaded = fp.load_masks(path, like=mesh)
    assert isinstance(loaded["w"], DTensor) and torch.equal(loaded["w"].full_tensor(), whole)
    assert not isinstance(loaded["b"], DTensor)  # saved whole: whole on a mesh too
    assert bit_equal({"w": whole, "b": torch.tensor([True, False])}, fp.load_masks([path]))
    with pytest.raises(ValueError, match=r"the mask 'w' is the block at mesh coordinate \(0,\) \(rank 0\) of a mask "
                       r"of shape \(5, 3\) laid out as \[Shard\(1\)\] on a mesh of shape \(1,\), but like\['w'\] "
                       r"is .* laid out as \[Shard\(0\)\]"):
        fp.load_masks(path, like={"w": distribute_tensor(whole, mesh, [Shard(0)]), "b": torch.ones(2)})


def test_a_whole_mask_loads_as_a_dtensor_like_its_parameter(mesh: DeviceMesh, tmp_path: Path) -> None:
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    whole = random_mask((4, 6), 1)
    path = tmp_path / "m.safetensors"
    fp.save_masks({"w": whole}, path)
    for placements in ([Shard(0)], [Replicate()]):
        param = distribute_tensor(torch.randn(4, 6), mesh, placements)
        got = fp.load_masks(path, like={"w": param})["w"]
        assert isinstance(got, DTensor) and got.placements == tuple(placements)
        assert torch.equal(got.full_tensor(), whole)
    with pytest.raises(ValueError, match=r"the mask 'w' has shape \(4, 6\), but like\['w'\] is a DTensor of shape"):
        fp.load_masks(path, like={"w": distribute_tensor(torch.randn(6, 4), mesh, [Shard(0)])})
    with pytest.raises(ValueError, match=r"the mask 'w' has no tensor in like"):
        fp.load_masks(path, like={})
    with pytest.raises(TypeError, match=r"like must be a mapping of names to tensors .* or a DeviceMesh, got int"):
        fp.load_masks(path, like=3)  # type: ignore[arg-type]


def test_partial_dtensor_masks_refused(mesh: DeviceMesh) -> None:
    from torch.distributed.tensor import DTensor, Partial

    mask = DTensor.from_local(torch.ones(4, dtype=torch.bool), mesh, [Partial()])
    with pytest.raises(NotImplementedError, match=r"pack_masks: masks\['w'\] is a DTensor laid out as"):
        fp.pack_masks({"w": mask})


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: {**r, "offsets": [1, 0]}, r"is not the one its placements"),
        (lambda r: {**r, "coordinate": [1]}, r"not in a mesh of shape \[1\]"),
        (lambda r: {**r, "placements": ["Shard(2)"]}, r"cuts dim 2 of a mask of 2 dims"),
        (lambda r: {**r, "placements": ["Partial()"]}, r"expected a placement"),
        (lambda r: {**r, "mesh": [1, 1]}, r"do not fit one another"),
        (lambda r: {k: v for k, v in r.items() if k != "rank"}, r"expected a record with the keys"),
    ],
)
def test_bad_block_records_refused(mesh: DeviceMesh, edit: object, message: str) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    packed = fp.pack_masks({"w": distribute_tensor(random_mask((3, 2), 2), mesh, [Shard(0)])})
    record = edit(json.loads(bytes(packed["w::dtensor"].tolist())))  # type: ignore[operator]
    packed["w::dtensor"] = torch.tensor(list(json.dumps(record).encode()), dtype=torch.uint8)
    with pytest.raises(ValueError, match=rf"unpack_masks: packed\['w::dtensor'\] is not where a block sits.*{message}"):
        fp.unpack_masks(packed)
    with pytest.raises(ValueError, match=r"packed\['w::dtensor'\] is where a DTensor's block sits with no packed"):
        fp.unpack_masks({"w::dtensor": packed["w::dtensor"]})


@needs_cuda
def test_cuda_round_trip(tmp_path: Path) -> None:
    masks = {"a": random_mask((333, 77), 0).cuda(), "b": torch.tensor(True, device="cuda")}
    packed = fp.pack_masks(masks)
    assert packed["a"].device.type == "cuda" and packed["a::shape"].device.type == "cpu"
    unpacked = fp.unpack_masks(packed)
    assert unpacked["a"].device.type == "cuda"
    assert bit_equal(masks, unpacked)
    fp.save_masks(masks, tmp_path / "m.safetensors")
    assert bit_equal(masks, fp.load_masks(tmp_path / "m.safetensors"))


# Files


@given(st.lists(shapes, min_size=0, max_size=4), st.integers(0, 2**16))
def test_save_load_round_trip(mask_shapes: list[tuple[int, ...]], seed: int) -> None:
    import tempfile

    masks = {f"z{i}" if i % 2 else f"a.{i}.weight": random_mask(s, seed + i) for i, s in enumerate(mask_shapes)}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "masks.safetensors")
        fp.save_masks(masks, path)
        assert os.path.getsize(path) <= data_bytes(masks) + header_bound(masks)
        assert bit_equal(masks, fp.load_masks(path))


def test_plan_masks_round_trip_and_file_size(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 30 * 30, 10))
    params = dict(model.named_parameters())
    masks = fp.Plan({"*.weight": fp.L1Unstructured(0.5), "*.bias": fp.L1Unstructured(0.3)})(params)
    path = tmp_path / "plan.safetensors"
    fp.save_masks(masks, path)
    loaded = fp.load_masks(str(path))
    assert bit_equal(masks, loaded)
    assert list(loaded) == list(masks)
    size = path.stat().st_size
    assert size <= data_bytes(masks) + header_bound(masks)
    assert size < sum(m.numel() for m in masks.values()) / 7  # vs one byte per entry
    # the masks apply to the model as the original ones do
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(
        fp.functional_call_masked(model, params, loaded, (x,)), fp.functional_call_masked(model, params, masks, (x,))
    )


def test_the_file_is_documented_safetensors(tmp_path: Path) -> None:
    from safetensors import safe_open

    path = tmp_path / "m.safetensors"
    masks = {"b": torch.tensor([True, False, True]), "a": torch.ones(2, 5, dtype=torch.bool)}
    fp.save_masks(masks, path)
    with safe_open(str(path), framework="pt") as f:
        record = json.loads(f.metadata()["funcprune.masks"])
        assert sorted(f.keys()) == ["a", "b"]
        assert f.get_tensor("b").tolist() == [5] and f.get_tensor("a").tolist() == [255, 3]
    assert record["format"] == "funcprune.masks" and record["version"] == 1
    assert [(r["name"], r["shape"], r["numel"], r["kept"]) for r in record["masks"]] == [
        ("b", [3], 3, 2),
        ("a", [2, 5], 10, 10),
    ]


def test_empty_and_odd_names(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    fp.save_masks({}, path)
    assert fp.load_masks(path) == {}
    masks = {"é.weight": torch.tensor([True]), 'q"uote': torch.zeros(0, dtype=torch.bool), "w::shape": torch.tensor(False)}
    fp.save_masks(masks, path)
    assert bit_equal(masks, fp.load_masks(path))
    with pytest.raises(ValueError, match=r"save_masks: masks\['__metadata__'\]"):
        fp.save_masks({"__metadata__": torch.ones(1)}, path)


def test_path_types(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"save_masks: path must be a str or os.PathLike, got int"):
        fp.save_masks({}, 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"load_masks: path must be a str or os.PathLike \(or a list of them.*got bytes"):
        fp.load_masks(b"x")  # type: ignore[arg-type]
    missing = tmp_path / "missing.safetensors"
    with pytest.raises(FileNotFoundError) as info:
        fp.load_masks(missing)
    assert "missing.safetensors" in str(info.value)


def test_missing_safetensors_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    for call in (lambda: fp.save_masks({}, tmp_path / "m"), lambda: fp.load_masks(tmp_path / "m")):
        with pytest.raises(ImportError, match=r'needs the safetensors package: pip install "funcprune\[hf\]"'):
            call()


# Damaged files: refused with a ValueError naming the file, never read wrong


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dict[str, Tensor], bytes]:
    masks = {"layer.weight": random_mask((5, 13), 0), "b": torch.tensor([True, False, True]), "s": torch.tensor(True)}
    path = tmp_path / "good.safetensors"
    fp.save_masks(masks, path)
    return path, masks, path.read_bytes()


def refused_or_equal(path: Path, masks: dict[str, Tensor]) -> bool:
    """Whether loading ``path`` is refused with a message naming it (True), or gives ``masks`` (False)."""
    try:
        loaded = fp.load_masks(path)
    except (ValueError, OSError) as err:
        assert str(path) in str(err), err
        return True
    assert bit_equal(masks, loaded)
    return False


def test_every_truncation_refused(saved: tuple[Path, dict[str, Tensor], bytes], tmp_path: Path) -> None:
    _, masks, data = saved
    cut = tmp_path / "cut.safetensors"
    for n in range(len(data)):
        cut.write_bytes(data[:n])
        assert refused_or_equal(cut, masks), n


def test_every_byte_flip_refused_or_harmless(saved: tuple[Path, dict[str, Tensor], bytes], tmp_path: Path) -> None:
    """A flip in the header, the metadata JSON or the data: an error naming the file, or the same masks."""
    _, masks, data = saved
    bad = tmp_path / "flipped.safetensors"
    refused = 0
    for i in range(len(data)):
        for xor in (0x01, 0x20, 0xFF):
            flipped = bytearray(data)
            flipped[i] ^= xor
            bad.write_bytes(bytes(flipped))
            refused += refused_or_equal(bad, masks)
    assert refused >= 0.9 * 3 * len(data)


def rewrite_metadata(path: Path, data: bytes, edit: object) -> None:
    """``data`` with its header's funcprune record edited by ``edit`` (a function of the record)."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    record = json.loads(header["__metadata__"]["funcprune.masks"])
    header["__metadata__"]["funcprune.masks"] = json.dumps(edit(record))  # type: ignore[operator]
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])


def edited(key: str, value: object, item: int | None = 0) -> object:
    def edit(record: dict[str, object]) -> dict[str, object]:
        if item is None:
            record[key] = value
        else:
            record["masks"][item][key] = value  # type: ignore[index]
        return record

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (edited("format", "safetensors.masks", None), "format is not 'funcprune.masks'"),
        (edited("version", 3, None), "format version 3"),
        (edited("version", 0, None), "format version 0"),
        (edited("dtensor", {}), "not a mask record"),  # a block's record in a version 1 file
        (edited("version", True, None), "format version True"),
        (edited("shape", [5, 12]), "shape, numel and kept disagree"),
        (edited("numel", 64), "shape, numel and kept disagree"),
        (edited("shape", [5, 13, 2], item=0), "disagree"),
        (edited("kept", 0), "checksum and count"),
        (edited("checksum", 1), "checksum and count"),
        (edited("name", "other"), "not in its record"),
        (edited("shape", [1.5]), "expected an int"),
        (lambda r: {**r, "masks": r["masks"][:2]}, r"tensors \['s'\] are not in its record"),
        (lambda r: {**r, "masks": r["masks"] + r["masks"][:1]}, "names a mask twice"),
        (lambda r: {**r, "masks": [{**r["masks"][0], "extra": 1}] + r["masks"][1:]}, "not a mask record"),
    ],
)
def test_metadata_edits_refused(
    saved: tuple[Path, dict[str, Tensor], bytes], tmp_path: Path, edit: object, message: str
) -> None:
    _, _, data = saved
    bad = tmp_path / "edited.safetensors"
    rewrite_metadata(bad, data, edit)
    with pytest.raises(ValueError, match=rf"load_masks: '{re.escape(str(bad))}' is not a masks file.*{message}"):
        fp.load_masks(bad)


def test_shape_mismatch_with_the_tensor_refused(tmp_path: Path) -> None:
    """A packed tensor whose length disagrees with its recorded shape (a consistent but wrong record)."""
    from safetensors.torch import save_file

    path = tmp_path / "short.safetensors"
    record = {"format": "funcprune.masks", "version": 1, "masks": [
        {"name": "w", "shape": [100], "numel": 100, "kept": 8, "checksum": 1},
    ]}  # fmt: skip
    save_file({"w": torch.tensor([255], dtype=torch.uint8)}, str(path), metadata={"funcprune.masks": json.dumps(record)})
    with pytest.raises(ValueError, match=rf"'{re.escape(str(path))}' .*the mask 'w' must be a 1-D torch.uint8 tensor of 13 bytes"):
        fp.load_masks(path)
    save_file({"w": torch.zeros(13, dtype=torch.int8)}, str(path), metadata={"funcprune.masks": json.dumps(record)})
    with pytest.raises(ValueError, match=r"got dtype torch.int8"):
        fp.load_masks(path)


def test_foreign_safetensors_files_refused(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "weights.safetensors"
    save_file({"w": torch.zeros(3)}, str(path))
    with pytest.raises(ValueError, match=rf"'{re.escape(str(path))}' .*no 'funcprune.masks' metadata entry"):
        fp.load_masks(path)
    save_file({"w": torch.zeros(3)}, str(path), metadata={"funcprune.masks": "{not json"})
    with pytest.raises(ValueError, match=r"metadata is not JSON"):
        fp.load_masks(path)
    path.write_bytes(b"not a safetensors file at all")
    with pytest.raises(ValueError, match=rf"load_masks: '{re.escape(str(path))}' is not a valid safetensors file"):
        fp.load_masks(path)


def test_every_byte_flip_of_a_block_s_file_refused_or_harmless(mesh: DeviceMesh, tmp_path: Path) -> None:
    """As above, for a file of DTensor blocks (version 2): a flip in where a block sits is refused too, or harmless.

    Harmless: the same block on the mesh (on a mesh of one, ``Shard(1)`` for ``Shard(0)`` is the same block;
    on more processes the block's shape tells them apart: ``tests/dtensor/test_masks_at_rest_across.py``).
    """
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    whole = random_mask((5, 13), 0)
    masks = {"layer.weight": distribute_tensor(whole, mesh, [Shard(0)]), "b": torch.tensor([True])}
    path = tmp_path / "good.safetensors"
    fp.save_masks(masks, path)
    data = path.read_bytes()
    bad = tmp_path / "flipped.safetensors"
    refused = 0
    for i in range(len(data)):
        flipped = bytearray(data)
        flipped[i] ^= 0x01
        bad.write_bytes(bytes(flipped))
        try:
            loaded = fp.load_masks(bad, like=mesh)
        except (ValueError, OSError) as err:
            assert str(bad) in str(err), err
            refused += 1
            continue
        assert isinstance(loaded["layer.weight"], DTensor) and loaded["layer.weight"].device_mesh == mesh
        locals_ = {k: v.to_local() if isinstance(v, DTensor) else v for k, v in loaded.items()}
        assert bit_equal({"layer.weight": whole, "b": masks["b"]}, locals_)  # a mesh of one: the block is all
    assert refused >= 0.9 * len(data)
