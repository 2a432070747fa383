"""Finding what breaks a check: the probes' results, located by the module that raised."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from funcprune._graph import as_inputs
from funcprune._payoff._verify import Failure, mismatch, search


def _world(bad: dict[int, str | None], order: Sequence[int]):  # type: ignore[no-untyped-def]
    """A model of the probes: removing a set fails where it holds a bad item; the first bad one in ``order`` (the
    order the model runs them) says how: raising inside its module (``bad[item]``), or computing something else."""
    calls: list[frozenset[int]] = []

    def fails(items: Sequence[int]) -> Failure | None:
        calls.append(frozenset(items))
        for item in order:
            if item in items and item in bad:
                module = bad[item]
                return Failure(f"bad {item}") if module is None else Failure(f"bad {item}", "RuntimeError", module)
        return None

    return fails, calls


@st.composite
def _worlds(draw: st.DrawFn) -> tuple[int, dict[int, str | None], list[int], dict[int, str]]:
    n = draw(st.integers(1, 12))
    modules = {i: f"blocks.{draw(st.integers(0, 3))}.{draw(st.sampled_from(['attn', 'mlp']))}" for i in range(n)}
    raising = draw(st.sets(st.integers(0, n - 1)))
    differing = draw(st.sets(st.integers(0, n - 1))) - raising
    bad: dict[int, str | None] = {i: modules[i] for i in raising} | dict.fromkeys(differing)
    order = draw(st.permutations(list(range(n))))
    return n, bad, order, modules


@given(_worlds(), st.booleans())
def test_search_finds_the_bad_items_with_or_without_the_module(world, located: bool) -> None:  # type: ignore[no-untyped-def]
    n, bad, order, modules = world
    fails, calls = _world(bad, order)
    inside = (lambda item, module: modules[item] == module or modules[item].startswith(module + ".")) if located else None
    found = search(list(range(n)), lambda item: item, fails, inside)
    assert set(found) == set(bad)
    for item, failure in found.items():
        assert failure.why == f"bad {item}"
    good = set(range(n)) - set(bad)
    assert not good or good in calls  # what goes was probed together, and passed
    assert len(set(calls)) == len(calls)  # no set probed twice


def test_search_takes_a_probe_per_raising_block_where_it_knows_the_module() -> None:
    blocks = 6
    items = list(range(2 * blocks))  # 2i: block i's MLP (fine), 2i + 1: its heads (raise in its attention)
    modules = {i: f"layers.{i // 2}.{'attn' if i % 2 else 'mlp'}" for i in items}
    bad: dict[int, str | None] = {i: modules[i] for i in items if i % 2}
    counts = {}
    for located in (True, False):
        fails, calls = _world(bad, items)
        inside = (lambda item, module: modules[item].startswith(module)) if located else None
        first = fails(items)
        found = search(items, lambda item: item, fails, inside, first)
        assert set(found) == set(bad)
        counts[located] = len(calls)
    # every item at once (given), one probe per block that raises, the MLPs together, each head alone on top of
    # them (the last block's head with the MLPs is the set that raised in it: known, not probed again)
    assert counts[True] == 1 + (blocks - 1) + 1 + (blocks - 1)
    assert counts[False] > counts[True]


def test_search_does_not_probe_again_what_it_is_given() -> None:
    fails, calls = _world({3: "x"}, range(5))
    found = search(range(5), lambda item: item, fails, None, Failure("bad 3", "E", "x"))
    assert set(found) == {3} and frozenset(range(5)) not in calls


class _Raises(nn.Module):
    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where
        self.body = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), _Inner(where == "inner")))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.where == "top":
            raise RuntimeError("top")
        out: torch.Tensor = self.body(x)
        return out


class _Inner(nn.Module):
    def __init__(self, raises: bool) -> None:
        super().__init__()
        self.raises = raises

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.raises:
            torch.ones(2) @ torch.ones(3)  # raises inside torch, called from here
        return x


@pytest.mark.parametrize(("where", "module"), [("inner", "body.1.1"), ("top", "")])
def test_mismatch_names_the_innermost_module_that_raised(where: str, module: str) -> None:
    model = _Raises(where)
    failure = mismatch(model, as_inputs("test", model, torch.ones(1, 2)), None)
    assert failure is not None and failure.module == module and failure.where is not None


def test_mismatch_of_a_model_that_runs_names_no_module() -> None:
    model = _Raises("nowhere")
    x = torch.ones(1, 2)
    with torch.no_grad():
        reference = model(x) + 1
    failure = mismatch(model, as_inputs("test", model, x), reference)
    assert failure is not None and failure.module is None and failure.where is None
