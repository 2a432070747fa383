"""Values the walk computes when something reads them: a transformer's linears are never multiplied out.

The walk needs the values of index tensors, masks and positions, and the
shapes of everything else. A node whose op is pure (:func:`pure`: its
schema writes nothing and draws no random numbers) and whose value export
already stands in for (a fake tensor of fixed shape, a list of them, or
``None``) waits (a :class:`Waiting`): a handler reads the stand-in's shape
(``Walk.peek``), and whatever reads its value (an index, a mask, a rotary
table met elementwise) computes it then, with the values it needs first.
An op that is not pure runs when walked, after every value still waiting:
a value read before a tensor is written is the value before the write.

The products of a 1B Llama's linears on 32 tokens were 0.7-0.8 s of a 2-3 s
walk, and nothing read them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import fx

from .._types import Tensor

__all__ = ["Values", "Waiting", "mapped", "pure", "stand_in"]

_T = TypeVar("_T")


class Waiting:
    """A node's value not computed yet: its op, its arguments (values, or others waiting) and export's stand-in
    for it; computed once, when something reads it (:meth:`compute`)."""

    __slots__ = ("target", "args", "kwargs", "stand_in", "value", "done")

    def __init__(self, target: Any, args: Any, kwargs: Any, stand_in: Any) -> None:
        self.target, self.args, self.kwargs, self.stand_in = target, args, kwargs, stand_in
        self.value: Any = None
        self.done = False

    def compute(self) -> Any:
        """The value, computed after every value it needs that is not yet (a stack, not recursion: a residual
        stream is a chain of a thousand nodes); the arguments are let go once it is."""
        stack = [self]
        while stack:
            top = stack[-1]
            if top.done:
                stack.pop()
                continue
            needed = [a for a in _waiting((top.args, top.kwargs)) if not a.done]
            if needed:
                stack.extend(needed)
                continue
            args, kwargs = _computed((top.args, top.kwargs))
            top.value = top.target(*args, **kwargs)
            top.done, top.args, top.kwargs = True, (), {}
            stack.pop()
        return self.value


class Values(dict[fx.Node, Any]):
    """The walk's values by node: a :class:`Waiting` read (``[]`` or ``get``) is computed."""

    def __getitem__(self, node: fx.Node) -> Any:
        value = dict.__getitem__(self, node)
        return value.compute() if isinstance(value, Waiting) else value

    def get(self, node: fx.Node, default: Any = None) -> Any:
        value = dict.get(self, node, default)
        return value.compute() if isinstance(value, Waiting) else value


#: Whether a value waits until read where it can; tests compare both ways.
LATER = True


def stand_in(node: fx.Node) -> tuple[bool, Any]:
    """Whether the node's value can wait until read (:class:`Waiting`), and export's value that stands in for it.

    It can where its op is :func:`pure` and export's value is a tensor of
    fixed shape, a list or tuple of them, or ``None`` (a check, which export
    passed and whose result nothing reads).
    """
    if not LATER or not pure(node):
        return False, None
    value = node.meta.get("val", ...)
    if value is None or isinstance(value, Tensor) and _fixed(value):
        return True, value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, Tensor) and _fixed(v) for v in value):
        return True, value
    return False, None


def pure(node: fx.Node) -> bool:
    """Whether the node's op only computes its result: an op whose schema writes nothing and draws no random
    numbers (attention with no dropout), or ``getitem``."""
    target: Any = node.target
    if target is operator.getitem:
        return True
    schema = getattr(target, "_schema", None)
    if schema is None or getattr(target, "overloadpacket", None) is None or schema.is_mutable:
        return False
    if torch.Tag.nondeterministic_seeded in getattr(target, "tags", ()):
        dropout = node.kwargs.get("dropout_p", node.args[4] if len(node.args) > 4 else 0.0)
        return bool(target.overloadpacket in _DROPOUT_ARG and dropout == 0)
    return True


#: Ops that draw random numbers only for a ``dropout_p`` that is not zero (argument 4, or by name).
_DROPOUT_ARG: frozenset[object] = frozenset({torch.ops.aten.scaled_dot_product_attention})


def _fixed(t: Tensor) -> bool:
    return all(type(n) is int for n in t.shape)


def mapped(arg: object, kind: type[_T], fn: Callable[[_T], Any]) -> Any:
    """``arg`` (nested tuples, lists, dicts) with every leaf of type ``kind`` replaced by ``fn(leaf)`` (the walk's
    nodes by their values; here, a :class:`Waiting` by its value)."""
    if isinstance(arg, kind):
        return fn(arg)
    if isinstance(arg, (list, tuple)):
        return type(arg)(mapped(a, kind, fn) for a in arg)
    if isinstance(arg, dict):
        return {k: mapped(v, kind, fn) for k, v in arg.items()}
    return arg


def _waiting(arg: object) -> list[Waiting]:
    found: list[Waiting] = []
    mapped(arg, Waiting, found.append)
    return found


def _computed(arg: Any) -> Any:
    """``arg`` with every :class:`Waiting` replaced by its value (computed already)."""
    return mapped(arg, Waiting, lambda w: w.value)
