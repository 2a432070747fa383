"""Sparsity reports of DTensor masks and modules: the report of the whole tensors on every process.

Two settings, cheapest first:

- in this process, a gloo group of 1 (1-process meshes of 1 and 2 dims):
  reports of DTensor masks, of masks with ``params=``, and of FSDP2 modules
  equal the reports of the whole tensors (a hypothesis property), and every
  refusal happens before anything crosses processes;
- a world of 4 processes (``tests/_distributed.py``): ``Shard(0)``,
  ``Shard(1)`` and ``Replicate()`` on a mesh of 4, uneven and empty blocks,
  the placements of a 2x2 mesh, an FSDP2 model, and masks on several meshes:
  every process gets the report of the whole masks, through one int64
  ``all_reduce`` per mesh dim per mesh and nothing else.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

import funcprune as fp
from _distributed import World

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed with gloo"
)

if dist.is_available():
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    from torch.distributed.tensor.debug import CommDebugMode

#: A layout: one entry per mesh dim, ``Shard(d)`` for an int ``d`` and ``Replicate()`` for ``None``.
Dims = tuple[int | None, ...]


def placements_of(dims: Dims) -> list[Placement]:
    return [Replicate() if d is None else Shard(d) for d in dims]


def distribute(t: torch.Tensor, mesh: DeviceMesh, dims: Dims) -> torch.Tensor:
    """This process's block of ``t`` as a DTensor laid out as ``dims`` (no communication)."""
    placements = placements_of(dims)
    size, offsets = compute_local_shape_and_global_offset(t.shape, mesh, placements)
    local = t[tuple(slice(o, o + n) for o, n in zip(offsets, size, strict=True))]
    return DTensor.from_local(
        local.contiguous(), mesh, placements, run_check=False, shape=t.shape, stride=t.contiguous().stride()
    )


def distributed(
    tensors: Mapping[str, torch.Tensor], layouts: Mapping[str, Dims | None], mesh: DeviceMesh
) -> dict[str, torch.Tensor]:
    """``tensors`` as DTensors laid out as ``layouts`` says (``None``: left a plain tensor)."""
    return {n: t if layouts[n] is None else distribute(t, mesh, layouts[n] or ()) for n, t in tensors.items()}


def comm_counts(mode: CommDebugMode) -> dict[str, int]:
    """How many of each collective ``mode`` saw (any process group)."""
    return {str(op): n for op, n in mode.get_comm_counts().items()}


def comm_mode() -> CommDebugMode:
    return CommDebugMode()  # type: ignore[no-untyped-call]


def assert_same_report(got: fp.SparsityReport, expected: fp.SparsityReport) -> None:
    assert got.rows == expected.rows
    assert str(got) == str(expected)


# --- one process: a gloo group of 1 -------------------------------------------------


@st.composite
def _masks(draw: st.DrawFn, ndim: int) -> tuple[dict[str, torch.Tensor], dict[str, Dims | None]]:
    """1 to 4 masks (empty ones included), each plain (bool or 0/1 numbers) or laid out on ``ndim`` mesh dims."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    masks: dict[str, torch.Tensor] = {}
    layouts: dict[str, Dims | None] = {}
    for i in range(draw(st.integers(1, 4))):
        shape = draw(st.lists(st.integers(0, 5), max_size=3))
        mask = torch.rand(shape, generator=g) < draw(st.floats(0.0, 1.0))
        dims = st.tuples(*[st.sampled_from([None, *range(len(shape))])] * ndim)
        layouts[f"m{i}"] = draw(dims) if draw(st.sampled_from(["dtensor", "plain", "dtensor"])) != "plain" else None
        dtype = torch.bool if layouts[f"m{i}"] is not None else draw(st.sampled_from([torch.bool, torch.float32]))
        masks[f"m{i}"] = mask.to(dtype)
    return masks, layouts


def _several() -> tuple[dict[str, torch.Tensor], dict[str, Dims | None]]:
    """DTensor masks of 3 layouts, one of them empty, beside a plain one of 0/1 numbers."""
    g = torch.Generator().manual_seed(0)
    masks = {"a": torch.rand(3, 4, generator=g) < 0.5, "b": torch.rand(2, 5, generator=g) < 0.5}
    masks |= {"c": torch.tensor([1.0, 0.0]), "d": torch.zeros(0, 3, dtype=torch.bool), "e": torch.tensor(False)}
    return masks, {"a": (0,), "b": (1,), "c": None, "d": (0,), "e": (None,)}


@settings(max_examples=15)
@example(example=_several(), unmasked=True)
@given(example=st.integers(1, 2).flatmap(_masks), unmasked=st.booleans())
def test_reports_on_a_mesh_of_one_are_the_reports_of_the_whole_masks(
    mesh: DeviceMesh, example: tuple[dict[str, torch.Tensor], dict[str, Dims | None]], unmasked: bool
) -> None:
    masks, layouts = example
    on = mesh if all(d is None or len(d) == 1 for d in layouts.values()) else init_device_mesh("cpu", (1, 1))
    dmasks = distributed(masks, layouts, on)
    params = {n: torch.randn(m.shape) for n, m in masks.items()}
    if unmasked:  # a parameter without a mask: a row of 0 pruned
        params["extra"], layouts["extra"] = torch.randn(2, 3), (0,) * on.ndim
    dparams = distributed(params, layouts, on)
    with comm_mode() as comm:
        got = fp.sparsity_report(dmasks)
        with_params = fp.sparsity_report(dmasks, params=dparams)
    assert_same_report(got, fp.sparsity_report(masks))
    assert_same_report(with_params, fp.sparsity_report(masks, params=params))
    dtensors = sum(d is not None for n, d in layouts.items() if n in masks)
    assert comm_counts(comm) == ({"c10d.allreduce_": 2 * on.ndim} if dtensors else {})


def test_a_module_with_dtensor_parameters_reports_the_zeros_of_the_whole_parameters(mesh: DeviceMesh) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    kept = {"0.weight": torch.rand(5, 3) < 0.5, "2.bias": torch.tensor([True, False])}
    fp.apply_masks_(dict(reference.named_parameters()), kept)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    model.load_state_dict(reference.state_dict())
    fully_shard(model[0], mesh=mesh)  # its parameters become DTensors; the last layer's stay plain
    assert isinstance(model[0].weight, DTensor) and not isinstance(model[2].weight, DTensor)
    with comm_mode() as comm:
        got = fp.sparsity_report(model)
    assert_same_report(got, fp.sparsity_report(reference))
    assert got["0.weight"].pruned > 0 and got["2.bias"].pruned == 1
    assert comm_counts(comm) == {"c10d.allreduce_": 1}  # the 2 DTensors of one mesh, together


def test_a_dtensor_mask_that_is_not_bool_is_refused(mesh: DeviceMesh) -> None:
    t = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    w = distribute(t, mesh, (0,))
    expected = r"^sparsity_report: the mask for 'w' is a DTensor of dtype torch.float32; DTensor masks must be torch.bool"
    with pytest.raises(TypeError, match=expected + r" .*convert it with `mask != 0`"):
        fp.sparsity_report({"w": w})
    with pytest.raises(TypeError, match=expected):
        fp.sparsity_report({"w": w}, params={"w": distribute(t, mesh, (0,))})


def test_masks_laid_out_otherwise_than_their_parameters_are_refused(mesh: DeviceMesh) -> None:
    t = torch.randn(4, 4)
    kept = t > 0
    plain = "a plain torch.Tensor"
    with pytest.raises(TypeError, match=rf"^sparsity_report: the mask for 'w' is a DTensor but the parameter is {plain}"):
        fp.sparsity_report({"w": distribute(kept, mesh, (0,))}, params={"w": t})
    with pytest.raises(TypeError, match=rf"^sparsity_report: the mask for 'w' is {plain} but the parameter is a DTensor"):
        fp.sparsity_report({"w": kept}, params={"w": distribute(t, mesh, (0,))})
    other = r"is laid out as \[Shard\(dim=1\)\] on .* but the parameter as \[Shard\(dim=0\)\] on .*; they must have the same mesh and placements"
    with pytest.raises(ValueError, match="^sparsity_report: the mask for 'w' " + other):
        fp.sparsity_report({"w": distribute(kept, mesh, (1,))}, params={"w": distribute(t, mesh, (0,))})


def test_refusals_come_before_anything_crosses_processes(mesh: DeviceMesh) -> None:
    kept = torch.rand(4, 4) < 0.5
    good = distribute(kept, mesh, (0,))
    partial = DTensor.from_local(kept, mesh, [Partial()], run_check=False, shape=kept.shape, stride=kept.stride())
    cut = DTensor.from_local(kept[:3], mesh, [Shard(0)], run_check=False, shape=kept.shape, stride=kept.stride())
    with comm_mode() as comm:
        with pytest.raises(NotImplementedError, match=r"^sparsity_report: the mask for 'b' is a DTensor laid out as \[Partial"):
            fp.sparsity_report({"a": good, "b": partial})
        with pytest.raises(ValueError, match=r"^sparsity_report: the mask for 'b' holds a block of shape \(3, 4\)"):
            fp.sparsity_report({"a": good, "b": cut})
        with pytest.raises(TypeError, match=r"^sparsity_report: the mask for 'b' is a DTensor of dtype torch.int64"):
            fp.sparsity_report({"a": good, "b": distribute(kept.long(), mesh, (0,))})
    assert comm_counts(comm) == {}


# --- 4 processes ----------------------------------------------------------------------


Answer = tuple[fp.SparsityReport, dict[str, int]]


def _report_on_ranks(
    rank: int, size: int, mesh_shape: tuple[int, ...], masks: dict[str, torch.Tensor], layouts: dict[str, Dims | None]
) -> Answer:
    """On each rank: the report of its blocks of ``masks``, and the collectives it took."""
    mesh = init_device_mesh("cpu", mesh_shape)
    dmasks = distributed(masks, layouts, mesh)
    with comm_mode() as comm:
        report = fp.sparsity_report(dmasks)
    return report, comm_counts(comm)


def _uneven(g: torch.Generator) -> dict[str, torch.Tensor]:
    """Masks whose blocks over 4 processes are uneven or empty, an empty mask and a scalar."""
    shapes = {"rows": (5, 3), "cols": (2, 7), "few": (3,), "one": (1, 2), "none": (0, 4), "scalar": ()}
    return {n: torch.rand(s, generator=g) < 0.6 for n, s in shapes.items()}


_LAYOUTS_4: dict[str, Dims | None] = {
    "rows": (0,), "cols": (1,), "few": (0,), "one": (None,), "none": (1,), "scalar": (None,),
}  # fmt: skip
_LAYOUTS_2x2: list[tuple[int | None, int | None]] = [(None, 0), (0, 1), (0, 0), (None, None)]


@pytest.mark.parametrize("mesh_shape", [(4,), (2, 2)], ids=["mesh 4", "mesh 2x2"])
def test_every_process_gets_the_report_of_the_whole_masks(world4: World, mesh_shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(len(mesh_shape))
    masks = _uneven(g)
    if mesh_shape == (4,):
        layouts = dict(_LAYOUTS_4)
    else:  # every 2x2 layout on a mask with uneven blocks, and on a 2-D copy of each other mask
        layouts = {n: _LAYOUTS_2x2[i % 4] if masks[n].dim() == 2 else (None, None) for i, n in enumerate(masks)}
        for dims in _LAYOUTS_2x2:
            masks[f"7x5 {dims}"], layouts[f"7x5 {dims}"] = torch.rand(7, 5, generator=g) < 0.5, dims
    masks["plain"], layouts["plain"] = torch.tensor([1.0, 0.0, 0.0]), None  # counted where it is
    expected = fp.sparsity_report(masks)
    answers: list[Answer] = world4.run(_report_on_ranks, mesh_shape, masks, layouts)
    for report, comm in answers:
        assert_same_report(report, expected)
        assert comm == {"c10d.allreduce_": len(mesh_shape)}  # all the masks in one vector
    assert 0 < expected.pruned < expected.numel


@st.composite
def _masks_4(draw: st.DrawFn) -> tuple[tuple[int, ...], dict[str, torch.Tensor], dict[str, Dims | None]]:
    mesh_shape = draw(st.sampled_from([(4,), (2, 2)]))
    masks, layouts = draw(_masks(len(mesh_shape)))
    return mesh_shape, masks, layouts


@settings(max_examples=5)
@given(example=_masks_4())
def test_random_masks_on_4_processes_report_as_one_process(
    world4: World, example: tuple[tuple[int, ...], dict[str, torch.Tensor], dict[str, Dims | None]]
) -> None:
    mesh_shape, masks, layouts = example
    answers: list[Answer] = world4.run(_report_on_ranks, mesh_shape, masks, layouts)
    calls = {"c10d.allreduce_": len(mesh_shape)} if any(d is not None for d in layouts.values()) else {}
    for report, comm in answers:
        assert_same_report(report, fp.sparsity_report(masks))
        assert comm == calls


def _meshes_on_ranks(rank: int, size: int, masks: dict[str, torch.Tensor]) -> Answer:
    """On each rank: a report of masks on 4 meshes, two of them equal, one on 2 dims, and a plain mask."""
    line, again = init_device_mesh("cpu", (4,)), init_device_mesh("cpu", (4,))
    named, square = init_device_mesh("cpu", (4,), mesh_dim_names=("tp",)), init_device_mesh("cpu", (2, 2))
    assert line == again and line != named
    on = {"a": (line, (0,)), "b": (square, (0, 1)), "c": (again, (None,)), "d": (named, (1,)), "e": (square, (1, None))}
    dmasks = {n: distribute(masks[n], *on[n]) if n in on else masks[n] for n in masks}
    with comm_mode() as comm:
        report = fp.sparsity_report(dmasks)
    return report, comm_counts(comm)


def test_masks_on_several_meshes_take_one_reduction_per_mesh(world4: World) -> None:
    g = torch.Generator().manual_seed(3)
    masks = {n: torch.rand(5, 6, generator=g) < 0.4 for n in "abcdef"}  # "f" stays plain
    expected = fp.sparsity_report(masks)
    for report, comm in world4.run(_meshes_on_ranks, masks):
        assert_same_report(report, expected)
        assert comm == {"c10d.allreduce_": 1 + 2 + 1}  # line (and its equal), square, named


def _fsdp_on_ranks(rank: int, size: int, state: dict[str, torch.Tensor], kept: dict[str, torch.Tensor]) -> Any:
    """On each rank: the reports of an FSDP2 model, and of its masks as DTensors beside its parameters."""
    from torch.distributed.fsdp import fully_shard

    warnings.filterwarnings("ignore")  # FSDP2's own warnings; pytest's filters do not reach here
    mesh = init_device_mesh("cpu", (size,))
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 3))
    model.load_state_dict(state)
    for module in (model[0], model[2], model):
        fully_shard(module, mesh=mesh)
    params = dict(model.named_parameters())
    masks = {n: distribute(m, mesh, (0,)) for n, m in kept.items()}
    with comm_mode() as comm:
        reports = fp.sparsity_report(model), fp.sparsity_report(masks, params=params)
    weight = params["0.weight"]
    assert isinstance(weight, DTensor)
    return reports, comm_counts(comm), weight.to_local().shape[0]


def test_an_fsdp2_model_and_its_masks_report_as_one_process(world4: World) -> None:
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 3))
    params = dict(reference.named_parameters())
    kept = fp.global_unstructured(["*.weight"], fp.L1Unstructured(0.5))({n: p.detach() for n, p in params.items()})
    fp.apply_masks_(params, kept)
    expected = fp.sparsity_report(reference), fp.sparsity_report(kept, params=params)
    answers = world4.run(_fsdp_on_ranks, reference.state_dict(), kept)
    assert [rows for _, _, rows in answers] == [2, 2, 1, 0]  # uneven, and an empty block
    for reports, comm, _ in answers:
        for got, want in zip(reports, expected, strict=True):
            assert_same_report(got, want)
        assert comm == {"c10d.allreduce_": 2}  # one per report
    assert expected[0].pruned == expected[1].pruned == 15  # half the 30 weights

