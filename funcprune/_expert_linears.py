"""Stacked expert weights read as one Linear weight per expert: which dim is each slice's input, and who reads it.

A transformers MoE layer's experts module (:func:`~funcprune._experts.routers`)
stacks its experts' weights along a leading dim: expert ``e`` computes
``F.linear(x_e, W[e])`` (Mixtral, Qwen-MoE, OLMoE, DeepSeek-V3: ``W[e]``
is ``(out, in)``) or ``x_e @ W[e]`` (GPT-OSS: ``W[e]`` is ``(in, out)``) on
the tokens routed to it, when its eager implementation runs. What a slice's
input dim is, is read from what the code does, never from names:

- :class:`SliceReads` is a torch-function mode that sees each such call
  and tells which stacked tensor, which expert and which rows of input it
  got;
- :func:`expert_input_dims` runs each experts module once, eagerly, on a
  few zero tokens routed to every expert, and returns, for each stacked
  parameter, the input dim of its slices (``1`` for ``F.linear``, ``0``
  for ``x @ W[e]``) or ``None`` where no call reads its slices as a
  weight (a bias, a layout read otherwise, an experts module that fails
  to run on its own);
- :func:`eager_call` runs an experts module's eager forward on some of its
  tokens (the ``forward`` that transformers' ``use_experts_implementation``
  wraps, whatever ``config._experts_implementation`` says: ``grouped_mm``
  reads no slice one at a time).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ._experts import Router, routers
from ._types import Tensor

__all__ = ["SliceReads", "eager_call", "expert_input_dims"]

#: ``(stacked name, expert, input rows, input dim of the slice)``: what :class:`SliceReads` reports.
Seen = Callable[[str, int, Tensor, int], None]

_MATMULS = frozenset({torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__})


class SliceReads(TorchFunctionMode):
    """Within: each ``F.linear(x, W[e])`` and ``x @ W[e]`` on a slice of a watched stacked tensor is reported.

    ``stacked``: the tensors watched, by name, as bound when the experts
    run (inside :func:`torch.func.functional_call`, the tensors passed in).
    A slice is recognized by its storage, shape, strides and offset: it is
    ``W[e]`` for exactly one ``e``. ``seen(name, e, rows, dim)`` gets the
    input as ``(tokens, in)`` rows and the slice's input dim (``1``: read
    as ``(out, in)``; ``0``: as ``(in, out)``).
    """

    def __init__(self, stacked: Mapping[str, Tensor], seen: Seen) -> None:
        super().__init__()
        self.stacked = dict(stacked)
        self.seen = seen

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            x = args[0] if args else kwargs.get("input")
            w = args[1] if len(args) > 1 else kwargs.get("weight")
            self._report(x, w, 1)
        elif func in _MATMULS and len(args) == 2:
            self._report(args[0], args[1], 0)
        return func(*args, **kwargs)

    def _report(self, x: object, w: object, dim: int) -> None:
        if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)) or w.dim() != 2:
            return
        for name, stack in self.stacked.items():
            e = _expert_of(w, stack)
            if e is not None:
                self.seen(name, e, x.detach().reshape(-1, w.shape[dim]), dim)
                return


def _expert_of(w: Tensor, stack: Tensor) -> int | None:
    """``e`` where ``w`` is ``stack[e]`` (the same memory, as a view), else ``None``."""
    if stack.dim() != 3 or tuple(w.shape) != tuple(stack.shape[1:]) or w.stride() != stack.stride()[1:]:
        return None
    if w.device != stack.device or w.dtype != stack.dtype:
        return None
    if w.untyped_storage().data_ptr() != stack.untyped_storage().data_ptr():
        return None
    offset = w.storage_offset() - stack.storage_offset()
    step = stack.stride(0)
    if step <= 0 or offset % step:
        return None
    e = offset // step
    return e if 0 <= e < stack.shape[0] else None


def _eager(module: nn.Module) -> Callable[..., Any]:
    """The experts module's own forward: unwrapped from transformers' dispatch to other implementations."""
    forward: Callable[..., Any] = inspect.unwrap(type(module).forward)
    return forward


def eager_call(module: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any], rows: Tensor | None) -> None:
    """Run ``module``'s eager forward on ``args`` and ``kwargs``, keeping only ``rows`` of its token-wise tensors.

    ``rows``: a bool ``(tokens,)`` tensor, or ``None`` for every token.
    The tensors whose leading dim has one entry per token (the hidden
    states, the top-k indices and weights) are cut to the rows kept; the
    result is dropped (it serves the hooks that watch the call).
    """
    tokens = args[0].shape[0] if args and isinstance(args[0], torch.Tensor) else None

    def cut(value: Any) -> Any:
        if rows is not None and isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == tokens:
            return value[rows.to(value.device)]
        return value

    _eager(module)(module, *(cut(a) for a in args), **{k: cut(v) for k, v in kwargs.items()})


def expert_input_dims(model: nn.Module, layers: Sequence[Router] | None = None) -> dict[str, int | None]:
    """The input dim of the slices of each stacked expert parameter of ``model`` (see the module's docstring).

    Each experts module runs once, eagerly, without gradients, on ``count``
    zero tokens of the router's width, token ``t`` routed to experts ``t``,
    ``t + 1``, ... (``top_k`` of them), so that every expert runs. A
    parameter whose slices are read by ``F.linear`` as a weight gets ``1``,
    by ``x @ W[e]`` gets ``0``; one read both ways, otherwise or not at all
    gets ``None``. ``layers``: the model's :func:`routers`, where the
    caller has them.
    """
    found: dict[str, int | None] = {}
    for layer in routers(model) if layers is None else layers:
        module = model.get_submodule(layer.experts)
        own = {name.rpartition(".")[2]: name for name in layer.parameters}
        stacked = {attr: getattr(module, attr) for attr in own}
        dims: dict[str, set[int]] = {attr: set() for attr in own}

        def seen(attr: str, e: int, rows: Tensor, dim: int, dims: dict[str, set[int]] = dims) -> None:
            dims[attr].add(dim)

        hidden = model.get_parameter(layer.weight).shape[1]
        # on the meta device (a model built without its weights) the routing cannot run: zeros on the CPU stand in
        # for the stacked weights of this layer while it runs (the slices read depend on the shapes alone)
        held = {a: t for a, t in stacked.items() if t.is_meta and a in module._parameters}
        for attr, t in held.items():
            module._parameters[attr] = nn.Parameter(torch.zeros(t.shape, dtype=t.dtype), requires_grad=False)
            stacked[attr] = getattr(module, attr)
        try:
            first = next(iter(stacked.values()))
            x = torch.zeros(layer.count, hidden, dtype=first.dtype, device=first.device)
            index = (torch.arange(layer.count)[:, None] + torch.arange(layer.top_k)[None, :]) % layer.count
            weights = torch.full((layer.count, layer.top_k), 1.0 / layer.top_k, dtype=first.dtype, device=first.device)
            with torch.no_grad(), SliceReads(stacked, seen):
                _eager(module)(module, x, index.to(first.device), weights)
        except Exception:  # noqa: BLE001 (an experts module that cannot run alone: its weights are not read here)
            dims = {attr: set() for attr in own}
        finally:
            for attr, t in held.items():
                module._parameters[attr] = t
            stacked.clear()
        for attr, name in own.items():
            found[name] = next(iter(dims[attr])) if len(dims[attr]) == 1 else None
    return found
