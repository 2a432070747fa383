"""``fp.oneshot(..., group=)``: each process calibrates on its own share of the batches; all get one result.

The reference is one process over the union of the shares (rank 0's
batches, then rank 1's, ...), computed by ``fp.oneshot`` without a group
on rank 0 of the same world (so on one torch thread, as the ranks run).
Every process must return the same params and masks as every other, and
the masks must be those of the reference. In ``float64`` the params too,
bit for bit, however the batches are split: the statistics of ``float64``
inputs add up in an ``ExactSum`` (``funcprune/_criteria/_exact.py``),
whose bits depend neither on the order of the calls nor on their grouping,
so ``(a + b) + (c + d)`` on two processes, or four processes'
``all_reduce``, gives the bits of one process over all. In ``float32`` the
sums are added as they come: where the terms are added in the same order
(two processes whose second holds one batch, ``(a + b) + c`` both ways; a
group of one process; a process without batches beside one with some) the
params are equal bit for bit too; otherwise (``(a + b) + (c + d)`` against
``((a + b) + c) + d``; four processes, whose ``all_reduce`` adds in its own
order) the sums differ in their last bits, and so do SparseGPT's updated
weights, compared to :data:`TOLERANCE` (Wanda's weights are not updated:
its masks alone differ, and did not).

Worlds are gloo processes on 127.0.0.1 (``tests/_distributed.py``). The
default run has the world of 2 on a tiny Llama; the world of 4 and the
mixture-of-experts models run under the ci profile.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import funcprune as fp

sys.path.insert(0, str(Path(__file__).parents[1]))
import _hf  # noqa: E402
from _distributed import World, one_process_group  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed with gloo"
)

Tensor = torch.Tensor
#: The float32 params where the sums were added in another order: SparseGPT's solve of Hessians that differ in
#: their last bits, over 2 blocks (measured, on these models, weights of about 0.02: at most 1.8e-6, with the same
#: masks; float32 SparseGPT amplifies rounding, and on deeper models its masks may differ too). Float64 params are
#: compared bit for bit, always.
TOLERANCE: dict[torch.dtype, tuple[float, float]] = {  # (rtol, atol)
    torch.float32: (1e-4, 1e-5),
}
#: Seconds a failing call may take on the world: far below its collectives' timeout (a hang would reach it).
BOUND = 20.0


def model_of(name: str, dtype: torch.dtype) -> Any:
    """The tiny model ``name`` (``tests/_hf.py``: 2 layers), in ``dtype``; MoE ones on their eager experts."""
    model: Any = _hf.tiny(name).model
    if name in _hf.MOE:
        model.config._experts_implementation = "eager"  # grouped_mm takes no float64
    return model.to(dtype)


def union(count: int) -> list[dict[str, Any]]:
    """``count`` calibration batches of 2 sequences of 8 tokens, the second one's last 3 tokens padding."""
    g = torch.Generator().manual_seed(7)
    mask = torch.ones(2, _hf.SEQUENCE, dtype=torch.long)
    mask[1, -3:] = 0
    return [{"input_ids": torch.randint(0, _hf.VOCAB, (2, _hf.SEQUENCE), generator=g), "attention_mask": mask,
             "use_cache": False} for _ in range(count)]  # fmt: skip


def share(rank: int, size: int, counts: tuple[int, ...]) -> list[dict[str, Any]]:
    """Rank ``rank``'s batches: the ``counts[rank]`` after the earlier ranks' in :func:`union`."""
    start = sum(counts[:rank])
    return union(sum(counts))[start : start + counts[rank]]


def _oneshot(rank: int, size: int, case: dict[str, Any]) -> dict[str, Any]:
    """This process's ``oneshot`` on its share, across the world; rank 0 also gives the one-process reference."""
    torch.manual_seed(0)
    model = model_of(case["model"], case["dtype"])
    kwargs = {"method": case["method"], "spec": case["spec"], "allocation": case.get("allocation"),
              "names": case.get("names")}  # fmt: skip
    try:
        params, masks = fp.oneshot(model, share(rank, size, case["counts"]), group=dist.group.WORLD, **kwargs)
    except Exception as e:  # noqa: BLE001 (compared by the test)
        return {"error": f"{type(e).__name__}: {e}"}
    pruned = {n: params[n].detach().clone() for n in masks}
    out: dict[str, Any] = {"params": pruned, "masks": masks}
    if rank == 0:
        alone, alone_masks = fp.oneshot(model, union(sum(case["counts"])), **kwargs)
        out["reference"] = ({n: alone[n].detach().clone() for n in alone_masks}, alone_masks)
    return out


def check(answers: list[dict[str, Any]], *, exact: bool, dtype: torch.dtype = torch.float64) -> None:
    """Every process the same params and masks; the masks the reference's; the params too (``exact``, and always
    in ``float64``) or close."""
    for a in answers:
        assert "error" not in a, a["error"]
    params, masks = answers[0]["reference"]
    assert masks and list(answers[0]["masks"]) == list(masks)
    for a in answers:
        for n in masks:
            assert torch.equal(a["masks"][n], answers[0]["masks"][n]), n  # every process the same
            assert torch.equal(a["params"][n], answers[0]["params"][n]), n
            assert torch.equal(a["masks"][n], masks[n]), n  # the reference's masks
            if exact or dtype == torch.float64:
                assert torch.equal(a["params"][n], params[n]), n
            else:
                rtol, atol = TOLERANCE[dtype]
                torch.testing.assert_close(a["params"][n], params[n], rtol=rtol, atol=atol)


def case(model: str, method: str, counts: tuple[int, ...], **more: Any) -> dict[str, Any]:
    return {"model": model, "method": method, "spec": fp.PerSlice(fp.L1Unstructured(0.5), dim=0),
            "dtype": torch.float64, "counts": counts, **more}  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_two_processes_of_one_batch_each_equal_one_process_over_both_bit_for_bit(world2: World, dtype: Any) -> None:
    names = [n for n, _ in model_of("llama", dtype).named_parameters() if n.endswith("proj.weight")]
    for method in ("wanda", "sparsegpt"):  # and the LM head, outside the blocks, pruned from a last pass
        check(world2.run(_oneshot, case("llama", method, (1, 1), dtype=dtype, names=[*names, "lm_head.weight"])),
              exact=True)  # fmt: skip


def test_a_process_without_batches_beside_one_with_some_adds_nothing(world2: World) -> None:
    check(world2.run(_oneshot, case("llama", "sparsegpt", (2, 0))), exact=True)
    check(world2.run(_oneshot, case("llama", "sparsegpt", (2, 1))), exact=True)  # (a + b) + c: the same order


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_several_batches_per_process_equal_one_process_bit_for_bit_in_float64(world2: World, dtype: Any) -> None:
    """``(a + b) + (c + d)`` against ``((a + b) + c) + d``: the same bits in float64, the last bits apart in float32."""
    check(world2.run(_oneshot, case("llama", "sparsegpt", (2, 2), dtype=dtype)), exact=False, dtype=dtype)
    check(world2.run(_oneshot, case("llama", "wanda", (3, 1), dtype=dtype)), exact=False, dtype=dtype)


def test_no_batch_on_any_process_is_one_error_on_every_process(world2: World) -> None:
    start = time.monotonic()
    for owl in (None, "owl"):
        for a in world2.run(_oneshot, case("llama", "wanda", (0, 0), allocation=owl)):
            assert a["error"].startswith("ValueError: oneshot: no batches: batches was empty"), a
    assert time.monotonic() - start < BOUND


def _failing(rank: int, size: int) -> str:
    """Rank 1's second batch has a token id past the vocabulary: its embedding fails, on rank 1 alone."""
    batches = share(rank, size, (2, 2))
    if rank == 1:
        batches[1] = {**batches[1], "input_ids": batches[1]["input_ids"] + _hf.VOCAB}
    try:
        fp.oneshot(model_of("llama", torch.float64), batches, method="wanda", spec=fp.L1Unstructured(0.5),
                   group=dist.group.WORLD)  # fmt: skip
    except Exception as e:  # noqa: BLE001 (compared by the test)
        return type(e).__name__ + ": " + str(e).splitlines()[0]
    return "no error"


def test_a_batch_that_fails_on_one_process_raises_on_every_process(world2: World) -> None:
    start = time.monotonic()
    zero, one = world2.run(_failing)
    assert time.monotonic() - start < BOUND
    assert "index out of range" in one, one  # its own error
    assert zero == "ValueError: oneshot: another process of the group failed on its batches (its own error says why)"


def _failing_to_advance(rank: int, size: int) -> str:
    """Rank 1 fails while advancing block 0's states (after the block's all_reduce, before the next one's)."""
    import funcprune._runner._blocks as blocks

    real = getattr(blocks, "functional_call_masked")  # noqa: B009 (not exported: patched on rank 1 alone)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("out of memory (simulated)")

    if rank == 1:
        setattr(blocks, "functional_call_masked", broken)  # noqa: B010
    try:
        fp.oneshot(model_of("llama", torch.float64), share(rank, size, (2, 2)), method="wanda",
                   spec=fp.L1Unstructured(0.5), group=dist.group.WORLD)  # fmt: skip
    except Exception as e:  # noqa: BLE001 (compared by the test)
        return type(e).__name__ + ": " + str(e).splitlines()[0]
    finally:
        setattr(blocks, "functional_call_masked", real)  # noqa: B010
    return "no error"


def test_a_process_that_fails_to_advance_a_block_makes_every_process_raise(world2: World) -> None:
    start = time.monotonic()
    zero, one = world2.run(_failing_to_advance)
    assert time.monotonic() - start < BOUND
    assert one == "RuntimeError: out of memory (simulated)"
    assert zero == "ValueError: oneshot: another process of the group failed in block 0 (its own error says why)"


def test_a_group_of_one_process_equals_no_group_bit_for_bit() -> None:
    model = model_of("llama", torch.float32)
    for method in ("wanda", "sparsegpt"):
        for allocation in (None, "owl"):
            kwargs: dict[str, Any] = {"method": method, "spec": fp.L1Unstructured(0.5), "allocation": allocation}
            params, masks = fp.oneshot(model, union(2), **kwargs)
            with one_process_group():
                got, got_masks = fp.oneshot(model, union(2), group=dist.group.WORLD, **kwargs)
            assert list(got_masks) == list(masks)
            for n in masks:
                assert torch.equal(got_masks[n], masks[n]) and torch.equal(got[n], params[n]), (method, allocation, n)


def test_a_group_that_is_not_a_process_group_or_not_initialized_is_refused_by_name() -> None:
    model = model_of("llama", torch.float32)
    with pytest.raises(TypeError, match=r"oneshot: group must be a torch\.distributed process group .* got True"):
        fp.oneshot(model, union(1), method="wanda", spec=fp.L1Unstructured(0.5), group=True)  # type: ignore[arg-type]
    with one_process_group():
        stale = dist.group.WORLD
    assert isinstance(stale, dist.ProcessGroup) and not dist.is_initialized()
    with pytest.raises(ValueError, match=r"oneshot: group is a process group, but torch\.distributed is not init"):
        fp.oneshot(model, union(1), method="wanda", spec=fp.L1Unstructured(0.5), group=stale)


@pytest.mark.ci
def test_owl_across_two_processes_equals_one_process(world2: World) -> None:
    check(world2.run(_oneshot, case("llama", "wanda", (1, 1), allocation="owl")), exact=True)
    check(world2.run(_oneshot, case("llama", "sparsegpt", (2, 2), allocation="owl")), exact=False)


@pytest.mark.ci
@pytest.mark.parametrize("name", _hf.MOE)
@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_experts_across_two_processes_equal_one_process(world2: World, name: str, method: str) -> None:
    check(world2.run(_oneshot, case(name, method, (1, 1), spec=fp.NM(2, 4))), exact=True)
    check(world2.run(_oneshot, case(name, method, (2, 2), spec=fp.NM(2, 4))), exact=False)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["llama", *_hf.MOE])
@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_four_processes_equal_one_process_bit_for_bit_in_float64(world4: World, name: str, method: str, dtype: torch.dtype) -> None:
    check(world4.run(_oneshot, case(name, method, (1, 2, 0, 1), dtype=dtype)), exact=False, dtype=dtype)
