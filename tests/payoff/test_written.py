"""Zeros written into a model's own tensors for one masked run, put back bit for bit (``_written``)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from funcprune._payoff._written import written_for_the_run

Tensor = torch.Tensor
_SPECIAL = [float("nan"), -0.0, float("-inf"), 1e-45, -3.0]


def _bytes(t: Tensor) -> bytes:
    return t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(4, 9), cols=st.integers(4, 11), seed=st.integers(0, 2**16),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]), transposed=st.booleans(),
)  # fmt: skip
def test_the_indices_read_zero_in_the_run_and_every_bit_is_back_after(
    rows: int, cols: int, seed: int, dtype: torch.dtype, transposed: bool
) -> None:  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    layer = nn.Linear(cols, rows).to(dtype)
    with torch.no_grad():
        w = torch.randn(rows, cols, generator=g).to(dtype)
        w.view(-1)[: len(_SPECIAL)] = torch.tensor(_SPECIAL[: w.numel()], dtype=dtype)[: w.numel()]
        layer.weight = nn.Parameter(w.t().contiguous().t() if transposed else w)  # (strided either way)
    before, version = _bytes(layer.weight), layer.weight._version
    row, col = int(torch.randint(rows, (1,), generator=g)), int(torch.randint(cols, (1,), generator=g))
    want = layer.weight.detach().clone()
    want[row] = 0.0
    want[:, col] = 0.0
    with written_for_the_run(layer, {"weight": {0: [row], 1: [col]}}) as (left, written):
        assert left == {} and written
        assert _bytes(layer.weight) == _bytes(want)  # +0.0 at both, the other bits as they were
    assert _bytes(layer.weight) == before and layer.weight._version == version


def test_what_is_written_is_put_back_when_the_run_raises() -> None:
    layer = nn.Linear(4, 3)
    before = _bytes(layer.weight)
    with pytest.raises(KeyError), written_for_the_run(layer, {"weight": {1: [0, 2]}}):
        assert bool((layer.weight[:, 0] == 0).all())
        raise KeyError("the run failed")
    assert _bytes(layer.weight) == before


class _Shared(nn.Module):
    """Two parameters on one storage, and one whose zeroing would keep more than half of it."""

    def __init__(self) -> None:
        super().__init__()
        base = torch.randn(4, 6)
        self.a, self.b = nn.Parameter(base[:, :3]), nn.Parameter(base[:, 3:])
        self.c = nn.Parameter(torch.randn(4, 6))


def test_a_tensor_writing_would_change_another_or_that_costs_a_copy_is_left_to_copy() -> None:
    model = _Shared()
    before = [_bytes(p) for p in model.parameters()]
    dropped = {"a": {1: [0]}, "b": {1: [1]}, "c": {0: [0, 1, 2]}}  # c: 3 of 4 rows is more than half of it
    with written_for_the_run(model, dropped) as (left, written):
        assert left == dropped and written == set()
        assert [_bytes(p) for p in model.parameters()] == before
    with torch.inference_mode():
        frozen = nn.Linear(3, 2)
    with written_for_the_run(frozen, {"weight": {0: [0]}}) as (left, _):
        assert left == {"weight": {0: [0]}}  # an inference tensor cannot be written outside inference mode


class _Returns(nn.Module):
    """A model whose output holds a view of its weight."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 4)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.lin(x), self.lin.weight[:, :3]


def test_a_run_whose_output_holds_a_written_tensor_is_made_again_with_copies() -> None:
    from funcprune._graph import Inputs
    from funcprune._payoff._smaller import masked_run

    torch.manual_seed(0)
    model = _Returns()
    before = _bytes(model.lin.weight)
    y, w = masked_run(model, {}, Inputs((torch.randn(2, 6),)), dropped={"lin.weight": {1: [1]}})
    assert bool((w[:, 1] == 0).all()) and w.untyped_storage().data_ptr() != model.lin.weight.untyped_storage().data_ptr()
    assert _bytes(model.lin.weight) == before
