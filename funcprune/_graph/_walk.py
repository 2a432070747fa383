"""One walk over an exported graph: every node's value, and beside it the atoms it carries.

:class:`Walk` runs the graph node by node on the example inputs (real
values: index tensors, masks and shapes are what the model computes) and,
beside each tensor, a tensor of atom ids of the same shape (``-1``: no
atom; ``None``: no atom anywhere). A tensor taken from a parameter or a
buffer without arithmetic (the tensor itself, a transpose, a slice...)
also keeps where each of its entries comes from (:class:`Origin`), so that
a layer knows which rows and columns of which parameter it uses. Each op's
handler (``_ops.py``) says what the op does to the atoms; an op with no
handler that reads atoms is recorded as unknown, naming the node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, final

import torch
from torch import fx

from .._types import Tensor
from ._atoms import Atoms
from ._export import Exported

__all__ = ["Handler", "NodeFailed", "Ops", "Origin", "Walk", "describe"]


@final
@dataclass(frozen=True, slots=True)
class Origin:
    """Where each entry of a tensor comes from: the flat index of each entry in tensor ``name``."""

    name: str
    shape: tuple[int, ...]
    flat: Tensor  # int64, the tensor's shape

    def coords(self) -> tuple[Tensor, ...]:
        """For each dim of the source tensor, the index of each entry along it."""
        return torch.unravel_index(self.flat, self.shape) if self.shape else ()


#: What an op does to the atoms of its inputs: given the walk and the node, its output's atom ids.
Handler = Callable[["Walk", fx.Node], Any]


@final
@dataclass(frozen=True, slots=True)
class Ops:
    """What a walk knows about ops (``_ops.py`` makes the one the analysis uses).

    Attributes:
        handlers: what each op does to the atoms of its inputs.
        producers: the ops that make new atoms even when their input carries none.
        elementwise: the elementwise ops, whose parameter operands follow the atoms.
        views: the ops that move entries without arithmetic.
        layer_slots: for each layer op, the argument positions and names of its parameters.
        view_ids: a view op applied to the given index tensors in place of its input's values.
    """

    handlers: Mapping[object, Handler]
    producers: frozenset[object]
    elementwise: frozenset[object]
    views: frozenset[object]
    layer_slots: Mapping[object, frozenset[object]]
    view_ids: Callable[[Walk, fx.Node, Mapping[fx.Node, Tensor]], Any]


def _member(target: Any, table: Mapping[object, Any] | frozenset[object]) -> bool:
    return target in table or getattr(target, "overloadpacket", None) in table


class NodeFailed(Exception):
    """A handler failed on a node: the analysis names the node and the cause."""


def describe(node: fx.Node) -> str:
    """A node as messages name it: ``node 'linear_3' (aten.linear.default in 'model.layers.0.mlp')``."""
    if node.op != "call_function":
        return f"node {node.name!r} ({node.op})"
    where = node.meta.get("funcprune_module")
    return f"node {node.name!r} ({node.target}{f' in {where!r}' if where else ''})"


class Walk:
    """The state of one walk: values, atom ids and origins by node, and the atoms."""

    def __init__(self, exported: Exported, ops: Ops) -> None:
        self.exported = exported
        self.ops = ops
        self.atoms = Atoms()
        self.values: dict[fx.Node, Any] = {}
        self.ids: dict[fx.Node, Any] = {}
        self.origins: dict[fx.Node, Any] = {}
        self.read_directly: dict[str, str] = {}  # tensor name -> the op reading its values directly
        self.attributes: dict[str, set[str]] = {}  # module path -> head-count attributes its views follow
        for node, name in exported.tensors.items():
            value = exported.values[node]
            self.origins[node] = Origin(name, tuple(value.shape), torch.arange(value.numel()).reshape(value.shape))
        for node, path in exported.modules.items():
            node.meta["funcprune_module"] = path

    # --- reading a node's arguments --------------------------------------------------

    def value(self, arg: object) -> Any:
        """``arg`` with every node replaced by its value."""
        return _map_nodes(arg, lambda n: self.values[n])

    def atoms_of(self, arg: object) -> Any:
        """``arg`` with every node replaced by its atom ids (``None`` where it carries none)."""
        return _map_nodes(arg, lambda n: self.ids.get(n))

    def origin(self, arg: object) -> Origin | None:
        return self.origins.get(arg) if isinstance(arg, fx.Node) else None

    def tensor_atoms(self, node: fx.Node) -> Iterator[Tensor]:
        """The atom ids of the node's tensor arguments that carry atoms."""
        for arg in _nodes(node.args, node.kwargs):
            ids = self.ids.get(arg)
            yield from (t for t in _tensors(ids) if bool((t >= 0).any()))

    def ids_or_none(self, arg: object) -> Tensor:
        """The atom ids of a tensor argument, ``-1`` everywhere where it carries none."""
        ids = self.ids.get(arg) if isinstance(arg, fx.Node) else None
        if isinstance(ids, Tensor):
            return ids
        value = self.values[arg] if isinstance(arg, fx.Node) else arg
        shape = value.shape if isinstance(value, Tensor) else ()
        return torch.full(shape, -1, dtype=torch.long)

    # --- running --------------------------------------------------------------------

    def run(self) -> None:
        for node in self.exported.graph.nodes:
            if node.op == "placeholder":
                self.values[node] = self.exported.values[node]
            elif node.op == "call_function":
                self._call(node)
            elif node.op == "output":
                for ids in _tensors(self.atoms_of(node.args)):
                    self.atoms.block(ids, f"{describe(node)} is an output of the model, whose shape stays")
            elif node.op == "get_attr":
                self.values[node] = getattr(self.exported.graph.owning_module, str(node.target), None)

    def _call(self, node: fx.Node) -> None:
        args, kwargs = self.value(node.args), self.value(node.kwargs)
        target: Any = node.target
        self.values[node] = target(*args, **kwargs)
        packet = getattr(target, "overloadpacket", None)
        handler = self.ops.handlers.get(target) or self.ops.handlers.get(packet)
        reads = any(True for _ in self.tensor_atoms(node))
        if handler is not None and (reads or _member(target, self.ops.producers)):
            try:
                self.ids[node] = handler(self, node)
            except Exception as e:  # a graph stranger than the handler expects
                raise NodeFailed(f"{describe(node)} ({type(e).__name__}: {e})") from e
        elif reads:
            for ids in self.tensor_atoms(node):
                self.atoms.refuse(ids, describe(node))
        self._follow_origin(node)

    def _follow_origin(self, node: fx.Node) -> None:
        """A tensor taken from a parameter without arithmetic keeps its origin; any other read is direct.

        A layer's weight and bias slots, and an elementwise op that scales or
        shifts atoms by a parameter's entries (a norm's weight), read it as
        layers do; their handlers relate the entries to the atoms.
        """
        sources = [a for a in _nodes(node.args, node.kwargs) if a in self.origins]
        if not sources or node in self.ids and _member(node.target, self.ops.elementwise):
            return
        if _member(node.target, self.ops.views) and len(sources) == 1:
            origin = self.origins[sources[0]]
            moved = self.ops.view_ids(self, node, {sources[0]: origin.flat})
            if isinstance(moved, Tensor):
                self.origins[node] = Origin(origin.name, origin.shape, moved)
                return
        for source in sources:
            if not self._is_layer_slot(node, source):
                self.read_directly.setdefault(self.origins[source].name, describe(node))

    def _is_layer_slot(self, node: fx.Node, source: fx.Node) -> bool:
        """Whether ``source`` is the weight or bias of the layer op ``node`` (read there as a layer reads it)."""
        target: Any = node.target
        slots = self.ops.layer_slots.get(target) or self.ops.layer_slots.get(getattr(target, "overloadpacket", None))
        if slots is None:
            return False
        positional = [i for i, a in enumerate(node.args) if a is source]
        named = [k for k, v in node.kwargs.items() if v is source]
        return all(i in slots for i in positional) and all(k in slots for k in named)


def _map_nodes(arg: object, fn: Callable[[fx.Node], Any]) -> Any:
    """``arg`` (nested tuples, lists, dicts) with every node replaced by ``fn(node)``."""
    if isinstance(arg, fx.Node):
        return fn(arg)
    if isinstance(arg, (list, tuple)):
        return type(arg)(_map_nodes(a, fn) for a in arg)
    if isinstance(arg, dict):
        return {k: _map_nodes(v, fn) for k, v in arg.items()}
    return arg


def _nodes(*args: object) -> Iterator[fx.Node]:
    found: list[fx.Node] = []
    _map_nodes(args, found.append)
    return iter(found)


def _tensors(ids: Any) -> Iterator[Tensor]:
    if isinstance(ids, Tensor):
        yield ids
    elif isinstance(ids, (list, tuple)):
        for item in ids:
            yield from _tensors(item)
    elif isinstance(ids, dict):
        for item in ids.values():
            yield from _tensors(item)
