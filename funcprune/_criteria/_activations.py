"""Calibration statistics: what reaches a model's weights when it runs on data.

:func:`input_norms` runs a module on calibration batches and returns, per
named weight, the L2 norm of each input feature over every token that
reached it: the activation statistic of Wanda (Sun et al. 2023), which
:func:`funcprune.wanda` turns into scores. Collection goes through forward
pre-hooks that are removed before returning, so the module is left as it was:
the engine is :func:`~._collect.collect`, and ``NORMS`` the statistic it sums here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from .._types import Tensor
from ._calls import calls
from ._collect import collect
from ._hooks import Statistic

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["NORMS", "input_norms"]


#: ``input_norms``'s: the L2 norm of each feature (the root of its sum of squares, taken before the result's cast).
NORMS = Statistic(
    lambda x: x.square().sum(dim=0), lambda f: (f,), linear_only=False, narrow_in_float64=False, finish=torch.sqrt
)


def input_norms(
    module: nn.Module, batches: Iterable[object], names: Iterable[str], *, across: ProcessGroup | None = None
) -> dict[str, Tensor]:
    """The L2 norm of each input feature of some weights, over calibration batches.

    Runs ``module`` on every batch, under :func:`torch.no_grad`, and for
    each weight in ``names`` collects the inputs reaching the module that
    owns it: an :class:`~torch.nn.Linear` or transformers' ``Conv1D``
    (GPT-2's layers; features: the last dim of its input; every other dim
    counts tokens) or a ``Conv1d/2d/3d`` with ``groups=1`` (features: the
    input channels; batch and spatial positions count tokens). The result
    feeds :func:`wanda`. A module called several times per batch (a shared
    layer) counts every call. Each module counts its input as it was when
    it received it, also where the forward changes that tensor in place
    between two layers (``x += fc1(x)`` before ``fc2(x)``).

    The norms of a weight come shaped to scale it as it is stored: a 1-D
    tensor of ``in`` norms for a Linear or Conv weight (``(out, in,
    *kernel)``, features along dim 1), and a column of shape ``(in, 1)``
    for a ``Conv1D`` weight (stored ``(in, out)``, features along dim 0), so
    that :func:`wanda` scales each along its input dim with no more
    argument (``norms.flatten()`` gives the plain vector).

    Sums of squares are accumulated in ``float64`` for inputs narrower than
    ``float32`` (``float16``, ``bfloat16``: their squares overflow early),
    in the input's dtype otherwise; the norms are returned as ``float64``
    if an input was ``float64``, as ``float32`` otherwise, on the inputs'
    device.

    Padding is left out: a dict batch with an ``attention_mask`` (``(batch,
    tokens)``, 1 at real tokens and 0 at padding) counts only the real
    tokens, in every module whose input has those tokens (``(batch, tokens,
    features)``, or the ``batch * tokens`` rows of a 2-D flattened input in
    that order); an input with one row per sequence (a pooler's) counts
    every row; a module whose input has other tokens is refused with an
    error naming it. Every token counts in batches of other kinds, with a
    mask of another shape (a 4-D one), and in encoder-decoder batches (with
    ``decoder_*`` keys), whose mask is the encoder's alone. An input laid
    out ``(tokens, batch, features)`` with as many tokens as sequences
    cannot be told apart from ``(batch, tokens, features)``: such a model
    needs batches without a mask.

    The module runs as it is: call ``module.eval()`` first to calibrate
    without dropout (in training mode, BatchNorm updates its running
    statistics as in any forward). The hooks are removed before returning,
    also on error: the module is left with its hooks, mode and parameters
    as they were. A tied weight goes by the name ``named_parameters()``
    gives it (the first), and only the module holding it under that name is
    observed.

    Args:
        module: the model, as an :class:`torch.nn.Module`.
        batches: an iterable of batches; each is called as
            ``module(batch)`` for a tensor, ``module(*batch)`` for a tuple or
            list, ``module(**batch)`` for a dict. A generator is fine: it is
            consumed once.
        names: weight names as ``module.named_parameters()`` gives them, such
            as ``"blocks.0.mlp.fc1.weight"``. With none, nothing runs and the
            result is empty.
        across: a ``torch.distributed`` process group (``dist.group.WORLD``
            for all): every process of it calls this with its own batches
            (data parallel, FSDP2) and each gets the norms over all of
            them, the sums of squares summed by one ``all_reduce`` (in
            ``float64``) before the root. ``None``: this process's batches
            only.

    Returns:
        A new dict ``{name: norms}``, in the order of ``names``, each with
        one entry per input feature: a 1-D tensor, or a ``(in, 1)`` column
        for a ``Conv1D`` weight.

    Raises:
        TypeError: if an argument or a batch has the wrong type, or an input
            is not floating-point.
        UnknownNameError: if a name is no parameter of ``module``.
        ValueError: if a name is not the weight of a supported module (this
            and the errors above are raised before any batch runs), if there
            are no batches, if a module receives an input without its
            features or whose tokens the batch's ``attention_mask`` does not
            match, or if a weight's module was never called.

    >>> import torch, funcprune as fp
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    >>> batches = [torch.tensor([[3.0, 0.0]]), torch.tensor([[4.0, 1.0]])]
    >>> fp.input_norms(model, batches, ["0.weight"])
    {'0.weight': tensor([5., 1.])}
    """
    fn = "input_norms"
    return collect(fn, module, calls(fn, batches), names, NORMS, across=across)
