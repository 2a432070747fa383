"""The typed stub of torch.nn.utils.prune (typings/) matches the installed torch.

The stub is what mypy checks compat's overrides and the tests' calls against,
so it must declare every public name (and the helpers compat re-exports) with
torch's parameter names, kinds and defaults. It is also checked to be read: mypy
run on a deliberately wrong call reports it.
"""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch.nn.utils.prune as tp

from _background import Job

from .test_surface import CLASSES, FUNCTIONS, HELPERS

TYPINGS = Path(__file__).resolve().parents[2] / "typings"
STUB = TYPINGS / "torch-stubs" / "nn" / "utils" / "prune.pyi"

Shape = list[tuple[str, Any, Any]]
_EMPTY = inspect.Parameter.empty


def stub_tree() -> ast.Module:
    return ast.parse(STUB.read_text())


def stub_shape(node: ast.FunctionDef) -> Shape:
    """Names, kinds and defaults of a stub function's parameters, as inspect gives them."""
    a = node.args
    positional = [(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in a.args]
    defaults: list[Any] = [_EMPTY] * (len(a.args) - len(a.defaults))
    defaults += [ast.literal_eval(d) for d in a.defaults]
    shape: Shape = [(p.arg, kind, d) for (p, kind), d in zip(positional, defaults)]
    if a.vararg is not None:
        shape.append((a.vararg.arg, inspect.Parameter.VAR_POSITIONAL, _EMPTY))
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        shape.append((p.arg, inspect.Parameter.KEYWORD_ONLY,
                      _EMPTY if d is None else ast.literal_eval(d)))  # fmt: skip
    if a.kwarg is not None:
        shape.append((a.kwarg.arg, inspect.Parameter.VAR_KEYWORD, _EMPTY))
    return shape


def torch_shape(fn: Any) -> Shape:
    if isinstance(fn, classmethod):
        fn = fn.__func__
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def defs(body: list[ast.stmt]) -> dict[str, list[ast.FunctionDef]]:
    """Each function of a body, with all its overloads."""
    found: dict[str, list[ast.FunctionDef]] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef):
            found.setdefault(node.name, []).append(node)
    return found


def test_the_stub_declares_every_name_compat_mirrors() -> None:
    tree = stub_tree()
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    assert classes == set(CLASSES)
    assert set(defs(tree.body)) == set(FUNCTIONS + HELPERS)


@pytest.mark.parametrize("name", FUNCTIONS + HELPERS)
def test_function_signatures_are_torchs(name: str) -> None:
    (node,) = defs(stub_tree().body)[name]
    assert stub_shape(node) == torch_shape(getattr(tp, name))


@pytest.mark.parametrize("cls", CLASSES)
def test_method_signatures_are_torchs(cls: str) -> None:
    (node,) = [n for n in stub_tree().body if isinstance(n, ast.ClassDef) and n.name == cls]
    methods = defs(node.body)
    torch_cls = getattr(tp, cls)
    assert set(methods) == {
        name for name, value in vars(torch_cls).items()
        if inspect.isfunction(value) or isinstance(value, classmethod)
    }  # fmt: skip
    for name, overloads in methods.items():
        theirs = inspect.getattr_static(torch_cls, name)
        for overload in overloads:
            assert stub_shape(overload) == torch_shape(theirs), name
        kind = isinstance(theirs, classmethod)
        assert kind == any(
            isinstance(d, ast.Name) and d.id == "classmethod" for d in overloads[0].decorator_list
        ), name


def _mypy_on_a_probe(directory: Path) -> list[str]:
    """mypy on a probe file that makes a wrong call (run in ``directory``, where the probe is)."""
    probe = directory / "probe.py"
    probe.write_text(
        "import torch.nn.utils.prune as tp\n"
        "from torch import nn\n"
        'module = tp.identity(nn.Linear(2, 2), "bias")\n'
        "reveal_type(module)\n"
        'tp.l1_unstructured(module, "weight", amount="half")\n'
    )
    return [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--config-file=", str(probe)]


#: mypy takes seconds to read torch: it runs in the background from the end of collection (tests/_background.py).
MYPY = Job(_mypy_on_a_probe, env={**os.environ, "PYTHONPATH": str(TYPINGS)}, timeout=300)
BACKGROUND = {"mypy_run": MYPY}


@pytest.fixture
def mypy_run() -> subprocess.CompletedProcess[str]:
    return MYPY.result()


def test_mypy_reads_the_stub(mypy_run: subprocess.CompletedProcess[str]) -> None:
    """A wrong call type-checks against the stub, not torch's untyped source."""
    out = mypy_run.stdout
    assert 'Revealed type is "torch.nn.modules.linear.Linear"' in out, out
    assert 'Argument "amount" to "l1_unstructured" has incompatible type "str"' in out
    assert out.count("error:") == 1, out
