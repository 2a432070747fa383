"""A model's repeated blocks, and what reaches the first of them.

:func:`find_blocks` finds the blocks a one-shot runner walks (the decoder
layers of a transformers model, or any run of modules of one class in a
``ModuleList``). a :class:`Capture` runs the model once per calibration batch
and records each block's arguments: the first block's hidden states, and,
for every block, the rest of its positional and keyword arguments (an
attention mask, position ids or rotary embeddings), which transformers
computes once before its layers and may differ per block (sliding-window
layers get their own mask).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, final

import torch
from torch import nn

from .._criteria import Call
from .._types import Tensor

__all__ = ["Blocks", "Capture", "Captured", "find_blocks", "hidden_of"]


@final
@dataclass(frozen=True, slots=True)
class Blocks:
    """The repeated blocks of a model: the ``ModuleList``'s path and its modules."""

    path: str
    modules: tuple[nn.Module, ...]

    def prefix(self, i: int) -> str:
        """The name prefix of block ``i``'s parameters: ``"model.layers.3."``."""
        return f"{self.path}.{i}." if self.path else f"{i}."


def find_blocks(fn: str, model: nn.Module) -> Blocks:
    """The ``ModuleList`` of modules of one class holding the most parameters (the first such, on ties)."""
    best: tuple[int, str, nn.ModuleList] | None = None
    for path, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or not len(module):
            continue
        kinds = {type(child) for child in module}
        if len(kinds) != 1:
            continue
        size = sum(p.numel() for p in module.parameters())
        if size and (best is None or size > best[0]):
            best = (size, path, module)
    if best is None:
        raise ValueError(
            f"{fn}: found no repeated blocks in the model ({type(model).__name__}): the runner walks a "
            "torch.nn.ModuleList of layers of one class holding parameters (a transformers model's "
            "decoder or encoder layers)"
        )
    return Blocks(best[1], tuple(best[2]))


@final
@dataclass(slots=True)
class Captured:
    """What reached the blocks on each calibration batch.

    ``hidden[b]``: block 0's hidden states on batch ``b`` (then, as the
    runner advances, the current block's); ``rest[i][b]``: block ``i``'s
    other arguments on batch ``b``, as ``(args after the hidden states,
    kwargs without them, whether the hidden states came as a keyword)``;
    ``tokens[b]``: the batch's real tokens (its ``attention_mask``), if any.
    """

    hidden: list[Tensor] = field(default_factory=list)
    rest: list[list[tuple[tuple[Any, ...], dict[str, Any], bool]]] = field(default_factory=list)
    tokens: list[Tensor | None] = field(default_factory=list)

    def call(self, i: int, b: int, hidden: Tensor | None = None) -> Call:
        """Block ``i``'s call on batch ``b``, on ``hidden`` (default: the states held)."""
        args, kwargs, keyword = self.rest[i][b]
        h = self.hidden[b] if hidden is None else hidden
        if keyword:
            return Call(args, {**kwargs, "hidden_states": h}, self.tokens[b])
        return Call((h, *args), kwargs, self.tokens[b])


class _Stop(Exception):
    """Raised by the hooks once every block's arguments are recorded, to skip the rest of the model."""


@final
class Capture:
    """Runs ``model`` on calls, recording what reaches every block, while entered (its hooks removed on exit).

    Each call (``capture(call)``) runs the model under ``no_grad`` and stops
    it at the last block's input (``whole=False``) or after its output
    (``whole=True``: statistics hooks of the caller's then see every
    block); the layers after the blocks (a final norm, an LM head) never
    run. A model whose forward takes ``use_cache`` is called with
    ``use_cache=False`` unless the batch sets it, so that no key-value cache
    is built or passed to the blocks; a block that still receives one is
    refused.
    """

    def __init__(self, fn: str, model: nn.Module, blocks: Blocks, *, whole: bool) -> None:
        self.fn, self.model, self.blocks, self.whole = fn, model, blocks, whole
        self.captured = Captured(rest=[[] for _ in blocks.modules])
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._cache = "use_cache" in inspect.signature(model.forward).parameters

    def __enter__(self) -> Capture:
        last = len(self.blocks.modules) - 1
        for i, module in enumerate(self.blocks.modules):
            self._handles.append(module.register_forward_pre_hook(self._before(i, i == last), with_kwargs=True))
        if self.whole:
            self._handles.append(self.blocks.modules[last].register_forward_hook(_stop, with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __call__(self, call: Call) -> None:
        captured, b = self.captured, len(self.captured.tokens)
        kwargs = call.kwargs if not self._cache or "use_cache" in call.kwargs else {**call.kwargs, "use_cache": False}
        with torch.no_grad():
            try:
                self.model(*call.args, **kwargs)
            except _Stop:
                pass
        if len(captured.hidden) != b + 1 or any(len(r) != b + 1 for r in captured.rest):
            raise ValueError(
                f"{self.fn}: batch {b} did not call every block of {self.blocks.path!r} once: the runner "
                "needs a model whose blocks each run once per forward, in order"
            )
        captured.tokens.append(call.tokens)

    def _before(self, i: int, last: bool) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], None]:
        fn = self.fn

        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            keyword = not args
            hidden = kwargs.get("hidden_states") if keyword else args[0]
            if not isinstance(hidden, torch.Tensor):
                raise ValueError(
                    f"{fn}: block {i} ({self.blocks.prefix(i)[:-1]}) was called without its hidden states "
                    "(a tensor) as its first argument or as hidden_states="
                )
            rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
            for key, value in rest.items():
                if type(value).__name__.endswith("Cache") and hasattr(value, "update"):
                    raise ValueError(
                        f"{fn}: block {i} received a key-value cache ({key}={type(value).__name__}); "
                        "calibrate without one: pass use_cache=False in the batches"
                    )
            self.captured.rest[i].append((tuple(args[1:]), rest, keyword))
            if i == 0:
                self.captured.hidden.append(hidden.detach())
            if last and not self.whole:
                raise _Stop

        return hook


def _stop(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: object) -> None:
    raise _Stop


def hidden_of(fn: str, i: int, out: object) -> Tensor:
    """A block's output hidden states: the output itself, or the first item of a tuple output."""
    first = out[0] if isinstance(out, (tuple, list)) and out else out
    if not isinstance(first, torch.Tensor):
        raise ValueError(
            f"{fn}: block {i} returned {type(out).__name__}; the runner expects the hidden states, "
            "alone or first in a tuple"
        )
    return first

