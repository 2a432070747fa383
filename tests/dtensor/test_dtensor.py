"""DTensor inputs: masks computed where the blocks lie equal the masks of the whole tensors.

Three settings, cheapest first:

- in this process, a gloo group of 1 (a 1-process mesh): the shard path runs
  for real (its all-reduces over one process), which checks specs, chains,
  earlier masks and every refusal fast;
- a world of 2 processes (``tests/_distributed.py``): an FSDP2 model
  (``fully_shard``, uneven dim 0) pruned by a global plan, bit for bit as one
  process, with all-reduces only, as many bytes at 10x the hidden size, and
  3 masked SGD steps;
- a world of 4: global groups of ``Shard(0)``, ``Shard(1)`` and
  ``Replicate()`` DTensors, uneven and empty blocks, ties and NaN (a
  hypothesis property).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _distributed import World
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import funcprune as fp
from funcprune._dtensor._layout import layout_of
from funcprune._dtensor._cuts import chunk
from funcprune._select._radix import BINS

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed with gloo"
)

if dist.is_available():
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.placement_types import _StridedShard


def distribute(t: torch.Tensor, mesh: DeviceMesh, placement: Placement) -> torch.Tensor:
    """This process's block of ``t`` as a DTensor, cut by ``torch.chunk`` (no communication)."""
    local = t
    if isinstance(placement, Shard):
        d = placement.dim % t.dim()
        pieces = list(torch.chunk(t, mesh.size(0), dim=d))
        rank = mesh.get_local_rank(0)
        empty = t.narrow(d, t.shape[d], 0)  # ranks past the last chunk hold nothing
        local = pieces[rank] if rank < len(pieces) else empty
    return DTensor.from_local(
        local.contiguous(), mesh, [placement], run_check=False, shape=t.shape, stride=t.contiguous().stride()
    )


class CommBytes(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's __init_subclass__
    """Counts the bytes of the tensors that collectives send (their first tensor argument)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.namespace in ("c10d", "_c10d_functional", "c10d_functional"):
            tensors = [a for a in tree_flatten((args, kwargs or {}))[0] if isinstance(a, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors[:1])
        return func(*args, **(kwargs or {}))


def comm_mode() -> CommDebugMode:
    """torch's counter of collectives (any process group, DTensor's or direct calls)."""
    return CommDebugMode()  # type: ignore[no-untyped-call]


def collectives(mode: CommDebugMode) -> set[str]:
    return {str(op) for op in mode.get_comm_counts()}


def dt(t: object) -> DTensor:
    """``t``, which must be a DTensor."""
    assert isinstance(t, DTensor)
    return t


# --- one process: a gloo group of 1 -------------------------------------------------


def test_blocks_are_cut_as_torch_cuts_them() -> None:
    for n in range(14):
        for pieces in range(1, 6):
            for index in range(pieces):
                size, offset = Shard.local_shard_size_and_offset(n, pieces, index)
                assert chunk(n, pieces, index)[1] == size
                if size:
                    assert chunk(n, pieces, index)[0] == offset


_SPECS = st.sampled_from([
    fp.L1Unstructured(0.4), fp.L1Unstructured(3), fp.L1Unstructured(sparsity=0.7), fp.Identity(),
    fp.chain(fp.L1Unstructured(0.5), fp.L1Unstructured(sparsity=0.8)), fp.chain(),
    fp.chain(fp.Identity(), fp.L1Unstructured(1)),
])  # fmt: skip


def outcome(compute: Any) -> Any:
    """What ``compute()`` returns, whole, or the ``ValueError`` message it raises."""
    try:
        got = compute()
    except ValueError as e:
        return str(e)
    return got.full_tensor() if isinstance(got, DTensor) else got


def same(got: Any, expected: Any) -> bool:
    """Equal masks, or the same error message."""
    if isinstance(expected, str):
        return isinstance(got, str) and got == expected
    return isinstance(got, torch.Tensor) and torch.equal(got, expected)


@settings(max_examples=30)
@given(
    seed=st.integers(0, 2**16),
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    dim=st.integers(-3, 3),
    spec=_SPECS,
    earlier=st.booleans(),
    custom=st.booleans(),
)
def test_a_mesh_of_one_gives_the_masks_of_one_process(
    mesh: DeviceMesh, seed: int, shape: list[int], dim: int, spec: fp.Spec, earlier: bool, custom: bool
) -> None:
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-3, 4, shape, generator=g).float()  # ties
    w[w == 3] = float("nan")
    before = torch.rand(shape, generator=g) < 0.8 if earlier else None
    if custom:
        spec = fp.chain(spec, fp.CustomFromMask(torch.rand(shape, generator=g) < 0.7))
    placement = Shard(dim % len(shape)) if -len(shape) <= dim < len(shape) else Replicate()
    dw = distribute(w, mesh, placement)
    dbefore = None if before is None else distribute(before, mesh, placement)
    expected = outcome(lambda: fp.compute_mask(spec, w, before))
    assert same(outcome(lambda: fp.compute_mask(spec, dw, dbefore)), expected)
    if isinstance(expected, str):  # an amount too large: the same error, and nothing else to compare
        return
    mask = dt(fp.compute_mask(spec, dw, dbefore))
    assert mask.placements == dt(dw).placements and mask.device_mesh == mesh and mask.dtype == torch.bool
    torch.testing.assert_close(
        outcome(lambda: fp.prune(spec, dw, dbefore)), fp.prune(spec, w, before), rtol=0, atol=0, equal_nan=True
    )
    plan = fp.Plan({"w": [spec, fp.L1Unstructured(1)] if earlier else spec})
    masks = {} if before is None else {"w": before}
    dmasks = {} if dbefore is None else {"w": dbefore}
    assert same(outcome(lambda: plan({"w": dw}, dmasks)["w"]), outcome(lambda: plan({"w": w}, masks)["w"]))


@settings(max_examples=20)
@given(seed=st.integers(0, 2**16), spec=_SPECS, sharded=st.sampled_from([(0, 1), (1, None), (None, None)]))
def test_a_group_on_a_mesh_of_one_is_ranked_as_one_process_ranks_it(
    mesh: DeviceMesh, seed: int, spec: fp.Spec, sharded: tuple[int | None, int | None]
) -> None:
    g = torch.Generator().manual_seed(seed)
    params = {"w": torch.randint(-2, 3, (3, 4), generator=g).float(), "v": torch.randn(5, 2, generator=g).double()}
    masks = {"w": torch.rand(3, 4, generator=g) < 0.5}
    layouts = {n: Replicate() if d is None else Shard(d) for n, d in zip(params, sharded, strict=True)}
    dparams = {n: distribute(t, mesh, layouts[n]) for n, t in params.items()}
    dmasks = {n: distribute(m, mesh, layouts[n]) for n, m in masks.items()}
    plan = fp.global_unstructured(["w", "v"], spec)
    expected = outcome(lambda: plan(params, masks))
    got = outcome(lambda: {n: dt(m).full_tensor() for n, m in plan(dparams, dmasks).items()})
    assert got == expected if isinstance(expected, str) else all(torch.equal(got[n], expected[n]) for n in params)


@dataclasses.dataclass(frozen=True)
class EveryOther(fp.Spec):
    """A user spec: keeps the odd flat indices."""

    @property
    def pruning_type(self) -> fp.PruningType:
        return "unstructured"

    def compute_mask(
        self, scores: torch.Tensor, default_mask: torch.Tensor | None = None, *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:  # fmt: skip
        keep = (torch.arange(scores.numel()) % 2 == 1).reshape(scores.shape)
        return keep if default_mask is None else keep & default_mask


_REFUSED = [EveryOther(), fp.chain(fp.L1Unstructured(0.5), EveryOther()), fp.chain(fp.NM(2, 4), EveryOther())]


@pytest.mark.parametrize("spec", _REFUSED, ids=lambda s: type(s).__name__ if not isinstance(s, fp.Chain) else "Chain")
def test_specs_that_would_need_the_whole_tensor_are_refused(mesh: DeviceMesh, spec: fp.Spec) -> None:
    w = distribute(torch.randn(4, 4), mesh, Shard(0))
    name = repr(spec.specs[-1] if isinstance(spec, fp.Chain) else spec)
    supported = (
        "on DTensors funcprune runs L1Unstructured, RandomUnstructured, LnStructured, RandomStructured, "
        "Identity, CustomFromMask, NM, Block, PerSlice and chains of them"
    )
    with pytest.raises(NotImplementedError, match=rf"^compute_mask: scores is a DTensor, and {re.escape(name)} cannot prune DTensors yet; {supported}"):
        fp.compute_mask(spec, w)
    with pytest.raises(NotImplementedError, match=rf"^Plan: the parameter 'w' is a DTensor, and {re.escape(name)} cannot"):
        fp.Plan({"w": spec})({"w": w})
    if spec.pruning_type == "unstructured":
        with pytest.raises(NotImplementedError, match=r"^global_unstructured: the parameter 'w' is a DTensor, and "):
            fp.global_unstructured(["w", "v"], spec)({"w": w, "v": w * 2})
        with pytest.raises(NotImplementedError, match=r"^compute_joint_masks: scores\[0\] is a DTensor, and "):
            fp.compute_joint_masks(spec, [w, w])


@pytest.mark.parametrize(
    "spec", [
        fp.RandomUnstructured(0.5), fp.LnStructured(0.5, n=2, dim=0), fp.RandomStructured(1, dim=1),
        fp.NM(2, 4), fp.Block(0.5, (2, 2)), fp.PerSlice(fp.L1Unstructured(1), dim=0),
        fp.L1Unstructured(0.5), fp.Identity(), fp.CustomFromMask(torch.ones(4, 4)),
    ],
    ids=lambda s: type(s).__name__,
)  # fmt: skip
def test_a_specs_own_compute_mask_refuses_dtensors_rather_than_gather_them(mesh: DeviceMesh, spec: fp.Spec) -> None:
    w = distribute(torch.randn(4, 4), mesh, Shard(0))
    with pytest.raises(TypeError, match=r"^compute_mask: got a DTensor where the kernels take whole tensors \(a spec's own compute_mask method\); call funcprune.compute_mask\(spec, scores\)"):
        spec.compute_mask(w)


def test_partial_placements_are_refused(mesh: DeviceMesh) -> None:
    t = torch.randn(4, 4)
    w = DTensor.from_local(t, mesh, [Partial()], run_check=False, shape=t.shape, stride=t.stride())
    expected = r"scores is a DTensor laid out as \[Partial\(sum\)\] .* funcprune computes masks of DTensors laid out as Shard\(dim\), Replicate\(\) or FSDP2's _StridedShard\(dim\) on each dim of a device mesh only \(not yet Partial\)"
    with pytest.raises(NotImplementedError, match="^compute_mask: " + expected):
        fp.compute_mask(fp.L1Unstructured(0.5), w)
    with pytest.raises(NotImplementedError, match=r"^global_unstructured: the parameter 'w' is a DTensor laid out as"):
        fp.global_unstructured(["w"], fp.L1Unstructured(0.5))({"w": w})


def test_a_block_not_cut_as_torch_chunk_cuts_is_refused(mesh: DeviceMesh) -> None:
    t = torch.randn(5, 4)
    w = DTensor.from_local(t[:3], mesh, [Shard(0)], run_check=False, shape=t.shape, stride=t.stride())
    with pytest.raises(ValueError, match=r"^compute_mask: scores holds a block of shape \(3, 4\) on this process, but \[Shard\(dim=0\)\] of shape \(5, 4\) over a mesh of shape \(1,\) gives \(5, 4\)"):
        fp.compute_mask(fp.L1Unstructured(1), w)


def test_dtensors_and_plain_tensors_do_not_mix(mesh: DeviceMesh) -> None:
    t = torch.randn(4, 4)
    w, kept = distribute(t, mesh, Shard(0)), distribute(t > 0, mesh, Shard(0))
    plain = "a plain torch.Tensor but"
    with pytest.raises(TypeError, match=rf"^compute_mask: default_mask is {plain} scores is a DTensor"):
        fp.compute_mask(fp.L1Unstructured(1), w, t > 0)
    with pytest.raises(TypeError, match=rf"^compute_mask: default_mask is a DTensor but scores is a plain"):
        fp.compute_mask(fp.L1Unstructured(1), t, kept)
    with pytest.raises(TypeError, match=rf"^prune: importance_scores is {plain} t is a DTensor"):
        fp.prune(fp.L1Unstructured(1), w, importance_scores=t)
    with pytest.raises(TypeError, match=rf"^compute_joint_masks: scores\[1\] is {plain} scores\[0\] is a DTensor"):
        fp.compute_joint_masks(fp.L1Unstructured(1), [w, t])
    with pytest.raises(TypeError, match=rf"^compute_joint_masks: default_masks\[0\] is a DTensor but scores\[0\] is a plain"):
        fp.compute_joint_masks(fp.L1Unstructured(1), [t], [kept])
    with pytest.raises(TypeError, match=rf"^global_unstructured: the parameter 'v' is {plain} the parameter 'w' is a DTensor; a group ranked jointly must be all DTensors"):
        fp.global_unstructured(["w", "v"], fp.L1Unstructured(1))({"w": w, "v": t})
    with pytest.raises(TypeError, match=rf"^Plan: the mask for 'w' is {plain} the parameter is a DTensor"):
        fp.Plan({"w": fp.L1Unstructured(1)})({"w": w}, masks={"w": t > 0})
    with pytest.raises(TypeError, match=r"^Plan: the scores for 'v' is a DTensor but the parameter is a plain"):
        fp.Plan({"w": fp.L1Unstructured(1)})({"w": w, "v": t}, scores={"v": w})
    for apply in (fp.apply_masks, fp.apply_masks_, fp.mask_gradients, fp.mask_gradients_, fp.to_multipliers):
        with pytest.raises(TypeError, match=rf"^{apply.__name__}: the mask for 'w' is {plain} the parameter is a DTensor"):
            apply({"w": w}, {"w": t > 0})


def test_a_plan_mixing_dtensor_and_plain_parameters_prunes_each_as_it_is(mesh: DeviceMesh) -> None:
    t = torch.randn(4, 4)
    plan = fp.Plan({"*": fp.L1Unstructured(0.5)})
    masks = plan({"w": distribute(t, mesh, Shard(1)), "v": t})
    assert isinstance(masks["w"], DTensor) and type(masks["v"]) is torch.Tensor
    assert torch.equal(masks["w"].full_tensor(), masks["v"])


def test_masks_laid_out_otherwise_than_their_tensor_are_refused(mesh: DeviceMesh) -> None:
    t = torch.randn(4, 4)
    w, kept = distribute(t, mesh, Shard(0)), distribute(t > 0, mesh, Shard(1))
    other = r"is laid out as \[Shard\(dim=1\)\] on .* but .* as \[Shard\(dim=0\)\] on .*; they must have the same mesh and placements"
    with pytest.raises(ValueError, match="^compute_mask: default_mask " + other):
        fp.compute_mask(fp.L1Unstructured(1), w, kept)
    with pytest.raises(ValueError, match="^Plan: the mask for 'w' " + other):
        fp.Plan({"w": fp.L1Unstructured(1)})({"w": w}, masks={"w": kept})
    with pytest.raises(ValueError, match="^global_unstructured: the scores for 'w' " + other):
        fp.global_unstructured(["w"], fp.L1Unstructured(1))({"w": w}, scores={"w": distribute(t, mesh, Shard(1))})
    for apply in (fp.apply_masks, fp.apply_masks_, fp.mask_gradients, fp.mask_gradients_, fp.to_multipliers):
        with pytest.raises(ValueError, match=f"^{apply.__name__}: the mask for 'w' " + other):
            apply({"w": w}, {"w": kept})
    with pytest.raises(TypeError, match=r"^apply_masks: the mask for 'w' is a DTensor of dtype torch.float32; DTensor masks must be torch.bool"):
        fp.apply_masks({"w": w}, {"w": distribute((t > 0).float(), mesh, Shard(0))})


def test_a_group_spans_one_mesh(mesh: DeviceMesh) -> None:
    t = torch.randn(4, 4)
    a = distribute(t, init_device_mesh("cpu", (1,), mesh_dim_names=("a",)), Shard(0))
    b = distribute(t, init_device_mesh("cpu", (1,), mesh_dim_names=("b",)), Shard(0))
    with pytest.raises(ValueError, match=r"^compute_joint_masks: scores\[1\] is on .* but scores\[0\] on .*; a group ranked jointly must share one device mesh"):
        fp.compute_joint_masks(fp.L1Unstructured(1), [a, b])


def test_payoff_refuses_dtensors_rather_than_rebuild_one_block(mesh: DeviceMesh) -> None:
    model = nn.Linear(4, 4)
    model.weight = nn.Parameter(distribute(torch.randn(4, 4), mesh, Shard(0)))
    params = dict(model.named_parameters())
    plain = {"weight": torch.ones(4, 4, dtype=torch.bool)}
    expected = r"the {} 'weight' is a DTensor \(.*\); {} does not support DTensors yet"
    with pytest.raises(NotImplementedError, match="^bake: " + expected.format("parameter", "bake")):
        fp.bake(model, plain)
    with pytest.raises(NotImplementedError, match="^to_sparse: " + expected.format("parameter", "to_sparse")):
        fp.to_sparse(params, plain, layout="csr")
    for fn in (fp.shrink, fp.propagate):
        with pytest.raises(NotImplementedError, match=f"^{fn.__name__}: " + expected.format("parameter", fn.__name__)):
            fn(model, plain, torch.randn(1, 4))
    with pytest.raises(NotImplementedError, match="^structure: " + expected.format("parameter", "structure")):
        fp.structure(model, torch.randn(1, 4))


def test_masks_apply_to_dtensors_block_by_block(mesh: DeviceMesh) -> None:
    t = torch.randn(4, 6)
    kept = fp.compute_mask(fp.L1Unstructured(0.5), t)
    w = nn.Parameter(distribute(t, mesh, Shard(1)))
    dkept = distribute(kept, mesh, Shard(1))
    with comm_mode() as comm:
        out = dt(fp.apply_masks({"w": w}, {"w": dkept})["w"])
        torch.autograd.backward(out.sum())
        grad = dt(w.grad)
        assert torch.equal(dt(fp.mask_gradients({"w": grad}, {"w": dkept})["w"]).full_tensor(), kept.float())
        fp.mask_gradients_({"w": w}, {"w": dkept})
        fp.apply_masks_({"w": w}, {"w": dkept})
        multiplied = dt(fp.apply_masks({"w": w}, fp.to_multipliers({"w": w}, {"w": dkept}))["w"])
    assert not collectives(comm)
    assert out.placements == dt(w).placements
    assert torch.equal(out.full_tensor(), t * kept)
    assert torch.equal(grad.full_tensor(), kept.float())
    assert torch.equal(dt(w.detach()).full_tensor(), t * kept) and torch.equal(multiplied.full_tensor(), t * kept)


def test_functional_call_masked_runs_a_module_of_dtensor_parameters_with_their_masks(mesh: DeviceMesh) -> None:
    plain = nn.Linear(6, 3)
    model = copy.deepcopy(plain)
    model.weight = nn.Parameter(distribute(plain.weight.detach(), mesh, Shard(0)))  # as tensor parallelism lays it
    model.bias = nn.Parameter(distribute(plain.bias.detach(), mesh, Replicate()))
    params = dict(model.named_parameters())
    plan = fp.Plan({"weight": fp.L1Unstructured(0.5)})
    masks = plan(params)
    x = torch.randn(5, 6)
    dx = distribute(x, mesh, Replicate()).requires_grad_()  # (CommDebugMode's module hooks want an input's grad)
    with comm_mode() as comm:
        out = dt(fp.functional_call_masked(model, params, masks, dx))
        torch.autograd.backward(out.sum())
    assert collectives(comm) <= {"c10d.allreduce_"}
    expected = fp.functional_call_masked(plain, dict(plain.named_parameters()), plan(dict(plain.named_parameters())), x)
    torch.testing.assert_close(out.full_tensor(), expected)
    assert not dt(model.weight.grad).full_tensor()[~dt(masks["weight"]).full_tensor()].any()  # no gradient where pruned


def test_functional_call_masked_refuses_an_fsdp2_module(mesh: DeviceMesh) -> None:
    from torch.distributed.fsdp import fully_shard

    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    params = dict(model.named_parameters())
    masks = fp.global_unstructured(["*.weight"], fp.L1Unstructured(0.5))(params)
    instead = r"fp.mask_gradients_\(params, masks\) after backward\(\), optimizer.step\(\), then fp.apply_masks_"
    with pytest.raises(TypeError, match=r"^functional_call_masked: module.0 is an FSDP2 module \(fully_shard\): .* " + instead):
        fp.functional_call_masked(model, params, masks, torch.randn(2, 3))


def test_compat_hook_mode_refuses_dtensor_parameters_and_leaves_the_module_as_it_was(mesh: DeviceMesh) -> None:
    from torch.distributed.fsdp import fully_shard

    import funcprune.compat as prune

    model = nn.Sequential(nn.Linear(4, 3))
    fully_shard(model[0], mesh=mesh)
    keys = set(model.state_dict())
    instead = r"use the functional API, which does: params = dict\(model.named_parameters\(\)\); masks = plan\(params\)"
    calls: dict[str, Callable[[], object]] = {
        "L1Unstructured.apply": lambda: prune.l1_unstructured(model[0], "weight", amount=0.5),
        "RandomStructured.apply": lambda: prune.random_structured(model[0], "weight", amount=1, dim=0),
        "global_unstructured": lambda: prune.global_unstructured(
            [(model[0], "weight")], pruning_method=prune.L1Unstructured, amount=0.5
        ),
        "install_masks_": lambda: prune.install_masks_(model, {"0.weight": torch.ones(3, 4, dtype=torch.bool)}),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=rf"^{re.escape(name)}: FSDPLinear.weight is a DTensor \(FSDP2 or tensor parallelism\); .* {instead}"):
            call()
        assert set(model.state_dict()) == keys and not prune.is_pruned(model)  # nothing half-done


# --- 2 processes: an FSDP2 model ------------------------------------------------------


def _model(hidden: int) -> nn.Sequential:
    """A seeded model whose entries have distinct magnitudes (no ties: a fixed number of rounds)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, hidden), nn.ReLU(), nn.Linear(hidden, 3))
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    g = torch.Generator().manual_seed(1)
    values = (torch.randperm(n, generator=g) + 1).float() / n * torch.randn(n, generator=g).sign()
    nn.utils.vector_to_parameters(values, params)
    return model


def _steps(model: nn.Module, params: Mapping[str, torch.Tensor], masks: dict[str, torch.Tensor]) -> None:
    """3 masked SGD steps (momentum, weight decay) on one batch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(2))
    fp.apply_masks_(params, masks)
    for _ in range(3):
        optimizer.zero_grad()
        torch.autograd.backward(model(x).square().mean())
        fp.mask_gradients_(params, masks)
        optimizer.step()
        fp.apply_masks_(params, masks)


def _prune_and_train_fsdp(
    rank: int, size: int, hidden: int, mesh_shape: tuple[int, ...] | None = None, tensor_parallel: bool = False
) -> dict[str, Any]:
    """On each rank: FSDP2 masks from a global plan and 3 masked steps, beside one process's.

    ``mesh_shape`` ``(replicas, shards)`` trains with HSDP (``Replicate()``
    along the first mesh dim, ``Shard(0)`` along the second); with
    ``tensor_parallel``, ``(dp, tp)``: the first layer column-wise and the
    second row-wise over ``tp``, then FSDP2 over ``dp``. ``None`` is a 1-D
    mesh of every process.
    """
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    warnings.filterwarnings("ignore")  # FSDP2's own warnings; pytest's filters do not reach here
    names = ("dp", "tp") if tensor_parallel else ("replicate", "shard")
    mesh = init_device_mesh("cpu", (size,)) if mesh_shape is None else init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    reference = _model(hidden)
    model = copy.deepcopy(reference)
    if tensor_parallel:
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    for module in (model[0], model[2], model):
        fully_shard(module, mesh=mesh["dp"] if tensor_parallel else mesh)
    params = {name: dt(p) for name, p in model.named_parameters()}
    plan = fp.global_unstructured(fp.prunable(model), fp.L1Unstructured(sparsity=0.9))
    with comm_mode() as comm, CommBytes() as sent:
        masks = {name: dt(m) for name, m in plan(params).items()}
    plain = dict(reference.named_parameters())
    expected = plan(plain)
    _steps(model, params, dict(masks))
    _steps(reference, plain, expected)
    return {
        "collectives": collectives(comm),
        "bytes": sent.bytes,
        "laid out": all(
            m.placements == params[n].placements and m.device_mesh == params[n].device_mesh for n, m in masks.items()
        ),
        "local rows": params["0.weight"].to_local().shape[0],
        "layouts": {n: tuple(p.placements) for n, p in params.items()},
        "masks": {n: torch.equal(m.full_tensor(), expected[n]) for n, m in masks.items()},
        "trained": {n: p.full_tensor().detach() for n, p in params.items()},
        "expected": {n: p.detach() for n, p in plain.items()},
        "kept": {n: m.full_tensor() for n, m in masks.items()},
    }


def test_an_fsdp2_model_is_pruned_as_one_process_would_with_all_reduces_of_fixed_size(world2: World) -> None:
    sent = {}
    for hidden in (5, 50):
        answers = world2.run(_prune_and_train_fsdp, hidden)
        assert [a["local rows"] for a in answers] == [-(-hidden // 2), hidden // 2]  # uneven dim 0
        for a in answers:
            assert a["collectives"] == {"c10d.allreduce_"}  # no all_gather, nothing else
            assert set(a["masks"]) == {"0.weight", "2.weight"} and all(a["masks"].values())
            assert a["laid out"]
            for name, mask in a["kept"].items():
                assert not a["trained"][name][~mask].any()  # pruned entries stay exactly 0
                assert a["trained"][name][mask].all()
            for name, p in a["trained"].items():
                torch.testing.assert_close(p, a["expected"][name])
        sent[hidden] = {a["bytes"] for a in answers}
    # 3 rounds of 32-bit keys' histograms (the first's sum is the unpruned count): whatever the size
    assert sent[5] == sent[50] == {3 * BINS * 8}


def _calibration(rank: int) -> list[torch.Tensor]:
    """Rank ``rank``'s calibration batches (data parallel: each process its own)."""
    g = torch.Generator().manual_seed(10 + rank)
    return [torch.randn(4, 3, generator=g) for _ in range(2)]


def _wanda_on_fsdp(rank: int, size: int, hidden: int) -> dict[str, Any]:
    """Wanda on an FSDP2 model: norms over every process's batches, scores and masks block by block."""
    from torch.distributed.fsdp import fully_shard

    warnings.filterwarnings("ignore")
    mesh = init_device_mesh("cpu", (size,))
    reference = _model(hidden)
    model = copy.deepcopy(reference)
    for module in (model[0], model[2], model):
        fully_shard(module, mesh=mesh)
    names = ["0.weight", "2.weight"]
    norms = fp.input_norms(model, _calibration(rank), names, across=dist.group.WORLD)
    params = {n: dt(p) for n, p in model.named_parameters()}
    plan = fp.global_unstructured(names, fp.L1Unstructured(sparsity=0.5))
    with comm_mode() as comm:
        scores = fp.wanda(params, norms)
    masks = plan(params, scores=scores)
    plain = dict(reference.named_parameters())
    return {
        "norms": norms,
        "scores sent": collectives(comm),
        "scores": {n: dt(t).full_tensor() for n, t in scores.items()},
        "masks": {n: dt(m).full_tensor() for n, m in masks.items()},
        "expected": plan(plain, scores=fp.wanda(plain, norms)),  # one process, the same norms
    }


def test_wanda_on_an_fsdp2_model_takes_every_process_s_batches_and_scores_block_by_block(world2: World) -> None:
    reference = _model(6)
    names = ["0.weight", "2.weight"]
    everyone = fp.input_norms(reference, _calibration(0) + _calibration(1), names)  # one process, all batches
    answers = world2.run(_wanda_on_fsdp, 6)
    for a in answers:
        for n in names:
            assert torch.equal(a["norms"][n], answers[0]["norms"][n])  # every process the same norms
            torch.testing.assert_close(a["norms"][n], everyone[n])
            torch.testing.assert_close(a["scores"][n], fp.wanda(dict(reference.named_parameters()), everyone)[n])
            assert torch.equal(a["masks"][n], a["expected"][n])
        assert not a["scores sent"]  # each process scales its own block


def _per_tensor(rank: int, size: int, spec: fp.Spec, earlier: bool, max_keys: int | None = None) -> dict[str, Any]:
    """A per-parameter plan over 5 DTensors (Shard(0), Shard(1), uneven): masks, and how many all-reduces.

    ``max_keys``: the keys per process a lockstep batch may hold, for this call.
    """
    from funcprune._dtensor import _rules

    budget = _rules.LOCKSTEP_MAX_KEYS
    _rules.LOCKSTEP_MAX_KEYS = budget if max_keys is None else max_keys
    try:
        return _per_tensor_plan(size, spec, earlier)
    finally:
        _rules.LOCKSTEP_MAX_KEYS = budget


def _per_tensor_plan(size: int, spec: fp.Spec, earlier: bool) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (size,))
    whole = _distinct_set()
    placements = [Shard(0), Shard(1), Shard(0), Shard(0), Shard(1)]
    params = {n: distribute(t, mesh, p) for (n, t), p in zip(whole.items(), placements, strict=True)}
    masks = {n: distribute(t > -1, mesh, p) for (n, t), p in zip(whole.items(), placements, strict=True)} if earlier else {}
    with comm_mode() as comm:
        try:
            got = fp.Plan({"*": spec})(params, masks)
        except ValueError as e:  # on every process alike, once the counts are known
            return {"masks": str(e), "counts": {str(k): v for k, v in comm.get_comm_counts().items()}}
    return {"masks": {n: dt(m).full_tensor() for n, m in got.items()}, "counts": {str(k): v for k, v in comm.get_comm_counts().items()}}


def _distinct_set() -> dict[str, torch.Tensor]:
    """5 float32 tensors of distinct magnitudes (no ties: a fixed number of rounds)."""
    shapes = [(7, 5), (4, 9), (6,), (3, 3, 2), (2, 11)]
    n = sum(math.prod(s) for s in shapes)
    values = (torch.randperm(n, generator=torch.Generator().manual_seed(0)) + 1).float() / n
    pieces = torch.split(values, [math.prod(s) for s in shapes])
    return {f"w{i}": t.reshape(s) for i, (t, s) in enumerate(zip(pieces, shapes, strict=True))}


@pytest.mark.parametrize(
    ("spec", "earlier"),
    [(fp.L1Unstructured(0.5), False), (fp.L1Unstructured(sparsity=0.7), True), (fp.L1Unstructured(2), True),
     (fp.L1Unstructured(30), True)],  # 30: more than w2's 6 entries, one process's error
)  # fmt: skip
def test_a_per_parameter_plan_runs_its_selections_in_lockstep_sharing_all_reduces(
    world2: World, spec: fp.Spec, earlier: bool
) -> None:
    whole = _distinct_set()
    masks = {n: t > -1 for n, t in whole.items()} if earlier else {}
    expected = outcome(lambda: fp.Plan({"*": spec})(whole, masks))
    for a in world2.run(_per_tensor, spec, earlier):
        if isinstance(expected, str):
            assert a["masks"] == expected and expected.startswith("Plan: cannot prune 'w2' with L1Unstructured(amount=30)")
            continue
        assert all(torch.equal(a["masks"][n], m) for n, m in expected.items())
        assert a["counts"] == {"c10d.allreduce_": 3}  # 3 rounds of float32 keys for the 5 tensors together


def test_lockstep_batches_are_cut_by_the_keys_they_hold(world2: World) -> None:
    whole = _distinct_set()  # 35, 36, 6, 18 and 22 entries: batches of at most 40 keys a process (80 in all)
    expected = fp.Plan({"*": fp.L1Unstructured(0.5)})(whole)
    for a in world2.run(_per_tensor, fp.L1Unstructured(0.5), False, 40):
        assert all(torch.equal(a["masks"][n], m) for n, m in expected.items())
        assert a["counts"] == {"c10d.allreduce_": 3 * 2}  # [35, 36] then [6, 18, 22]: 3 rounds each


class Routed(nn.Module):
    """Two layers, one of them called per batch (as an expert a router picks)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, 2), nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, to_a: bool) -> torch.Tensor:
        out: torch.Tensor = self.a(x) if to_a else self.b(x)
        return out


def _norms_across(rank: int, size: int, case: str) -> dict[str, torch.Tensor] | str:
    """``input_norms(across=WORLD)`` with each process's own batches (``case`` says which)."""
    torch.manual_seed(0)
    model = Routed()
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(rank))
    batches: list[Any] = {
        "uneven": [(x, True)] * (2 if rank == 0 else 0),  # rank 1: no batch
        "routed": [(x, rank == 0)],  # a on rank 0 only, b on rank 1 only
        "bad": [(x if rank == 0 else torch.ones(4, 5), True)],  # rank 1's batch does not fit
        "none": [],
    }[case]
    try:
        return fp.input_norms(model, batches, ["a.weight", "b.weight"] if case != "uneven" else ["a.weight"], across=dist.group.WORLD)
    except ValueError as e:
        return str(e)


def test_input_norms_across_processes_decide_together_from_every_process_s_batches(world2: World) -> None:
    torch.manual_seed(0)
    model = Routed()
    g0, g1 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    x0 = torch.randn(4, 3, generator=g0)
    expected = fp.input_norms(model, [(x0, True), (x0, True)], ["a.weight"])
    for got in world2.run(_norms_across, "uneven"):  # one process ran no batch: the other's count
        assert isinstance(got, dict) and torch.allclose(got["a.weight"], expected["a.weight"])
    x1 = torch.randn(4, 3, generator=g1)
    routed = {"a.weight": fp.input_norms(model, [(x0, True)], ["a.weight"])["a.weight"],
              "b.weight": fp.input_norms(model, [(x1, False)], ["b.weight"])["b.weight"]}  # fmt: skip
    for got in world2.run(_norms_across, "routed"):  # each layer called on one process only: both counted
        assert isinstance(got, dict) and all(torch.allclose(got[n], routed[n]) for n in routed)
    bad, other = world2.run(_norms_across, "bad")
    assert isinstance(other, str) and "expected its 3 input features in dim -1" in other  # its own error
    assert bad == "input_norms: another process of the group failed on its batches (its own error says why)"
    for got in world2.run(_norms_across, "none"):  # no batch anywhere: one process's error, on both
        assert got == "input_norms: no batches: batches was empty; pass at least one calibration batch"


def _large(seed: int) -> dict[str, torch.Tensor]:
    """A weight set of 2.2M entries (1.1M per process of 2), ties at the cut likely (float32)."""
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(1500, 1024, generator=g), "b": torch.randn(700, 1000, generator=g).double().float()}


def _prune_large(rank: int, size: int, spec: fp.Spec) -> dict[str, Any]:
    from funcprune._select import _choose

    threshold, _choose.SHARDED_BRACKET_MIN_KEYS = _choose.SHARDED_BRACKET_MIN_KEYS, 1 << 20  # bracketed here
    try:
        return _prune_large_bracketed(size, spec)
    finally:
        _choose.SHARDED_BRACKET_MIN_KEYS = threshold


def _prune_large_bracketed(size: int, spec: fp.Spec) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (size,))
    whole = _large(0)
    params = {"a": distribute(whole["a"], mesh, Shard(0)), "b": distribute(whole["b"], mesh, Shard(1))}
    earlier = {"b": distribute(whole["b"] > -1.5, mesh, Shard(1))}
    with comm_mode() as comm, CommBytes() as sent:
        try:
            masks = fp.global_unstructured(["a", "b"], spec)(params, earlier)
        except ValueError as e:  # on every process alike, after the count is known
            return {"collectives": collectives(comm), "bytes": sent.bytes, "masks": str(e)}
    return {"collectives": collectives(comm), "bytes": sent.bytes, "masks": {n: dt(m).full_tensor() for n, m in masks.items()}}


@pytest.mark.parametrize(
    "spec", [fp.L1Unstructured(sparsity=0.9), fp.L1Unstructured(0.5), fp.L1Unstructured(3), fp.L1Unstructured(3_000_000)]
)
def test_large_groups_are_bracketed_across_processes_and_equal_one_process(world2: World, spec: fp.Spec) -> None:
    """Bracketed, the selection samples, scans and ranks the few keys in its bracket."""
    whole = _large(0)
    expected = outcome(lambda: fp.global_unstructured(["a", "b"], spec)(whole, {"b": whole["b"] > -1.5}))
    for a in world2.run(_prune_large, spec):
        assert a["collectives"] == {"c10d.allreduce_"}
        if isinstance(expected, str):  # an amount larger than the unpruned entries: one process's error
            assert a["masks"] == expected and a["bytes"] == (BINS + 1) * 8  # the sample's first round and the count
            continue
        assert all(torch.equal(a["masks"][n], m) for n, m in expected.items())
        # the sample's 2 rounds (the unpruned count beside the first), the bracket's counts,
        # at most 3 rounds in it, at most 2 over positions
        assert a["bytes"] <= 8 + 16 + (2 + 3 + 2) * BINS * 8


# --- 4 processes: global groups over Shard(0), Shard(1) and Replicate() ----------------------


def test_the_issue_s_done_when_an_fsdp2_model_on_4_processes_gets_one_process_s_masks(world4: World) -> None:
    """``global_unstructured(prunable(model), L1Unstructured(sparsity=0.9))`` on FSDP2 over 4 processes."""
    answers = world4.run(_prune_and_train_fsdp, 50)
    assert [a["local rows"] for a in answers] == [13, 13, 13, 11]  # uneven dim 0, as torch.chunk cuts it
    for a in answers:
        assert a["collectives"] == {"c10d.allreduce_"}
        assert a["bytes"] == 3 * BINS * 8  # kilobytes, as with 2 processes
        assert set(a["masks"]) == {"0.weight", "2.weight"} and all(a["masks"].values())
        for name, mask in a["kept"].items():
            assert not a["trained"][name][~mask].any()
        for name, p in a["trained"].items():
            torch.testing.assert_close(p, a["expected"][name])


Part = tuple[torch.Tensor, "torch.Tensor | None", int | None]  # values, earlier mask, Shard dim (None: Replicate)
#: What a per-parameter plan does to the group's first tensor.
_CHAIN = [fp.L1Unstructured(0.3), fp.L1Unstructured(sparsity=0.6)]


Block = tuple[tuple[int, ...], torch.Tensor]  # offsets (torch's own helper says), local mask


def _group_on_ranks(rank: int, size: int, parts: list[Part], spec: fp.Spec) -> dict[str, Block]:
    """On each rank: its blocks of the group's masks (a global plan), and of a plan's for ``p0``."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh = init_device_mesh("cpu", (size,))
    names = [f"p{i}" for i in range(len(parts))]
    params, masks, offsets = {}, {}, {}
    for name, (values, earlier, dim) in zip(names, parts, strict=True):
        placement = Replicate() if dim is None else Shard(dim)
        params[name] = distribute(values, mesh, placement)
        if earlier is not None:
            masks[name] = distribute(earlier, mesh, placement)
        shape, offsets[name] = compute_local_shape_and_global_offset(values.shape, mesh, [placement])
        assert layout_of("test", name, dt(params[name])).size == tuple(shape)
    with comm_mode() as comm:
        joint = fp.global_unstructured(names, spec)(params, masks)
        single = fp.Plan({names[0]: _CHAIN})(params, masks)
    assert collectives(comm) <= {"c10d.allreduce_"}
    for name, mask in [*joint.items(), *single.items()]:
        assert dt(mask).placements == dt(params[name]).placements and dt(mask).device_mesh == mesh
    blocks = {name: (tuple(offsets[name]), dt(mask).to_local()) for name, mask in joint.items()}
    return {**blocks, "plan": (tuple(offsets[names[0]]), dt(single[names[0]]).to_local())}


def _assembled(blocks: list[Block], shape: torch.Size, replicated: bool) -> torch.Tensor:
    """The whole mask from the ranks' blocks; replicas must all be the whole."""
    if replicated:
        assert all(torch.equal(b, blocks[0][1]) for _, b in blocks)
        return blocks[0][1]
    whole = torch.zeros(shape, dtype=torch.bool)
    covered = 0
    for offsets, block in blocks:
        if block.numel():
            whole[tuple(slice(o, o + n) for o, n in zip(offsets, block.shape, strict=True))] = block
            covered += block.numel()
    assert covered == whole.numel()
    return whole


@st.composite
def _groups(draw: st.DrawFn) -> tuple[list[Part], fp.Spec]:
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    parts: list[Part] = []
    for _ in range(draw(st.integers(1, 3))):
        shape = tuple(draw(st.lists(st.integers(0, 7), min_size=1, max_size=2)))
        dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float64, torch.float16, torch.bfloat16]))
        kind = draw(st.sampled_from(["normal", "ties", "specials"]))
        if kind == "normal":
            values = torch.randn(shape, generator=g)
        elif kind == "ties":
            values = torch.randint(-2, 3, shape, generator=g).float()
        else:
            pool = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0])
            values = pool[torch.randint(0, len(pool), shape, generator=g)]
        earlier = torch.rand(shape, generator=g) < 0.7 if draw(st.booleans()) else None
        dim = draw(st.sampled_from([None, *range(len(shape))]))
        parts.append((values.to(dtype), earlier, dim))
    return parts, draw_l1(draw, parts)


def draw_l1(draw: st.DrawFn, parts: list[Any]) -> fp.Spec:
    """An ``L1Unstructured`` of an ``int`` amount up to the unpruned entries of ``parts``
    (values, earlier mask, layout), a ``float`` amount, or a ``sparsity=`` target."""
    unpruned = sum(int(v.numel() if e is None else e.sum()) for v, e, _ in parts)
    return draw(st.sampled_from([
        fp.L1Unstructured(draw(st.integers(0, unpruned))),
        fp.L1Unstructured(draw(st.floats(0.0, 1.0))),
        fp.L1Unstructured(sparsity=draw(st.floats(0.0, 1.0))),
    ]))  # fmt: skip


def _uneven() -> tuple[list[Part], fp.Spec]:
    """5 rows over 4 ranks (2, 2, 1, 0), 7 columns (2, 2, 2, 1), a replica; ties, NaN, mixed dtypes."""
    g = torch.Generator().manual_seed(0)
    w = torch.randint(-2, 3, (5, 3), generator=g).float()
    w[1, 1] = float("nan")
    parts: list[Part] = [
        (w, torch.rand(5, 3, generator=g) < 0.8, 0),
        (torch.randn(2, 7, generator=g).double(), None, 1),
        (torch.randn(3, generator=g).half(), None, None),
    ]
    return parts, fp.L1Unstructured(sparsity=0.6)


@settings(max_examples=8)
@example(example=_uneven())
@given(example=_groups())
def test_global_groups_of_sharded_and_replicated_dtensors_equal_one_process(
    world4: World, example: tuple[list[Part], fp.Spec]
) -> None:
    parts, spec = example
    names = [f"p{i}" for i in range(len(parts))]
    params = {n: values for n, (values, _, _) in zip(names, parts, strict=True)}
    masks = {n: earlier for n, (_, earlier, _) in zip(names, parts, strict=True) if earlier is not None}
    joint = fp.global_unstructured(names, spec)(params, masks)
    single = fp.Plan({names[0]: _CHAIN})(params, masks)[names[0]]
    answers = world4.run(_group_on_ranks, parts, spec)
    for i, (name, (values, _, dim)) in enumerate(zip(names, parts, strict=True)):
        assert torch.equal(_assembled([a[name] for a in answers], values.shape, dim is None), joint[name])
        if i == 0:
            assert torch.equal(_assembled([a["plan"] for a in answers], values.shape, dim is None), single)
