"""One walk over an exported graph: every node's value, and beside it the atoms it carries.

:class:`Walk` runs the graph node by node on the example inputs (real
values: index tensors, masks and shapes are what the model computes) and,
beside each tensor, a tensor of atom ids of the same shape (``-1``: no
atom; ``None``: no atom anywhere); a value nothing reads is never
computed (``_later.py``). A tensor taken from a parameter or a
buffer without arithmetic (the tensor itself, a transpose, a slice...)
also keeps where each of its entries comes from (:class:`Origin`), so that
a layer knows which rows and columns of which parameter it uses. Each op's
handler (``_ops.py``) says what the op does to the atoms; an op with no
handler that reads atoms is recorded as unknown, naming the node.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, final

import torch
from torch import fx

from .._experts import Router
from .._types import Tensor
from ._atoms import Atoms
from ._export import Exported
from ._later import Values, Waiting, mapped, pure, stand_in

__all__ = ["Handler", "NodeFailed", "Ops", "Origin", "Walk", "describe", "moved_args"]


@final
@dataclass(frozen=True, slots=True)
class Origin:
    """Where each entry of a tensor comes from: the flat (row-major) index of each entry in tensor ``name``.

    Either ``strided``, ``(offset, strides, size)``: the tensor is a view of
    the source with that size, strides and offset, counted in the source's
    row-major order (a parameter, its transpose, a slice: no index tensor is
    made); or ``flat_ids``, the index of each entry (after a copy that keeps
    entries, such as ``index_select``).
    """

    name: str
    shape: tuple[int, ...]
    strided: tuple[int, tuple[int, ...], tuple[int, ...]] | None = None
    flat_ids: Tensor | None = None  # int64, the tensor's shape

    @property
    def size(self) -> tuple[int, ...]:
        """The shape of the tensor (not of its source)."""
        if self.strided is not None:
            return self.strided[2]
        assert self.flat_ids is not None
        return tuple(self.flat_ids.shape)

    @property
    def flat(self) -> Tensor:
        """The flat index in the source of each entry (made here for a strided origin)."""
        if self.flat_ids is not None:
            return self.flat_ids
        assert self.strided is not None
        offset, strides, size = self.strided
        return torch.arange(math.prod(self.shape)).as_strided(size, strides, offset)

    def coords(self) -> tuple[Tensor, ...]:
        """For each dim of the source tensor, the index of each entry along it."""
        return torch.unravel_index(self.flat, self.shape) if self.shape else ()

    def axis_dim(self, axis: int) -> tuple[int, Tensor] | None:
        """For a strided origin whose axes each run along their own source dim: the source dim ``axis`` runs
        along and the index along it of each position (``None``: not such a view, or ``axis`` of size 1)."""
        if self.strided is None:
            return None
        offset, strides, size = self.strided
        source = _row_major(self.shape)
        dims: list[int | None] = []
        for n, stride in zip(size, strides, strict=True):
            if n == 1 or stride == 0:
                dims.append(None)
                continue
            found = [d for d, (m, c) in enumerate(zip(self.shape, source, strict=True)) if m > 1 and c == stride]
            if len(found) != 1:
                return None
            dims.append(found[0])
        taken = [d for d in dims if d is not None]
        dim = dims[axis]
        if len(taken) != len(set(taken)) or dim is None:
            return None
        start = (offset // source[dim]) % self.shape[dim]
        if start + size[axis] > self.shape[dim]:
            return None
        return dim, torch.arange(start, start + size[axis])


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    return tuple(strides)


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
        stands_for: the op the tables know a target by, and whether the target writes its first
            argument in place: the target itself; an in-place op's functional form (``relu_``:
            ``relu``); a view its schema declares (an alias of its input), by ``aten.alias``.
        is_alias: whether an op returns a view that shares its first argument's memory (a write
            into it writes into the argument).
        conversions: the ops that convert dtype or device, entry for entry (a parameter converted
            is still that parameter, as a layer reads it).
        metadata: the ops that read only a tensor's shape, dtype or device (checks, ``new_empty``):
            they read no parameter's values.
    """

    handlers: Mapping[object, Handler]
    producers: frozenset[object]
    elementwise: frozenset[object]
    views: frozenset[object]
    layer_slots: Mapping[object, frozenset[object]]
    view_ids: Callable[[Walk, fx.Node, Mapping[fx.Node, Tensor]], Any]
    stands_for: Callable[[Any], tuple[object, bool]]
    is_alias: Callable[[Any], bool]
    conversions: frozenset[object] = frozenset()
    metadata: frozenset[object] = frozenset()


def _keys(target: Any) -> Iterator[object]:
    """How tables may name an op: the overload, its packet, and the packet's qualified name (``"ns::op"``)."""
    yield target
    packet = getattr(target, "overloadpacket", None)
    if packet is not None:
        yield packet
        name = getattr(packet, "_qualified_op_name", None)
        if name is not None:
            yield name


def _lookup(target: Any, table: Mapping[object, Any]) -> Any:
    return next((table[key] for key in _keys(target) if key in table), None)


def _member(target: Any, table: Mapping[object, Any] | frozenset[object]) -> bool:
    return any(key in table for key in _keys(target))


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

    def __init__(self, exported: Exported, ops: Ops, routers: Iterable[Router] = ()) -> None:
        self.exported = exported
        self.ops = ops
        self.atoms = Atoms()
        self.values: dict[fx.Node, Any] = Values()  # computed when read (:class:`~._later.Waiting`)
        self.ids: dict[fx.Node, Any] = {}
        self.origins: dict[fx.Node, Any] = {}
        self.read_directly: dict[str, str] = {}  # tensor name -> the op reading its values directly
        self.routers: dict[str, Router] = {r.weight: r for r in routers}  # MoE routers, by weight name
        # a router's per-expert tensors: read as values to route (their experts' entries go with the experts)
        self.router_extras = frozenset(name for r in self.routers.values() for name in r.extras)
        self.sources: dict[str, Tensor] = {}  # tensor name -> its value
        self.heads: dict[fx.Node, Tensor] = {}  # attention-like ops -> the atom of each head (batch position)
        for node, name in exported.tensors.items():
            value = exported.values[node]
            shape = tuple(value.shape)
            self.origins[node] = Origin(name, shape, strided=(0, _row_major(shape), shape))
            self.sources[name] = value
        for node, path in exported.modules.items():
            node.meta["funcprune_module"] = path

    # --- reading a node's arguments --------------------------------------------------

    def value(self, arg: object) -> Any:
        """``arg`` with every node replaced by its value."""
        return _map_nodes(arg, lambda n: self.values[n])

    def peek(self, node: fx.Node) -> Any:
        """The node's value, or, where it is not computed yet, export's stand-in for it (a fake tensor, or a list of
        them): for its shape, dtype and structure only, which a handler may read without computing it."""
        value = dict.get(self.values, node)
        if isinstance(value, Waiting):
            return value.value if value.done else value.stand_in
        return value

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
        value = self.peek(arg) if isinstance(arg, fx.Node) else arg
        shape = value.shape if isinstance(value, Tensor) else ()
        return torch.full(shape, -1, dtype=torch.long)

    # --- running --------------------------------------------------------------------

    def run(self) -> None:
        """Walk the graph node by node; each node's value and atom ids are dropped once no later node reads them (a
        1B model's walk held about 430 MB of them to the end)."""
        nodes = list(self.exported.graph.nodes)
        dying = _last_reads(nodes, self.ops.is_alias)
        for i, node in enumerate(nodes):
            self._step(node)
            for done in dying.get(i, ()):
                self.values.pop(done, None)
                self.ids.pop(done, None)

    def _step(self, node: fx.Node) -> None:
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
        target: Any = node.target
        key, in_place = self.ops.stands_for(target)
        waits, standing = stand_in(node)
        if waits:
            held = _map_nodes((node.args, node.kwargs), lambda n: dict.__getitem__(self.values, n))
            self.values[node] = Waiting(target, held[0], held[1], standing)
        else:
            if not pure(node):  # it may write a tensor, or draw random numbers: what reads before, runs before
                for value in dict.values(self.values):
                    if isinstance(value, Waiting):
                        value.compute()
            args, kwargs = self.value(node.args), self.value(node.kwargs)
            self.values[node] = target(*args, **kwargs)
        handler = _lookup(key, self.ops.handlers)
        reads = any(True for _ in self.tensor_atoms(node))
        if handler is not None and (reads or _member(key, self.ops.producers)):
            try:
                self.ids[node] = handler(self, node)
            except Exception as e:  # a graph stranger than the handler expects
                raise NodeFailed(f"{describe(node)} ({type(e).__name__}: {e})") from e
            written = node.args[0] if node.args else None
            if in_place and isinstance(written, fx.Node) and isinstance(self.ids[node], Tensor):
                self._write(written, self.ids[node])
        elif reads:
            for ids in self.tensor_atoms(node):
                self.atoms.refuse(ids, describe(node))
        self._follow_origin(node)

    def _write(self, written: fx.Node, ids: Tensor) -> None:
        """An op wrote ``ids`` into ``written`` in place: later readers of it, and of the tensor it views, read them.

        Where ``written`` is a view (``k[..., :8].copy_(k_nope)`` into a tensor made by ``new_empty``),
        the entries it covers in its base tensor take the written atoms too.
        """
        self.ids[written] = ids
        chain = [written]
        while chain[-1].op == "call_function" and self.ops.is_alias(chain[-1].target) and chain[-1].args:
            parent = chain[-1].args[0]
            if not isinstance(parent, fx.Node) or not isinstance(self.values.get(parent), Tensor):
                return
            chain.append(parent)
        if len(chain) == 1:
            return
        base = chain[-1]
        size = self.values[base].shape
        positions = torch.arange(math.prod(size)).reshape(size)
        for view, parent in zip(reversed(chain[:-1]), reversed(chain[1:]), strict=True):
            positions = self.ops.view_ids(self, view, {parent: positions})
            if not isinstance(positions, Tensor):
                return
        updated = self.ids_or_none(base).expand(size).clone().reshape(-1)
        updated[positions.reshape(-1)] = ids.expand(positions.shape).reshape(-1)
        self.ids[base] = updated.reshape(size)

    def _follow_origin(self, node: fx.Node) -> None:
        """A tensor taken from a parameter without arithmetic keeps its origin; any other read is direct.

        A layer's weight and bias slots, and an elementwise op that scales or
        shifts atoms by a parameter's entries (a norm's weight), read it as
        layers do; their handlers relate the entries to the atoms.
        """
        sources = [a for a in _nodes(node.args, node.kwargs) if a in self.origins]
        key, _ = self.ops.stands_for(node.target)
        if not sources or node in self.ids and _member(key, self.ops.elementwise) or _member(key, self.ops.metadata):
            return
        converted = node.args[0] if node.args else None
        if _member(key, self.ops.conversions) and isinstance(converted, fx.Node) and converted in self.origins:
            value, origin = self.peek(node), self.origins[converted]  # (its shape)
            if isinstance(value, Tensor) and tuple(value.shape) == origin.size:
                self.origins[node] = origin
                return
        moved = [a for a in moved_args(node) if a in self.origins]
        if _member(key, self.ops.views) and len(moved) == 1:
            sources = moved  # any other tensor argument indexes (a buffer of positions): not read as values
            origin = self.origins[sources[0]]
            strided = self._view_of_source(node, origin)
            if strided is not None:
                self.origins[node] = Origin(origin.name, origin.shape, strided=strided)
                return
            moved = self.ops.view_ids(self, node, {sources[0]: origin.flat})
            if isinstance(moved, Tensor):
                self.origins[node] = Origin(origin.name, origin.shape, flat_ids=moved)
                return
        if _member(key, self.ops.elementwise) and len(sources) == 1 and node not in self.ids:
            follows = self._elementwise_origin(node, self.origins[sources[0]])
            if follows is not None:
                self.origins[node] = follows
                return
        for source in sources:
            name = self.origins[source].name
            if not self._is_layer_slot(node, source) and name not in self.router_extras:
                self.read_directly.setdefault(name, describe(node))

    def _elementwise_origin(self, node: fx.Node, origin: Origin) -> Origin | None:
        """A parameter met elementwise by tensors of no channel (``table[index] + mask``): each entry of the result
        comes from one entry of the parameter (broadcast), which follows wherever the result meets channels."""
        value = self.peek(node)  # (its shape)
        if not isinstance(value, Tensor) or value.dim() < len(origin.size):
            return None
        try:
            flat = origin.flat.expand(value.shape)
        except RuntimeError:
            return None
        return Origin(origin.name, origin.shape, flat_ids=flat)

    def _view_of_source(self, node: fx.Node, origin: Origin) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
        """The node's value as a strided view of ``origin``'s source tensor, if it is one (it shares its memory)."""
        value = self.values.get(node)
        source = self.sources.get(origin.name)
        if not isinstance(value, Tensor) or source is None or not source.is_contiguous() or not value.numel():
            return None
        if value.dtype != source.dtype or value.device != source.device or source.device.type == "meta":
            return None
        if value.untyped_storage().data_ptr() != source.untyped_storage().data_ptr():
            return None
        offset = int(value.storage_offset()) - int(source.storage_offset())
        return offset, tuple(value.stride()), tuple(value.shape)

    def _is_layer_slot(self, node: fx.Node, source: fx.Node) -> bool:
        """Whether ``source`` is the weight or bias of the layer op ``node`` (read there as a layer reads it)."""
        target: Any = node.target
        slots = _lookup(target, self.ops.layer_slots)
        if slots is None:
            return False
        positional = [i for i, a in enumerate(node.args) if a is source]
        named = [k for k, v in node.kwargs.items() if v is source]
        return all(i in slots for i in positional) and all(k in slots for k in named)


def moved_args(node: fx.Node) -> list[fx.Node]:
    """The tensor arguments whose entries a view moves (the first, or the list of ``cat``/``stack``)."""
    first = node.args[0] if node.args else next(iter(node.kwargs.values()), None)
    if isinstance(first, (list, tuple)):
        return [a for a in first if isinstance(a, fx.Node)]
    return [first] if isinstance(first, fx.Node) else []


def _last_reads(nodes: list[fx.Node], is_alias: Callable[[Any], bool]) -> dict[int, list[fx.Node]]:
    """For each position in ``nodes``, the nodes that no node after it reads (a node no node reads: its own).

    A view's inputs count as read as long as the view is: an in-place op that
    writes through the view writes into them (:meth:`Walk._write`), which later
    readers of them see.
    """
    last: dict[fx.Node, int] = {}
    for i, node in enumerate(nodes):
        last.setdefault(node, i)
        for arg in node.all_input_nodes:
            last[arg] = i
    for node in reversed(nodes):
        if node.op == "call_function" and is_alias(node.target):
            for arg in node.all_input_nodes:
                last[arg] = max(last[arg], last[node])
    dying: dict[int, list[fx.Node]] = {}
    for node, i in last.items():
        dying.setdefault(i, []).append(node)
    return dying


def _map_nodes(arg: object, fn: Callable[[fx.Node], Any]) -> Any:
    """``arg`` (nested tuples, lists, dicts) with every node replaced by ``fn(node)``."""
    return mapped(arg, fx.Node, fn)


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
