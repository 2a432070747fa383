"""DTensor masks of NM, Block and PerSlice: block by block, equal to one process's bit for bit.

Three settings, cheapest first:

- no process group: the block norms computed from a block equal the whole
  tensor's, bit for bit, however the blocks are cut (vector lanes, threads);
- in this process, a gloo group of 1 (a 1-process mesh): masks, prune and
  plans equal one process's (chains, earlier masks, one process's errors),
  and the refusals of inner specs that draw random numbers;
- a world of 4 processes (``tests/_distributed.py``), a 1-D mesh
  (``Shard(0)``, ``Shard(1)``, ``Replicate()``) and a 2x2 mesh: every
  rank's block of the mask equals one process's mask there (uneven and
  empty blocks, ties, NaN and inf, earlier masks, chains with
  ``L1Unstructured``, one process's errors on every rank), ``NM`` and
  ``PerSlice`` communicate nothing and ``Block`` only all-reduces; layouts
  that cut the groups are refused on every rank before any work.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hypothesis import example, given, settings
from hypothesis import strategies as st

import funcprune as fp
from _distributed import World
from funcprune._dtensor._shapes import block_norms
from test_dtensor import EveryOther, collectives, comm_mode, distribute, dt

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed with gloo"
)

if dist.is_available():
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import DTensor, Placement, Replicate, Shard


def outcome(compute: Any) -> Any:
    """What ``compute()`` returns, whole, or its error as ``"Type: message"``."""
    try:
        got = compute()
    except (ValueError, IndexError) as e:
        return f"{type(e).__name__}: {e}"
    return got.full_tensor() if isinstance(got, DTensor) else got


def same(got: Any, expected: Any) -> bool:
    """Equal masks, or the same error."""
    if isinstance(expected, str) or isinstance(got, str):
        return bool(got == expected)
    return isinstance(got, torch.Tensor) and got.dtype == expected.dtype and torch.equal(got, expected)


def values_of(shape: tuple[int, ...], kind: str, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Scores of ``kind``: normal, small integers (ties, also between block norms), or NaN, inf and zeros."""
    if kind == "normal":
        values = torch.randn(shape, generator=g)
    elif kind == "ties":
        values = torch.randint(-2, 3, shape, generator=g).float()
    else:
        pool = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, 2.0])
        values = pool[torch.randint(0, len(pool), shape, generator=g)]
    return values.to(dtype)


# --- no process group: block norms ------------------------------------------------------


def _one_process_norms(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The block norms as the one-process kernel takes them on the whole tensor."""
    lead = t.dim() - len(shape)
    view = list(t.shape[:lead])
    for length, size in zip(t.shape[lead:], shape, strict=True):
        view += [length // size, size]
    norms: torch.Tensor = torch.linalg.vector_norm(t.reshape(view), dim=[lead + 2 * i + 1 for i in range(len(shape))])
    return norms


@settings(max_examples=40)
@given(
    seed=st.integers(0, 2**16),
    grid=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    block=st.lists(st.sampled_from([1, 2, 3, 8, 16]), min_size=3, max_size=3),
    lead=st.sampled_from([(), (2,), (1,)]),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
    cut=st.integers(0, 3),
    per=st.integers(1, 2),
)
@example(seed=0, grid=[2, 1], block=[256, 256, 1], lead=(), dtype=torch.float32, cut=0, per=1)  # one block of 65536
@example(seed=0, grid=[1, 2], block=[256, 256, 1], lead=(), dtype=torch.float64, cut=1, per=1)
def test_block_norms_from_a_block_equal_the_whole_tensors_bit_for_bit(
    seed: int, grid: list[int], block: list[int], lead: tuple[int, ...], dtype: torch.dtype, cut: int, per: int
) -> None:
    shape = tuple(block[: len(grid)])
    whole_shape = lead + tuple(n * b for n, b in zip(grid, shape, strict=True))
    g = torch.Generator().manual_seed(seed)
    whole = (torch.randn(whole_shape, generator=g) * 10).to(dtype)
    expected = _one_process_norms(whole, shape)
    d = cut % len(whole_shape)  # cut dim d into pieces of ``per`` rows of blocks (the last may be short)
    unit = 1 if d < len(lead) else shape[d - len(lead)]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # a reduction of one output is split across threads
    try:
        for start in range(0, whole_shape[d], per * unit):
            length = min(per * unit, whole_shape[d] - start)
            got = block_norms(whole.narrow(d, start, length).contiguous(), shape, whole_shape)
            assert torch.equal(got, expected.narrow(d, start // unit, length // unit))  # the grid has the tensor's dims
    finally:
        torch.set_num_threads(threads)


# --- one process: a gloo group of 1 -------------------------------------------------


_SPECS = st.sampled_from([
    fp.NM(2, 4), fp.NM(1, 2, dim=0), fp.NM(0, 2), fp.NM(2, 2),
    fp.Block(0.5, (2, 2)), fp.Block(2, (1, 2)), fp.Block(sparsity=0.6, shape=(2,)),
    fp.PerSlice(fp.L1Unstructured(0.5), dim=0), fp.PerSlice(fp.L1Unstructured(1), dim=-1),
    fp.PerSlice(fp.chain(fp.NM(1, 2), fp.LnStructured(1, n=1, dim=0)), dim=0),
    fp.chain(fp.L1Unstructured(0.3), fp.NM(2, 4)), fp.chain(fp.Block(1, (2, 2)), fp.L1Unstructured(0.5)),
])  # fmt: skip


@settings(max_examples=25)
@given(
    seed=st.integers(0, 2**16),
    shape=st.lists(st.sampled_from([1, 2, 4, 6]), min_size=1, max_size=3),
    spec=_SPECS,
    kind=st.sampled_from(["normal", "ties", "specials"]),
    earlier=st.booleans(),
    dim=st.integers(-1, 2),
)
def test_a_mesh_of_one_gives_the_masks_of_one_process(
    mesh: DeviceMesh, seed: int, shape: list[int], spec: fp.Spec, kind: str, earlier: bool, dim: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    w = values_of(tuple(shape), kind, torch.float32, g)
    before = torch.rand(shape, generator=g) < 0.7 if earlier else None
    placement = Replicate() if dim < 0 or dim >= len(shape) else Shard(dim)
    dw = distribute(w, mesh, placement)
    dbefore = None if before is None else distribute(before, mesh, placement)
    expected = outcome(lambda: fp.compute_mask(spec, w, before))
    assert same(outcome(lambda: fp.compute_mask(spec, dw, dbefore)), expected)
    if isinstance(expected, str):
        return
    mask = dt(fp.compute_mask(spec, dw, dbefore))
    assert mask.placements == dt(dw).placements and mask.device_mesh == mesh
    torch.testing.assert_close(
        outcome(lambda: fp.prune(spec, dw, dbefore)), fp.prune(spec, w, before), rtol=0, atol=0, equal_nan=True
    )
    plan = fp.Plan({"w": [fp.L1Unstructured(1), spec]})
    masks = {} if before is None else {"w": before}
    dmasks = {} if dbefore is None else {"w": dbefore}
    assert same(outcome(lambda: plan({"w": dw}, dmasks)["w"]), outcome(lambda: plan({"w": w}, masks)["w"]))


_RANDOM_INSIDE = [
    fp.PerSlice(fp.RandomUnstructured(0.5)), fp.PerSlice(fp.RandomStructured(1, dim=0), dim=1),
    fp.PerSlice(fp.chain(fp.L1Unstructured(1), fp.RandomUnstructured(1))),
    fp.PerSlice(fp.PerSlice(fp.RandomUnstructured(1), dim=0), dim=0),
]  # fmt: skip


@pytest.mark.parametrize("spec", _RANDOM_INSIDE, ids=repr)
def test_per_slice_of_a_random_spec_is_refused_before_any_draw(mesh: DeviceMesh, spec: fp.PerSlice) -> None:
    w = distribute(torch.randn(4, 4), mesh, Shard(0))
    inner = spec.spec if isinstance(spec.spec, fp.PerSlice) else spec  # the PerSlice that draws
    drawn = inner.spec.specs[-1] if isinstance(inner.spec, fp.Chain) else inner.spec
    expected = (
        rf"is a DTensor, and {re.escape(repr(inner))} draws random numbers in each slice \({re.escape(repr(drawn))}\): "
        r"each process would draw its own, not what one process draws; on DTensors PerSlice runs L1Unstructured, "
        r"LnStructured, Identity, CustomFromMask, NM, Block, PerSlice and chains of them\. To draw per slice on one "
        r"process, gather the tensor yourself with \.full_tensor\(\)$"
    )
    with pytest.raises(NotImplementedError, match=r"^compute_mask: scores " + expected):
        fp.compute_mask(spec, w)
    state = torch.random.get_rng_state()
    with pytest.raises(NotImplementedError, match=r"^Plan: the parameter 'w' " + expected):
        fp.Plan({"w": [fp.RandomUnstructured(1), spec]})({"w": w})
    assert torch.equal(torch.random.get_rng_state(), state)  # refused before the first step drew


def test_per_slice_of_a_user_spec_is_refused(mesh: DeviceMesh) -> None:
    w = distribute(torch.randn(4, 4), mesh, Shard(0))
    spec = fp.PerSlice(EveryOther(), dim=0)
    with pytest.raises(NotImplementedError, match=rf"^compute_mask: scores is a DTensor, and {re.escape(repr(spec))} runs EveryOther\(\) in each slice, which funcprune cannot run on DTensors \(it may draw random numbers\); on DTensors PerSlice runs L1Unstructured, "):
        fp.compute_mask(spec, w)


# --- 4 processes: a 1-D mesh and a 2x2 mesh ----------------------------------------------------


#: One call on the ranks: values, earlier mask, placements (one per mesh dim), a spec or a plan's steps.
Case = tuple[torch.Tensor, "torch.Tensor | None", tuple["Placement", ...], "fp.Spec | list[fp.Spec]"]


def _laid_out(t: torch.Tensor, mesh: DeviceMesh, placements: tuple[Placement, ...]) -> tuple[DTensor, tuple[int, ...]]:
    """This rank's block of ``t`` as torch's own helper cuts it (no communication), and its offsets."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    size, offsets = compute_local_shape_and_global_offset(t.shape, mesh, placements)
    local = t[tuple(slice(o, o + n) for o, n in zip(offsets, size, strict=True))]
    whole = DTensor.from_local(
        local.contiguous(), mesh, placements, run_check=False, shape=t.shape, stride=t.contiguous().stride()
    )
    return whole, tuple(offsets)


def _mask_of(spec: fp.Spec | list[fp.Spec], w: torch.Tensor, before: torch.Tensor | None) -> torch.Tensor:
    """``compute_mask``, or a plan's fold for a list of steps."""
    if isinstance(spec, list):
        return fp.Plan({"w": spec})({"w": w}, {} if before is None else {"w": before})["w"]
    return fp.compute_mask(spec, w, before)


def _on_ranks(rank: int, size: int, mesh_shape: tuple[int, ...], cases: list[Case]) -> list[dict[str, Any]]:
    """On each rank: its block of each case's mask (or its error), the block's offsets, what crossed processes."""
    mesh = init_device_mesh("cpu", mesh_shape)
    answers = []
    for values, earlier, placements, spec in cases:
        w, offsets = _laid_out(values, mesh, placements)
        before = None if earlier is None else _laid_out(earlier, mesh, placements)[0]
        with comm_mode() as comm:
            try:
                mask: Any = dt(_mask_of(spec, w, before))
                assert mask.placements == w.placements and mask.device_mesh == mesh
                mask = mask.to_local()
            except (ValueError, IndexError, NotImplementedError, RuntimeError) as e:
                mask = f"{type(e).__name__}: {e}"
        answers.append({"offsets": offsets, "mask": mask, "collectives": collectives(comm)})
    return answers


def _communicates(spec: fp.Spec | list[fp.Spec]) -> bool:
    """Whether ``spec`` may all-reduce on a sharded tensor (NM never does; PerSlice only to agree on failing)."""
    steps = spec if isinstance(spec, list) else list(spec.specs) if isinstance(spec, fp.Chain) else [spec]
    return any(isinstance(s, (fp.Block, fp.L1Unstructured, fp.PerSlice)) for s in steps)


def _check(cases: list[Case], answers: list[list[dict[str, Any]]]) -> None:
    """Every rank's block equals one process's mask there (or it raised one process's error)."""
    for i, (values, earlier, placements, spec) in enumerate(cases):
        expected = outcome(lambda: _mask_of(spec, values, earlier))
        for rank, a in enumerate(ans[i] for ans in answers):
            where = f"case {i} ({spec!r}, {placements}) on rank {rank}"
            if isinstance(expected, str) and a["mask"] != expected:  # the slice that fails lies elsewhere
                assert a["mask"].startswith("ValueError: PerSlice(") and "another process of the mesh" in a["mask"], where
            elif isinstance(expected, str) or isinstance(a["mask"], str):
                assert a["mask"] == expected, where
            else:
                box = tuple(slice(o, o + n) for o, n in zip(a["offsets"], a["mask"].shape, strict=True))
                assert a["mask"].dtype == torch.bool and torch.equal(a["mask"], expected[box]), where
            sharded = any(isinstance(p, Shard) for p in placements)
            assert a["collectives"] <= ({"c10d.allreduce_"} if sharded and _communicates(spec) else set()), where


def _near_ties(units: int, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """``units`` tensors of ``shape``, each a permutation of the same values: norms equal but for rounding.

    Which of them rank lower is decided by the last bits of their norms, so
    only norms summed in one process's order give one process's mask.
    """
    values = torch.randn(math.prod(shape), generator=g) * 10
    return torch.stack([values[torch.randperm(len(values), generator=g)].reshape(shape) for _ in range(units)])


def _cases_1d(kind: str, dtype: torch.dtype, g: torch.Generator) -> list[Case]:
    """NM, Block and PerSlice on layouts of a 1-D mesh of 4 that cut no group (uneven and empty blocks)."""
    def v(*shape: int) -> torch.Tensor:
        return values_of(shape, kind, dtype, g)

    def kept(*shape: int) -> torch.Tensor:
        return torch.rand(shape, generator=g) < 0.7

    s0, s1, s2, r = (Shard(0),), (Shard(1),), (Shard(2),), (Replicate(),)
    blocks = _near_ties(16, (2, 16), g).reshape(4, 4, 2, 16).transpose(1, 2).reshape(8, 64)  # a 4x4 grid
    channels = _near_ties(64, (64,), g).reshape(4, 16, 64).movedim(0, 2).contiguous()  # 4 slices of 16
    return [
        (v(5, 16), None, s0, fp.NM(2, 4)), (v(5, 16), kept(5, 16), s1, fp.NM(2, 4)), (v(5, 16), None, r, fp.NM(1, 4)),
        (v(8, 3), kept(8, 3), s0, fp.NM(1, 2, dim=0)), (v(8, 3), None, s1, fp.NM(1, 2, dim=0)),
        (v(6, 16), None, s0, fp.Block(0.5, (2, 4))), (v(6, 16), kept(6, 16), s1, fp.Block(3, (2, 4))),
        (v(6, 16), kept(6, 16), r, fp.Block(0.5, (2, 4))), (v(5, 16), None, s0, fp.Block(sparsity=0.6, shape=(1, 4))),
        (v(4, 64), None, s1, fp.Block(0.5, (2, 16))), (v(3, 4, 8), kept(3, 4, 8), s0, fp.Block(5, (2,))),
        (v(3, 4, 8), None, s2, fp.Block(0.25, (2, 2))), (v(4, 8), None, s1, fp.Block(0, (1, 2))),
        (v(5, 6), kept(5, 6), s0, fp.PerSlice(fp.L1Unstructured(0.5), dim=0)),
        (v(4, 6), None, s1, fp.PerSlice(fp.NM(1, 2), dim=1)), (v(4, 6), None, r, fp.PerSlice(fp.L1Unstructured(1), 1)),
        (v(4, 3, 5), kept(4, 3, 5), s0, fp.PerSlice(fp.chain(fp.L1Unstructured(1), fp.LnStructured(1, n=1, dim=0)))),
        (v(6, 16), kept(6, 16), s0, fp.chain(fp.L1Unstructured(0.3), fp.NM(2, 4), fp.Block(1, (2, 4)))),
        (v(6, 16), None, s1, [fp.Block(0.5, (1, 4)), fp.L1Unstructured(sparsity=0.7)]),
        # norms of one block, or of one slice, summed in one process's order (each rank holds one)
        (blocks, None, s1, fp.Block(8, (2, 16))), (channels, None, s2, fp.PerSlice(fp.LnStructured(8, 2, dim=0), 2)),
        # one process's errors, on every rank alike
        (v(4, 6), None, s0, fp.NM(2, 4)), (v(6, 16), None, s1, fp.Block(100, (2, 4))),
        (v(4, 6), None, s1, fp.PerSlice(fp.L1Unstructured(7), dim=1)), (v(4, 6), None, s0, fp.Block(1, (4, 4))),
        (v(4, 6), None, s0, fp.PerSlice(fp.L1Unstructured(1), dim=2)),
    ]  # fmt: skip


def _cases_2d(kind: str, dtype: torch.dtype, g: torch.Generator) -> list[Case]:
    """The same on a 2x2 mesh: replicated along one mesh dim, or cut along both."""
    def v(*shape: int) -> torch.Tensor:
        return values_of(shape, kind, dtype, g)

    rs, ss, s11, sr = (Replicate(), Shard(0)), (Shard(0), Shard(1)), (Shard(1), Shard(1)), (Shard(0), Replicate())
    mask = torch.rand(8, 16, generator=g) < 0.7
    return [
        (v(5, 16), None, ss, fp.NM(2, 4)), (v(5, 16), None, s11, fp.NM(2, 4)), (v(8, 3), None, rs, fp.NM(1, 2, 0)),
        (v(8, 16), mask, ss, fp.Block(0.5, (2, 4))), (v(8, 16), None, rs, fp.Block(3, (2, 4))),
        (v(8, 16), mask, s11, fp.Block(sparsity=0.5, shape=(4, 4))), (v(4, 64), None, s11, fp.Block(0.5, (2, 16))),
        (v(8, 16), None, sr, fp.Block(0.5, (1, 8))),
        (v(6, 5), None, rs, fp.PerSlice(fp.L1Unstructured(0.5), dim=0)),
        (v(6, 5), None, (Shard(0), Shard(0)), fp.PerSlice(fp.L1Unstructured(2), dim=0)),
        (v(8, 16), mask, ss, fp.chain(fp.L1Unstructured(0.3), fp.Block(1, (2, 4)))),
    ]  # fmt: skip


@settings(max_examples=3)
@example(seed=0, kind="ties", dtype=torch.float32)
@example(seed=1, kind="specials", dtype=torch.float32)
@given(
    seed=st.integers(0, 2**16),
    kind=st.sampled_from(["normal", "ties", "specials"]),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
)
def test_on_4_processes_each_rank_s_block_is_one_process_s_mask_there(
    world4: World, seed: int, kind: str, dtype: torch.dtype
) -> None:
    g = torch.Generator().manual_seed(seed)
    cases_1d, cases_2d = _cases_1d(kind, dtype, g), _cases_2d(kind, dtype, g)
    _check(cases_1d, world4.run(_on_ranks, (4,), cases_1d))
    _check(cases_2d, world4.run(_on_ranks, (2, 2), cases_2d))


def test_nm_communicates_nothing_per_slice_one_number_and_block_only_all_reduces(world4: World) -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 16, generator=g)
    per_slice = fp.PerSlice(fp.L1Unstructured(0.5), dim=0)
    cases: list[Case] = [
        (w, None, (Shard(1),), fp.NM(2, 4)), (w, None, (Shard(0),), per_slice), (w, w > 0, (Shard(0),), per_slice),
        (w, None, (Shard(1),), fp.Block(0.5, (2, 4))), (w, w > 0, (Replicate(),), fp.Block(0.5, (2, 4))),
        (w, None, (Shard(0), Shard(1)), fp.Block(0.5, (2, 4))),
    ]  # fmt: skip
    answers = world4.run(_on_ranks, (4,), cases[:5]) + world4.run(_on_ranks, (2, 2), cases[5:])
    _check(cases[:5], answers[:4])
    _check(cases[5:], answers[4:])
    for a in answers[:4]:  # PerSlice: one number, whether a process failed
        assert [c["collectives"] for c in a] == [set(), {"c10d.allreduce_"}, {"c10d.allreduce_"}, {"c10d.allreduce_"}, set()]
    assert all(a[0]["collectives"] == {"c10d.allreduce_"} for a in answers[4:])


def test_a_slice_that_cannot_take_the_amount_fails_every_process_together(world4: World) -> None:
    w = torch.randn(8, 6, generator=torch.Generator().manual_seed(0))
    earlier = torch.ones(8, 6, dtype=torch.bool)
    earlier[5, :4] = False  # row 5 (on rank 2) keeps 2 entries: fewer than the 3 asked
    spec = fp.PerSlice(fp.L1Unstructured(3), dim=0)
    cases: list[Case] = [(w, earlier, (Shard(0),), spec)]
    answers = world4.run(_on_ranks, (4,), cases)
    expected = outcome(lambda: fp.compute_mask(spec, w, earlier))
    assert isinstance(expected, str) and expected.startswith("ValueError: ")
    assert answers[2][0]["mask"] == expected  # the process that holds row 5: one process's error
    for rank in (0, 1, 3):
        assert answers[rank][0]["mask"] == (
            "ValueError: PerSlice(spec=L1Unstructured(amount=3), dim=0): another process of the mesh could "
            "not prune its slices (its own error says why); no process computed a mask"
        )


def test_a_slice_one_process_cannot_norm_fails_every_process_together(world4: World) -> None:
    values = torch.randn(4, 3, 4, 5, generator=torch.Generator().manual_seed(0))
    values[0, 0, 0, 0] = math.nan  # slice 0 (rank 0's): its nuclear norm's SVD fails there only
    spec = fp.PerSlice(fp.LnStructured(1, n="nuc", dim=0), dim=0)
    answers = world4.run(_on_ranks, (4,), [(values, None, (Shard(0),), spec)])
    assert "svd" in answers[0][0]["mask"].lower()  # one process's own error
    for rank in (1, 2, 3):  # the others fail with it rather than wait in the next collective
        assert answers[rank][0]["mask"] == (
            f"ValueError: {spec!r}: another process of the mesh could not prune its slices (its own error "
            "says why); no process computed a mask"
        )


#: Layouts that cut the groups, with the spec and what the refusal says after ``"... is a DTensor laid out as ..."``.
_CUT: list[tuple[tuple[int, ...], tuple[int, ...], tuple[Placement, ...], fp.Spec, str]] = [
    ((4,), (4, 8), (Shard(1),), fp.NM(2, 4), r"along dim 1 \(of length 8\) its blocks include 0:2, 2:4, 4:6, 6:8, which do not start and end on multiples of 4, so NM\(n=2, m=4, dim=-1\) would have to move weights between processes to see whole groups of 4 consecutive entries\. On DTensors it works where every process's block starts and ends on multiples of 4 along dim 1: shard another dim, or choose sizes whose cut \(torch.chunk's\) falls on such multiples$"),
    ((4,), (10, 4), (Shard(0),), fp.NM(1, 2, dim=0), r"along dim 0 \(of length 10\) its blocks include 0:3, 3:6, 6:9, 9:10, which do not start and end on multiples of 2"),
    ((2, 2), (4, 8), (Shard(1), Shard(1)), fp.NM(2, 4), r"along dim 1 \(of length 8\) its blocks include 0:2, 2:4, 4:6, 6:8, which"),
    ((4,), (4, 8), (Shard(1),), fp.Block(0.5, (2, 4)), r"along dim 1 \(of length 8\) its blocks include 0:2, 2:4, 4:6, 6:8, which do not start and end on multiples of 4, so Block\(amount=0\.5, shape=\(2, 4\)\) would have to move weights between processes to see whole blocks of shape \(2, 4\)\."),
    ((4,), (4, 8), (Shard(0),), fp.Block(0.5, (2, 4)), r"along dim 0 \(of length 4\) its blocks include 0:1, 1:2, 2:3, 3:4, which do not start and end on multiples of 2"),
    ((2, 2), (8, 8), (Shard(0), Shard(1)), fp.Block(1, (4, 8)), r"along dim 1 \(of length 8\) its blocks include 0:4, 4:8, which do not start"),
    ((4,), (4, 6), (Shard(1),), fp.PerSlice(fp.L1Unstructured(1), dim=0), r"whose blocks cut dim 1, so the slices of PerSlice\(spec=L1Unstructured\(amount=1\), dim=0\) along dim 0 are split across processes; each slice would have to be ranked across processes, which funcprune does not do\. On DTensors PerSlice works where each process holds whole slices: shard dim 0 \(the slices' dim\) or replicate the tensor$"),
    ((2, 2), (4, 6), (Shard(0), Shard(1)), fp.PerSlice(fp.NM(1, 2), dim=1), r"whose blocks cut dim 0, so the slices of .* along dim 1 are split"),
    ((4,), (4, 16), (Shard(0),), fp.chain(fp.L1Unstructured(0.5), fp.PerSlice(fp.L1Unstructured(1), dim=1)), r"whose blocks cut dim 0, so"),
]  # fmt: skip


def _refused_on_ranks(rank: int, size: int, cut: list[tuple[Any, ...]]) -> list[tuple[str, str, set[str]]]:
    """On each rank: what compute_mask and a plan raise for each layout that cuts the groups, and what was sent."""
    answers = []
    for mesh_shape, shape, placements, spec, _ in cut:
        w, _ = _laid_out(torch.randn(shape), init_device_mesh("cpu", mesh_shape), placements)
        errors = []
        with comm_mode() as comm:
            for call in (lambda: fp.compute_mask(spec, w), lambda: fp.Plan({"w": spec})({"w": w})):
                try:
                    call()
                    errors.append("")
                except NotImplementedError as e:
                    errors.append(str(e))
        answers.append((errors[0], errors[1], collectives(comm)))
    return answers


def test_layouts_that_cut_the_groups_are_refused_on_every_rank_before_any_work(world4: World) -> None:
    answers = world4.run(_refused_on_ranks, _CUT)
    for i, (mesh_shape, _, placements, spec, says) in enumerate(_CUT):
        for a in answers:
            direct, planned, sent = a[i]
            layout = rf"{re.escape(str(list(placements)))} on DeviceMesh\(.*\)"
            assert re.match(rf"^compute_mask: scores is a DTensor laid out as {layout}[;,] {says}", direct), direct
            assert re.match(rf"^Plan: the parameter 'w' is a DTensor laid out as {layout}[;,] {says}", planned), planned
            assert sent == set()  # refused before the first step (L1Unstructured) sent anything
        assert len({a[i][:2] for a in answers}) == 1  # the same refusal on every rank
