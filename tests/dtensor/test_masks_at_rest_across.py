"""Masks at rest on DTensor masks, on worlds of 2 and 4 gloo processes.

Each process saves (or packs) its own block of each mask, with where it sits,
to its own file; loaded with ``like=`` (the mesh, or the masks as
parameters) on the process that saved it, each mask is the DTensor saved,
bit for bit (placements, mesh, blocks); every process's files merge, on one
process, into the whole masks (``full_tensor()``); a file is its blocks'
bits and a bounded header; what does not fit (another placement, shape,
mesh, process, or files that do not make up the masks) is refused with an
error naming the file, the mask, what was saved and what was found.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _distributed import World

import funcprune as fp

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed with gloo"
)

if dist.is_available():
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import (
        DTensor,
        Placement,
        Replicate,
        Shard,
        distribute_tensor,
    )
    from torch.distributed.tensor.placement_types import _StridedShard

Tensor = torch.Tensor
Case = tuple[tuple[int, ...], list["Placement"]]


def whole(shape: tuple[int, ...], seed: int) -> Tensor:
    """A mask of ``shape``, the same on every process."""
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < 0.5


def block(mask: Tensor, mesh_shape: tuple[int, ...], coordinate: Sequence[int], placements: list[Placement]) -> Tensor:
    """The block of ``mask`` at ``coordinate``, split mesh dim by mesh dim by the placements' own splits."""
    out = mask
    for i, p in enumerate(placements):
        if isinstance(p, (Shard, _StridedShard)):
            pieces, _ = p._split_tensor(out, mesh_shape[i], with_padding=False)
            out = pieces[coordinate[i]]
    return out.contiguous()


def dtensor(mask: Tensor, mesh: DeviceMesh, placements: list[Placement]) -> Tensor:
    """``mask`` as a DTensor laid out as ``placements`` (nothing communicated)."""
    coordinate = mesh.get_coordinate()
    assert coordinate is not None
    local = block(mask, tuple(mesh.shape), coordinate, placements)
    return DTensor.from_local(local, mesh, placements, run_check=False, shape=mask.shape, stride=mask.stride())


def dtensors(cases: dict[str, Case], mesh: DeviceMesh) -> dict[str, Tensor]:
    return {name: dtensor(whole(shape, i), mesh, cut) for i, (name, (shape, cut)) in enumerate(cases.items())}


def header_bound(masks: dict[str, Tensor]) -> int:
    """The header bound save_masks documents, for ASCII names."""
    bound = 8 + 256
    for name, m in masks.items():
        bound += 256 + 2 * len(name) + 24 * m.dim()
        if isinstance(m, DTensor):
            bound += 192 + 24 * m.dim() + 64 * m.device_mesh.ndim
    return bound


def local(m: Tensor) -> Tensor:
    return m.to_local() if isinstance(m, DTensor) else m


def same(expected: dict[str, Tensor], got: dict[str, Tensor]) -> None:
    """``got`` is ``expected``, bit for bit: DTensors of the same mesh, placements, shape and blocks."""
    assert list(got) == list(expected)
    for name, m in expected.items():
        g = got[name]
        assert type(g) is type(m) and g.dtype == torch.bool and g.shape == m.shape, name
        if isinstance(m, DTensor):
            assert isinstance(g, DTensor) and g.device_mesh == m.device_mesh and g.placements == m.placements, name
        assert torch.equal(local(g), local(m).bool()), name


def round_trip(masks: dict[str, Tensor], mesh: DeviceMesh, path: str) -> dict[str, Any]:
    """Save this process's blocks to ``path`` and load them back every way; the file and the whole masks."""
    fp.save_masks(masks, path)
    for like in (mesh, masks):
        same(masks, fp.load_masks(path, like=like))
        same(masks, fp.unpack_masks(fp.pack_masks(masks), like=like))
    as_saved = fp.load_masks(path)  # no like: each block plainly
    assert list(as_saved) == list(masks) and all(torch.equal(as_saved[n], local(m)) for n, m in masks.items())
    data = sum(math.ceil(local(m).numel() / 8) for m in masks.values())
    return {
        "path": path,
        "size": os.path.getsize(path),
        "bound": data + header_bound(masks),
        "full": {n: m.full_tensor() if isinstance(m, DTensor) else m for n, m in masks.items()},
    }


def merged_is(paths: list[str], full: dict[str, Tensor]) -> None:
    merged = fp.load_masks(paths)
    assert list(merged) == list(full)
    for name, m in full.items():
        assert merged[name].dtype == torch.bool and torch.equal(merged[name], m), name


def refused(call: Callable[[], object]) -> str:
    try:
        call()
    except ValueError as err:
        return str(err)
    return "not refused"


# --- 2 processes, a 1-D mesh ---------------------------------------------------------------


def _cases_1d() -> dict[str, Case]:
    return {
        "fsdp.weight": ((7, 5), [Shard(0)]),  # FSDP2's: 4 rows and 3
        "col.weight": ((3, 9), [Shard(1)]),  # 5 columns and 4
        "rep.bias": ((6,), [Replicate()]),
        "tiny.weight": ((1, 3), [Shard(0)]),  # rank 1's block is empty
        "scale": ((), [Replicate()]),
    }


def _save_1d(rank: int, size: int, tmp: str) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (size,))
    masks = dtensors(_cases_1d(), mesh)
    masks["plain.weight"] = whole((4, 4), 99)  # not a DTensor: every process saves it whole
    return round_trip(masks, mesh, os.path.join(tmp, f"masks.{rank}.safetensors"))


def _resume(rank: int, size: int, path: str) -> None:
    """The merged file, loaded like the DTensors on each process: each takes its block."""
    mesh = init_device_mesh("cpu", (size,))
    masks = dtensors(_cases_1d(), mesh)
    masks["plain.weight"] = whole((4, 4), 99)
    same(masks, fp.load_masks(path, like=masks))


def test_each_process_saves_its_blocks_and_gets_its_dtensors_back(world2: World, tmp_path: Any) -> None:
    answers = world2.run(_save_1d, str(tmp_path))
    for a in answers:
        assert a["size"] <= a["bound"], a
    full = answers[0]["full"]
    paths = [a["path"] for a in answers]
    merged_is(paths, full)
    merged_is(paths[::-1], full)
    one = str(tmp_path / "whole.safetensors")
    fp.save_masks(fp.load_masks(paths), one)  # one whole file, for one machine
    merged_is([one], full)
    world2.run(_resume, one)  # and back to the processes, each taking its block


def test_merging_needs_every_block(world2: World, tmp_path: Any) -> None:
    answers = world2.run(_save_1d, str(tmp_path))
    paths = [a["path"] for a in answers]
    message = refused(lambda: fp.load_masks(paths[:1]))
    assert message.startswith("load_masks: the mask 'fsdp.weight': no file holds its block [4:7, 0:5], that of mesh "
                              "coordinate (1,); give every process's file (these hold coordinates (0,))"), message
    merged_is([paths[0], *paths], answers[0]["full"])  # a file twice: copies that agree


def _refusals(rank: int, size: int, tmp: str) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (size,))
    mask = dtensor(whole((7, 5), 0), mesh, [Shard(0)])
    path = os.path.join(tmp, f"refuse.{rank}.safetensors")
    fp.save_masks({"w": mask}, path)
    fp.save_masks({"w": dtensor(whole((7, 5), 0), mesh, [Shard(1)])}, os.path.join(tmp, f"other.{rank}.safetensors"))
    dist.barrier()  # every file written before a process reads another's
    like_2x1 = init_device_mesh("cpu", (size, 1))
    return {
        "path": path,
        "placement": refused(lambda: fp.load_masks(path, like={"w": dtensor(torch.zeros(7, 5), mesh, [Shard(1)])})),
        "shape": refused(lambda: fp.load_masks(path, like={"w": dtensor(torch.zeros(8, 5), mesh, [Shard(0)])})),
        "process": refused(lambda: fp.load_masks(os.path.join(tmp, f"refuse.{1 - rank}.safetensors"), like=mesh)),
        "mesh": refused(lambda: fp.load_masks(path, like=like_2x1)),
        "plain": refused(lambda: fp.load_masks(path, like={"w": torch.zeros(7, 5)})),
        "packed": refused(lambda: fp.unpack_masks(
            fp.pack_masks({"w": mask}), like={"w": distribute_tensor(torch.zeros(7, 5), mesh, [Replicate()])}
        )),
    }  # fmt: skip


def test_what_does_not_fit_is_refused_naming_the_file_the_mask_and_both_layouts(world2: World, tmp_path: Any) -> None:
    answers = world2.run(_refusals, str(tmp_path))
    for rank, a in enumerate(answers):
        path = re.escape(repr(a["path"]))
        saved = (rf"the mask 'w' is the block at mesh coordinate \({rank},\) \(rank {rank}\) of a mask of shape "
                 r"\(7, 5\) laid out as \[Shard\(0\)\] on a mesh of shape \(2,\)")  # fmt: skip
        expected = {
            "placement": rf"load_masks: {path}: {saved}, but like\['w'\] is the block at mesh coordinate \({rank},\) "
            rf"\(rank {rank}\) of a tensor of shape \(7, 5\) laid out as \[Shard\(1\)\] on a mesh of shape \(2,\); "
            "load .* or merge every process's files",
            "shape": rf"load_masks: {path}: {saved}, but like\['w'\] is .* of a tensor of shape \(8, 5\) laid out as "
            r"\[Shard\(0\)\]",
            "process": rf"load_masks: '.*refuse\.{1 - rank}\.safetensors': the mask 'w' is the block at mesh "
            rf"coordinate \({1 - rank},\) \(rank {1 - rank}\) .*, but this process is at coordinate \({rank},\) of a "
            r"mesh of shape \(2,\)",
            "mesh": rf"load_masks: {path}: {saved}, but this process is at coordinate \({rank}, 0\) of a mesh of "
            r"shape \(2, 1\)",
            "plain": rf"load_masks: {path}: {saved}, but like\['w'\] is a plain tensor of shape \(7, 5\)",
            "packed": r"unpack_masks: packed: the mask 'w' is .*, but like\['w'\] is .* laid out as \[Replicate\(\)\]",
        }
        for key, pattern in expected.items():
            assert re.match(pattern, a[key]), (key, a[key])
    message = refused(lambda: fp.load_masks([answers[0]["path"], str(tmp_path / "other.1.safetensors")]))
    assert re.match(
        r"load_masks: the mask 'w' is a block of a mask of shape \(7, 5\) laid out as \[Shard\(0\)\] on a mesh of "
        r"shape \(2,\) in '.*refuse\.0\.safetensors' but a block of a mask of shape \(7, 5\) laid out as "
        r"\[Shard\(1\)\] on a mesh of shape \(2,\) in '.*other\.1\.safetensors'", message
    ), message


# --- 4 processes, a 2x2 mesh ---------------------------------------------------------------


def _cases_2d() -> dict[str, Case]:
    return {
        "tp.weight": ((7, 5), [Shard(0), Shard(1)]),
        "hsdp.weight": ((7, 5), [Replicate(), Shard(0)]),  # HSDP: copies along mesh dim 0
        "twice.weight": ((7, 3), [Shard(0), Shard(0)]),  # rows 0-1, 2-3, 4-5, 6
        "fsdp_tp.weight": ((8, 3), [_StridedShard(0, split_factor=2), Shard(0)]),  # FSDP2 over TP: rows 0-1, 4-5, ...
    }


def _save_2d(rank: int, size: int, tmp: str) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (2, size // 2))
    masks = dtensors(_cases_2d(), mesh)
    answer = round_trip(masks, mesh, os.path.join(tmp, f"mesh.{rank}.safetensors"))
    hsdp = masks["hsdp.weight"]
    assert isinstance(hsdp, DTensor)
    fp.save_masks({"hsdp.weight": hsdp}, os.path.join(tmp, f"hsdp.{rank}.safetensors"))
    if rank == 2:  # a copy of rank 0's block that is not one
        odd = DTensor.from_local(~hsdp.to_local(), mesh, hsdp.placements, run_check=False, shape=hsdp.shape,
                                 stride=hsdp.stride())  # fmt: skip
        fp.save_masks({"hsdp.weight": odd}, os.path.join(tmp, "odd.2.safetensors"))
    return answer


def test_blocks_on_a_2x2_mesh_round_trip_and_merge(world4: World, tmp_path: Any) -> None:
    answers = world4.run(_save_2d, str(tmp_path))
    for a in answers:
        assert a["size"] <= a["bound"], a
    full = answers[0]["full"]
    merged_is([a["path"] for a in answers], full)
    hsdp = [str(tmp_path / f"hsdp.{rank}.safetensors") for rank in range(4)]
    merged_is(hsdp[:2], {"hsdp.weight": full["hsdp.weight"]})  # one replica's files hold every block
    merged_is(hsdp[2:], {"hsdp.weight": full["hsdp.weight"]})
    message = refused(lambda: fp.load_masks([hsdp[0], hsdp[2]]))
    assert message.startswith("load_masks: the mask 'hsdp.weight': no file holds its block [4:7, 0:5], that of "
                              "mesh coordinate (0, 1) or (1, 1)"), message
    message = refused(lambda: fp.load_masks([*hsdp[:2], str(tmp_path / "odd.2.safetensors")]))
    assert re.match(r"load_masks: the mask 'hsdp.weight': the copies of its block \[0:4, 0:5\] differ between "
                    r"'.*hsdp\.0\.safetensors' and '.*odd\.2\.safetensors'", message), message
