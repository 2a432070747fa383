"""A model's repeated layers, and what reaches the first of them.

:func:`find_layers` finds the blocks a one-shot runner walks, as
:class:`RepeatedLayers` (the decoder or encoder layers of a transformers
model, or any run of modules of one class in a ``ModuleList``; each of them
is a *block* of the runner). A :class:`Capture` runs the model once per calibration batch
and records each block's arguments: the first block's hidden states, and,
for every block, the rest of its positional and keyword arguments (an
attention mask, position ids or rotary embeddings), which transformers
computes once before its layers and may differ per block (sliding-window
layers get their own mask).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, final

import torch
from torch import nn

from .._criteria import Call
from .._families import takes_use_cache
from .._types import Tensor

__all__ = ["Capture", "Captured", "RepeatedLayers", "find_layers", "hidden_of"]


@final
@dataclass(frozen=True, slots=True)
class RepeatedLayers:
    """The repeated layers of a model (its decoder or encoder layers): the ``ModuleList``'s path and its modules."""

    path: str
    modules: tuple[nn.Module, ...]

    def prefix(self, i: int) -> str:
        """The name prefix of block ``i``'s parameters: ``"model.layers.3."``."""
        return f"{self.path}.{i}." if self.path else f"{i}."


def find_layers(fn: str, model: nn.Module) -> RepeatedLayers:
    """The ``ModuleList`` holding the most parameters (the first such, on ties), refused unless of one class.

    A largest list of mixed classes (a hybrid model's attention and
    state-space layers) is refused rather than passed over for a smaller
    list that is not the model's backbone.
    """
    best: tuple[int, str, nn.ModuleList] | None = None
    for path, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or not len(module):
            continue
        size = sum(p.numel() for p in module.parameters())
        if size and (best is None or size > best[0]):
            best = (size, path, module)
    if best is not None and len({type(child) for child in best[2]}) != 1:
        kinds = sorted({type(child).__name__ for child in best[2]})
        raise ValueError(
            f"{fn}: the model's largest ModuleList, {best[1]!r}, holds layers of several classes "
            f"({', '.join(kinds)}); the runner walks repeated blocks of one class"
        )
    if best is None:
        raise ValueError(
            f"{fn}: found no repeated blocks in the model ({type(model).__name__}): the runner walks a "
            "torch.nn.ModuleList of layers of one class holding parameters (a transformers model's "
            "decoder or encoder layers)"
        )
    return RepeatedLayers(best[1], tuple(best[2]))


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
    """Runs ``model`` on calls, recording what reaches every block, while entered (undone on exit).

    Each call (``capture(call)``) runs the model under ``no_grad`` and
    stops it at the last block's input (``whole=False``) or after its
    output (``whole=True``: statistics hooks of the caller's then see every
    dense block); the layers after the blocks (a final norm, an LM head)
    never run. With ``whole=False``, blocks 1 onwards do not compute: while
    entered, each one's ``forward`` is a pass-through returning its input
    hidden states in the structure block 0 returned (their hooks still
    run, and the instance attributes are restored on exit, also on error),
    so a call costs the embeddings and block 0. Each block must take its
    hidden states from the block before it (checked): a list of parallel
    modules is refused. A model whose forward takes ``use_cache`` is called
    with ``use_cache=False`` unless the batch sets it, so that no key-value
    cache is built or passed to the blocks; a block that still receives one
    is refused.
    """

    def __init__(self, fn: str, model: nn.Module, blocks: RepeatedLayers, *, whole: bool) -> None:
        self.fn, self.model, self.blocks, self.whole = fn, model, blocks, whole
        self.captured = Captured(rest=[[] for _ in blocks.modules])
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._patched: list[tuple[nn.Module, object]] = []
        self._cache = takes_use_cache(model)
        self._template: object = None  # block 0's output on the call running
        self._last: Tensor | None = None  # the hidden states the block before returned

    def __enter__(self) -> Capture:
        count = len(self.blocks.modules)
        try:
            for i, module in enumerate(self.blocks.modules):
                self._handles.append(module.register_forward_pre_hook(self._before(i, i == count - 1), with_kwargs=True))
                self._handles.append(module.register_forward_hook(self._after(i), with_kwargs=True))
                if i and not self.whole:
                    self._patched.append((module, module.__dict__.get("forward", _ABSENT)))
                    module.forward = self._passthrough(module)
            if self.whole:
                self._handles.append(self.blocks.modules[-1].register_forward_hook(_stop, with_kwargs=True))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for module, before in self._patched:
            if before is _ABSENT:
                del module.forward
            else:
                setattr(module, "forward", before)  # noqa: B010 (an instance attribute put back as it was)
        self._patched.clear()

    def __call__(self, call: Call) -> None:
        captured, b = self.captured, len(self.captured.tokens)
        kwargs = call.kwargs if not self._cache or "use_cache" in call.kwargs else {**call.kwargs, "use_cache": False}
        self._template = self._last = None
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

    def _passthrough(self, module: nn.Module) -> Callable[..., object]:
        original = module.forward

        def forward(*args: Any, **kwargs: Any) -> object:
            template = self._template
            if not isinstance(template, (torch.Tensor, tuple, list)):  # a structure not to imitate: compute
                return original(*args, **kwargs)
            hidden = args[0] if args else kwargs["hidden_states"]
            if isinstance(template, torch.Tensor):
                return hidden
            return type(template)([hidden, *template[1:]]) if isinstance(template, list) else (hidden, *template[1:])

        return forward

    def _after(self, i: int) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any], object], None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: object) -> None:
            if i == 0:
                self._template = out
            first = out[0] if isinstance(out, (tuple, list)) and out else out
            self._last = first if isinstance(first, torch.Tensor) else None

        return hook

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
            before = self._last
            if i and (before is None or (hidden is not before and not _same(hidden, before))):
                raise ValueError(
                    f"{fn}: block {i} ({self.blocks.prefix(i)[:-1]}) does not take its hidden states from "
                    f"block {i - 1}'s output: the modules of {self.blocks.path!r} are not a chain of blocks "
                    "the runner can walk"
                )
            rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
            for key, value in rest.items():
                if type(value).__name__.endswith("Cache") and hasattr(value, "update"):
                    raise ValueError(
                        f"{fn}: block {i} received a key-value cache ({key}={type(value).__name__}); "
                        "calibrate without one: set use_cache=False (in the batches or the model's config)"
                    )
            self.captured.rest[i].append((tuple(args[1:]), rest, keyword))
            if i == 0:  # a copy: block 0, about to run, may add to its input in place (x += attn(x))
                self.captured.hidden.append(hidden.detach().clone())
            if last and not self.whole:
                raise _Stop

        return hook


#: No instance attribute ``forward`` before the capture patched one in.
_ABSENT = object()


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and bool(torch.equal(a, b))


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

