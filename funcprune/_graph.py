"""Which channels of a model hang together, read from its ``torch.fx`` graph.

:func:`trace_channels` traces a model with :func:`torch.fx.symbolic_trace`,
runs it once on example inputs to learn every tensor's shape
(:class:`torch.fx.passes.shape_prop.ShapeProp`), then follows the
*channels* through the graph. Every output channel of a Linear or a Conv is
an *atom*; a tensor that carries channels has a :class:`Layout`, the atoms
along its channel axis (dim 1 of a Conv activation ``(N, C, ...)``, the last
dim of a Linear activation ``(..., F)``). Node by node:

- a Linear or a Conv (``groups=1``) reads the atoms of its input as its
  input columns and makes new atoms, its output channels;
- channel-wise ops pass the atoms on: activations, dropout, BatchNorm and
  InstanceNorm (whose entries follow their channel), depthwise convolutions
  (``groups == in_channels``: the weights of a channel follow it), pooling,
  interpolation, reductions and softmax over other dims, simple indexing,
  arithmetic with a scalar;
- a residual ``add`` (``sub``, ``mul``) of two channel tensors *couples*
  their atoms pairwise (a union-find); ``torch.cat`` along the channel axis
  concatenates layouts; a flatten (``flatten``, ``nn.Flatten``,
  ``x.view(x.size(0), -1)``) repeats each atom over the features it becomes,
  so a Conv channel maps to its block of columns of the next Linear;
- some ops *block* the channels they read, which then stay whole: the
  model's outputs, norms whose statistics span the channels (LayerNorm,
  GroupNorm, RMSNorm), softmax or a reduction over the channel axis, a view
  or reshape that spells sizes out, reading the channel count
  (``x.shape[1]``), grouped convolutions, arithmetic with a tensor that has
  its own entries per channel, a layer whose parameters are shared or read
  elsewhere;
- any other op that reads channels is *unknown*: :mod:`funcprune._shrink`
  refuses the masks that would remove channels it reads, naming the node.

Nothing here reads parameter values or masks: the result says which atoms
form a group, which groups are blocked, and which modules own which atoms.
"""

from __future__ import annotations

import copy
import itertools
import math
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, Union, final

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from ._types import Tensor

__all__ = ["Layout", "Role", "RoleKind", "ChannelGraph", "trace_channels", "as_inputs"]


@final
@dataclass(frozen=True, slots=True)
class Layout:
    """A tensor whose dim ``axis`` holds the channels ``atoms``, in order."""

    axis: int
    atoms: tuple[int, ...]


@final
@dataclass(frozen=True, slots=True)
class _Sizes:
    """``x.shape`` or ``x.size()`` of a tensor with channels, of ``ndim`` dims."""

    layout: Layout
    ndim: int


_Value = Union[Layout, _Sizes, None]
#: ``linear``, ``conv``: weight rows are output atoms, columns input atoms.
#: ``norm``, ``depthwise``: per-channel entries that follow their input atoms.
RoleKind = Literal["linear", "conv", "norm", "depthwise"]


@final
@dataclass(frozen=True, slots=True)
class Role:
    """The atoms of one module: its output channels and input channels.

    ``in_atoms`` is ``None`` when its input keeps all its channels.
    """

    kind: RoleKind
    out_atoms: tuple[int, ...]
    in_atoms: tuple[int, ...] | None


@final
@dataclass(frozen=True, slots=True)
class ChannelGraph:
    """The channel dependencies of a model.

    Attributes:
        roles: each module that may shrink, by qualified name.
        roots: for each atom, the atom that names its group.
        produced: for each atom a Linear or Conv makes, ``(module, row)``.
        blocked: the groups that keep their channels, with a reason.
        unknown: the groups an op reads that shrink cannot reason about,
            with that node's description.
    """

    roles: Mapping[str, Role]
    roots: tuple[int, ...]
    produced: Mapping[int, tuple[str, int]]
    blocked: Mapping[int, str]
    unknown: Mapping[int, str]


def as_inputs(fn: str, example_inputs: object) -> tuple[Tensor, ...]:
    """``example_inputs`` as a tuple of tensors, or a TypeError."""
    if isinstance(example_inputs, Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, tuple) and all(isinstance(t, Tensor) for t in example_inputs):
        return example_inputs
    raise TypeError(
        f"{fn}: example_inputs must be a tensor or a tuple of tensors (the positional "
        f"arguments of forward), got {type(example_inputs).__name__}"
    )


def trace_channels(fn: str, module: nn.Module, example_inputs: object) -> ChannelGraph:
    """Trace ``module`` (a copy, in eval mode) and follow its channels.

    Args:
        fn: the public function asking, for messages.
        module: the model (not modified).
        example_inputs: a tensor, or a tuple of tensors: the positional
            arguments of ``forward``, run once to learn every shape.

    Returns:
        The :class:`ChannelGraph`: roles by module, groups, blocked groups.

    Raises:
        TypeError: if ``module`` is not a module or the inputs are no tensors.
        ValueError: if torch.fx cannot trace the model or the inputs do not
            run through it.

    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Conv2d(3, 2, 1), nn.Flatten(), nn.Linear(8, 3))
    >>> graph = trace_channels("example", model, torch.randn(1, 3, 2, 2))
    >>> graph.roles["0"]
    Role(kind='conv', out_atoms=(0, 1), in_atoms=None)
    >>> graph.roles["2"].in_atoms  # each Conv channel becomes 4 Linear columns
    (0, 0, 0, 0, 1, 1, 1, 1)
    >>> graph.blocked[2]
    "node 'output' (output) is an output of the model, whose shape stays"
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"{fn}: module must be a torch.nn.Module, got {type(module).__name__}")
    inputs = as_inputs(fn, example_inputs)
    traced = _trace(fn, copy.deepcopy(module).eval())
    try:
        with torch.no_grad():
            ShapeProp(traced).propagate(*inputs)
    except Exception as exc:  # any failure of the user's forward on these inputs
        raise ValueError(
            f"{fn}: the model failed on example_inputs ({exc}); pass inputs that forward "
            "accepts, as a tensor or a tuple of positional arguments"
        ) from exc
    return _Walk(traced).run()


def _trace(fn: str, module: nn.Module) -> fx.GraphModule:
    try:
        return fx.symbolic_trace(module)
    except Exception as exc:  # torch.fx raises many types; all mean "not traceable"
        raise ValueError(
            f"{fn}: torch.fx.symbolic_trace cannot trace {type(module).__name__} ({exc}); "
            "shrink reads the dependencies between channels from the traced graph, so the "
            "forward must be traceable (no control flow on tensor values or shapes)"
        ) from exc


def _shared_modules(gm: fx.GraphModule) -> set[str]:
    """Modules whose tensors are shared with another, or read by ``get_attr`` nodes."""
    owners: dict[int, set[str]] = {}
    for name, sub in gm.named_modules(remove_duplicate=False):
        tensors = itertools.chain(sub.parameters(recurse=False), sub.buffers(recurse=False))
        for t in tensors:
            owners.setdefault(id(t), set()).add(name)
    shared = {name for names in owners.values() if len(names) > 1 for name in names}
    shared |= {str(n.target).rpartition(".")[0] for n in gm.graph.nodes if n.op == "get_attr"}
    return shared


def _describe(node: fx.Node, gm: fx.GraphModule) -> str:
    """``node 'roll' (call_function torch.roll)``: how messages name a node."""
    if node.op == "call_module":
        kind = type(gm.get_submodule(str(node.target))).__name__
        return f"node {node.name!r} (call_module {node.target}: {kind})"
    if node.op == "call_method":
        return f"node {node.name!r} (call_method .{node.target}())"
    if node.op in ("output", "placeholder"):
        return f"node {node.name!r} ({node.op})"
    return f"node {node.name!r} ({node.op} {_callable_name(node.target)})"


def _callable_name(target: object) -> str:
    """``torch.roll``, ``torch.nn.functional.gelu``, ``operator.matmul``, ``mod.fn``."""
    name = str(getattr(target, "__name__", repr(target)))
    for prefix, namespace in (("torch.nn.functional", F), ("torch", torch), ("operator", operator)):
        if getattr(namespace, name, None) is target:
            return f"{prefix}.{name}"
    module = getattr(target, "__module__", None)
    qualname = str(getattr(target, "__qualname__", name))
    return f"{module}.{qualname}" if module else qualname


def _dim(d: object, ndim: int) -> int | None:
    """``d`` as a non-negative dim of an ``ndim``-d tensor, or ``None``."""
    if isinstance(d, int) and not isinstance(d, bool) and -ndim <= d < max(ndim, 1):
        return d % max(ndim, 1)
    return None


def _arg(node: fx.Node, index: int, name: str, default: object = None) -> object:
    """Argument ``name`` of a call, given by position ``index`` or by keyword."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


_UNARY_MODULES: tuple[type[nn.Module], ...] = (
    nn.Identity, nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.LeakyReLU,
    nn.ELU, nn.SELU, nn.CELU, nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Mish,
    nn.Softplus, nn.Softsign, nn.Tanhshrink, nn.Dropout, nn.Dropout1d, nn.Dropout2d,
    nn.Dropout3d, nn.AlphaDropout,
)  # fmt: skip
_UNARY_FUNCTIONS: frozenset[object] = frozenset({
    torch.relu, F.relu, F.relu6, F.gelu, F.silu, torch.sigmoid, F.sigmoid, torch.tanh, F.tanh,
    F.leaky_relu, F.elu, F.selu, F.celu, F.hardswish, F.hardsigmoid, F.hardtanh, F.mish,
    F.softplus, F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout,
    torch.abs, torch.neg, torch.square,
})  # fmt: skip
_UNARY_METHODS = frozenset({
    "relu", "relu_", "sigmoid", "tanh", "abs", "neg", "square", "contiguous", "clone",
    "detach", "float", "double", "half", "bfloat16", "to", "type_as",
})  # fmt: skip
_BINARY = frozenset({
    operator.add, operator.sub, operator.mul, operator.iadd, operator.isub, operator.imul,
    torch.add, torch.sub, torch.mul, "add", "sub", "mul", "add_", "sub_", "mul_",
})  # fmt: skip
_DIVIDE = frozenset({operator.truediv, operator.itruediv, torch.div, "div", "div_"})
_SPANNING_MODULES: tuple[type[nn.Module], ...] = (
    nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.LocalResponseNorm,
)  # fmt: skip
_SPANNING_FUNCTIONS = frozenset({F.layer_norm, F.group_norm, F.rms_norm, F.normalize})
_POOL_MODULES: tuple[tuple[type[nn.Module], int], ...] = tuple(
    (getattr(nn, f"{kind}{k}d"), k)
    for kind in ("MaxPool", "AvgPool", "AdaptiveAvgPool", "AdaptiveMaxPool", "LPPool")
    for k in (1, 2, 3)
)
_POOL_FUNCTIONS: Mapping[object, int] = {
    getattr(F, f"{kind}{k}d"): k
    for kind in ("max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool", "lp_pool")
    for k in (1, 2, 3)
}
_REDUCTIONS = frozenset({torch.mean, torch.sum, torch.amax, torch.amin,
                         "mean", "sum", "amax", "amin"})  # fmt: skip
_SOFTMAX = frozenset({F.softmax, F.log_softmax, torch.softmax, torch.log_softmax,
                      "softmax", "log_softmax"})  # fmt: skip
_FLATTEN = frozenset({torch.flatten, "flatten"})
_RESHAPE = frozenset({torch.reshape, "view", "reshape"})
_CAT = frozenset({torch.cat, torch.concat, torch.concatenate})
_HARMLESS_ATTRIBUTES = frozenset({"dtype", "device", "ndim", "is_cuda", "requires_grad"})


class _Walk:
    """One pass over a traced graph, node by node, building a :class:`ChannelGraph`."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.shared = _shared_modules(gm)
        self.parent: list[int] = []
        self.produced: dict[int, tuple[str, int]] = {}
        self.blocked: dict[int, str] = {}
        self.unknown: dict[int, str] = {}
        self.values: dict[fx.Node, _Value] = {}
        self.kinds: dict[str, tuple[RoleKind, int]] = {}
        self.out_atoms: dict[str, tuple[int, ...]] = {}
        self.in_atoms: dict[str, tuple[int, ...] | None] = {}

    # --- atoms: a union-find over channels -----------------------------------

    def new_atoms(self, count: int) -> tuple[int, ...]:
        start = len(self.parent)
        self.parent.extend(range(start, start + count))
        return tuple(range(start, start + count))

    def find(self, atom: int) -> int:
        while self.parent[atom] != atom:
            self.parent[atom] = self.parent[self.parent[atom]]
            atom = self.parent[atom]
        return atom

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def block(self, atoms: Iterable[int], reason: str) -> None:
        for atom in atoms:
            self.blocked.setdefault(atom, reason)

    def block_node(self, node: fx.Node, why: str) -> _Value:
        """Block every channel ``node`` reads; return ``None``: its result carries none."""
        reason = f"{_describe(node, self.gm)} {why}"
        for value in self.inputs(node):
            self.block(value.atoms if isinstance(value, Layout) else value.layout.atoms, reason)
        return None

    def unknown_op(self, node: fx.Node) -> _Value:
        """Mark the channels ``node`` reads as read by an op shrink cannot reason about.

        Returns ``None``: the node's result carries no channels.
        """
        description = _describe(node, self.gm)
        for value in self.inputs(node):
            for atom in value.atoms if isinstance(value, Layout) else ():
                self.unknown.setdefault(atom, description)
        return None

    # --- values ----------------------------------------------------------------

    def value(self, arg: object) -> _Value:
        return self.values.get(arg) if isinstance(arg, fx.Node) else None

    def layout(self, arg: object) -> Layout | None:
        value = self.value(arg)
        return value if isinstance(value, Layout) else None

    def inputs(self, node: fx.Node) -> list[Layout | _Sizes]:
        """The values with channels among ``node``'s inputs."""
        return [v for n in node.all_input_nodes if (v := self.values.get(n)) is not None]

    def shape(self, arg: object) -> tuple[int, ...] | None:
        """The shape of a tensor node (``None`` for constants and non-tensors)."""
        meta = arg.meta.get("tensor_meta") if isinstance(arg, fx.Node) else None
        return tuple(meta.shape) if isinstance(meta, TensorMetadata) else None

    def first(self, node: fx.Node) -> tuple[Layout, tuple[int, ...]] | None:
        """The layout and shape of the first argument, if it alone has channels."""
        head = node.args[0] if node.args else None
        x, shape = self.layout(head), self.shape(head)
        others = [n for n in node.all_input_nodes if n is not head]
        if x is None or shape is None or any(isinstance(self.values[n], Layout) for n in others):
            return None
        return x, shape

    # --- the walk --------------------------------------------------------------

    def run(self) -> ChannelGraph:
        for node in self.gm.graph.nodes:
            self.values[node] = self.visit(node)
        roots = tuple(self.find(a) for a in range(len(self.parent)))
        roles = {name: self.role(name) for name in self.kinds}
        return ChannelGraph(
            roles={name: role for name, role in roles.items() if role is not None},
            roots=roots,
            produced=self.produced,
            blocked={roots[a]: why for a, why in sorted(self.blocked.items(), reverse=True)},
            unknown={roots[a]: what for a, what in sorted(self.unknown.items(), reverse=True)},
        )

    def visit(self, node: fx.Node) -> _Value:
        if node.op in ("placeholder", "get_attr"):
            return None
        if node.op == "output":
            return self.block_node(node, "is an output of the model, whose shape stays")
        if node.op == "call_module":
            return self.call_module(node, self.gm.get_submodule(str(node.target)))
        if not self.inputs(node):
            return None
        if node.target is not operator.getitem:
            for value in self.inputs(node):
                if isinstance(value, _Sizes):
                    self.block(value.layout.atoms, f"{_describe(node, self.gm)} reads a shape")
        handler = _HANDLERS.get(node.target)
        if handler is None and node.target in _POOL_FUNCTIONS:
            return self.spatial(node, _POOL_FUNCTIONS[node.target])
        return self.unknown_op(node) if handler is None else handler(self, node)

    def role(self, name: str) -> Role | None:
        kind, expand = self.kinds[name]
        in_atoms = self.in_atoms.get(name)
        if kind in ("linear", "conv"):
            return Role(kind, self.out_atoms[name], in_atoms)
        if in_atoms is None:
            return None
        return Role(kind, tuple(a for a in in_atoms for _ in range(expand)), in_atoms)

    # --- modules with parameters -------------------------------------------------

    def call_module(self, node: fx.Node, mod: nn.Module) -> _Value:
        name, shape = str(node.target), self.shape(node.args[0] if node.args else None)
        if isinstance(mod, nn.Linear):
            return self.weighted(node, name, "linear", 0)
        if isinstance(mod, nn.modules.conv._ConvNd) and not mod.transposed:
            return self.conv(node, name, mod)
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            return self.follow(node, name, ("norm", 1), len(shape or (0, 0)) - 2)
        if isinstance(mod, nn.modules.instancenorm._InstanceNorm):
            return self.follow(node, name, ("norm", 1), _spatial_dims(mod))
        if not self.inputs(node):
            return None
        return self.stateless_module(node, mod)

    def weighted(self, node: fx.Node, name: str, kind: RoleKind, spatial: int) -> _Value:
        """A Linear (``spatial=0``) or a Conv with ``groups=1``: reads columns, makes rows."""
        out_shape = self.shape(node)
        if name in self.shared or out_shape is None:
            return self.block_node(node, "has parameters that are shared or read elsewhere")
        self.kinds[name] = (kind, 1)
        self.merge_in(name, self.read_channels(node, spatial))
        axis = len(out_shape) - 1 - spatial
        if name not in self.out_atoms:
            atoms = self.new_atoms(out_shape[axis])
            self.produced.update((a, (name, row)) for row, a in enumerate(atoms))
            self.out_atoms[name] = atoms
        return Layout(axis, self.out_atoms[name])

    def conv(self, node: fx.Node, name: str, mod: nn.modules.conv._ConvNd) -> _Value:
        spatial = len(mod.kernel_size)
        if mod.groups == 1:
            return self.weighted(node, name, "conv", spatial)
        if mod.groups == mod.in_channels:
            expand = mod.out_channels // mod.in_channels
            return self.follow(node, name, ("depthwise", expand), spatial)
        return self.block_node(node, f"is a grouped convolution (groups={mod.groups})")

    def follow(
        self, node: fx.Node, name: str, kind: tuple[RoleKind, int], spatial: int
    ) -> _Value:
        """A per-channel layer (norm, depthwise conv) whose entries follow their channel."""
        if name in self.shared:
            self.merge_in(name, None)
            return self.block_node(node, "has parameters that are shared or read elsewhere")
        self.kinds[name] = kind
        atoms = self.read_channels(node, spatial)
        self.merge_in(name, atoms)
        x = self.layout(node.args[0])
        if atoms is None or x is None or self.in_atoms[name] is None:
            return None
        return Layout(x.axis, tuple(a for a in atoms for _ in range(kind[1])))

    def read_channels(self, node: fx.Node, spatial: int) -> tuple[int, ...] | None:
        """The atoms of a layer's input channels (dim ``-1 - spatial``), or ``None``."""
        x = self.first(node)
        if x is not None and x[0].axis == len(x[1]) - 1 - spatial:
            return x[0].atoms
        self.block_node(node, "reads its input along another dim than the channels")
        return None

    def merge_in(self, name: str, atoms: tuple[int, ...] | None) -> None:
        """Record a call's input atoms; the calls of one module must agree channel by channel."""
        if name not in self.in_atoms:
            self.in_atoms[name] = atoms
            return
        old = self.in_atoms[name]
        if old is not None and atoms is not None and len(old) == len(atoms):
            for a, b in zip(old, atoms):
                self.union(a, b)
            return
        reason = f"{name!r} is called on inputs whose channels do not match"
        self.block(old or (), reason)
        self.block(atoms or (), reason)
        self.in_atoms[name] = None

    def stateless_module(self, node: fx.Node, mod: nn.Module) -> _Value:
        if isinstance(mod, _SPANNING_MODULES):
            return self.block_node(node, "computes statistics across the channels")
        if isinstance(mod, _UNARY_MODULES):
            return self.unary(node)
        if isinstance(mod, nn.Flatten):
            return self.flatten(node, mod.start_dim, mod.end_dim)
        if isinstance(mod, (nn.Softmax, nn.LogSoftmax)):
            return self.softmax(node, mod.dim)
        if isinstance(mod, nn.Upsample):
            return self.spatial(node, None)
        for kind, k in _POOL_MODULES:
            if isinstance(mod, kind) and not getattr(mod, "return_indices", False):
                return self.spatial(node, k)
        return self.unknown_op(node)

    # --- channel-wise ops ----------------------------------------------------------

    def unary(self, node: fx.Node) -> _Value:
        x = self.first(node)
        if x is None or self.shape(node) != x[1]:
            return self.unknown_op(node)
        return x[0]

    def spatial(self, node: fx.Node, k: int | None) -> _Value:
        """Pooling or interpolation over the last ``k`` dims (``None``: all but two)."""
        x, out = self.first(node), self.shape(node)
        if x is None or out is None or len(out) != len(x[1]):
            return self.unknown_op(node)
        (lay, shape), pooled = x, len(x[1]) - 2 if k is None else k
        if lay.axis >= len(shape) - pooled or out[lay.axis] != shape[lay.axis]:
            return self.block_node(node, "pools across the channels")
        return lay

    def reduction(self, node: fx.Node) -> _Value:
        x, dim = self.first(node), _arg(node, 1, "dim")
        if x is None or self.shape(node) is None:
            return self.unknown_op(node)
        lay, shape = x
        dims = [_dim(d, len(shape)) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))]
        if None in dims or lay.axis in dims:
            return self.block_node(node, "reduces over the channels")
        keepdim = _arg(node, 2, "keepdim", False)
        dropped = 0 if keepdim else sum(1 for d in dims if d is not None and d < lay.axis)
        return Layout(lay.axis - dropped, lay.atoms)

    def softmax(self, node: fx.Node, dim: object = None) -> _Value:
        x = self.first(node)
        if x is None or self.shape(node) != x[1]:
            return self.unknown_op(node)
        if node.op != "call_module":
            dim = _arg(node, 1, "dim")
        if _dim(dim, len(x[1])) in (None, x[0].axis):
            return self.block_node(node, "normalizes across the channels")
        return x[0]

    def spanning(self, node: fx.Node) -> _Value:
        return self.block_node(node, "computes statistics across the channels")

    # --- arithmetic ------------------------------------------------------------------

    def binary(self, node: fx.Node) -> _Value:
        a, b, out = _arg(node, 0, "input"), _arg(node, 1, "other"), self.shape(node)
        la, lb = self.layout(a), self.layout(b)
        if out is None or self.reads_more(node, (a, b)):
            return self.unknown_op(node)
        if la is not None and lb is not None:
            return self.couple(node, (la, self.shape(a)), (lb, self.shape(b)), out)
        if la is not None:
            return self.broadcast(node, la, self.shape(a), b, out)
        if lb is not None and node.target not in _DIVIDE:  # not a division by channels
            return self.broadcast(node, lb, self.shape(b), a, out)
        return self.unknown_op(node)

    def reads_more(self, node: fx.Node, operands: Iterable[object]) -> bool:
        """Whether ``node`` reads channels from other tensors than ``operands``."""
        known = [n for n in operands if isinstance(n, fx.Node)]
        return any(
            isinstance(self.values[n], Layout) and all(n is not k for k in known)
            for n in node.all_input_nodes
        )

    def couple(
        self,
        node: fx.Node,
        left: tuple[Layout, tuple[int, ...] | None],
        right: tuple[Layout, tuple[int, ...] | None],
        out: tuple[int, ...],
    ) -> _Value:
        """Two channel tensors combined entry by entry: their channels pair up."""
        axis = _out_axis(*left, out)
        if axis is None or axis != _out_axis(*right, out):
            return self.block_node(node, "combines tensors whose channels do not line up")
        for a, b in zip(left[0].atoms, right[0].atoms):
            self.union(a, b)
        return Layout(axis, left[0].atoms)

    def broadcast(
        self, node: fx.Node, x: Layout, shape: tuple[int, ...] | None, other: object,
        out: tuple[int, ...],
    ) -> _Value:  # fmt: skip
        """A channel tensor combined with a scalar, or with a tensor without channels."""
        axis = _out_axis(x, shape, out)
        if axis is None:
            return self.unknown_op(node)
        theirs = self.shape(other)
        offset = len(out) - len(theirs) if theirs is not None else 0
        if theirs is not None and axis >= offset and theirs[axis - offset] != 1:
            return self.block_node(node, "combines the channels with a tensor of its own")
        return Layout(axis, x.atoms)

    # --- shapes and indexing -----------------------------------------------------------

    def getitem(self, node: fx.Node) -> _Value:
        container, index = node.args[0], node.args[1]
        value = self.value(container)
        if isinstance(value, _Sizes):
            return self.shape_item(node, value, index)
        x = self.first(node)
        return self.unknown_op(node) if x is None else self.index(node, x[0], index)

    def shape_item(self, node: fx.Node, sizes: _Sizes, index: object) -> _Value:
        """``x.shape[i]``: harmless unless it reads the channel count."""
        if isinstance(index, int) and _dim(index, sizes.ndim) != sizes.layout.axis:
            return None
        if isinstance(index, slice) and sizes.layout.axis not in range(sizes.ndim)[index]:
            return None
        self.block(sizes.layout.atoms, f"{_describe(node, self.gm)} reads the channel count")
        return None

    def index(self, node: fx.Node, x: Layout, index: object) -> _Value:
        """``x[...]`` with constant ints and slices that leave the channel axis whole."""
        items = index if isinstance(index, tuple) else (index,)
        if not all(_is_constant_index(i) for i in items):
            return self.unknown_op(node)
        if x.axis < len(items) and items[x.axis] != slice(None):
            return self.block_node(node, "selects some of the channels")
        dropped = sum(1 for i in items[: x.axis] if isinstance(i, int))
        return Layout(x.axis - dropped, x.atoms)

    def attribute(self, node: fx.Node) -> _Value:
        x, attr = self.first(node), node.args[1]
        if x is not None and attr == "shape":
            return _Sizes(x[0], len(x[1]))
        return None if attr in _HARMLESS_ATTRIBUTES else self.unknown_op(node)

    def size(self, node: fx.Node) -> _Value:
        x, dim = self.first(node), _arg(node, 1, "dim")
        if x is None:
            return self.unknown_op(node)
        if dim is None:
            return _Sizes(x[0], len(x[1]))
        if _dim(dim, len(x[1])) != x[0].axis:
            return None
        self.block(x[0].atoms, f"{_describe(node, self.gm)} reads the channel count")
        return None

    # --- flatten, reshape, cat ------------------------------------------------------------

    def flatten(self, node: fx.Node, start: object = None, end: object = None) -> _Value:
        x = self.first(node)
        if x is None:
            return self.unknown_op(node)
        (lay, shape), ndim = x, len(x[1])
        if start is None:
            start, end = _arg(node, 1, "start_dim", 0), _arg(node, 2, "end_dim", -1)
        first, last = _dim(start, ndim), _dim(end, ndim)
        if first is None or last is None:
            return self.unknown_op(node)
        if lay.axis < first:
            return lay
        if lay.axis > last:
            return Layout(lay.axis - (last - first), lay.atoms)
        outer = math.prod(shape[first : lay.axis])
        inner = math.prod(shape[lay.axis + 1 : last + 1])
        atoms = tuple(a for _ in range(outer) for a in lay.atoms for _ in range(inner))
        return Layout(first, atoms)

    def reshape(self, node: fx.Node) -> _Value:
        """``view``/``reshape`` to ``(d0, ..., dk, -1)``: a flatten from ``dk + 1`` on.

        Any other view spells out sizes that shrinking would break: it blocks.
        """
        x, out = self.first(node), self.shape(node)
        sizes: object = node.args[1:]
        if len(node.args) == 2 and isinstance(node.args[1], (tuple, list)):
            sizes = tuple(node.args[1])
        if x is None or out is None or not isinstance(sizes, tuple) or not sizes:
            return self.unknown_op(node)
        (lay, shape), start = x, len(sizes) - 1
        merged = shape[:start] + (math.prod(shape[start:]),)
        if sizes[-1] == -1 and start <= lay.axis and out == merged:
            return self.flatten(node, start, -1)
        return self.block_node(node, "reshapes the channels to sizes it spells out")

    def cat(self, node: fx.Node) -> _Value:
        parts, out = _arg(node, 0, "tensors"), self.shape(node)
        if not isinstance(parts, (tuple, list)) or out is None or self.reads_more(node, parts):
            return self.unknown_op(node)
        dim, layouts = _dim(_arg(node, 1, "dim", 0), len(out)), [self.layout(p) for p in parts]
        if dim is None:
            return self.unknown_op(node)
        if any(lay is not None and lay.axis != dim for lay in layouts):
            return self.cat_across(node, layouts)
        atoms: list[int] = []
        for part, lay in zip(parts, layouts):
            atoms += lay.atoms if lay is not None else self.foreign_atoms(node, part, dim)
        return Layout(dim, tuple(atoms))

    def cat_across(self, node: fx.Node, layouts: list[Layout | None]) -> _Value:
        """``cat`` along another dim than the channels: the parts' channels pair up."""
        tracked = [lay for lay in layouts if lay is not None]
        first = tracked[0]
        if len(tracked) < len(layouts) or any(lay.axis != first.axis for lay in tracked):
            return self.block_node(node, "concatenates tensors whose channels do not line up")
        for lay in tracked[1:]:
            for a, b in zip(first.atoms, lay.atoms):
                self.union(a, b)
        return first

    def foreign_atoms(self, node: fx.Node, part: object, dim: int) -> tuple[int, ...]:
        """Blocked atoms for a concatenated part that carries no channels of ours."""
        shape = self.shape(part)
        atoms = self.new_atoms(shape[dim] if shape is not None else 0)
        self.block(atoms, f"{_describe(node, self.gm)} concatenates channels from elsewhere")
        return atoms


def _is_constant_index(item: object) -> bool:
    if isinstance(item, slice):
        return not any(isinstance(p, fx.Node) for p in (item.start, item.stop, item.step))
    return isinstance(item, int) and not isinstance(item, bool)


def _out_axis(x: Layout, shape: tuple[int, ...] | None, out: tuple[int, ...]) -> int | None:
    """The channel axis of ``x`` in a broadcast result of shape ``out``."""
    if shape is None:
        return None
    axis = x.axis + len(out) - len(shape)
    return axis if out[axis] == len(x.atoms) else None


def _spatial_dims(mod: nn.Module) -> int:
    """How many dims follow the channels in an InstanceNorm's input."""
    kinds = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
    return next((k for k, kind in enumerate(kinds, start=1) if isinstance(mod, kind)), 1)


_Handler = Callable[[_Walk, fx.Node], _Value]
#: call_function targets and call_method names, and how each moves channels.
_HANDLERS: Mapping[object, _Handler] = {
    **{t: _Walk.unary for t in _UNARY_FUNCTIONS | _UNARY_METHODS},
    **{t: _Walk.binary for t in _BINARY | _DIVIDE},
    **{t: _Walk.reduction for t in _REDUCTIONS},
    **{t: _Walk.softmax for t in _SOFTMAX},
    **{t: _Walk.spanning for t in _SPANNING_FUNCTIONS},
    **{t: _Walk.flatten for t in _FLATTEN},
    **{t: _Walk.reshape for t in _RESHAPE},
    **{t: _Walk.cat for t in _CAT},
    operator.getitem: _Walk.getitem,
    getattr: _Walk.attribute,
    "size": _Walk.size,
    F.interpolate: lambda walk, node: walk.spatial(node, None),
}
