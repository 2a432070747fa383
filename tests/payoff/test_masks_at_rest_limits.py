"""Masks files whose metadata claims absurd numbers: refused (or read as saved) at once, with bounded memory.

A few hundred bytes of edited metadata (a split factor of 10**12, a mesh of
10**9 processes, a shape of [10**30, 0], JSON nested a hundred thousand
deep) must give the documented ValueError naming the file, or the masks
saved, quickly: every number is checked against what the file holds before
anything proportional to it is visited or allocated. Each case runs under a
deadline (a timer signal), so a loader that iterates per claimed unit fails
instead of hanging.
"""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_masks_at_rest import bit_equal, random_mask

import funcprune as fp

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

Tensor = torch.Tensor
#: What "at once" means here: well under a second is expected; the deadline leaves room for a busy machine.
DEADLINE = 5.0


@contextmanager
def deadline(seconds: float = DEADLINE) -> Iterator[None]:
    """Raise TimeoutError in the block if it runs longer than ``seconds`` (a loop per claimed unit never ends)."""

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def with_metadata(path: Path, data: bytes, record: str) -> None:
    """``data`` (a safetensors file) with its funcprune record replaced by the JSON text ``record``, at ``path``."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header["__metadata__"]["funcprune.masks"] = "@RECORD@"
    raw = json.dumps(header).replace('"@RECORD@"', json.dumps(record)).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])


def record_of(data: bytes) -> dict[str, Any]:
    (n,) = struct.unpack("<Q", data[:8])
    record: dict[str, Any] = json.loads(json.loads(data[8 : 8 + n])["__metadata__"]["funcprune.masks"])
    return record


def refused_or_saved(
    load: Callable[[], dict[str, Tensor]], path: Path, saved: dict[str, Tensor], *, reshaped: bool = False
) -> str:
    """``"refused"`` if ``load()`` raises the ValueError naming ``path``, ``"saved"`` if it gives ``saved`` exactly.

    ``reshaped``: the edit was to a shape, which may give the bits saved in another shape of as many entries
    (a record consistent with itself: the checksums cover the bits, not the shapes).
    """
    try:
        with deadline():
            got = load()
    except ValueError as err:
        assert str(path) in str(err) and len(str(err)) < 2000, err
        return "refused"
    if reshaped:
        got = {k: v.reshape(saved[k].shape) if k in saved and v.numel() == saved[k].numel() else v for k, v in got.items()}
    assert bit_equal(saved, got), got
    return "saved"


def block_file(mesh: DeviceMesh, directory: Path, shape: tuple[int, ...] = (8, 4)) -> tuple[bytes, dict[str, Tensor]]:
    """The bytes of a masks file holding a DTensor mask's block (the whole mask, on a mesh of one) and a plain mask."""
    from torch.distributed.tensor import Shard, distribute_tensor

    whole = {"w": random_mask(shape, 0), "b": random_mask((3,), 1)}
    path = directory / "block.safetensors"
    fp.save_masks({"w": distribute_tensor(whole["w"], mesh, [Shard(0)]), "b": whole["b"]}, path)
    return path.read_bytes(), whole


def block_edited(**changes: object) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def edit(record: dict[str, Any]) -> dict[str, Any]:
        record["masks"][0]["dtensor"].update(changes)
        return record

    return edit


# Items 8 and 9: a split factor, a mesh, a shape that would take forever to visit


@pytest.mark.parametrize(
    ("shape", "edit", "message"),
    [
        # a split factor of 10**12 on 8 rows: 8 pieces hold entries, the block is where it says: the masks saved
        ((8, 4), block_edited(placements=["_StridedShard(0, split_factor=1000000000000)"]), None),
        # and on 10**12 rows: more strided pieces than any mesh cuts
        ((8, 4), block_edited(placements=["_StridedShard(0, split_factor=1000000000000)"], shape=[10**12, 4]),
         r"into more than 65536 strided pieces"),
        # a split factor with more digits than an int64: no placement
        ((8, 4), block_edited(placements=["_StridedShard(0, split_factor=" + "9" * 5000 + ")"]),
         r"expected a placement .* got '_StridedShard\(0, split_factor=9999"),
        ((8, 4), block_edited(placements=["Shard(" + "9" * 30 + ")"]), r"expected a placement"),
        # a mesh of 10**9 processes whose first holds the only row: the masks saved, whole when merged
        ((1, 4), block_edited(mesh=[10**9]), None),
        # huge offsets, coordinates and meshes that do not give this block
        ((8, 4), block_edited(offsets=[10**18, 0]), r"is not the one its placements"),
        ((8, 4), block_edited(mesh=[10**18], coordinate=[10**18 - 1]), r"is not the one its placements"),
        ((8, 4), block_edited(mesh=[2**64]), r"expected an int from 0 to 2\*\*63 - 1, got 18446744073709551616"),
        ((8, 4), block_edited(shape=[10**30, 4]), r"expected an int from 0 to 2\*\*63 - 1"),
        ((8, 4), block_edited(shape=[2**40, 2**40]), r"is larger than torch can hold"),
        ((8, 4), block_edited(rank=True), r"expected an int"),
        ((8, 4), block_edited(mesh=[-1]), r"expected an int"),
    ],
)
def test_absurd_block_records_are_refused_or_read_as_saved_at_once(
    mesh: DeviceMesh, tmp_path: Path, shape: tuple[int, ...], edit: Callable[[dict[str, Any]], dict[str, Any]],
    message: str | None,
) -> None:  # fmt: skip
    data, whole = block_file(mesh, tmp_path, shape)
    bad = tmp_path / "edited.safetensors"
    with_metadata(bad, data, json.dumps(edit(record_of(data))))
    start = time.perf_counter()
    if message is None:
        assert refused_or_saved(lambda: fp.load_masks(bad), bad, whole) == "saved"
        assert refused_or_saved(lambda: fp.load_masks([bad, bad]), bad, whole) == "saved"
    else:
        pattern = rf"load_masks: '{re.escape(str(bad))}' is not a masks file .*{message}"
        for path in (bad, [bad]):
            with pytest.raises(ValueError, match=pattern), deadline():
                fp.load_masks(path)
    assert time.perf_counter() - start < DEADLINE


def test_merging_a_file_that_claims_a_mesh_of_a_billion_visits_no_coordinate_it_does_not_hold(
    mesh: DeviceMesh, tmp_path: Path
) -> None:
    """The file's block is the first row of 2, or of one row per process, on a mesh of 10**7 to 10**18 processes:
    the others are missing. (10**7: small enough that a loader that holds every coordinate fails by the deadline
    rather than by running out of memory.)"""
    data, _ = block_file(mesh, tmp_path, (1, 4))
    bad = tmp_path / "billion.safetensors"
    for processes, rows in ((10**7, 2), (10**7, 10**7), (10**9, 10**9), (10**18, 2)):
        with_metadata(bad, data, json.dumps(block_edited(mesh=[processes], shape=[rows, 4])(record_of(data))))
        assert fp.load_masks(bad)["w"].shape == (1, 4)  # the block, plainly
        tracemalloc.start()
        try:
            with pytest.raises(ValueError, match=r"load_masks: the mask 'w': no file holds its block \[1:2, 0:4\], "
                               r"that of mesh coordinate \(1,\); give every process's file \(these hold coordinates "
                               r"\(0,\)\)"), deadline():  # fmt: skip
                fp.load_masks([bad])
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 2**20, peak  # nothing per coordinate of the mesh, nor the claimed whole mask


# Item 12: shapes torch cannot hold, JSON nested too deep, values too long to show


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.replace('"shape":[0]', '"shape":[' + str(10**30) + ",0]"), r"got 10000000000000000000000000"),
        (lambda r: r.replace('"shape":[0]', f'"shape":[{2**40},{2**40},0]'), r"larger than torch can hold"),
        (lambda r: r.replace('"shape":[0]', f'"shape":[0,{2**62},4]'), r"larger than torch can hold"),
        (lambda r: r.replace('"shape":[0]', '"shape":[-1]'), r"expected an int"),
        (lambda r: r.replace('"shape":[0]', '"shape":[false]'), r"expected an int"),
        (lambda r: r.replace('"shape":[0]', '"shape":' + "[" * 100_000 + "]" * 100_000), r"metadata is not JSON"),
        (lambda r: r.replace('"shape":[0]', '"shape":' + "[" * 400 + "]" * 400), r"expected an int"),
        (lambda r: "[" * 100_000 + "]" * 100_000, r"metadata is not JSON"),
        (lambda r: '{"a":' * 100_000 + "1" + "}" * 100_000, r"metadata is not JSON"),
        (lambda r: r.replace('"version":1', '"version":' + "9" * 5000), r"metadata is not JSON"),
        (lambda r: r.replace('"version":1', '"version":"' + "9" * 100_000 + '"'), r"format version '9999"),
    ],
)
def test_absurd_shapes_and_nesting_are_refused_naming_the_file(
    tmp_path: Path, edit: Callable[[str], str], message: str
) -> None:
    path = tmp_path / "good.safetensors"
    fp.save_masks({"e": torch.zeros(0, dtype=torch.bool), "w": random_mask((3, 5), 2)}, path)
    data = path.read_bytes()
    text = json.dumps(record_of(data), separators=(",", ":"))
    assert '"shape":[0]' in text and '"version":1' in text
    bad = tmp_path / "edited.safetensors"
    with_metadata(bad, data, edit(text))
    with pytest.raises(ValueError, match=rf"load_masks: '{re.escape(str(bad))}' is not a masks file .*{message}") as err, \
            deadline():  # fmt: skip
        fp.load_masks(bad)
    assert len(str(err.value)) < 1000  # a value too long or too deep is shown cut


def test_packed_shapes_torch_cannot_hold_are_refused() -> None:
    packed = {"w": torch.zeros(0, dtype=torch.uint8), "w::shape": torch.tensor([2**40, 2**40, 0])}
    with pytest.raises(ValueError, match=r"unpack_masks: packed\['w::shape'\] is a shape larger than torch can hold"):
        fp.unpack_masks(packed)


# Any edit of the metadata: the ValueError naming the file, or the masks saved


def _leaves(value: object, at: tuple[object, ...] = ()) -> Iterator[tuple[object, ...]]:
    """The path to every value in a JSON record (containers included)."""
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*at, i))


_NUMBERS = st.sampled_from([0, 1, 2, 3, 7, 8, -1, 2**31, 2**63 - 1, 2**63, 2**64, 10**12, 10**30, -(10**30)])
_PLACEMENTS = st.sampled_from([
    "Shard(0)", "Shard(1)", "Replicate()", "Partial()", "Shard(9)", "_StridedShard(0, split_factor=1000000000000)",
    "_StridedShard(1, split_factor=3)", "_StridedShard(0, split_factor=" + "9" * 30 + ")",
])  # fmt: skip
#: A replacement, as JSON text: numbers, other types, strings, lists of numbers, and nesting (too deep for JSON too).
_REPLACEMENTS = st.one_of(
    _NUMBERS.map(str), st.integers(-(2**70), 2**70).map(str), st.sampled_from(["true", "false", "null", "1.5", "1e400"]),
    _PLACEMENTS.map(json.dumps), st.text(max_size=8).map(json.dumps),
    st.lists(_NUMBERS, max_size=4).map(json.dumps), st.lists(_PLACEMENTS, max_size=3).map(json.dumps),
    st.integers(1, 200_000).map(lambda depth: "[" * depth + "]" * depth),
    st.integers(1, 200_000).map(lambda depth: '{"a":' * depth + "0" + "}" * depth),
)


@pytest.fixture(scope="module")
def files(mesh: DeviceMesh) -> Iterator[dict[str, tuple[bytes, dict[str, Tensor]]]]:
    """A plain masks file and one of DTensor blocks (masks with no size 0: one a size 0 leaves empty is empty
    whatever its other sizes, and no bit of the file can tell them apart)."""
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "plain.safetensors"
        masks = {"layer.weight": random_mask((5, 13), 0), "b": random_mask((3,), 1), "s": torch.tensor(True)}
        fp.save_masks(masks, plain)
        yield {"plain": (plain.read_bytes(), masks), "blocks": block_file(mesh, Path(tmp))}


@given(which=st.sampled_from(["plain", "blocks"]), pick=st.integers(0, 10**6), replacement=_REPLACEMENTS)
def test_any_edit_of_the_metadata_is_refused_naming_the_file_or_harmless(
    files: dict[str, tuple[bytes, dict[str, Tensor]]], which: str, pick: int, replacement: str
) -> None:
    data, masks = files[which]
    record = record_of(data)
    paths = list(_leaves(record))
    at = paths[pick % len(paths)]
    if not at:
        text = replacement
    else:
        parent: Any = record
        for key in at[:-1]:
            parent = parent[key]
        parent[at[-1]] = "@EDIT@"
        text = json.dumps(record, separators=(",", ":")).replace('"@EDIT@"', replacement)
    with tempfile.TemporaryDirectory() as tmp:
        bad = Path(tmp) / "edited.safetensors"
        with_metadata(bad, data, text)
        reshaped = "shape" in at
        refused_or_saved(lambda: fp.load_masks(bad), bad, masks, reshaped=reshaped)
        refused_or_saved(lambda: fp.load_masks([bad]), bad, masks, reshaped=reshaped)
        os.remove(bad)
