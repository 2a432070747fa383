"""DTensor masks of LnStructured, RandomStructured and RandomUnstructured (issue 14, item 2).

Three settings, cheapest first:

- no process group: the random keys are splitmix64's outputs;
- in this process, a gloo group of 1 (a 1-process mesh): reproducible random
  masks of exact counts, the generator put back when nothing is drawn, and
  every refusal;
- worlds of 2 and 4 processes (``tests/_distributed.py``): Ln-structured
  masks gathered with ``full_tensor()`` equal one process's bit for bit
  (channels along the sharded dim, along another dim, replicated; uneven and
  empty blocks; earlier masks, ``sparsity=``, chains; ties, NaN and inf;
  data whose norms are exact or far apart where norms cross processes), the
  random masks are the same for every world size and placement and on every
  process, ``global_structured`` groups equal one process's, and each call
  sends a few all-reduces whose bytes do not grow with the tensor.
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
from funcprune._dtensor import _dispatch
from funcprune._dtensor._random import uniform
from funcprune._select._radix import BINS
from test_dtensor import CommBytes, EveryOther, collectives, comm_mode, distribute, dt

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed with gloo"
)

if dist.is_available():
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

#: The norm orders LnStructured takes that are no matrix norm, and 'nuc' (3 dims only).
_ORDERS: list[fp.NormOrder] = [1, 2, 3, 0.5, 0, -1, -2.5, math.inf, -math.inf, "fro"]
#: A supported spec on DTensors, as the refusals list them.
_SUPPORTED = (
    "on DTensors funcprune runs L1Unstructured, RandomUnstructured, LnStructured, RandomStructured, "
    "Identity, CustomFromMask, NM, Block, PerSlice and chains of them"
)


def placement_of(dim: int | None) -> Placement:
    return Replicate() if dim is None else Shard(dim)


def outcome(compute: Any) -> Any:
    """What ``compute()`` returns, whole, or its error as ``"Type: message"``."""
    try:
        got = compute()
    except (ValueError, IndexError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"
    return got.full_tensor() if isinstance(got, DTensor) else got


def same(got: Any, expected: Any) -> bool:
    """Equal masks, or the same error."""
    if isinstance(expected, str) or isinstance(got, str):
        return bool(got == expected)
    return isinstance(got, torch.Tensor) and torch.equal(got, expected)


def pruned(mask: torch.Tensor) -> int:
    return int((~mask).sum())


def units_pruned(spec: fp.Spec, mask: torch.Tensor) -> int:
    """How many entries ``mask`` prunes, or channels (entirely) for a structured ``spec``."""
    if isinstance(spec, (fp.LnStructured, fp.RandomStructured)):
        d = spec.dim % mask.dim()
        return int((~mask.any(dim=[i for i in range(mask.dim()) if i != d])).sum())
    return pruned(mask)


# --- no process group: the random keys ----------------------------------------------


_M64 = (1 << 64) - 1


def _splitmix64(seed: int, i: int) -> int:
    """Output ``i + 1`` of splitmix64 from the state ``seed`` (the reference, in Python ints)."""
    z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


@settings(max_examples=20)
@given(seed=st.integers(-(2**63), 2**63 - 1), start=st.integers(0, 2**40), n=st.integers(0, 50))
def test_random_keys_are_splitmix64_outputs_in_the_unit_interval(seed: int, start: int, n: int) -> None:
    index = torch.arange(start, start + n, dtype=torch.int64)
    keys = uniform(seed, index)
    draws = [(_splitmix64(seed & _M64, i) >> 11) * 2.0**-53 for i in range(start, start + n)]  # exact floats
    assert keys.dtype == torch.float64 and torch.equal(keys, torch.tensor(draws, dtype=torch.float64))
    assert bool(((keys >= 0) & (keys < 1)).all())


# --- one process: a gloo group of 1 -------------------------------------------------


def _random_mask(spec: fp.Spec, w: torch.Tensor, before: torch.Tensor | None, seed: int) -> torch.Tensor:
    """``spec``'s DTensor mask drawn from a generator seeded ``seed`` (the explicit-generator entry)."""
    g = torch.Generator().manual_seed(seed)
    return dt(_dispatch.compute_mask("compute_mask", spec, w, before, generator=g)).full_tensor()


_RANDOM_SPECS = st.sampled_from([
    fp.RandomUnstructured(0.4), fp.RandomUnstructured(3), fp.RandomUnstructured(sparsity=0.7),
    fp.RandomStructured(0.5, dim=0), fp.RandomStructured(1, dim=-1), fp.RandomStructured(sparsity=0.6, dim=1),
])  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
@pytest.mark.parametrize("n", [2, 1, 0.5, math.inf, 0, "fro"])
def test_norms_across_processes_leave_the_scores_and_parameters_as_they_were(
    mesh: DeviceMesh, n: fp.NormOrder, dtype: torch.dtype
) -> None:
    values = torch.randn(4, 6, generator=torch.Generator().manual_seed(0)).to(dtype)
    w = distribute(values, mesh, Shard(1))  # the channels (dim 0) cut along dim 1: norms reduced across
    before = dt(w).to_local().clone()
    for prune in (
        lambda: fp.compute_mask(fp.LnStructured(0.5, n=n, dim=0), w),
        lambda: fp.Plan({"w": [fp.LnStructured(1, n=n, dim=0), fp.LnStructured(1, n=n, dim=0)]})({"w": w}),
        lambda: fp.global_structured(["w"], fp.LnStructured(0.5, n=n, dim=0))({"w": w}),
    ):
        prune()
        assert torch.equal(dt(w).to_local(), before)  # nothing written into the caller's tensors


@settings(max_examples=25)
@given(
    seed=st.integers(0, 2**16),
    shape=st.lists(st.integers(1, 6), min_size=2, max_size=3),
    spec=_RANDOM_SPECS,
    earlier=st.booleans(),
    shard=st.sampled_from([None, 0, 1]),
)
def test_random_masks_on_a_mesh_of_one_are_reproducible_and_prune_exactly_the_amount(
    mesh: DeviceMesh, seed: int, shape: list[int], spec: fp.Spec, earlier: bool, shard: int | None
) -> None:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g)
    before = torch.rand(shape, generator=g) < 0.7 if earlier else None
    dw = distribute(w, mesh, placement_of(shard))
    dbefore = None if before is None else distribute(before, mesh, placement_of(shard))
    expected = outcome(lambda: fp.compute_mask(spec, w, before))  # torch's draws: only the count is shared
    got = outcome(lambda: _random_mask(spec, dw, dbefore, seed))
    if isinstance(expected, str):  # an amount larger than what is left: the same error
        assert got == expected
        return
    assert units_pruned(spec, got) == units_pruned(spec, expected)  # exactly the amount asked
    assert torch.equal(got, _random_mask(spec, dw, dbefore, seed))  # the same seed, the same mask
    if before is not None:
        assert not got[~before].any()  # nothing revived
    if isinstance(spec, fp.RandomStructured):  # whole channels: a channel keeps all it kept, or nothing
        d = spec.dim % w.dim()
        kept_before = torch.ones(shape, dtype=torch.bool) if before is None else before
        others = [i for i in range(w.dim()) if i != d]
        channel = got.any(dim=others, keepdim=True)
        assert torch.equal(got, channel & kept_before)
    torch.manual_seed(seed)  # the global generator, the public entry point
    assert torch.equal(dt(fp.compute_mask(spec, dw, dbefore)).full_tensor(), got)
    torch.manual_seed(seed)
    plan = fp.Plan({"w": spec})
    assert torch.equal(dt(plan({"w": dw}, {} if dbefore is None else {"w": dbefore})["w"]).full_tensor(), got)


def test_the_generator_is_put_back_when_nothing_is_drawn_and_moved_on_otherwise(mesh: DeviceMesh) -> None:
    w = distribute(torch.randn(4, 6), mesh, Shard(1))
    for spec in (fp.RandomUnstructured(0), fp.RandomStructured(0, dim=0), fp.RandomUnstructured(sparsity=0.0)):
        g = torch.Generator().manual_seed(3)
        state = g.get_state()
        assert dt(_dispatch.compute_mask("compute_mask", spec, w, None, generator=g)).full_tensor().all()
        assert torch.equal(g.get_state(), state)
    for spec in (fp.RandomUnstructured(25), fp.RandomStructured(5, dim=0)):
        g = torch.Generator().manual_seed(3)
        state = g.get_state()
        with pytest.raises(ValueError, match=r"amount=\d+ should be smaller than the number of parameters to prune"):
            _dispatch.compute_mask("compute_mask", spec, w, None, generator=g)
        assert torch.equal(g.get_state(), state)
    g = torch.Generator().manual_seed(3)
    first = _dispatch.compute_mask("compute_mask", fp.RandomUnstructured(0.5), w, None, generator=g)
    second = _dispatch.compute_mask("compute_mask", fp.RandomUnstructured(0.5), w, None, generator=g)
    assert not torch.equal(dt(first).full_tensor(), dt(second).full_tensor())  # the generator moved on
    torch.manual_seed(3)
    before = torch.random.get_rng_state()
    fp.compute_mask(fp.RandomStructured(0, dim=1), w)
    assert torch.equal(torch.random.get_rng_state(), before)
    fp.compute_mask(fp.RandomStructured(1, dim=1), w)
    assert not torch.equal(torch.random.get_rng_state(), before)


def test_an_explicit_generator_reaches_the_dtensor_masks_through_every_entry_point(mesh: DeviceMesh) -> None:
    t = torch.randn(6, 5)
    w = distribute(t, mesh, Shard(0))
    for spec in (fp.RandomUnstructured(0.5), fp.RandomStructured(2, dim=0)):
        expected = _random_mask(spec, w, None, 3)
        torch.manual_seed(99)  # the global generator drawn from elsewhere
        got = fp.compute_mask(spec, w, generator=torch.Generator().manual_seed(3))
        assert torch.equal(dt(got).full_tensor(), expected)
        planned = fp.Plan({"w": spec})({"w": w}, generator=torch.Generator().manual_seed(3))["w"]
        assert torch.equal(dt(planned).full_tensor(), expected)
        kept = dt(fp.prune(spec, w, generator=torch.Generator().manual_seed(3))).full_tensor() != 0
        assert torch.equal(kept, expected | (t == 0))


_STILL_REFUSED = [
    EveryOther(), fp.chain(fp.LnStructured(1, n=2, dim=0), EveryOther()), fp.chain(fp.RandomUnstructured(1), EveryOther()),
]  # fmt: skip


def _name(spec: fp.Spec) -> str:
    return "Chain" if isinstance(spec, fp.Chain) else type(spec).__name__


@pytest.mark.parametrize("spec", _STILL_REFUSED, ids=_name)
def test_other_specs_are_still_refused_naming_what_is_supported(mesh: DeviceMesh, spec: fp.Spec) -> None:
    w = distribute(torch.randn(4, 4), mesh, Shard(0))
    name = re.escape(repr(spec.specs[-1] if isinstance(spec, fp.Chain) else spec))
    with pytest.raises(NotImplementedError, match=rf"^compute_mask: scores is a DTensor, and {name} cannot prune DTensors yet; {_SUPPORTED} \(block by block, nothing gathered\)"):
        fp.compute_mask(spec, w)
    with pytest.raises(NotImplementedError, match=rf"^Plan: the parameter 'w' is a DTensor, and {name} cannot prune DTensors yet; {_SUPPORTED}"):
        fp.Plan({"w": [fp.RandomUnstructured(1), spec]})({"w": w})  # refused before the first step draws
    if spec.pruning_type == "unstructured":
        with pytest.raises(NotImplementedError, match=rf"^global_unstructured: the parameter 'w' is a DTensor, and {name} cannot"):
            fp.global_unstructured(["w", "v"], spec)({"w": w, "v": w * 2})


def test_a_nuclear_norm_across_processes_is_refused_before_any_work(mesh: DeviceMesh) -> None:
    t = torch.randn(3, 4, 5)
    spec = fp.LnStructured(1, n="nuc", dim=0)
    for shard in (1, 2):
        w = distribute(t, mesh, Shard(shard))
        expected = (
            rf"is a DTensor sharded along dim {shard} \(\[Shard\(dim={shard}\)\] on .*\), and {re.escape(repr(spec))} "
            r"takes each channel's nuclear norm over the other dims, which no sum of per-process parts gives; on "
            r"DTensors n='nuc' works where the channels' dim \(0\) is the only sharded dim or the tensor is replicated"
        )
        with pytest.raises(NotImplementedError, match=r"^compute_mask: scores " + expected):
            fp.compute_mask(spec, w)
        with pytest.raises(NotImplementedError, match=r"^Plan: the parameter 'w' " + expected):
            fp.Plan({"w": [fp.RandomUnstructured(1), spec]})({"w": w})
    for placement in (Shard(0), Replicate()):  # channels whole on each process: as one process
        got = fp.compute_mask(spec, distribute(t, mesh, placement))
        assert torch.equal(dt(got).full_tensor(), fp.compute_mask(spec, t))
    with pytest.raises(ValueError, match=r"^LnStructured: n='nuc' needs scores with exactly 3 dims"):
        fp.compute_mask(spec, distribute(torch.randn(3, 4), mesh, Shard(1)))  # one process's error first


def test_global_structured_refuses_what_a_group_of_dtensors_cannot_be(mesh: DeviceMesh) -> None:
    t = torch.randn(4, 4)
    w = distribute(t, mesh, Shard(0))
    plan = fp.global_structured(["w", "v"], fp.LnStructured(1, n=2, dim=0))
    with pytest.raises(TypeError, match=r"^global_structured: the parameter 'v' is a plain torch.Tensor but the parameter 'w' is a DTensor; a group ranked jointly must be all DTensors"):
        plan({"w": w, "v": t})
    other = distribute(t, init_device_mesh("cpu", (1,), mesh_dim_names=("other",)), Shard(0))
    with pytest.raises(ValueError, match=r"^global_structured: the parameter 'v' is on .* but the parameter 'w' on .*; a group ranked jointly must share one device mesh"):
        plan({"w": w, "v": other})
    cube = distribute(torch.randn(2, 3, 4), mesh, Shard(2))
    with pytest.raises(NotImplementedError, match=r"^global_structured: the parameter 'w' is a DTensor sharded along dim 2 .* nuclear norm"):
        fp.global_structured(["w"], fp.LnStructured(1, n="nuc", dim=0))({"w": cube})
    with pytest.raises(IndexError, match=r"^global_structured: cannot prune 'v' with LnStructured\(amount=1, n=2, dim=2\): "):
        fp.global_structured(["w", "v"], fp.LnStructured(1, n=2, dim=2))({"w": cube, "v": w})  # one process's error


def test_global_structured_over_dtensors_is_the_units_plan_of_one_process(mesh: DeviceMesh) -> None:
    """Channels are units (issue 37): on a mesh, ``RandomStructured`` keeps what one process draws from the
    same generator (the channels' old code drew its own keys), and the float64 keys see what float32 ties."""
    g = torch.Generator().manual_seed(2)
    whole = {"a": torch.randn(6, 5, generator=g), "b": torch.randn(4, 3, 2, generator=g)}
    earlier = {"a": torch.rand(6, 5, generator=g) < 0.7}
    spec = fp.RandomStructured(sparsity=0.5, dim=0)
    for placements in ((Shard(0), Shard(1)), (Shard(1), Replicate())):
        params = {n: distribute(t, mesh, p) for (n, t), p in zip(whole.items(), placements, strict=True)}
        masks = {"a": distribute(earlier["a"], mesh, placements[0])}
        for seed in range(3):
            plan = fp.global_structured(["a", "b"], spec)
            got = plan(params, masks, generator=torch.Generator().manual_seed(seed))
            expected = plan(whole, earlier, generator=torch.Generator().manual_seed(seed))
            assert all(torch.equal(dt(got[n]).full_tensor(), m) for n, m in expected.items())
    tied = torch.tensor([[1.0, 2.0**-20], [1.0, 0.0], [3.0, 0.0]])  # channels 0 and 1: 1.0 in float32
    got = fp.global_structured(["w"], fp.LnStructured(1, n=2, dim=0))({"w": distribute(tied, mesh, Shard(1))})
    assert dt(got["w"]).full_tensor().all(1).tolist() == [True, False, True]


# --- worlds of 2 and 4 processes ---------------------------------------------------------


_ROUNDS32 = 3 * BINS * 8  # bytes of the radix select over float32 keys: 3 rounds of BINS int64
_ROUNDS64 = 6 * BINS * 8  # over the random specs' float64 keys


#: One call on the ranks: values, earlier mask, Shard dim (None: Replicate), spec, generator seed (None: 7 + rank).
Case = tuple[torch.Tensor, "torch.Tensor | None", int | None, fp.Spec, int | None]


def _on_ranks(rank: int, size: int, cases: list[Case]) -> list[dict[str, Any]]:
    """On each rank: each case's mask, gathered (or its error), and what crossed processes."""
    mesh = init_device_mesh("cpu", (size,))
    answers = []
    for values, earlier, shard, spec, seed in cases:
        w = distribute(values, mesh, placement_of(shard))
        before = None if earlier is None else distribute(earlier, mesh, placement_of(shard))
        g = torch.Generator().manual_seed(7 + rank if seed is None else seed)
        mask, error = None, ""
        with comm_mode() as comm:
            try:
                mask = dt(_dispatch.compute_mask("compute_mask", spec, w, before, generator=g))
            except (ValueError, IndexError, RuntimeError) as e:
                error = f"{type(e).__name__}: {e}"
        answers.append({
            "mask": error if mask is None else mask.full_tensor(),
            "collectives": collectives(comm),
            "laid out": mask is None or (mask.placements == dt(w).placements and mask.dtype == torch.bool),
            "local": None if mask is None else mask.to_local(),
        })  # fmt: skip
    return answers


def _separated(shape: tuple[int, ...], d: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Channels (along ``d``) that are one another's multiples: norms far apart for every order."""
    d %= len(shape)
    profile = torch.randn([1 if i == d else n for i, n in enumerate(shape)], generator=g).abs() + 0.25
    scales = 1 + torch.randperm(shape[d], generator=g).double() / max(shape[d], 1)
    scales = scales.reshape([-1 if i == d else 1 for i in range(len(shape))])
    signs = torch.randint(0, 2, shape, generator=g) * 2 - 1
    return (profile.double() * scales * signs).to(dtype)


@st.composite
def _ln_cases(draw: st.DrawFn) -> list[Case]:
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=2, max_size=3)))
    dim = draw(st.integers(-len(shape), len(shape) - 1))
    kind = draw(st.sampled_from(["separated", "ties", "specials"]))
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float64, torch.float16, torch.bfloat16]))
    if kind == "separated":
        values = _separated(shape, dim, dtype, g)
    else:
        values = torch.randint(-2, 3, shape, generator=g).float()
        if kind == "specials":
            pool = torch.tensor([math.nan, math.inf, -math.inf, -0.0])
            special = pool[torch.randint(0, 4, shape, generator=g)]
            values = torch.where(torch.rand(shape, generator=g) < 0.15, special, values)
        values = values.to(dtype)
    earlier = None
    if draw(st.booleans()):
        earlier = torch.rand(shape, generator=g) < 0.7
        if shape[dim % len(shape)]:
            earlier.select(dim, int(torch.randint(0, shape[dim], (1,), generator=g))).fill_(False)  # a whole channel
    shard = draw(st.sampled_from([None, *range(len(shape))]))
    channels = shape[dim]
    cases: list[Case] = []
    orders = _ORDERS if kind == "specials" else [*_ORDERS, "nuc"]  # (an SVD of NaN fails: tested below)
    for n in draw(st.lists(st.sampled_from(orders), min_size=1, max_size=3, unique=True)):
        amount = draw(st.sampled_from([
            fp.LnStructured(draw(st.integers(0, channels + 1)), n=n, dim=dim),
            fp.LnStructured(draw(st.floats(0, 1)), n=n, dim=dim),
            fp.LnStructured(sparsity=draw(st.floats(0, 1)), n=n, dim=dim),
        ]))  # fmt: skip
        cases.append((values, earlier, shard, amount, 0))
    if draw(st.booleans()):  # chains: an Ln step after an unstructured one, and before one
        for chain in (
            fp.chain(fp.L1Unstructured(0.3), fp.LnStructured(1, n=1, dim=dim)),
            fp.chain(fp.LnStructured(sparsity=0.5, n=2, dim=dim), fp.L1Unstructured(2)),
        ):
            cases.append((values, earlier, shard, chain, 0))
    return cases


def _nuc_across(case: Case) -> bool:
    """Whether ``case`` asks for a nuclear norm of a 3-dim tensor sharded along another dim (refused)."""
    values, _, shard, spec, _ = case
    if not isinstance(spec, fp.LnStructured) or spec.n != "nuc" or values.dim() != 3 or shard is None:
        return False
    return shard != spec.dim % 3


def _uneven_example() -> list[Case]:
    """7 channels over 4 ranks (2, 2, 2, 1) and 5 rows (2, 2, 1, 0); ties, an earlier mask."""
    g = torch.Generator().manual_seed(1)
    values = torch.randint(-2, 3, (5, 7), generator=g).float()
    earlier = torch.rand(5, 7, generator=g) < 0.8
    earlier[:, 3] = False
    split = torch.ones(5, 7, dtype=torch.bool)
    split[0, 2:] = False  # row 0 kept on the first process's columns only
    split[1, :4] = False  # row 1 on the others' only
    specials = values.clone()
    specials[2, 6], specials[3, 0] = math.nan, math.inf  # NaN beside smaller numbers of other processes
    return [
        (values, split, 1, fp.LnStructured(2, n=-math.inf, dim=0), 0),
        (values, split, 1, fp.LnStructured(2, n=math.inf, dim=0), 0),
        (specials, None, 1, fp.LnStructured(3, n=-math.inf, dim=0), 0),
        (specials, split, 1, fp.LnStructured(sparsity=0.8, n=math.inf, dim=0), 0),
        (values, earlier, 1, fp.LnStructured(sparsity=0.6, n=1, dim=1), 0),
        (values, earlier, 0, fp.LnStructured(3, n=2, dim=1), 0),
        (values, None, 0, fp.LnStructured(0.5, n=math.inf, dim=0), 0),
        (values, earlier, 1, fp.LnStructured(2, n=0, dim=0), 0),
        (values, earlier, None, fp.LnStructured(2, n=-1, dim=0), 0),
    ]


@settings(max_examples=12)
@example(cases=_uneven_example())
@given(cases=_ln_cases())
def test_ln_structured_masks_gathered_equal_one_process_bit_for_bit(world4: World, cases: list[Case]) -> None:
    answers = world4.run(_on_ranks, [c for c in cases if not _nuc_across(c)])
    for i, (values, earlier, _, spec, _) in enumerate(c for c in cases if not _nuc_across(c)):
        expected = outcome(lambda: fp.compute_mask(spec, values, earlier))
        for a in answers:
            assert same(a[i]["mask"], expected), (spec, values.shape, values.dtype)
            assert a[i]["collectives"] <= {"c10d.allreduce_"} and a[i]["laid out"]


def _extremes(rank: int, size: int, cases: list[tuple[torch.Tensor, fp.Spec]]) -> list[torch.Tensor]:
    mesh = init_device_mesh("cpu", (size,))
    return [dt(fp.compute_mask(spec, distribute(values, mesh, Shard(1)))).full_tensor() for values, spec in cases]


def test_norms_across_processes_overflow_and_underflow_where_torchs_sums_do(world2: World) -> None:
    big = torch.tensor([[3e19, 3e19], [2e19, 2e19], [1.0, 1.0]])  # squares sum past float32's range: inf, inf
    tiny = torch.tensor([[3e-30, 3e-30], [2e-30, 2e-30], [1.0, 1.0]])  # squares under it: 0, 0
    half = torch.tensor([[300.0, 300.0], [200.0, 200.0], [500.0, 500.0]]).half()  # summed in float32, as torch
    cases = [
        (big, fp.LnStructured(1, n=2, dim=0)),  # inf and inf tie: the lower index goes
        (big.double(), fp.LnStructured(1, n=2, dim=0)),  # float64: no overflow, the smaller goes
        (tiny, fp.LnStructured(1, n=2, dim=0)),
        (tiny, fp.LnStructured(1, n=-1, dim=0)),  # |x|**-1 of 1e-30 overflows: 0, 0
        (half, fp.LnStructured(1, n=2, dim=0)),
        (half, fp.LnStructured(1, n=3, dim=0)),
    ]
    answers = world2.run(_extremes, cases)
    for i, (values, spec) in enumerate(cases):
        expected = fp.compute_mask(spec, values)
        assert all(torch.equal(a[i], expected) for a in answers), (values, spec)
    assert not expected[1].any() and expected[0].all()  # what torch does: half's 300s are no inf


def _norm_pairs(rank: int, size: int, shape: tuple[int, ...], d: int, shard: int) -> list[torch.Tensor]:
    """The masks of every order on random floats (no structure), for the consistency check."""
    mesh = init_device_mesh("cpu", (size,))
    values = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    w = distribute(values, mesh, Shard(shard))
    return [dt(fp.compute_mask(fp.LnStructured(0.5, n=n, dim=d), w)).full_tensor() for n in _ORDERS]


def test_norms_across_processes_give_every_process_the_same_mask_and_exact_orders_agree(world4: World) -> None:
    shape = (6, 37, 3)
    for d, shard in ((0, 1), (2, 1), (1, 0)):
        answers = world4.run(_norm_pairs, shape, d, shard)
        values = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        for i, n in enumerate(_ORDERS):
            assert all(torch.equal(a[i], answers[0][i]) for a in answers)  # one decision everywhere
            if n in (0, math.inf, -math.inf):  # computed exactly: always one process's mask
                assert torch.equal(answers[0][i], fp.compute_mask(fp.LnStructured(0.5, n=n, dim=d), values))


def _failing_norms(rank: int, size: int) -> list[str]:
    mesh = init_device_mesh("cpu", (size,))
    values = torch.randn(4, 3, 3)
    if rank == 1:
        values[0, 0, 0] = math.nan  # only this process's SVD fails
    shape = torch.Size((4 * size, 3, 3))
    w = DTensor.from_local(values, mesh, [Shard(0)], run_check=False, shape=shape, stride=(9, 3, 1))
    spec = fp.LnStructured(1, n="nuc", dim=0)
    errors = []
    for prune in (lambda: fp.compute_mask(spec, w), lambda: fp.global_structured(["w"], spec)({"w": w})):
        with pytest.raises(RuntimeError) as failed:
            prune()
        errors.append(str(failed.value))
    assert dt(fp.compute_mask(fp.LnStructured(0, n="nuc", dim=0), w)).to_local().all()  # nothing to rank: no norm
    return errors


def test_a_norm_one_process_cannot_compute_fails_on_every_process_instead_of_hanging(world2: World) -> None:
    mine, other = world2.run(_failing_norms)
    assert all("linalg.svd" in e for e in other)
    assert mine == 2 * [
        "LnStructured(amount=1, n='nuc', dim=0): another process of the mesh failed to compute its channels' "
        "norms (its own error says why); no process computed a mask"
    ]


def _random_group(rank: int, size: int, placements: list[int | None], seed: int | None) -> dict[str, Any]:
    """A global RandomUnstructured plan and per-parameter random chains, the generator seeded per rank."""
    mesh = init_device_mesh("cpu", (size,))
    g = torch.Generator().manual_seed(0)
    whole = {name: torch.randn(shape, generator=g) for name, shape in (("a", (5, 7)), ("b", (3, 6)), ("c", (4, 2)))}
    earlier = {"a": torch.rand(5, 7, generator=g) < 0.6}
    params = {n: distribute(t, mesh, placement_of(p)) for (n, t), p in zip(whole.items(), placements, strict=True)}
    masks = {"a": distribute(earlier["a"], mesh, placement_of(placements[0]))}
    torch.manual_seed(11 + rank if seed is None else seed)  # the global generator: the plans' entry
    with comm_mode() as comm:
        joint = fp.global_unstructured(["a", "b", "c"], fp.RandomUnstructured(sparsity=0.5))(params, masks)
        chains = fp.Plan({
            "a": [fp.RandomStructured(1, dim=1), fp.LnStructured(1, n=2, dim=0)],
            "b": fp.chain(fp.L1Unstructured(3), fp.RandomUnstructured(0.5)),
            "c": fp.RandomStructured(sparsity=0.5, dim=0),
        })(params, masks)  # fmt: skip
    return {
        "collectives": collectives(comm),
        "joint": {n: dt(m).full_tensor() for n, m in joint.items()},
        "chains": {n: dt(m).full_tensor() for n, m in chains.items()},
        "earlier": earlier["a"],
    }


def test_random_masks_are_the_same_for_every_world_size_and_placement_and_process(
    mesh: DeviceMesh, world2: World, world4: World
) -> None:
    reference = _random_group(0, 1, [0, 1, None], 11)  # a mesh of one, seeded 11: what every world gives
    for world, placements in ((world2, [0, 1, None]), (world4, [1, 0, 0]), (world4, [None, None, None])):
        for a in world.run(_random_group, placements, None):  # rank r seeded 11 + r: rank 0's seed wins
            assert a["collectives"] == {"c10d.allreduce_"}
            for key in ("joint", "chains"):
                assert all(torch.equal(a[key][n], reference[key][n]) for n in reference[key])
    joint, before = reference["joint"], reference["earlier"]
    assert not joint["a"][~before].any()
    assert sum(pruned(m) for m in joint.values()) == round(0.5 * (35 + 18 + 8))  # exactly the sparsity asked
    assert pruned(reference["chains"]["c"]) == 2 * 2  # 2 of 4 rows
    a = reference["chains"]["a"]
    assert pruned(a | ~before) == 0 or not torch.equal(a, before)  # the chain pruned on top of the earlier mask
    again = _random_group(0, 1, [0, 1, None], 11)
    assert all(torch.equal(again["joint"][n], joint[n]) for n in joint)  # identical on re-run
    other = _random_group(0, 1, [0, 1, None], 12)
    assert not all(torch.equal(other["joint"][n], joint[n]) for n in joint)  # another seed, another draw


def _random_cases(seed: int) -> list[Case]:
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(5, 7, generator=g)
    earlier = torch.rand(5, 7, generator=g) < 0.7
    earlier[2] = False
    cases: list[Case] = []
    for shard in (None, 0, 1):
        for spec in (
            fp.RandomUnstructured(sparsity=0.5), fp.RandomStructured(2, dim=0), fp.RandomStructured(0.5, dim=1)
        ):
            cases += [(values, None, shard, spec, seed), (values, earlier, shard, spec, None)]
    return cases


def test_random_structured_and_unstructured_prune_exact_counts_consistently(mesh: DeviceMesh, world4: World) -> None:
    cases = _random_cases(5)
    answers = world4.run(_on_ranks, cases)
    for i, (values, earlier, shard, spec, seed) in enumerate(cases):
        ones = distribute(values, mesh, Shard(0))  # a mesh of one, seeded as rank 0 is
        before = None if earlier is None else distribute(earlier, mesh, Shard(0))
        expected = _random_mask(spec, ones, before, 7 if seed is None else seed)
        count = units_pruned(spec, fp.compute_mask(spec, values, earlier))
        for a in answers:
            assert torch.equal(a[i]["mask"], expected) and units_pruned(spec, a[i]["mask"]) == count
            assert a[i]["laid out"] and a[i]["collectives"] == {"c10d.allreduce_"}
        if shard is None:  # replicas: each process holds the whole mask, all the same
            assert all(torch.equal(a[i]["local"], expected) for a in answers)


# --- global_structured over DTensors ---------------------------------------------------------


Member = tuple[torch.Tensor, "torch.Tensor | None", int | None]  # values, earlier mask, Shard dim (None: Replicate)


def _global_on_ranks(
    rank: int, size: int, members: list[Member], spec: fp.Spec, normalize: Any, seed: int | None
) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (size,))
    names = [f"p{i}" for i in range(len(members))]
    params = {n: distribute(v, mesh, placement_of(s)) for n, (v, _, s) in zip(names, members, strict=True)}
    masks = {
        n: distribute(e, mesh, placement_of(s)) for n, (_, e, s) in zip(names, members, strict=True) if e is not None
    }
    g = torch.Generator().manual_seed(5 + rank if seed is None else seed)
    plan = fp.global_structured(names, spec, normalize=normalize)  # type: ignore[arg-type]
    got: dict[str, DTensor] = {}
    error = ""
    with comm_mode() as comm, CommBytes() as sent:
        try:
            got = {n: dt(m) for n, m in plan(params, masks, generator=g).items()}
        except (ValueError, IndexError, RuntimeError) as e:
            error = f"{type(e).__name__}: {e}"
    return {
        "masks": error or {n: m.full_tensor() for n, m in got.items()},
        "laid out": all(m.placements == dt(params[n]).placements for n, m in got.items()),
        "collectives": collectives(comm),
        "bytes": sent.bytes,
    }


def _global_expected(members: list[Member], spec: fp.Spec, normalize: Any) -> Any:
    names = [f"p{i}" for i in range(len(members))]
    params = {n: v for n, (v, _, _) in zip(names, members, strict=True)}
    masks = {n: e for n, (_, e, _) in zip(names, members, strict=True) if e is not None}
    plan = fp.global_structured(names, spec, normalize=normalize)  # type: ignore[arg-type]
    return outcome(lambda: plan(params, masks))


@st.composite
def _global_groups(draw: st.DrawFn) -> tuple[list[Member], fp.Spec, Any]:
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    dim = draw(st.sampled_from([0, -1]))
    normalize = draw(st.sampled_from([None, "max", "mean"]))
    members: list[Member] = []
    for _ in range(draw(st.integers(1, 3))):
        shape = tuple(draw(st.lists(st.integers(0, 6), min_size=2, max_size=3)))
        values = torch.randint(-3, 4, shape, generator=g).to(draw(st.sampled_from([torch.float32, torch.float64])))
        earlier = torch.rand(shape, generator=g) < 0.8 if draw(st.booleans()) else None
        members.append((values, earlier, draw(st.sampled_from([None, *range(len(shape))]))))
    # small integers: every order's norms are exact but for 'mean', whose sums are exact for n = 1, 0, inf
    orders: list[fp.NormOrder] = [1, 0, math.inf] if normalize == "mean" else [1, 2, 3, 0, -1, math.inf, -math.inf, "fro"]
    n = draw(st.sampled_from(orders))
    channels = sum(v.shape[dim] for v, _, _ in members)
    spec = draw(st.sampled_from([
        fp.LnStructured(draw(st.integers(0, channels)), n=n, dim=dim),
        fp.LnStructured(draw(st.floats(0, 1)), n=n, dim=dim),
        fp.LnStructured(sparsity=draw(st.floats(0, 1)), n=n, dim=dim),
    ]))  # fmt: skip
    return members, spec, normalize


def _uneven_group() -> tuple[list[Member], fp.Spec, Any]:
    """Channels cut 2, 2, 1, 0 and 2, 2, 2, 1; a replica; a tensor sharded along its other dim; ties."""
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-2, 3, (5, 4), generator=g).float()
    earlier = torch.rand(5, 4, generator=g) < 0.8
    earlier[1] = False
    members: list[Member] = [
        (a, earlier, 0),
        (torch.randint(-2, 3, (7, 3, 2), generator=g).double(), None, 0),
        (torch.randint(-2, 3, (3, 6), generator=g).float(), None, None),
        (torch.randint(-2, 3, (4, 9), generator=g).float(), torch.rand(4, 9, generator=g) < 0.5, 1),
    ]
    return members, fp.LnStructured(sparsity=0.5, n=2, dim=0), "max"


def _means_of_cut_channels() -> tuple[list[Member], fp.Spec, Any]:
    """Two tensors of different scales, their channels cut: the mean of each counts its unpruned channels."""
    g = torch.Generator().manual_seed(4)
    a = torch.randint(1, 4, (6, 3), generator=g).float()
    earlier = torch.ones(6, 3, dtype=torch.bool)
    earlier[[0, 5]] = False
    b = torch.randint(1, 4, (5, 2), generator=g).float() * 10
    return [(a, earlier, 0), (b, None, 0), (b.T.contiguous(), None, 0)], fp.LnStructured(0.4, n=1, dim=0), "mean"


@settings(max_examples=10)
@example(example=_uneven_group())
@example(example=_means_of_cut_channels())
@given(example=_global_groups())
def test_global_structured_over_dtensors_equals_one_process(
    world4: World, example: tuple[list[Member], fp.Spec, Any]
) -> None:
    members, spec, normalize = example
    expected = _global_expected(members, spec, normalize)
    for a in world4.run(_global_on_ranks, members, spec, normalize, 0):
        assert a["collectives"] <= {"c10d.allreduce_"} and a["laid out"]
        if isinstance(expected, str):
            assert a["masks"] == expected
        else:
            assert all(torch.equal(a["masks"][n], m) for n, m in expected.items()), (spec, normalize)


def test_global_random_structured_is_the_same_for_every_world_size_and_placement(
    mesh: DeviceMesh, world2: World, world4: World
) -> None:
    g = torch.Generator().manual_seed(0)
    values = [torch.randn(6, 5, generator=g), torch.randn(3, 4, 2, generator=g), torch.randn(5, 3, generator=g)]
    earlier = torch.rand(6, 5, generator=g) < 0.7
    earlier[4] = False
    earlier[0] = torch.arange(5) == 4  # kept on the last columns' process only
    spec = fp.RandomStructured(sparsity=0.5, dim=0)
    channels_cut: list[Member] = [(values[0], earlier, 0), (values[1], None, 0), (values[2], None, 0)]
    reference = _global_on_ranks(0, 1, channels_cut, spec, None, 9)
    masks = reference["masks"]
    assert sum(units_pruned(spec, m) for m in masks.values()) == round(0.5 * 14)  # channels, earlier one included
    assert not masks["p0"][~earlier].any()
    for world, placements in ((world2, (0, 1, None)), (world4, (1, None, 0)), (world4, (0, 0, 0))):
        members = [(v, e, p) for v, e, p in zip(values, (earlier, None, None), placements, strict=True)]
        for a in world.run(_global_on_ranks, members, spec, None, None):  # rank r seeded 5 + r: rank 0's wins
            assert a["collectives"] <= {"c10d.allreduce_"} and a["laid out"]
            same_seed = _global_on_ranks(0, 1, members, spec, None, 5)["masks"]
            assert all(torch.equal(a["masks"][n], same_seed[n]) for n in masks)
    again = _global_on_ranks(0, 1, channels_cut, spec, None, 9)
    assert all(torch.equal(again["masks"][n], masks[n]) for n in masks)


def test_global_structured_sends_two_all_reduces_of_a_few_numbers_per_channel(world2: World) -> None:
    g = torch.Generator().manual_seed(0)
    sent: dict[str | None, set[int]] = {}
    for width in (12, 120):  # 10x along the dims other than the channels
        members: list[Member] = [
            (_separated((8, width), 0, torch.float32, g), None, 0),
            (_separated((6, width, 2), 0, torch.float32, g), torch.rand(6, width, 2, generator=g) < 0.9, 0),
        ]
        for normalize in (None, "max", "mean"):
            answers = world2.run(_global_on_ranks, members, fp.LnStructured(0.5, n=2, dim=0), normalize, 0)
            assert all(a["collectives"] == {"c10d.allreduce_"} for a in answers)
            sent.setdefault(normalize, set()).update(a["bytes"] for a in answers)
    # the units' two all-reduces, in float64, whatever normalize (every process then holds every key):
    # the maximum of each channel's NaN and inf flags and largest term, and of the masked tensor's "left"
    # flags (3 * 14 + 6), then the sum of each channel's rounded squares (14): fixed as the width grows
    assert sent == dict.fromkeys((None, "max", "mean"), {8 * (3 * 14 + 6 + 14)})


# --- communication -----------------------------------------------------------------------


def _bytes_sent(
    rank: int, size: int, shape: tuple[int, ...], shard: int | None, spec: fp.Spec, earlier: bool
) -> tuple[set[str], int]:
    mesh = init_device_mesh("cpu", (size,))
    g = torch.Generator().manual_seed(0)
    d = spec.dim if isinstance(spec, (fp.LnStructured, fp.RandomStructured)) else 0
    values = _separated(shape, d, torch.float32, g)  # no ties: a fixed number of rounds
    w = distribute(values, mesh, placement_of(shard))
    before = None
    if earlier:
        kept = torch.ones(shape, dtype=torch.bool).index_fill_(0, torch.tensor([1]), False)  # channel 1 pruned
        before = distribute(kept, mesh, placement_of(shard))
    with comm_mode() as comm, CommBytes() as sent:
        fp.compute_mask(spec, w, before)
    return collectives(comm), sent.bytes


#: (shard, spec, earlier mask, bytes per call, whether they stay fixed as the channels grow too):
#: channels whole on each process, or not (C numbers: fixed as the other dims grow); replicas.
_TRAFFIC = [
    (0, fp.LnStructured(0.5, n=2, dim=0), False, 16 + _ROUNDS32, True),  # the count and a failure flag, the select
    (0, fp.LnStructured(sparsity=0.5, n=1, dim=0), True, 16 + _ROUNDS32, True),
    (1, fp.LnStructured(0.5, n=2, dim=0), False, 8 * 8, False),  # 8 channels' sums, float64
    (1, fp.LnStructured(0.5, n=math.inf, dim=0), True, 2 * 8 * 8, False),  # their largest |x| and unpruned flags
    (None, fp.LnStructured(0.5, n=2, dim=0), True, 0, True),
    (0, fp.RandomUnstructured(0.5), True, 16 + _ROUNDS64, True),  # the count and the seed, then the select
    (None, fp.RandomUnstructured(0.5), False, 8, True),  # the seed
    (0, fp.RandomStructured(0.5, dim=0), False, 16 + _ROUNDS64, True),
    (1, fp.RandomStructured(0.5, dim=0), False, 8, True),  # the seed
    (1, fp.RandomStructured(0.5, dim=0), True, 8 * (8 + 1), False),  # the channels' counts and the seed
]


@pytest.mark.parametrize(("shard", "spec", "earlier", "expected", "channels_too"), _TRAFFIC)
def test_each_call_sends_a_few_all_reduces_of_fixed_size(
    world2: World, shard: int | None, spec: fp.Spec, earlier: bool, expected: int, channels_too: bool
) -> None:
    sent = []
    shapes = [(8, 12), (8, 120)] + ([(80, 12)] if channels_too else [])  # 10x along the other dim, the channels
    for shape in shapes:
        for comms, count in world2.run(_bytes_sent, shape, shard, spec, earlier):
            assert comms == ({"c10d.allreduce_"} if expected else set())
            sent.append(count)
    assert set(sent) == {expected}
