"""Which channels of a model hang together, read from its ``torch.fx`` graph.

:func:`trace_channels` traces the model, records every tensor's shape in one
run on the example inputs, hands each node to its handler (``_ops``,
``_shapes``, ``_modules``) and reads the :class:`ChannelGraph` off the walk.
How channels move, couple and get blocked: ``README.md`` in this folder.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Mapping

from torch import fx, nn

from ._modules import call_module, fixed_layers, roles, shared_modules
from ._ops import HANDLERS as _OP_HANDLERS
from ._shapes import HANDLERS as _SHAPE_HANDLERS
from .._types import Tensor
from ._values import ChannelGraph, ChannelLayout, Role, RoleKind, Sizes, Value
from ._walk import Handler, NodeFailed, Walk, record_shapes

__all__ = ["trace_channels", "as_inputs"]

#: call_function targets and call_method names, and how each moves channels.
_HANDLERS: Mapping[object, Handler] = {**_OP_HANDLERS, **_SHAPE_HANDLERS}


def as_inputs(fn: str, example_inputs: object) -> tuple[Tensor, ...]:
    """``example_inputs`` as a tuple of tensors, or a TypeError naming what is not one.

    >>> import torch
    >>> as_inputs("example", (torch.zeros(1), 2.0))
    Traceback (most recent call last):
    ...
    TypeError: example: example_inputs must be ..., but example_inputs[1] is a float
    """
    expected = (
        f"{fn}: example_inputs must be a tensor or a tuple of tensors (the positional "
        "arguments of forward)"
    )
    if isinstance(example_inputs, Tensor):
        return (example_inputs,)
    if not isinstance(example_inputs, tuple):
        raise TypeError(f"{expected}, got {type(example_inputs).__name__}")
    for i, item in enumerate(example_inputs):
        if not isinstance(item, Tensor):
            raise TypeError(f"{expected}, but example_inputs[{i}] is a {type(item).__name__}")
    return example_inputs


def trace_channels(fn: str, module: nn.Module, example_inputs: object) -> ChannelGraph:
    """Trace ``module`` (a copy, in eval mode) and follow its channels.

    Args:
        fn: the public function asking, for messages.
        module: the model (not modified).
        example_inputs: a tensor, or a tuple of tensors: the positional
            arguments of ``forward``, run once to learn every shape.

    Returns:
        The :class:`ChannelGraph`: roles by module, groups, blocked groups,
        unknown groups, layers whose channels stay whole.

    Raises:
        TypeError: if ``module`` is not a module or the inputs are no tensors.
        ValueError: if torch.fx cannot trace the model, the inputs do not
            run through it, or the analysis fails on one of its nodes.

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
    traced = _symbolic_trace(fn, copy.deepcopy(module).eval())
    try:
        record_shapes(traced, inputs)
    except NodeFailed as failed:
        cause = failed.__cause__
        first_line = next(iter(str(cause).splitlines()), "")
        raise ValueError(
            f"{fn}: the model failed on example_inputs at node {failed.node!r} "
            f"({type(cause).__name__}: {first_line}); pass inputs that forward accepts, as a "
            "tensor or a tuple of positional arguments"
        ) from cause
    return _walk(fn, traced)


def _symbolic_trace(fn: str, module: nn.Module) -> fx.GraphModule:
    try:
        return fx.symbolic_trace(module)
    except Exception as exc:  # torch.fx raises many types; all mean "not traceable"
        raise ValueError(
            f"{fn}: torch.fx.symbolic_trace cannot trace {type(module).__name__} ({exc}); "
            "shrink reads the dependencies between channels from the traced graph, so the "
            "forward must be traceable (no control flow on tensor values or shapes)"
        ) from exc


def _walk(fn: str, gm: fx.GraphModule) -> ChannelGraph:
    """Visit the nodes of ``gm`` in order, then read the groups off the union-find."""
    walk = Walk(gm, shared_modules(gm))
    for node in gm.graph.nodes:
        walk.values[node] = _guarded_visit(fn, walk, node)
    roots = tuple(walk.find(a) for a in range(len(walk.parent)))
    found = roles(walk)
    return ChannelGraph(
        roles=found,
        roots=roots,
        produced=walk.produced,
        blocked=_by_group(walk.blocked, roots),
        unknown=_by_group(walk.unknown, roots),
        fixed=fixed_layers(walk, found),
    )


def _by_group(notes: Mapping[int, str], roots: tuple[int, ...]) -> dict[int, str]:
    """``notes`` on atoms as notes on their groups: a group keeps its smallest atom's."""
    return {roots[a]: note for a, note in sorted(notes.items(), reverse=True)}


def _guarded_visit(fn: str, walk: Walk, node: fx.Node) -> Value:
    """:func:`_visit`, with any failure of a handler a ValueError naming ``node``."""
    try:
        return _visit(walk, node)
    except Exception as exc:  # a graph no handler expects: fail, never half-record it
        raise ValueError(
            f"{fn}: cannot follow the channels through {_name(walk, node)} "
            f"({type(exc).__name__}: {exc}); nothing was changed. Write that part of forward "
            "with ops funcprune follows (activations, add, cat, flatten, pooling, Linear, Conv, "
            "BatchNorm), or report the model"
        ) from exc


def _name(walk: Walk, node: fx.Node) -> str:
    """``walk.describe(node)``, or the node's name if even that fails."""
    try:
        return walk.describe(node)
    except Exception:  # describing is best effort here: the node's name always exists
        return f"node {node.name!r}"


def _visit(walk: Walk, node: fx.Node) -> Value:
    """Record what ``node`` does to the channels it reads; return what its result carries."""
    if node.op in ("placeholder", "get_attr"):
        return None
    if node.op == "output":
        return walk.block_node(node, "is an output of the model, whose shape stays")
    if node.target is not operator.getitem:
        _block_shape_reads(walk, node)
    if node.op == "call_module":
        return call_module(walk, node)
    if not walk.inputs(node):
        return None
    handler = _HANDLERS.get(node.target)
    return walk.unknown_op(node) if handler is None else handler(walk, node)


def _block_shape_reads(walk: Walk, node: fx.Node) -> None:
    """Block the channels of each ``x.shape`` (or ``x.size()``) that ``node`` reads whole."""
    for value in walk.inputs(node):
        if isinstance(value, Sizes):
            walk.block(value.layout.atoms, f"{walk.describe(node)} reads a shape")
