"""The collector paused while ``structure`` and ``shrink`` run, and export's stack traces off: both as they were after."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import funcprune as fp
from funcprune._collector import paused
from funcprune._graph._export import as_inputs, export_model


@pytest.fixture(autouse=True)
def _collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


#: Whether the collector was on, for each run of a :class:`_Seen` (a copy's too: the analysis runs copies).
SEEN: list[bool] = []


class _Seen(nn.Module):
    """An MLP that records whether the collector was on as it ran (and can fail on demand)."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(4, 6), nn.Linear(6, 2)
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        SEEN.append(gc.isenabled())
        if self.fail:
            raise RuntimeError("asked to fail")
        out: torch.Tensor = self.down(torch.relu(self.up(x)))
        return out


def test_paused_restores_what_was() -> None:
    with paused():
        assert not gc.isenabled()
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner pause leaves it to the outer one
    assert gc.isenabled()
    gc.disable()
    with paused():
        pass
    assert not gc.isenabled()  # off before, off after


def test_paused_restores_on_error() -> None:
    with pytest.raises(KeyError), paused():
        raise KeyError("x")
    assert gc.isenabled()


class _Node:
    """An object with a slot for a cycle."""

    def __init__(self) -> None:
        self.other: object = None


def _in_generation(obj: object, generation: int) -> bool:
    return any(o is obj for o in gc.get_objects(generation=generation))


def test_what_a_paused_call_keeps_goes_to_the_oldest_generation_unwalked() -> None:
    gc.collect()
    with paused():
        kept = [_Node() for _ in range(1000)]
    # tracked, frozen nowhere, in neither young generation: in the oldest (read without listing the oldest's millions)
    assert gc.is_tracked(kept) and not gc.get_freeze_count()
    assert not _in_generation(kept, 0) and not _in_generation(kept, 1)
    assert gc.get_count()[0] < 100  # (no collection walked it on the way)
    with paused():
        cycle = _Node()
        cycle.other = cycle
        gone = weakref.ref(cycle)
        del cycle
    assert gone() is not None  # cyclic garbage stays until a full collection, and then goes
    gc.collect()
    assert gone() is None


def test_a_process_s_frozen_objects_stay_frozen_and_a_paused_call_s_stay_young() -> None:
    gc.collect()
    frozen = _Node()
    gc.freeze()
    try:
        with paused():
            kept = [_Node() for _ in range(10)]
        # the process's own stay frozen: tracked, and in no generation a collection walks (the count may fall as
        # frozen objects die, so it is no witness; the oldest generation is nearly empty after the freeze)
        assert gc.is_tracked(frozen) and not any(_in_generation(frozen, g) for g in range(3))
        assert _in_generation(kept, 0)  # left where a collection finds them
    finally:
        gc.unfreeze()


def test_structure_and_shrink_run_without_collections() -> None:
    torch.manual_seed(0)
    SEEN.clear()
    model = _Seen().eval()
    x = torch.randn(3, 4)
    s = fp.structure(model, x)
    assert SEEN and not any(SEEN)  # every run inside (the export's, the walk's and the trials') paused
    assert gc.isenabled()
    SEEN.clear()
    masks = fp.structured(s, fp.LnStructured(0.5, n=2), kinds="channels")(dict(model.named_parameters()))
    small = fp.shrink(model, masks, x, structure=s)
    assert small.up.out_features == 3
    assert SEEN and not any(SEEN)  # shrink's check runs the masked model and the copy, paused
    assert gc.isenabled()
    fp.propagate(model, masks, x)
    assert gc.isenabled()


def test_collector_back_on_after_a_failure() -> None:
    model = _Seen().eval()
    model.fail = True
    with pytest.raises(ValueError, match="asked to fail"):
        fp.structure(model, torch.randn(3, 4))
    assert gc.isenabled()
    masks = {"up.weight": torch.ones(6, 4, dtype=torch.bool)}
    with pytest.raises(ValueError, match="asked to fail"):
        fp.shrink(model, masks, torch.randn(3, 4))
    assert gc.isenabled()


@pytest.mark.parametrize("before", [False, True])
def test_export_emits_no_stack_traces_and_restores_the_setting(before: bool) -> None:
    torch.fx.config.do_not_emit_stack_traces = before
    try:
        model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)).eval()
        exported = export_model("test", model, as_inputs("test", model, torch.randn(2, 4)))
        calls = [n for n in exported.graph.nodes if n.op == "call_function"]
        assert calls and all(n.meta.get("stack_trace") is None for n in calls)
        assert torch.fx.config.do_not_emit_stack_traces is before
    finally:
        torch.fx.config.do_not_emit_stack_traces = False
