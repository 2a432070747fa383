"""The walk drops each node's value and atom ids once no later node reads them, and analyzes as it did.

A 1B model's walk held about 430 MB of activations and atom ids to its end;
it now holds what later nodes read. A write through a view into the tensor
it views (``_write``) needs every view of the chain it goes through, even
one that no later node reads directly: the chain keeps them.
"""

from __future__ import annotations

import torch
from torch import nn

from funcprune import _graph
from funcprune._graph._export import export_model
from funcprune._graph._ops import OPS
from funcprune._graph._walk import Walk

Tensor = torch.Tensor


class _Chain(nn.Module):
    """Writes a layer's output into a buffer through a view (read by nothing else) and a slice of it, then a second
    layer reads the buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(12, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.a(x)
        buf = h.new_zeros(2, 2, 6)
        buf.view(2, 12)[:, :6].copy_(h)
        out: Tensor = self.b(buf.reshape(2, 12))
        return out


def test_a_write_through_a_view_of_a_view_reaches_the_tensor_read_later() -> None:
    model = _Chain().eval()
    inputs = _graph.as_inputs("t", model, torch.randn(2, 4))
    graph = export_model("t", model, inputs).graph
    view = next(n for n in graph.nodes if n.target is torch.ops.aten.view.default)
    assert len(view.users) == 1  # the slice alone reads it: it is dead but for the chain the write goes through
    analysis = _graph.analyze("t", model, inputs)
    rows, cols = analysis.related["a.weight"][0], analysis.related["b.weight"][1]
    assert [cols[i] for i in range(6)] == [rows[i] for i in range(6)]  # b reads a's channels in its first columns
    assert not {g for i in range(6, 12) for g in cols[i]} & {g for i in range(6) for g in rows[i]}


def test_the_walk_holds_no_value_and_no_atom_ids_at_its_end() -> None:
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2)).eval()
    exported = export_model("t", model, _graph.as_inputs("t", model, torch.randn(3, 4)))
    seen: dict[str, set[str]] = {"values": set(), "ids": set()}

    class Watched(Walk):
        def _step(self, node: torch.fx.Node) -> None:
            super()._step(node)
            seen["values"].update(n.name for n in self.values)
            seen["ids"].update(n.name for n in self.ids)

    walk = Watched(exported, OPS)
    walk.run()
    assert walk.values == {} and walk.ids == {}
    assert {"linear", "relu", "linear_1"} <= seen["values"] and {"linear", "linear_1"} <= seen["ids"]  # (they ran)
    assert len(walk.atoms) > 0
