"""``fp.hessians(across=group)`` on a world of 2 gloo processes, each with its own calibration batches.

Every process gets the same ``XᵀX``: the one a single process computes over
every process's batches (data parallel calibration); ``float16`` inputs come
back ``float64``; a process whose batch fails makes every process raise, in
bounded time, and each leaves its module without hooks.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import funcprune as fp

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed with gloo"
)

Tensor = torch.Tensor
NAMES = ["fc1.weight", "fc2.weight"]
#: Seconds a failing call may take on the world: far below its collectives' timeout (a hang would reach it).
BOUND = 20.0


class Tokens(nn.Module):
    """Two layers on (batch, tokens, in) inputs; the second skipped when ``head`` is false (a routed layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 4)
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x: Tensor, attention_mask: Tensor | None = None, head: bool = True) -> Tensor:
        h: Tensor = torch.relu(self.fc1(x))
        return self.fc2(h) if head else h


def tokens_model(dtype: torch.dtype = torch.float32) -> Tokens:
    torch.manual_seed(0)
    return Tokens().to(dtype)


def exact(*shape: int, seed: int, dtype: torch.dtype) -> Tensor:
    """Multiples of 1/16 in [-4, 4]: exact in float16, and so are the Gram sums of their first layer in float64."""
    return (torch.randint(-64, 65, shape, generator=torch.Generator().manual_seed(seed)) / 16).to(dtype)


def mask(batch: int, lengths: list[int]) -> Tensor:
    m = torch.zeros(batch, 5, dtype=torch.long)
    for i, length in enumerate(lengths):
        m[i, :length] = 1
    return m


def failing(first: Any) -> Iterator[Any]:
    yield first
    raise RuntimeError("rank 1's data loader failed")


def batches(rank: int, case: str) -> Any:
    """Rank ``rank``'s calibration batches (each process its own, of different counts and shapes)."""
    dtype = torch.float16 if case == "half" else torch.float32
    xs = [exact(2 + rank, 5, 3, seed=10 * rank + i, dtype=dtype) for i in range(2 + rank)]
    if case in ("float32", "half"):
        return xs
    if case == "uneven":  # rank 1: no batch
        return xs if rank == 0 else []
    if case == "masked":
        return [{"x": x, "attention_mask": mask(x.shape[0], [5 - i, 2 + rank] + [0] * rank)} for i, x in enumerate(xs)]
    if case == "routed":  # fc2 called on rank 0 only
        return [(x, None, rank == 0) for x in xs]
    if case == "bad":  # rank 1's second batch does not fit fc1
        return xs if rank == 0 else [xs[0], exact(2, 5, seed=99, dtype=dtype)]
    if case == "raises":
        return xs if rank == 0 else failing(xs[0])
    assert case == "none"
    return []


def _hessians_across(rank: int, size: int, case: str) -> dict[str, Any]:
    """``hessians(across=WORLD)`` on this process's batches; its error as text; whether the module is as it was."""
    model = tokens_model(torch.float16 if case == "half" else torch.float32)
    state = copy.deepcopy(model.state_dict())
    try:
        got: dict[str, Tensor] | str = fp.hessians(model, batches(rank, case), NAMES, across=dist.group.WORLD)
    except Exception as e:  # noqa: BLE001 (compared by the test)
        got = f"{type(e).__name__}: {e}"
    after = model.state_dict()
    unchanged = all(torch.equal(after[k], state[k]) for k in state)
    no_hooks = all(not m._forward_pre_hooks and not m._forward_pre_hooks_with_kwargs for m in model.modules())
    return {"got": got, "as it was": unchanged and no_hooks}


def one_process(case: str) -> dict[str, Tensor]:
    """What one process computes over every process's batches."""
    model = tokens_model(torch.float16 if case == "half" else torch.float32)
    return fp.hessians(model, [*batches(0, case), *batches(1, case)], NAMES)


def gram(xs: list[Tensor]) -> Tensor:
    rows = torch.cat([x.reshape(-1, x.shape[-1]).double() for x in xs])
    return rows.T @ rows


@pytest.mark.parametrize("case", ["float32", "half", "uneven", "masked", "routed"])
def test_every_process_gets_the_hessians_over_every_process_s_batches(world2: Any, case: str) -> None:
    expected = one_process(case)
    answers = world2.run(_hessians_across, case)
    dtype = torch.float64 if case == "half" else torch.float32
    for a in answers:
        got = a["got"]
        assert isinstance(got, dict) and list(got) == NAMES, got
        assert a["as it was"]
        for name in NAMES:
            assert got[name].dtype == expected[name].dtype == dtype
            assert torch.equal(got[name], answers[0]["got"][name])  # every process the same numbers
            if case == "half" and name == "fc1.weight":  # exact: float64 sums of exact products, in any order
                assert torch.equal(got[name], expected[name])
            torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-5)
    firsts = [*batches(0, case), *batches(1, case)]
    if case in ("float32", "half", "uneven"):  # fc1 sees the batches themselves
        torch.testing.assert_close(answers[0]["got"]["fc1.weight"].double(), gram(firsts), rtol=1e-6, atol=1e-6)
    if case == "masked":  # padding left out on every process
        real = [b["x"][b["attention_mask"].bool()] for b in firsts]
        torch.testing.assert_close(answers[0]["got"]["fc1.weight"].double(), gram(real), rtol=1e-6, atol=1e-6)
    if case == "routed":  # fc2 called on rank 0 only: its batches alone
        alone = fp.hessians(tokens_model(), batches(0, case), ["fc2.weight"])["fc2.weight"]
        torch.testing.assert_close(answers[1]["got"]["fc2.weight"], alone)


@pytest.mark.parametrize(
    ("case", "own"),
    [("bad", "ValueError: hessians: the module 'fc1' received an input of shape (2, 5); expected its 3 input "
              "features in dim -1"),
     ("raises", "RuntimeError: rank 1's data loader failed")],
)  # fmt: skip
def test_a_process_whose_batch_fails_makes_every_process_raise(world2: Any, case: str, own: str) -> None:
    start = time.monotonic()
    zero, one = world2.run(_hessians_across, case)
    assert time.monotonic() - start < BOUND
    assert one["got"] == own  # its own error
    assert zero["got"] == (
        "ValueError: hessians: another process of the group failed on its batches (its own error says why)"
    )
    assert zero["as it was"] and one["as it was"]


def test_no_batch_on_any_process_is_one_error_on_every_process(world2: Any) -> None:
    start = time.monotonic()
    for a in world2.run(_hessians_across, "none"):
        assert a["got"] == "ValueError: hessians: no batches: batches was empty; pass at least one calibration batch"
        assert a["as it was"]
    assert time.monotonic() - start < BOUND
