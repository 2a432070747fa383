"""An analysis kept for the next call on the same model and inputs: ``structure`` → ``structured`` → ``shrink`` traces once.

:func:`~funcprune.structure` keeps the analysis it made (an
:class:`Analyzed`, on the ``Structure``, never pickled or compared), and
:func:`~funcprune.shrink` given that structure takes it back instead of
exporting and walking the model again, but only where nothing it was made
from has changed since (:func:`remembered`): the same module object, the
same submodules (objects, classes and plain settings: a stride, an eps, a
forward set on an instance), the same parameter and buffer tensors, not
written in place since (their version counters), and the same input
tensors, unchanged; and its copies of the buffers still hold the module's
values. Anything else (a fine-tuned weight, a swapped activation, other
example inputs, even equal ones) analyzes again. The analysis' copy of the
model holds the module's own parameters (:func:`~._export.export_model`),
so keeping it costs no copy of the weights, and a parameter written
through ``.data`` (which no version counter sees) is the value the checks
of ``shrink`` then read; the buffers are the copy's own (a forward may
write them), compared by value.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, final

import torch
from torch import nn

from ._analysis import Analysis, analyze
from ._export import Inputs

__all__ = ["Analyzed", "analyzed", "remembered"]

#: The types of a module's plain settings compared by value (a stride, an eps, a flag, a name).
_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device)


@final
@dataclass(frozen=True, eq=False)
class Analyzed:
    """An analysis, what it was made from (:func:`_state`), and the tensors whose identities that names."""

    analysis: Analysis
    state: tuple[Any, ...]
    held: tuple[object, ...]  # the module, its tensors and the inputs': no id in ``state`` is reused while kept


def analyzed(fn: str, module: nn.Module, inputs: Inputs) -> Analyzed:
    """The analysis of ``module`` on ``inputs``, kept with its state."""
    state, held = _state(module, inputs)
    return Analyzed(analyze(fn, module, inputs), state, held)


def remembered(fn: str, module: nn.Module, inputs: Inputs, memo: object) -> Analysis:
    """``memo``'s analysis if it was made from ``module`` and ``inputs`` as they are now; else a new one."""
    if isinstance(memo, Analyzed) and memo.state == _state(module, inputs)[0] and _same_buffers(memo, module):
        return memo.analysis
    return analyze(fn, module, inputs)


def _same_buffers(memo: Analyzed, module: nn.Module) -> bool:
    """Whether the analysis' copies of the buffers hold the module's values (a write through ``.data`` bumps no
    version counter; the parameters are the module's own tensors, so their values are always the current ones)."""
    copies = dict(memo.analysis.model.named_buffers(remove_duplicate=False))
    for name, b in module.named_buffers(remove_duplicate=False):
        held = copies.get(name)
        if held is None or held.shape != b.shape or held.dtype != b.dtype or not torch.equal(held, b):
            return False
    return True


def _state(module: nn.Module, inputs: Inputs) -> tuple[tuple[Any, ...], tuple[object, ...]]:
    """What an analysis of ``module`` on ``inputs`` depends on, comparable with ``==``; and the objects it names."""
    held: list[object] = [module]
    parts: list[Any] = [id(module)]
    for name, m in module.named_modules(remove_duplicate=False):
        held.append(m)
        parts.append((name, id(m), type(m), tuple(_settings(m))))
    for kind, tensors in (("p", module.named_parameters(remove_duplicate=False)),
                          ("b", module.named_buffers(remove_duplicate=False))):  # fmt: skip
        for name, t in tensors:
            held.append(t)
            parts.append((kind, name, *_tensor(t)))
    for path, value in _leaves(("args",), inputs.args):
        parts.append(_input(path, value, held))
    for path, value in _leaves(("kwargs",), dict(inputs.kwargs)):
        parts.append(_input(path, value, held))
    return tuple(parts), tuple(held)


def _settings(m: nn.Module) -> Iterator[tuple[str, Any]]:
    """A module's own plain settings by value, and anything else it holds as an attribute by identity."""
    for key, value in sorted(vars(m).items()):
        if key.startswith("_") or key == "training":
            continue
        if isinstance(value, _PLAIN) or (isinstance(value, tuple) and all(isinstance(v, _PLAIN) for v in value)):
            yield key, value
        else:
            yield key, ("object", id(value))


def _tensor(t: torch.Tensor) -> tuple[Any, ...]:
    return id(t), t._version if not t.is_inference() else None, tuple(t.shape), t.dtype, t.device


def _input(path: tuple[object, ...], value: object, held: list[object]) -> tuple[Any, ...]:
    if isinstance(value, torch.Tensor):
        held.append(value)
        return (path, *_tensor(value))
    if isinstance(value, _PLAIN):
        return (path, type(value), value)
    held.append(value)
    return (path, "object", id(value))


def _leaves(path: tuple[object, ...], value: object) -> Iterator[tuple[tuple[object, ...], object]]:
    """The leaves of nested tuples, lists and dicts, each with its path."""
    if isinstance(value, (tuple, list)):
        yield (*path, type(value).__name__, len(value)), None
        for i, v in enumerate(value):
            yield from _leaves((*path, i), v)
    elif isinstance(value, dict):
        yield (*path, "dict", tuple(value)), None
        for k, v in value.items():
            yield from _leaves((*path, k), v)
    else:
        yield path, value
