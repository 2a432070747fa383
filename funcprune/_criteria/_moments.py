"""The mean and variance of each input feature of some weights over calibration tokens (FLAP's statistics).

:func:`input_moments` runs a model on calibration batches through the one
collection engine (:func:`~._collect.collect`) with ``MOMENTS``: per call,
the token count and the sums of ``x`` and ``x²`` of every feature, in
``float64``. :class:`Moments` holds, per weight, the mean and the
variance of each input feature and the tokens they were taken over: what
:func:`~funcprune.fluctuation` ranks by and :func:`~funcprune.compensate`
keeps the layers' mean outputs with (An et al. 2024, "Fluctuation-based
Adaptive Structured Pruning for Large Language Models", FLAP).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, final

import torch
from torch import nn

from .._types import Tensor, is_conv1d
from ._calls import calls
from ._collect import collect
from ._hooks import Statistic

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["MOMENTS", "Moments", "input_moments"]


def _sums(x: Tensor) -> Tensor:
    """One call's ``(3, features)`` float64 sums: the token count, ``Σ x`` and ``Σ x²`` per feature."""
    x = x.to(torch.float64)
    count = torch.full_like(x[0], float(x.shape[0])) if x.shape[0] else torch.zeros_like(x[0])
    return torch.stack([count, x.sum(dim=0), x.square().sum(dim=0)])


#: ``input_moments``'s: the token count and the sums of ``x`` and ``x²`` of each feature, in float64.
MOMENTS = Statistic(_sums, lambda f: (3, f), linear_only=True, narrow_in_float64=True)


@final
@dataclass(frozen=True, slots=True)
class Moments:
    """The mean and variance of each input feature of one weight, over the calibration tokens that reached it.

    ``mean`` and ``var`` are ``float64``, one value per input feature,
    shaped as :func:`~funcprune.input_norms` shapes norms: ``(in,)`` for a
    Linear weight (stored ``(out, in)``), ``(in, 1)`` for transformers'
    ``Conv1D`` (stored ``(in, out)``), so that each broadcasts against the
    weight along its input dim. ``var`` is the sample variance (divided by
    ``tokens - 1``); ``tokens`` counts the real tokens (padding left out).
    """

    mean: Tensor
    var: Tensor
    tokens: int


def input_moments(
    model: nn.Module, batches: Iterable[object], names: Iterable[str], *, across: ProcessGroup | None = None
) -> dict[str, Moments]:
    """The mean and variance of each input feature of some weights, over calibration batches.

    Runs ``model`` on every batch, under :func:`torch.no_grad`, and for each
    weight in ``names`` (of an :class:`~torch.nn.Linear` or transformers'
    ``Conv1D``) sums, over every token reaching its module, the count and
    ``x`` and ``x²`` of each input feature, in ``float64`` whatever the
    inputs' dtype; the mean is ``Σx / n`` and the variance the sample
    variance ``(Σx² - n·mean²) / (n - 1)``, over all tokens of all batches
    (not a mean of per-batch values). Padding is left out as
    :func:`~funcprune.input_norms` leaves it out (a dict batch's 0/1
    ``attention_mask``), and the same engine collects it: the hooks are
    removed before returning, also on error, and the model is left as it
    was. Collect on the dense model (``model.eval()``): these are the inputs
    :func:`~funcprune.compensate` keeps the mean outputs of.

    FLAP (An et al. 2024) collects these per layer with a running update
    (``lib/layerwrapper.py::BiasGPT``): its mean is this mean where every
    calibration sample has as many tokens (FLAP's case); its "fluctuation"
    is an approximation of the tokens per sample times this variance (its
    first sample is left out, and its running mean is updated before the
    deviations are taken), which ranks the channels of a layer nearly, not
    exactly, alike. This is the exact sample variance of the paper's
    definition.

    Args:
        model: the model, as an :class:`torch.nn.Module`.
        batches: an iterable of batches; each is called as ``model(batch)``
            for a tensor, ``model(*batch)`` for a tuple or list,
            ``model(**batch)`` for a dict. A generator is fine: it is
            consumed once.
        names: weight names as ``model.named_parameters()`` gives them, such
            as ``"model.layers.0.mlp.down_proj.weight"`` (FLAP's layers: the
            output projections, whose input columns a width plan removes).
        across: a ``torch.distributed`` process group: every process of it
            calls this with its own batches and each gets the moments over
            all of them (the sums added by one ``all_reduce``). ``None``:
            this process's batches only.

    Returns:
        A new dict ``{name: Moments}``, in the order of ``names``.

    Raises:
        TypeError: if an argument or a batch has the wrong type, or an input
            is not floating-point.
        UnknownNameError: if a name is no parameter of ``model``.
        ValueError: if a name is not the weight of a Linear or ``Conv1D``,
            if there are no batches, if a weight's module was never called
            or received fewer than two tokens (no variance), or as for
            :func:`~funcprune.input_norms`.

    >>> import torch, funcprune as fp
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(2, 2))
    >>> m = fp.input_moments(model, [torch.tensor([[1.0, 0.0], [3.0, 2.0]]), torch.tensor([[5.0, 4.0]])], ["0.weight"])
    >>> m["0.weight"].mean, m["0.weight"].var, m["0.weight"].tokens
    (tensor([3., 2.], dtype=torch.float64), tensor([4., 4.], dtype=torch.float64), 3)
    """
    fn = "input_moments"
    sums = collect(fn, model, calls(fn, batches), names, MOMENTS, across=across)
    return {name: _moments(fn, model, name, total) for name, total in sums.items()}


def _moments(fn: str, model: nn.Module, name: str, total: Tensor) -> Moments:
    """One weight's :class:`Moments` from its ``(3, features)`` sums."""
    count = int(total[0, 0].item()) if total.shape[1] else 0
    if count < 2:
        raise ValueError(
            f"{fn}: the module holding {name!r} received {count} token(s) in all; a variance needs at least 2: "
            "pass more calibration tokens (padding does not count)"
        )
    mean = total[1] / count
    var = (total[2] - count * mean.square()).clamp_min(0.0) / (count - 1)
    owner = model.get_submodule(name.rpartition(".")[0])
    if is_conv1d(owner):  # stored (in, out): a column that broadcasts against it
        mean, var = mean[:, None], var[:, None]
    return Moments(mean.clone(), var, count)
