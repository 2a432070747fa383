"""The runner's and the criteria's rooms stay readable: modules of at most 450 lines, classes named apart.

Issue 37 (items 5 and 6) for these two rooms: no module over 450 lines,
and no class of the runner called like a class of another room (three
``Blocks`` meant decoder layers, runs of entries and a process's slices).
The source is read as text and parsed; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import funcprune

PACKAGE = Path(funcprune.__file__).parent
ROOMS = ("_criteria", "_runner")
LIMIT = 450


@pytest.mark.parametrize("path", [p for room in ROOMS for p in sorted((PACKAGE / room).glob("*.py"))],
                         ids=lambda p: f"{p.parent.name}/{p.name}")  # fmt: skip
def test_no_module_of_the_runner_or_the_criteria_is_over_450_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= LIMIT, f"{path.relative_to(PACKAGE)} has {lines} lines; split it by concept"


def classes(path: Path) -> set[str]:
    """The classes a module defines at its top level."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef)}


def test_the_runners_classes_are_named_apart_from_every_other_rooms() -> None:
    runner = PACKAGE / "_runner"
    ours = {name: path.name for path in runner.glob("*.py") for name in classes(path)}
    elsewhere = {
        name: str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if runner not in path.parents
        for name in classes(path)
    }
    shared = sorted(f"{name} ({ours[name]}; {elsewhere[name]})" for name in ours.keys() & elsewhere.keys())
    assert not shared, f"the runner names classes as other rooms do: {', '.join(shared)}"
    assert "RepeatedLayers" in ours  # the decoder or encoder layers the runner walks
