"""A model's calls on calibration batches: their arguments, and which of their tokens are real.

:func:`calls` turns batches into :class:`Call` values (``module(batch)``,
``module(*batch)`` or ``module(**batch)``), reading a dict batch's
``attention_mask`` as the real tokens to count; :func:`~._collect.collect`
makes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, final

import torch

from .._types import Tensor

__all__ = ["Call", "calls"]


@final
@dataclass(frozen=True, slots=True)
class Call:
    """One call of a module: its positional and keyword arguments, and which of its tokens are real.

    ``tokens`` is a bool ``(batch, tokens)`` tensor (``True`` = counted, as
    an ``attention_mask`` marks real tokens), or ``None`` to count every token.
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    tokens: Tensor | None = None


def calls(fn: str, batches: Iterable[object]) -> Iterator[Call]:
    """The calls of a model on ``batches``: ``module(batch)``, ``module(*batch)`` or ``module(**batch)``.

    ``batches`` is checked now; each batch when its turn comes. A dict
    batch's ``attention_mask`` (a 2-D tensor) marks its real tokens.
    """
    _check_batches(fn, batches)
    return _calls(fn, batches)


def _calls(fn: str, batches: Iterable[object]) -> Iterator[Call]:
    for i, batch in enumerate(batches):
        if isinstance(batch, torch.Tensor):
            yield Call((batch,), {})
        elif isinstance(batch, (tuple, list)):
            yield Call(tuple(batch), {})
        elif isinstance(batch, Mapping):
            kwargs = dict(batch)
            seq2seq = any(k.startswith("decoder_") for k in kwargs)  # the mask is the encoder's only
            yield Call((), kwargs, None if seq2seq else _tokens(fn, i, kwargs.get("attention_mask")))
        else:
            raise TypeError(
                f"{fn}: batch {i} must be a tensor, a tuple or list of arguments or a dict "
                f"of keyword arguments, got {type(batch).__name__}"
            )


def _tokens(fn: str, i: int, mask: object) -> Tensor | None:
    """The real tokens a batch's ``attention_mask`` marks, or ``None`` (every token counts).

    Only a ``(batch, tokens)`` tensor of 0 and 1 (or bool) marks tokens; any
    other mask (a 4-D one, a list) tells nothing per token, and every token
    counts, as the model's own handling of it decides. A 2-D mask of other
    values (an additive one, 0 and ``-inf``) is refused: which of its values
    mean padding is not for this to guess.
    """
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        return None
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(
            f"{fn}: batch {i}'s attention_mask must hold 1 at real tokens and 0 at padding (or be bool); "
            "it holds other values (an additive mask?): pass the 0/1 mask a tokenizer returns"
        )
    return mask != 0


def _check_batches(fn: str, batches: object) -> None:
    if isinstance(batches, (torch.Tensor, Mapping, str)) or not isinstance(batches, Iterable):
        raise TypeError(
            f"{fn}: batches must be an iterable of batches (a list, a DataLoader, a generator), "
            f"got {type(batches).__name__}; wrap a single batch as [batch]"
        )
