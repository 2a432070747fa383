"""The layers contract: funcprune's imports run one way, through the doors, in no circle.

Every import of the package is read from the source (``TYPE_CHECKING``
imports and imports inside functions included) into a graph of modules.
Three rules hold on it:

1. **No circle**: no module imports itself through others.
2. **Declared order**: the package is made of *rooms*: the base modules
   and the private subpackages. :data:`MAY_IMPORT` says which rooms each
   room may import from; an import between rooms it does not list fails.
3. **Doors**: a subpackage's ``__init__.py`` is its door. From outside,
   a module imports the subpackage itself (``from .._select import keep``),
   never a module inside it; inside, modules import their siblings, never
   their own door.

A new room must be declared here before it may import or be imported.
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import funcprune

PACKAGE = Path(funcprune.__file__).parent

#: Which rooms each room may import from, through their doors: the base modules first, then the
#: subpackages, bottom to top. The spine runs _native <- _select <- _specs <- _dtensor <- _plans <- compat.
BASE = frozenset({
    "funcprune._torch_private", "funcprune._types", "funcprune._validate", "funcprune._names", "funcprune._experts",
    "funcprune._families", "funcprune._units", "funcprune._expert_linears", "funcprune._collector",
})  # fmt: skip
MAY_IMPORT: Mapping[str, frozenset[str]] = {
    "funcprune._torch_private": frozenset(),
    "funcprune._types": frozenset(),
    "funcprune._validate": frozenset({"funcprune._torch_private", "funcprune._types"}),
    "funcprune._names": frozenset({"funcprune._types", "funcprune._validate"}),
    "funcprune._experts": frozenset({"funcprune._types", "funcprune._families"}),
    "funcprune._expert_linears": frozenset({"funcprune._types", "funcprune._experts"}),
    "funcprune._families": frozenset(),
    "funcprune._units": frozenset(),
    "funcprune._collector": frozenset(),
    "funcprune._native": BASE,
    "funcprune._select": BASE | {"funcprune._native"},
    "funcprune._specs": BASE | {"funcprune._select"},
    "funcprune._dtensor": BASE | {"funcprune._select", "funcprune._specs"},
    "funcprune._plans": BASE | {"funcprune._native", "funcprune._specs", "funcprune._dtensor"},
    "funcprune._targets": BASE,
    "funcprune._criteria": BASE | {"funcprune._native", "funcprune._specs", "funcprune._dtensor"},
    "funcprune._apply": BASE | {"funcprune._native", "funcprune._dtensor"},
    "funcprune._graph": BASE,
    "funcprune._structure": BASE | {"funcprune._targets", "funcprune._graph", "funcprune._payoff"},
    "funcprune._payoff": BASE | {"funcprune._specs", "funcprune._dtensor", "funcprune._graph"},
    "funcprune._runner": BASE
    | {"funcprune._specs", "funcprune._plans", "funcprune._targets", "funcprune._criteria", "funcprune._apply"}
    | {"funcprune._payoff"},  # a checkpoint streamed block by block: its shards and packed masks (issue 41)
    "funcprune._quality": BASE | {"funcprune._criteria", "funcprune._apply"},
    "funcprune.compat": BASE | {"funcprune._specs", "funcprune._plans"},
    "funcprune._demo": BASE
    | {"funcprune._specs", "funcprune._plans", "funcprune._targets", "funcprune._apply", "funcprune._payoff"}
    | {"funcprune.compat"},
    # the command line sits on top: the public names (``import funcprune``) and the doors it needs
    "funcprune._cli": frozenset({"funcprune", "funcprune._demo", "funcprune._runner"}),
}
#: Above every room: the public facade and ``python -m funcprune`` may import any door.
TOP = frozenset({"funcprune", "funcprune.__main__"})

Graph = dict[str, set[str]]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root``, by dotted name."""
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def imported(name: str, path: Path, known: Mapping[str, Path]) -> Iterator[str]:
    """The package's modules that ``name`` (at ``path``) imports, wherever the import stands."""
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    yield sub  # a module: ``from . import _native``
                elif target in known:
                    yield target


def graph_of(root: Path) -> Graph:
    known = modules(root)
    return {name: set(imported(name, path, known)) - {name} for name, path in known.items()}


def room_of(module: str) -> str:
    """The room a module is in: its top-level subpackage, or the module itself."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def circles(graph: Graph) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def violations(graph: Graph) -> list[str]:
    """Every import that breaks the declared order or walks around a door, and every undeclared room."""
    problems = []
    for source, targets in sorted(graph.items()):
        src_room = room_of(source)
        if source not in TOP and src_room not in MAY_IMPORT:
            problems.append(f"{source}: in no declared room (add it to MAY_IMPORT)")
        for target in sorted(targets):
            dst_room = room_of(target)
            if src_room == dst_room:
                if target == dst_room and source != dst_room and dst_room != "funcprune":
                    problems.append(f"{source} -> {target}: a module imports its own room's door")
                continue
            if target != dst_room:
                problems.append(f"{source} -> {target}: around the door of {dst_room}")
            if source in TOP:
                continue
            if dst_room not in MAY_IMPORT.get(src_room, frozenset()):
                problems.append(f"{source} -> {target}: {src_room} may not import {dst_room}")
    return problems


def test_the_declared_order_has_no_circle() -> None:
    declared = {room: set(allowed) for room, allowed in MAY_IMPORT.items()}
    assert not circles(declared)


def test_no_module_imports_itself_through_others() -> None:
    assert circles(graph_of(PACKAGE)) == set()


def test_imports_follow_the_declared_order_through_the_doors() -> None:
    assert violations(graph_of(PACKAGE)) == []


#: Where one class name may stand in two modules: ``compat`` mirrors torch's method classes on purpose.
MIRRORS = frozenset({"funcprune.compat"})


def class_names(root: Path) -> dict[str, list[str]]:
    """Each class name defined at a module's top level, with the modules (outside ``MIRRORS``) that define one."""
    found: dict[str, list[str]] = {}
    for name, path in modules(root).items():
        if room_of(name) in MIRRORS:
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(name)
    return found


def test_no_two_modules_define_a_class_of_one_name() -> None:
    """A name says what a thing is: three ``Blocks`` (decoder layers, runs of entries, a process's
    member slices) were three things (issue 37, item 5)."""
    shared = {name: where for name, where in class_names(PACKAGE).items() if len(where) > 1}
    assert shared == {}


@pytest.mark.parametrize(
    ("where", "line", "expected"),
    [
        ("_types.py", "from ._graph import Analysis", "funcprune._graph: funcprune._types may not import"),
        ("_graph/_atoms.py", "from .. import compat", "funcprune.compat: funcprune._graph may not import"),
        ("_names.py", "from ._graph._atoms import Atoms", "around the door of funcprune._graph"),
        ("_graph/_walk.py", "from . import Analysis", "imports its own room's door"),
    ],
)
def test_a_back_import_added_on_purpose_fails_the_contract(
    tmp_path: Path, where: str, line: str, expected: str
) -> None:
    copy = tmp_path / "funcprune"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    path = copy / where
    text = path.read_text(encoding="utf-8")
    path.write_text(text + f"\nif TYPE_CHECKING:\n    {line}\n", encoding="utf-8")  # type-only counts too
    found = violations(graph_of(copy))
    assert any(expected in problem for problem in found), found


def test_a_circle_added_on_purpose_is_found(tmp_path: Path) -> None:
    copy = tmp_path / "funcprune"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    atoms = copy / "_graph" / "_atoms.py"
    atoms.write_text(atoms.read_text(encoding="utf-8") + "\nfrom ._walk import Walk\n", encoding="utf-8")
    assert frozenset({"funcprune._graph._atoms", "funcprune._graph._walk"}) in circles(graph_of(copy))
