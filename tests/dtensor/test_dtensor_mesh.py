"""DTensors on meshes of several dims: 2x2 meshes of 4 processes, and HSDP.

Each mesh dim places a tensor ``Shard(d)`` or ``Replicate()``, so a block
may be cut along two dims, twice along one (``(Shard(0), Shard(0))``), or
be copied along one mesh dim and cut along the other (HSDP's
``(Replicate(), Shard(0))``). The masks gathered must equal one process's
(random ones: a mesh of one's), every process must agree, only
``all_reduce`` may cross processes, and a reduction runs over the mesh dims
that cut the tensors only: HSDP sends what FSDP2 on its shard group sends.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hypothesis import example, given, settings
from hypothesis import strategies as st

import funcprune as fp
from _distributed import World
from funcprune._dtensor._cuts import box
from funcprune._select._radix import BINS
from test_dtensor import CommBytes, _prune_and_train_fsdp, collectives, comm_mode, draw_l1, dt

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed with gloo"
)

if dist.is_available():
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
    from torch.distributed.tensor.placement_types import _StridedShard

#: Per mesh dim, the tensor dim it cuts (``Shard``), that dim and a split factor
#: (``_StridedShard``), or ``None`` (``Replicate``).
Cut = tuple["int | tuple[int, int] | None", ...]


def placements_of(cut: Cut) -> list[Placement]:
    def placement(d: int | tuple[int, int] | None) -> Placement:
        if isinstance(d, tuple):
            return _StridedShard(d[0], split_factor=d[1])
        return Replicate() if d is None else Shard(d)

    return [placement(d) for d in cut]


def distribute(t: torch.Tensor, mesh: DeviceMesh, cut: Cut) -> torch.Tensor:
    """This process's block of ``t`` as a DTensor, where torch's own helper says it starts (nothing sent).

    (For a ``_StridedShard``, torch's helper gives the first index only:
    right where the block is one range, as FSDP2 over tensor parallelism cuts.)
    """
    placements = placements_of(cut)
    coordinate = mesh.get_coordinate()
    assert coordinate is not None
    size, offsets = _compute_local_shape_and_global_offset(t.shape, mesh.shape, list(coordinate), placements)
    local = t[tuple(slice(o, o + n) for o, n in zip(offsets, size, strict=True))]
    return DTensor.from_local(
        local.contiguous(), mesh, placements, run_check=False, shape=t.shape, stride=t.contiguous().stride()
    )


# --- no process group: where blocks lie --------------------------------------------------


@settings(max_examples=60)
@given(
    shape=st.lists(st.integers(0, 9), min_size=1, max_size=3),
    mesh_shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    data=st.data(),
)
def test_blocks_lie_where_torch_puts_them_on_meshes_of_several_dims(
    shape: list[int], mesh_shape: list[int], data: st.DataObject
) -> None:
    dims = [None, *range(len(shape)), *((d, f) for d in range(len(shape)) for f in (2, 3))]
    cut = tuple(data.draw(st.sampled_from(dims)) for _ in mesh_shape)
    placements = placements_of(cut)
    whole = torch.arange(math.prod(shape)).reshape(shape)
    for coordinate in zip(*(t.reshape(-1).tolist() for t in torch.meshgrid(*map(torch.arange, mesh_shape), indexing="ij"))):
        size, offsets = _compute_local_shape_and_global_offset(shape, mesh_shape, list(coordinate), placements)
        block = _block(whole, mesh_shape, coordinate, placements)  # the entries DTensor's own split gives
        mine = box(tuple(shape), tuple(mesh_shape), coordinate, placements)
        assert tuple(block.shape) == tuple(size)
        if mine is None:  # not one box: some dim's entries are no range
            assert not any(torch.equal(block, whole[_slices(o, size)]) for o in _starts(shape, size))
            continue
        assert mine[1] == tuple(size)
        if all(size):
            assert mine[0] == tuple(offsets) and torch.equal(block, whole[_slices(mine[0], size)])


def _block(whole: torch.Tensor, mesh_shape: list[int], coordinate: tuple[int, ...], placements: list[Placement]) -> torch.Tensor:
    """The entries of ``whole`` at ``coordinate``, split mesh dim by mesh dim by the placements' own splits."""
    block = whole
    for i, p in enumerate(placements):
        if isinstance(p, (Shard, _StridedShard)):
            pieces, _ = p._split_tensor(block, mesh_shape[i], with_padding=False)
            block = pieces[coordinate[i]]
    return block


def _slices(offsets: tuple[int, ...], size: list[int] | tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(o, o + n) for o, n in zip(offsets, size, strict=True))


def _starts(shape: list[int], size: list[int] | tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every offset where a box of ``size`` fits in ``shape``."""
    ranges = [range(n - s + 1) for n, s in zip(shape, size, strict=True)]
    return [tuple(int(v) for v in o) for o in (torch.cartesian_prod(*map(torch.tensor, ranges)).reshape(-1, len(shape)).tolist() if ranges else [[]])]


# --- 4 processes on a 2x2 mesh ------------------------------------------------------------


Member = tuple[torch.Tensor, "torch.Tensor | None", Cut]  # values, earlier mask, cut
#: A per-parameter chain for the group's first tensor.
_CHAIN = [fp.L1Unstructured(0.3), fp.L1Unstructured(sparsity=0.6)]
#: Norm orders whose masks match one process's exactly on small integers.
_ORDERS: list[fp.NormOrder] = [1, 2, 0, math.inf, -math.inf, "fro"]


def _masks(
    members: list[Member], mesh: DeviceMesh, spec: fp.Spec, structured: fp.LnStructured, seed: int
) -> dict[str, dict[str, torch.Tensor]]:
    """Every plan of the group (on DTensors of ``mesh``, the cuts as given), gathered."""
    names = [f"p{i}" for i in range(len(members))]
    params = {n: distribute(v, mesh, c) for n, (v, _, c) in zip(names, members, strict=True)}
    masks = {n: distribute(e, mesh, c) for n, (_, e, c) in zip(names, members, strict=True) if e is not None}
    ln = [fp.LnStructured(sparsity=0.5, n=n, dim=-1) for n in _ORDERS]
    g = torch.Generator().manual_seed(seed)
    plans: dict[str, Any] = {
        "joint": lambda: fp.global_unstructured(names, spec)(params, masks),
        "chain": lambda: fp.Plan({names[0]: _CHAIN})(params, masks),
        "norms": lambda: {str(s.n): fp.compute_mask(s, params[names[0]], masks.get(names[0])) for s in ln},
        "channels": lambda: fp.global_structured(names, structured, normalize=_normalize(structured))(params, masks),
        "random": lambda: fp.global_unstructured(names, fp.RandomUnstructured(sparsity=0.5))(params, masks, generator=g),
        "random rows": lambda: fp.Plan({n: fp.RandomStructured(sparsity=0.5, dim=0) for n in names})(
            params, masks, generator=g
        ),
        "wanda": lambda: fp.wanda({names[0]: params[names[0]]}, {names[0]: _norms(members[0][0])}),
    }
    out = {}
    inputs = [*params.values(), *masks.values()]
    before = [dt(t).to_local().clone() for t in inputs]
    with comm_mode() as comm:
        for key, plan in plans.items():
            out[key] = plan()
    assert collectives(comm) <= {"c10d.allreduce_"}, collectives(comm)  # nothing gathered
    for t, kept in zip(inputs, before, strict=True):  # nothing written into the inputs
        torch.testing.assert_close(dt(t).to_local(), kept, rtol=0, atol=0, equal_nan=True)
    for key, masks in out.items():
        for name, m in masks.items():
            assert dt(m).placements == dt(params.get(name, params[names[0]])).placements
            assert m.dtype == (torch.bool if key != "wanda" else params[names[0]].dtype)
    return {key: {name: dt(m).full_tensor() for name, m in masks.items()} for key, masks in out.items()}


def _on_ranks(rank: int, size: int, members: list[Member], spec: fp.Spec, structured: fp.LnStructured) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (2, size // 2))
    return _masks(members, mesh, spec, structured, 11 + rank)  # rank 0's seed wins


def _expected(members: list[Member], spec: fp.Spec, structured: fp.LnStructured, mesh: DeviceMesh) -> dict[str, Any]:
    """One process's masks; the random ones a mesh of one's (layout-independent)."""
    names = [f"p{i}" for i in range(len(members))]
    params = {n: v for n, (v, _, _) in zip(names, members, strict=True)}
    masks = {n: e for n, (_, e, _) in zip(names, members, strict=True) if e is not None}
    whole: list[Member] = [(v, e, (None,)) for v, e, _ in members]
    return {
        "joint": fp.global_unstructured(names, spec)(params, masks),
        "chain": fp.Plan({names[0]: _CHAIN})(params, masks),
        "norms": {
            str(n): fp.compute_mask(fp.LnStructured(sparsity=0.5, n=n, dim=-1), params[names[0]], masks.get(names[0]))
            for n in _ORDERS
        },
        "channels": fp.global_structured(names, structured, normalize=_normalize(structured))(params, masks),
        "wanda": fp.wanda({names[0]: params[names[0]]}, {names[0]: _norms(params[names[0]])}),
        **{k: v for k, v in _masks(whole, mesh, spec, structured, 11).items() if k.startswith("random")},
    }


def _norms(weight: torch.Tensor) -> torch.Tensor:
    """Distinct input-feature norms for ``weight`` (Wanda's scores scale its columns, cut or not)."""
    return torch.arange(1, weight.shape[1] + 1, dtype=weight.dtype) / 3


def _normalize(spec: fp.LnStructured) -> Any:
    """Sums of channel norms are exact (so one process's) for n = 1 and inf on small integers: 'mean' there."""
    return "max" if spec.n == 2 else "mean"


_CUTS: list[Cut] = [(None, 0), (0, None), (0, 1), (1, 0), (0, 0), (1, 1), (None, None), (None, 1), ((0, 2), 0), ((1, 2), 1)]


@st.composite
def _groups(draw: st.DrawFn) -> tuple[list[Member], fp.Spec, fp.LnStructured]:
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    members: list[Member] = []
    for _ in range(draw(st.integers(1, 3))):
        shape = tuple(draw(st.lists(st.integers(1, 7), min_size=2, max_size=2)))
        values = torch.randint(-3, 4, shape, generator=g).float()  # ties; norms exact
        if draw(st.booleans()):
            values[tuple(torch.randint(0, n, (1,), generator=g) for n in shape)] = math.nan
        earlier = torch.rand(shape, generator=g) < 0.7 if draw(st.booleans()) else None
        members.append((values.to(draw(st.sampled_from([torch.float32, torch.float64]))), earlier, draw(st.sampled_from(_CUTS))))
    spec = draw_l1(draw, members)
    structured = fp.LnStructured(sparsity=draw(st.floats(0.0, 1.0)), n=draw(st.sampled_from([1, 2, math.inf])), dim=0)
    return members, spec, structured


def _uneven() -> tuple[list[Member], fp.Spec, fp.LnStructured]:
    """7 rows cut twice (2, 2, 2, 1); 5 columns cut along both mesh dims' other; a replica; NaN, ties."""
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-2, 3, (7, 5), generator=g).float()
    a[3, 1] = math.nan
    members: list[Member] = [
        (a, torch.rand(7, 5, generator=g) < 0.8, (0, 0)),
        (torch.randint(-2, 3, (3, 5), generator=g).double(), None, (0, 1)),
        (torch.randint(-2, 3, (5, 3), generator=g).float(), torch.rand(5, 3, generator=g) < 0.6, (None, 0)),
        (torch.randint(-2, 3, (2, 2), generator=g).float(), None, (None, None)),
    ]
    return members, fp.L1Unstructured(sparsity=0.6), fp.LnStructured(sparsity=0.5, n=2, dim=0)


@settings(max_examples=6)
@example(example=_uneven())
@given(example=_groups())
def test_every_plan_on_a_2x2_mesh_equals_one_process(
    world4: World, mesh: DeviceMesh, example: tuple[list[Member], fp.Spec, fp.LnStructured]
) -> None:
    members, spec, structured = example
    expected = _expected(members, spec, structured, mesh)
    for a in world4.run(_on_ranks, members, spec, structured):
        for key, masks in expected.items():
            for name, m in masks.items():  # (Wanda's scores: NaN where the weight is)
                torch.testing.assert_close(a[key][name], m, rtol=0, atol=0, equal_nan=True, msg=f"{key} {name}")


def _bytes_on_ranks(rank: int, size: int, rows: int, cut: Cut) -> tuple[set[str], int, torch.Tensor]:
    mesh = init_device_mesh("cpu", (2, size // 2))
    n = rows * 6
    values = ((torch.randperm(n, generator=torch.Generator().manual_seed(0)) + 1).float() / n).reshape(rows, 6)
    w = distribute(values, mesh, cut)
    with comm_mode() as comm, CommBytes() as sent:
        mask = fp.global_unstructured(["w"], fp.L1Unstructured(sparsity=0.7))({"w": w})["w"]
    return collectives(comm), sent.bytes, dt(mask).full_tensor()


@pytest.mark.parametrize(("cut", "reduced_over"), [((None, 0), 1), ((0, None), 1), ((0, 1), 2), ((0, 0), 2), ((None, None), 0)])
def test_counts_cross_only_the_mesh_dims_that_cut_and_stay_fixed_as_tensors_grow(
    world4: World, cut: Cut, reduced_over: int
) -> None:
    for rows in (8, 80):  # 10x
        expected = fp.global_unstructured(["w"], fp.L1Unstructured(sparsity=0.7))(
            {"w": ((torch.randperm(rows * 6, generator=torch.Generator().manual_seed(0)) + 1).float() / (rows * 6)).reshape(rows, 6)}
        )["w"]
        for comms, sent, mask in world4.run(_bytes_on_ranks, rows, cut):
            assert torch.equal(mask, expected)
            assert comms == ({"c10d.allreduce_"} if reduced_over else set())
            assert sent == reduced_over * 3 * BINS * 8  # per mesh dim cut: 3 rounds of float32 keys


def test_hsdp_on_a_2x2_mesh_prunes_as_one_process_and_sends_what_fsdp2_on_its_shard_group_sends(world4: World) -> None:
    answers = world4.run(_prune_and_train_fsdp, 50, (2, 2))
    assert [a["local rows"] for a in answers] == [25, 25, 25, 25]
    for a in answers:
        assert a["layouts"]["0.weight"] == (Replicate(), Shard(0)) and a["laid out"]
        assert a["collectives"] == {"c10d.allreduce_"}
        assert a["bytes"] == 3 * BINS * 8  # over the shard group only: the replicas decide alike
        assert set(a["masks"]) == {"0.weight", "2.weight"} and all(a["masks"].values())
        for name, mask in a["kept"].items():
            assert not a["trained"][name][~mask].any()
        for name, p in a["trained"].items():
            torch.testing.assert_close(p, a["expected"][name])


def _lone_strided(rank: int, size: int) -> str:
    mesh = init_device_mesh("cpu", (2, size // 2))
    t = torch.arange(32.0).reshape(8, 4)
    w = distribute_tensor(t, mesh, [_StridedShard(0, split_factor=2), Replicate()])  # rows 0, 1, 4, 5 / 2, 3, 6, 7
    with comm_mode() as comm, pytest.raises(NotImplementedError) as refused:
        fp.compute_mask(fp.L1Unstructured(0.5), w)
    assert not collectives(comm)  # refused before any work, on every process alike
    return str(refused.value)


def test_a_strided_cut_that_leaves_no_box_is_refused_on_every_process(world4: World) -> None:
    for message in world4.run(_lone_strided):
        assert message.startswith(
            "compute_mask: scores is a DTensor laid out as [_StridedShard(dim=0, sf=2), Replicate()] on "
        )
        assert "which leaves some process of the mesh entries of shape (8, 4) that are no box" in message


def test_fsdp2_over_tensor_parallelism_prunes_as_one_process_and_keeps_pruned_entries_zero(world4: World) -> None:
    for a in world4.run(_prune_and_train_fsdp, 12, (2, 2), True):
        assert a["layouts"]["0.weight"] == (_StridedShard(0, split_factor=2), Shard(0))  # colwise, then FSDP2
        assert a["layouts"]["2.weight"] == (Shard(0), Shard(1))  # rowwise, then FSDP2
        assert a["collectives"] == {"c10d.allreduce_"} and a["laid out"]
        assert set(a["masks"]) == {"0.weight", "2.weight"} and all(a["masks"].values())
        assert a["bytes"] == 2 * 3 * BINS * 8  # both mesh dims cut the weights: each round over each
        for name, mask in a["kept"].items():
            assert not a["trained"][name][~mask].any()
        for name, p in a["trained"].items():
            torch.testing.assert_close(p, a["expected"][name])
