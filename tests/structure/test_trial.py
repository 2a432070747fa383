"""structure's trial (issue 42): one unit of every group removed from a copy that shares the model's tensors, cut
to views, and checked against the masked model; the groups of a stack's blocks tried once per kind of block (the
first two of each kind and the last, as a model on the meta device is read), the others standing by them."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from _hf import inputs, tiny
from torch import nn

import funcprune as fp
from funcprune._structure import _find


class Block(nn.Module):
    def __init__(self, layer_idx: int, spelled: int | None) -> None:
        super().__init__()
        self.layer_idx, self.spelled = layer_idx, spelled
        self.up, self.down = nn.Linear(8, 12), nn.Linear(12, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.up(x))
        if self.layer_idx == self.spelled:  # a size spelled out in one block only: its kind cannot tell
            h = h.view(-1, 12)
        out: torch.Tensor = x + self.down(h)
        return out


class Stack(nn.Module):
    def __init__(self, blocks: int, spelled: int | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(i, spelled) for i in range(blocks))
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        out: torch.Tensor = self.head(x)
        return out


def _tried(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []
    real = vars(_find)["removable"]

    def spied(model: nn.Module, analysis: Any, trial: dict[str, Any]) -> dict[str, str]:
        calls.append(sorted(trial))
        failed: dict[str, str] = real(model, analysis, trial)
        return failed

    monkeypatch.setattr(_find, "removable", spied)
    return calls


def test_a_stack_s_groups_are_tried_once_per_kind_of_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Six blocks of one kind: the trial removes a unit of blocks 0, 1 and 5 only; every block's group is listed,
    as the trial of all of them lists them."""
    calls = _tried(monkeypatch)
    torch.manual_seed(0)
    model = Stack(6).eval()
    s = fp.structure(model, torch.randn(2, 8))
    assert calls == [["layers.0", "layers.1", "layers.5"]]
    assert [name for name in s if name.startswith("layers.")][:6] == [f"layers.{i}" for i in range(6)]
    monkeypatch.setattr(_find, "standing_for", lambda model, names: {n: n for n in names})  # every group tried
    calls.clear()
    assert fp.structure(model, torch.randn(2, 8)) == s
    assert calls == [[f"layers.{i}" for i in range(6)]]


def test_a_block_that_fails_where_its_kind_does_not_is_listed_and_shrink_keeps_it() -> None:
    """What standing by the first block of a kind costs: a block whose code depends on its index (a size spelled
    out in block 3 alone) is listed with its kind, and shrink, which checks the model it builds against the
    masked one, finds and keeps its channels, with a warning: never a model that computes something else."""
    torch.manual_seed(0)
    model = Stack(6, spelled=3).eval()
    x = torch.randn(2, 8)
    s = fp.structure(model, x)
    assert "layers.3" in s
    masks = fp.structured(s, fp.LnStructured(0.25, n=2), scope="group")(dict(model.named_parameters()))
    with pytest.warns(fp.KeptChannelsWarning, match=r"'layers.3.up' keeps 3 \(removing them changes"):
        small: Any = fp.shrink(model, masks, x, structure=s)
    assert small.layers[3].up.out_features == 12 and small.layers[2].up.out_features == 9
    reference = fp.functional_call_masked(model, dict(model.named_parameters()), masks, (x,))
    torch.testing.assert_close(small(x), reference)


def test_a_transformer_s_layers_are_tried_once_per_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Llama of 5 layers: the groups of layers 0, 1 and 4 are tried, the other layers' stand by layer 0's; the
    structure is the one every group's trial gives."""
    calls = _tried(monkeypatch)
    t = tiny("llama", layers=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fp.UnitsLeftOutWarning)
        s = fp.structure(t.model, inputs(t))
        tried = {name.split(".")[2] for name in calls[0] if name.startswith("model.layers.")}
        assert tried == {"0", "1", "4"}
        monkeypatch.setattr(_find, "standing_for", lambda model, names: {n: n for n in names})
        assert fp.structure(t.model, inputs(t)) == s
    assert {g.split(".")[2] for g in s if g.startswith("model.layers.") and s[g].kind != "layers"} == set("01234")
