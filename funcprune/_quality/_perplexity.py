"""Held-out perplexity of a causal language model: dense, masked, shrunk or reloaded.

:func:`perplexity` runs the model on each batch (as it is, or on masked
parameters through :func:`~funcprune.functional_call_masked`), scores every
counted next-token prediction in ``float64`` and sums them over all the
batches before dividing once: a token-weighted mean, never a mean of
per-batch means.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, final

import torch
import torch.nn.functional as F

from .._apply import functional_call_masked
from .._criteria import Call, calls
from .._types import Params, Tensor

__all__ = ["Perplexity", "perplexity"]

#: The label transformers' losses ignore.
IGNORE_INDEX = -100


@final
@dataclass(frozen=True, slots=True)
class Perplexity:
    """What :func:`perplexity` measured.

    Attributes:
        nll: the mean negative log-likelihood per counted token, in nats.
        tokens: how many next-token predictions were counted.
    """

    nll: float
    tokens: int

    @property
    def perplexity(self) -> float:
        """``exp(nll)``."""
        return math.exp(self.nll)


def perplexity(
    model: torch.nn.Module,
    batches: Iterable[object],
    *,
    params: Params | None = None,
    masks: Mapping[str, Tensor] | None = None,
) -> Perplexity:
    """The token-weighted next-token perplexity of a causal language model on ``batches``.

    Each position ``t`` of a sequence predicts the token at ``t + 1`` from
    the logits at ``t`` (the shift of transformers' causal-LM loss). A
    prediction is counted when both tokens are real: ``attention_mask`` is 1
    at ``t`` and at ``t + 1`` (every token is real without a mask), and, when
    the batch has ``labels``, the label at ``t + 1`` is not ``-100``. On
    unpadded and right-padded batches this counts exactly what transformers'
    ``labels=`` loss counts (with ``-100`` at padding); on left-padded ones
    it also leaves out the first real token, predicted from padding. A
    batch with ``shift_labels`` (transformers' name for labels already
    shifted: the target of position ``t`` at ``t``) predicts them from every
    real position, the last one included: ``{"input_ids": s[:, :-1],
    "shift_labels": s[:, 1:]}`` scores every token of the sequences ``s``
    after the first. The
    negative log-likelihoods of every counted prediction of every batch are
    summed in ``float64`` and divided by their count once.

    The model runs as it is, or on ``params`` masked by ``masks`` through
    :func:`~funcprune.functional_call_masked` when either is given (a
    parameter left out of ``params`` is the module's own), under
    :func:`torch.no_grad`. A shrunk or reloaded model is just a model.

    Args:
        model: a causal language model in eval mode whose output is its
            logits ``(batch, tokens, vocabulary)`` or has them as ``.logits``.
        batches: an iterable of batches in the forms
            :func:`~funcprune.oneshot` takes: a ``(batch, tokens)`` tensor of
            token ids (``model(ids)``), a tuple or list of positional
            arguments, the ids first (``model(*batch)``), or a dict of
            keyword arguments with ``input_ids`` (``model(**batch)``), and
            optionally a 0/1 ``attention_mask`` and either ``labels`` (the
            targets, unshifted, ``-100`` where ignored) or ``shift_labels``
            (shifted); neither is passed to the model.
        params: parameters to run the model on, by name (its own by default).
        masks: masks by name, as :func:`~funcprune.apply_masks` takes them.

    Returns:
        A :class:`Perplexity`: ``.nll`` (mean per token), ``.tokens`` and
        ``.perplexity``.

    Raises:
        TypeError: a batch, its ids, labels (of another shape) or the model's output of another kind.
        ValueError: a model in training mode, an encoder-decoder batch, both
            labels and shift_labels, logits or an attention mask of another
            shape, or no token counted.

    >>> import torch, funcprune as fp
    >>> class Uniform(torch.nn.Module):
    ...     def forward(self, ids: torch.Tensor) -> torch.Tensor:
    ...         return torch.zeros(*ids.shape, 16)
    >>> result = fp.perplexity(Uniform().eval(), [torch.zeros(2, 5, dtype=torch.long)])
    >>> result.tokens, round(result.perplexity, 6)
    (8, 16.0)
    """
    fn = "perplexity"
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{fn}: model must be a torch.nn.Module, got {type(model).__name__}")
    if model.training:
        raise ValueError(
            f"{fn}: model is in training mode (dropout would make the value random); call model.eval() first"
        )
    masked = params is not None or masks is not None
    total, count = 0.0, 0
    with torch.no_grad():
        for i, call in enumerate(calls(fn, batches)):
            ids, targets, call = _targets(fn, i, call)
            if masked:
                out = functional_call_masked(model, params or {}, masks or {}, call.args, call.kwargs)
            else:
                out = model(*call.args, **call.kwargs)
            logits = _logits(fn, i, out, ids)[:, : targets.shape[1]]
            counted = _counted(call.tokens, targets)
            predicted = logits[counted].to(torch.float64)
            total += float(F.cross_entropy(predicted, targets[counted], reduction="sum"))
            count += int(counted.sum())
    if count == 0:
        raise ValueError(
            f"{fn}: no token was counted (batches gave no sequence of 2 real tokens or more); "
            "pass sequences of at least 2 tokens"
        )
    return Perplexity(total / count, count)


def _targets(fn: str, i: int, call: Call) -> tuple[Tensor, Tensor, Call]:
    """The batch's ids, each position's target (``-100``: none) and the call to make (without the labels).

    The targets are ``labels[:, 1:]`` (the ids by default), one fewer than
    the positions, or ``shift_labels``, one per position.
    """
    kwargs = dict(call.kwargs)
    if any(k.startswith("decoder_") for k in kwargs):
        raise ValueError(
            f"{fn}: batch {i} is an encoder-decoder batch ({sorted(kwargs)}); only causal language models "
            "(next-token prediction over input_ids) are measured"
        )
    labels, shifted = kwargs.pop("labels", None), kwargs.pop("shift_labels", None)
    ids = call.args[0] if call.args else kwargs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point() or ids.is_complex():
        raise TypeError(
            f"{fn}: batch {i}'s token ids (a tensor batch, the first of a tuple, or input_ids) must be a "
            f"(batch, tokens) tensor of integers, got {_kind(ids)}"
        )
    if labels is not None and shifted is not None:
        raise ValueError(f"{fn}: batch {i} has both labels and shift_labels; give one (shift_labels: already shifted)")
    for name, given in (("labels", labels), ("shift_labels", shifted)):
        if given is not None and (
            not isinstance(given, torch.Tensor) or given.shape != ids.shape or given.is_floating_point()
        ):
            raise TypeError(
                f"{fn}: batch {i}'s {name} must be integers of the ids' shape {tuple(ids.shape)}, got {_kind(given)}"
            )
    if call.tokens is not None and call.tokens.shape != ids.shape:
        raise ValueError(
            f"{fn}: batch {i}'s attention_mask has shape {tuple(call.tokens.shape)}, its ids {tuple(ids.shape)}"
        )
    targets = shifted if isinstance(shifted, torch.Tensor) else (ids if labels is None else labels)[:, 1:]
    return ids, targets, Call(call.args, kwargs, call.tokens)


def _kind(given: object) -> str:
    return f"a {tuple(given.shape)} {given.dtype} tensor" if isinstance(given, torch.Tensor) else type(given).__name__


def _logits(fn: str, i: int, out: Any, ids: Tensor) -> Tensor:
    """The model's logits from its output, checked against the ids' shape."""
    logits = out if isinstance(out, torch.Tensor) else getattr(out, "logits", None)
    if not isinstance(logits, torch.Tensor):
        raise TypeError(
            f"{fn}: the model's output on batch {i} must be its logits or have them as .logits, "
            f"got {type(out).__name__}"
        )
    if logits.dim() != 3 or logits.shape[:2] != ids.shape:
        raise ValueError(
            f"{fn}: the model's logits on batch {i} must be (batch, tokens, vocabulary) with (batch, tokens) = "
            f"{tuple(ids.shape)}, got {tuple(logits.shape)}"
        )
    return logits


def _counted(tokens: Tensor | None, targets: Tensor) -> Tensor:
    """Which predictions count: a target that is not ``-100``, real, predicted from a real token.

    ``targets`` has one column per predicting position (``shift_labels``:
    each position's, whose own realness the mask cannot tell for the last
    one) or one fewer (the next token's, real where the mask says so).
    """
    counted = targets != IGNORE_INDEX
    if tokens is not None:
        width = targets.shape[1]
        counted = counted & tokens[:, :width]
        if width < tokens.shape[1]:
            counted = counted & tokens[:, 1 : width + 1]
    return counted
