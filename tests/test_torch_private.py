"""torch's private API is reached through ``funcprune/_torch_private.py`` only, and its accessors behave.

A torch upgrade that moves a private name should touch that one module.
Every other module's source is read (imports inside functions included):
an import of a private torch module or name (``from
torch.distributed.tensor.placement_types import _StridedShard``), or an
attribute path through one (``torch._C._functorch...``), is a bypass.
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import funcprune
from funcprune import _torch_private as private
from funcprune._dtensor import cut_dim

PACKAGE = Path(funcprune.__file__).parent
#: The module that may reach into torch's private API.
GATE = "_torch_private.py"
#: Bypasses allowed for now, by (module, private name): none.
ELSEWHERE: frozenset[tuple[str, str]] = frozenset()


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _first_private(dotted: str) -> str | None:
    """``dotted`` up to its first private part (``torch._C._functorch`` -> ``torch._C``), or None."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if _private(part):
            return ".".join(parts[: i + 1])
    return None


def bypasses(source: str) -> Iterator[str]:
    """The private torch names (up to their first private part) that ``source`` reaches."""
    tree = ast.parse(source)
    roots: dict[str, str] = {}  # a local name -> the torch module or name it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    roots[alias.asname or "torch"] = alias.name if alias.asname else "torch"
                    yield from filter(None, [_first_private(alias.name)])
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                roots[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                yield from filter(None, [_first_private(f"{node.module}.{alias.name}")])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts: list[str] = []
            value: ast.expr = node
            while isinstance(value, ast.Attribute):
                parts.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in roots:
                yield from filter(None, [_first_private(".".join([roots[value.id], *reversed(parts)]))])


def found(root: Path) -> set[tuple[str, str]]:
    """Every ``(module, private name)`` outside the gate, as paths relative to the package ``root``."""
    return {
        (path.relative_to(root).as_posix(), name)
        for path in sorted(root.rglob("*.py"))
        if path.relative_to(root).as_posix() != GATE
        for name in bypasses(path.read_text(encoding="utf-8"))
    }


def test_no_module_but_the_gate_reaches_into_torch_private_api() -> None:
    assert found(PACKAGE) - ELSEWHERE == set()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("from torch.distributed.tensor.placement_types import _StridedShard", "torch.distributed.tensor.placement_types._StridedShard"),
        ("import torch\nflag = torch._C._functorch.is_functorch_wrapped_tensor", "torch._C"),
        ("from torch import nn\nbase = nn.modules.conv._ConvNd", "torch.nn.modules.conv._ConvNd"),
        ("import torch._dynamo", "torch._dynamo"),
        ("import torch.utils as u\nflat = u._pytree.tree_flatten", "torch.utils._pytree"),
    ],
)  # fmt: skip
def test_a_bypass_added_on_purpose_is_found(tmp_path: Path, line: str, expected: str) -> None:
    copy = tmp_path / "funcprune"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    path = copy / "compat" / "_pruned.py"
    path.write_text(path.read_text(encoding="utf-8") + f"\n\ndef planted() -> None:\n    {line.replace(chr(10), chr(10) + '    ')}\n")
    assert found(copy) - ELSEWHERE == {("compat/_pruned.py", expected)}


def test_public_names_and_dunders_are_no_bypass() -> None:
    source = "import torch\nfrom torch import nn\nv = torch.__version__\nm = nn.Module.__init__\nx = torch.utils.data"
    assert list(bypasses(source)) == []


@pytest.mark.skipif(not dist.is_available(), reason="torch built without torch.distributed")
def test_strided_shard_round_trips_and_other_placements_have_no_split_factor() -> None:
    from torch.distributed.tensor import Replicate, Shard

    placement = private.strided_shard(1, 4)
    assert cut_dim(placement, 2) == 1 and placement == private.strided_shard(1, 4) != private.strided_shard(1, 2)
    assert private.strided_split_factor(placement) == 4
    assert private.strided_split_factor(Shard(1)) is None
    assert private.strided_split_factor(Replicate()) is None
    assert private.strided_split_factor("Shard(1)") is None


def test_functorch_wrapped_inside_a_transform_only() -> None:
    seen: list[bool] = []

    def record(t: torch.Tensor) -> torch.Tensor:
        seen.append(private.is_functorch_wrapped(t))
        return t * 2

    torch.func.vmap(record)(torch.ones(3, 2))
    assert seen == [True] and not private.is_functorch_wrapped(torch.ones(2))


def test_graph_modules_made_inside_write_their_code_when_first_run_and_compute_the_same() -> None:
    model = nn.Sequential(nn.Linear(3, 2), nn.ReLU()).eval()
    x = torch.randn(4, 3)
    with private.lazy_graph_modules():
        lazy = torch.fx.symbolic_trace(model)
    eager = torch.fx.symbolic_trace(model)
    bases = {c.__name__ for c in type(lazy).__mro__}, {c.__name__ for c in type(eager).__mro__}
    assert "_LazyGraphModule" in bases[0] and "_LazyGraphModule" not in bases[1]  # (outside: as before)
    assert torch.equal(lazy(x), model(x)) and lazy.code == eager.code
