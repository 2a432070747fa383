"""What one walk over a traced graph knows, and the helpers every op handler uses.

A :class:`Walk` holds the union-find of atoms, the blocked and unknown ones,
each node's value and each layer's atoms while the nodes are visited in
order; a handler is a function ``(walk, node) -> Value`` (``README.md``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from typing import final

import torch
import torch.nn.functional as F
from torch import fx

from ._values import ChannelLayout, Pieces, RoleKind, Sizes, Value

__all__ = [
    "Handler", "NodeFailed", "Walk", "as_dim", "call_arg", "carries", "record_shapes", "shape_of",
]  # fmt: skip

#: The key of ``node.meta`` where :func:`record_shapes` puts a tensor's shape.
_SHAPE = "funcprune_shape"


@final
class Walk:
    """The state of one pass over ``gm`` (see the module docstring).

    Args:
        gm: the traced model, its nodes' shapes recorded (:func:`record_shapes`).
        shared: the modules whose tensors are shared or read elsewhere.

    >>> from torch import fx, nn
    >>> walk = Walk(fx.symbolic_trace(nn.Identity()), shared=set())
    >>> walk.new_atoms(3)
    (0, 1, 2)
    >>> walk.union(2, 1)
    >>> [walk.find(atom) for atom in range(3)]  # a group is named by its smallest atom
    [0, 1, 1]
    """

    def __init__(self, gm: fx.GraphModule, shared: AbstractSet[str]) -> None:
        self.gm = gm
        self.shared = shared
        self.parent: list[int] = []
        self.produced: dict[int, tuple[str, int]] = {}
        self.blocked: dict[int, str] = {}
        self.unknown: dict[int, str] = {}
        self.values: dict[fx.Node, Value] = {}
        self.kinds: dict[str, tuple[RoleKind, int]] = {}
        self.out_atoms: dict[str, tuple[int, ...]] = {}
        self.in_atoms: dict[str, tuple[int, ...] | None] = {}
        self.fixed: dict[str, str] = {}

    # --- atoms: a union-find over channels -----------------------------------

    def new_atoms(self, count: int) -> tuple[int, ...]:
        """``count`` new atoms, each a group of its own."""
        start = len(self.parent)
        self.parent.extend(range(start, start + count))
        return tuple(range(start, start + count))

    def find(self, atom: int) -> int:
        """The atom that names the group of ``atom``: its smallest."""
        while self.parent[atom] != atom:
            self.parent[atom] = self.parent[self.parent[atom]]
            atom = self.parent[atom]
        return atom

    def union(self, a: int, b: int) -> None:
        """Put ``a`` and ``b`` in one group."""
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def pair(self, left: Iterable[int], right: Iterable[int]) -> None:
        """Put ``left`` and ``right`` in one group, atom by atom, as ``zip`` pairs them."""
        for a, b in zip(left, right):
            self.union(a, b)

    # --- blocked and unknown atoms ---------------------------------------------

    def block(self, atoms: Iterable[int], reason: str) -> None:
        """Keep ``atoms`` whole, for ``reason`` (an atom keeps its first reason)."""
        for atom in atoms:
            self.blocked.setdefault(atom, reason)

    def block_node(self, node: fx.Node, why: str) -> Value:
        """Block every channel ``node`` reads; return ``None``: its result carries none."""
        reason = f"{self.describe(node)} {why}"
        for value in self.inputs(node):
            self.block(value.atoms if isinstance(value, ChannelLayout) else value.layout.atoms, reason)
        return None

    def unknown_op(self, node: fx.Node) -> Value:
        """Mark the channels ``node`` reads as read by an op shrink cannot reason about.

        Returns ``None``: the node's result carries no channels.
        """
        description = self.describe(node)
        for value in self.inputs(node):
            layout = value if isinstance(value, ChannelLayout) else None
            layout = value.layout if isinstance(value, Pieces) else layout
            for atom in layout.atoms if layout is not None else ():
                self.unknown.setdefault(atom, description)
        return None

    def describe(self, node: fx.Node) -> str:
        """``node 'roll' (call_function torch.roll)``: how messages name a node."""
        if node.op == "call_module":
            kind = type(self.gm.get_submodule(str(node.target))).__name__
            return f"node {node.name!r} (call_module {node.target}: {kind})"
        if node.op == "call_method":
            return f"node {node.name!r} (call_method .{node.target}())"
        if node.op in ("output", "placeholder"):
            return f"node {node.name!r} ({node.op})"
        return f"node {node.name!r} ({node.op} {_callable_name(node.target)})"

    # --- what the arguments carry ------------------------------------------------

    def value(self, arg: object) -> Value:
        """What ``arg`` carries: ``None`` for constants and nodes without channels."""
        return self.values.get(arg) if isinstance(arg, fx.Node) else None

    def layout(self, arg: object) -> ChannelLayout | None:
        """The channels of ``arg``, if it is a tensor that carries some."""
        value = self.value(arg)
        return value if isinstance(value, ChannelLayout) else None

    def inputs(self, node: fx.Node) -> list[ChannelLayout | Sizes | Pieces]:
        """The values with channels among ``node``'s inputs."""
        return [v for n in node.all_input_nodes if (v := self.values.get(n)) is not None]

    def first(self, node: fx.Node) -> tuple[ChannelLayout, tuple[int, ...]] | None:
        """The layout and shape of the first argument, if it alone has channels."""
        head = node.args[0] if node.args else None
        x, shape = self.layout(head), shape_of(head)
        others = [n for n in node.all_input_nodes if n is not head]
        if x is None or shape is None or any(carries(self.values[n]) for n in others):
            return None
        return x, shape

    def reads_more(self, node: fx.Node, operands: Iterable[object]) -> bool:
        """Whether ``node`` reads channels from other tensors than ``operands``."""
        known = [n for n in operands if isinstance(n, fx.Node)]
        return any(
            carries(self.values[n]) and all(n is not k for k in known)
            for n in node.all_input_nodes
        )


#: What a node does to channels: records it in the walk, returns what the result carries.
Handler = Callable[[Walk, fx.Node], Value]


def carries(value: Value) -> bool:
    """Whether ``value`` is a tensor with channels, or pieces of one."""
    return isinstance(value, (ChannelLayout, Pieces))


def shape_of(arg: object) -> tuple[int, ...] | None:
    """The shape of a tensor node (``None`` for constants and non-tensors)."""
    shape = arg.meta.get(_SHAPE) if isinstance(arg, fx.Node) else None
    return shape if isinstance(shape, tuple) else None


@final
class NodeFailed(Exception):
    """The traced model failed on a node: ``node``'s name, and the error as ``__cause__``."""

    def __init__(self, node: str) -> None:
        super().__init__(node)
        self.node = node


def record_shapes(gm: fx.GraphModule, inputs: tuple[torch.Tensor, ...]) -> None:
    """Run ``gm`` once on ``inputs`` (no grad), recording each tensor node's shape.

    Raises:
        NodeFailed: naming the node, if the model fails on it (the error is
            its ``__cause__``); nothing is printed.
    """
    with torch.no_grad():
        _ShapeRecorder(gm).run(*inputs)


@final
class _ShapeRecorder(fx.Interpreter):
    """An interpreter that writes each tensor result's shape into its node's meta.

    Unlike ``ShapeProp``, it prints no traceback when a node fails.
    """

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.extra_traceback = False  # the error as raised: no graph dump added

    def run_node(self, n: fx.Node) -> object:
        try:
            result = super().run_node(n)
        except Exception as exc:  # anything the user's forward raises
            raise NodeFailed(n.name) from exc
        if isinstance(result, torch.Tensor):
            n.meta[_SHAPE] = tuple(result.shape)
        return result


def as_dim(d: object, ndim: int) -> int | None:
    """``d`` as a non-negative dim of an ``ndim``-d tensor, or ``None``.

    >>> as_dim(-1, 4), as_dim(4, 4), as_dim(None, 4)
    (3, None, None)
    """
    if isinstance(d, int) and not isinstance(d, bool) and -ndim <= d < max(ndim, 1):
        return d % max(ndim, 1)
    return None


def call_arg(node: fx.Node, index: int, name: str, default: object = None) -> object:
    """Argument ``name`` of a call, given by position ``index`` or by keyword."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _callable_name(target: object) -> str:
    """``torch.roll``, ``torch.nn.functional.gelu``, ``operator.matmul``, ``mod.fn``."""
    name = str(getattr(target, "__name__", repr(target)))
    for prefix, namespace in (("torch.nn.functional", F), ("torch", torch), ("operator", operator)):
        if getattr(namespace, name, None) is target:
            return f"{prefix}.{name}"
    module = getattr(target, "__module__", None)
    qualname = str(getattr(target, "__qualname__", name))
    return f"{module}.{qualname}" if module else qualname
