"""The walk computes a value when something reads it (issue 42): a transformer's linears are never multiplied out,
and the analysis is the one the walk made computing every node as it went, field by field.

A node's value waits (``_later.Waiting``) where its op is pure (its schema
writes nothing and draws no random numbers) and export's value stands in
for it (a tensor of fixed shape): handlers read its shape from the stand-in.
An op that may write a tensor computes every value waiting before it runs,
so that a value read before a write is the value before the write.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from _hf import ARCHITECTURES, MATRIX, inputs, tiny
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from funcprune import _graph
from funcprune._experts import routers
from funcprune._graph import _export, _later, _walk
from funcprune._graph._export import export_model
from funcprune._graph._ops import OPS

Tensor = torch.Tensor
aten = torch.ops.aten
_MATMULS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.linear.default}


class _Counted(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's __init_subclass__
    """Counts the matrix products computed while it is held."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # (torch's, untyped)
        self.products = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.products += func in _MATMULS
        return func(*args, **(kwargs or {}))


def _products(model: nn.Module, x: Any, later: bool, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(_later, "LATER", later)
    exported = export_model("t", model, _graph.as_inputs("t", model, x))
    walk = _walk.Walk(exported, OPS, routers(exported.model))
    with _Counted() as counted:
        walk.run()
    return int(counted.products)


def test_a_transformer_s_walk_multiplies_no_linear_out(monkeypatch: pytest.MonkeyPatch) -> None:
    t = tiny("llama")
    assert _products(t.model, inputs(t), True, monkeypatch) == 0
    assert _products(t.model, inputs(t), False, monkeypatch) > 0  # (computed as walked, they are)


def _fields(analysis: _graph.Analysis) -> tuple[Any, ...]:
    """Every field of an analysis but the copy of the model it holds, its own indices included."""
    return (analysis.made, analysis.related, analysis.blocked, analysis.refused, analysis.coupled, analysis.attention,
            [(e.router.weight, e.groups) for e in analysis.experts], analysis.least, analysis.unseen, analysis.read,
            analysis.unreached, _graph.own_indices(analysis))  # fmt: skip


def _both_ways(model: nn.Module, x: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    inputs_ = _graph.as_inputs("t", model, x)
    found = []
    for later in (True, False):
        monkeypatch.setattr(_later, "LATER", later)
        found.append(_fields(_graph.analyze("t", model, inputs_)))
    return found[0], found[1]


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == "llama" else pytest.mark.ci)
                                  for n in (*MATRIX, "qwen2_moe", *ARCHITECTURES)])  # fmt: skip
def test_the_analysis_is_the_one_made_computing_every_node_as_walked(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    t = tiny(name)
    later, now = _both_ways(t.model, inputs(t), monkeypatch)
    assert later == now


class _ReadThenWritten(nn.Module):
    """An order computed from a tensor (a pure op: it may wait) that is then zeroed in place, before the order
    picks the first layer's channels for the second."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.a(x)
        order = torch.arange(6, device=x.device) * 1
        flipped = order.flip(0)
        order.zero_()  # written after flip read it: flip reads [0, ..., 5], not zeros
        out: Tensor = self.b(h[:, flipped])
        return out


def test_a_value_read_before_a_write_is_the_value_before_the_write(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _ReadThenWritten().eval()
    x = torch.randn(2, 4)
    graph = export_model("t", model, _graph.as_inputs("t", model, x)).graph
    assert any(n.target is aten.zero_.default for n in graph.nodes)  # (export keeps the write)
    later, now = _both_ways(model, x, monkeypatch)
    assert later == now
    analysis = _graph.analyze("t", model, _graph.as_inputs("t", model, x))
    rows, cols = analysis.related["a.weight"][0], analysis.related["b.weight"][1]
    assert [cols[i] for i in range(6)] == [rows[5 - i] for i in range(6)]  # column i reads channel 5 - i


def test_a_pure_op_s_shape_read_by_a_handler_is_its_stand_in_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """The convolutions of a CNN read their output's shape; a value never read stays uncomputed, its stand-in
    export's fake tensor of the same shape."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3), nn.Flatten(), nn.Linear(4 * 4 * 4, 2)).eval()
    x = torch.randn(1, 3, 8, 8)
    exported = export_model("t", model, _graph.as_inputs("t", model, x))
    walk = _walk.Walk(exported, OPS)
    seen: dict[str, tuple[bool, tuple[int, ...]]] = {}
    real = walk._step

    def step(node: torch.fx.Node) -> None:
        real(node)
        value = dict.get(walk.values, node)
        if isinstance(value, _later.Waiting):
            seen[node.name] = (value.done, tuple(walk.peek(node).shape))

    monkeypatch.setattr(walk, "_step", step)
    walk.run()
    out = model(x)
    assert seen and not all(done for done, _ in seen.values())  # (some wait, and some never run)
    last = next(n for n in reversed(list(exported.graph.nodes)) if n.name in seen)
    assert seen[last.name][1] == tuple(out.shape)
    later, now = _both_ways(model, x, monkeypatch)
    assert later == now


def test_export_s_graph_modules_written_when_run_change_no_analysis(monkeypatch: pytest.MonkeyPatch) -> None:
    """The export makes its graph modules lazily (``_torch_private.lazy_graph_modules``); the analysis is the one
    made with them written as made."""
    t = tiny("llama")
    inputs_ = _graph.as_inputs("t", t.model, inputs(t))
    lazy = _fields(_graph.analyze("t", t.model, inputs_))
    monkeypatch.setattr(_export, "lazy_graph_modules", contextlib.nullcontext)
    assert _fields(_graph.analyze("t", t.model, inputs_)) == lazy
