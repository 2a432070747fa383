"""FLAP without training: rank input channels by their fluctuation, and keep each layer's mean output.

An et al. 2024 ("Fluctuation-based Adaptive Structured Pruning for Large
Language Models", FLAP) score the input channel ``j`` of an output
projection by how much its contribution to the output varies over the
calibration tokens, ``var(x_j) · ||W[:, j]||²`` (:func:`fluctuation`), and
replace what the removed channels contributed on average by a bias,
``W[:, pruned] @ mean(x[pruned])`` (:func:`compensate`). Both are pure
functions of the parameters and the :class:`~._moments.Moments` that
:func:`~funcprune.input_moments` collects.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .._names import check_params, unknown_name
from .._types import Params, Tensor
from ._moments import Moments

__all__ = ["compensate", "fluctuation"]


def fluctuation(params: Params, moments: Mapping[str, Moments]) -> dict[str, Tensor]:
    """FLAP's fluctuation metric as scores shaped like each weight, for a structured plan's ``scores=``.

    For each weight in ``moments`` (a Linear's ``W``, stored ``(out, in)``,
    or a ``Conv1D``'s, stored ``(in, out)``: the moments' shape tells),
    input channel ``j`` has FLAP's "WIFV" ``F_j = var(x_j) · ||W[:, j]||²``.
    The scores are ``S[i, j] = |W[i, j]| · var(x_j) · ||W[:, j]||``,
    ``float64``, so that the 2-norm of column ``j`` is ``F_j`` and the
    2-norm of several columns (a head, a KV group) is ``sqrt(Σ F_j²)``:
    with ``LnStructured(amount, n=2)`` (n=2: other norms rank otherwise), a
    plan ranks MLP channels by ``F_j`` and heads by ``Σ F_j²``, as FLAP's
    code does (``lib/prune.py``: it squares the attention metric before
    summing it per head of 128 channels).

    A unit is scored by all its members: give the other members of the
    groups ranked (the gate, up, query, key and value rows) zero scores, or
    their weights count too. For the whole of a Llama's widths:
    ``scores = {n: torch.zeros_like(p) for n, p in params.items()} |
    fp.fluctuation(params, moments)`` with moments on every ``o_proj`` and
    ``down_proj`` weight (a group none of whose members has moments then
    scores zero: leave it out of ``kinds`` or collect its moments).
    FLAP's adaptive structure ranks all layers together after standardising
    each layer's metric; ``normalize=`` is this library's way to make
    groups compete (not the same numbers).

    Args:
        params: the parameters, keyed like ``named_parameters()``; those in
            ``moments`` must be 2-D.
        moments: by weight name, as :func:`~funcprune.input_moments` returns them.

    Returns:
        A new dict of ``float64`` scores, one per weight in ``moments``, each
        shaped like it (detached).

    Raises:
        TypeError: if ``params`` or ``moments`` is not a mapping, or a value
            of ``moments`` is not :class:`~funcprune.Moments`.
        UnknownNameError: if a name of ``moments`` is not in ``params``.
        ValueError: if a weight is not 2-D or its moments do not fit its input dim.

    >>> import torch, funcprune as fp
    >>> params = {"fc.weight": torch.tensor([[3.0, 1.0], [4.0, 1.0]])}
    >>> m = {"fc.weight": fp.Moments(torch.zeros(2, dtype=torch.float64), torch.tensor([1.0, 4.0]).double(), 10)}
    >>> fp.fluctuation(params, m)["fc.weight"].norm(dim=0)  # var * ||W[:, j]||^2
    tensor([25.,  8.], dtype=torch.float64)
    """
    fn = "fluctuation"
    out: dict[str, Tensor] = {}
    for name, (weight, m, dim) in _weights(fn, params, moments).items():
        var = m.var.detach().to(torch.float64).flatten()
        w = weight.detach().to(torch.float64)
        wt = w if dim == 1 else w.T  # (out, in)
        scale = var * wt.norm(dim=0)
        out[name] = wt.abs() * scale if dim == 1 else (wt.abs() * scale).T
    return out


def compensate(params: Params, masks: Mapping[str, Tensor], moments: Mapping[str, Moments]) -> dict[str, Tensor]:
    """New biases that keep each layer's mean output where the masks remove whole input columns (FLAP).

    For each weight in ``moments`` whose mask in ``masks`` prunes input
    columns entirely (every entry of ``W[:, j]``: a width plan's MLP
    channels and heads, on the output projections), the layer's bias
    becomes ``b + W[:, pruned] @ mean(x[pruned])``, with ``W`` the weight
    as ``params`` holds it: on the calibration tokens, the masked layer's
    mean output then equals the dense layer's (``mean(W x + b)``), the
    removed channels' average contribution moved into the bias. A layer
    without a bias gets one (zeros plus that), under the weight's name with
    ``bias`` for ``weight``: run the result with :func:`~funcprune.with_biases`.
    Entries pruned inside columns that stay are not compensated. Sums are
    taken in ``float64``; each bias has its weight's dtype.

    This is FLAP's ``compress`` (``lib/prune.py``: ``(mean * ~mask) @
    W.T``) on any Linear or ``Conv1D`` weight, with the bias a layer had kept.

    Args:
        params: the dense parameters, keyed like ``named_parameters()``.
        masks: the masks of a plan; a weight without one is left as it is.
        moments: by weight name, from :func:`~funcprune.input_moments` on the
            dense model.

    Returns:
        A new dict: ``params`` with the compensated biases replaced or
        added (every other value is the same tensor).

    Raises:
        TypeError: if an argument is not a mapping, or a mask is not bool.
        UnknownNameError: if a name of ``moments`` is not in ``params``.
        ValueError: if a weight is not 2-D, its moments or mask do not fit
            it, or its bias does not have one entry per output.

    >>> import torch, funcprune as fp
    >>> params = {"fc.weight": torch.tensor([[1.0, 2.0], [3.0, 4.0]])}
    >>> m = {"fc.weight": fp.Moments(torch.tensor([0.5, 10.0]).double(), torch.ones(2).double(), 8)}
    >>> fp.compensate(params, {"fc.weight": torch.tensor([[True, False], [True, False]])}, m)["fc.bias"]
    tensor([20., 40.])
    """
    fn = "compensate"
    if not isinstance(masks, Mapping):
        raise TypeError(f"{fn}: masks must be a dict of masks keyed like the parameters, got {type(masks).__name__}")
    out = dict(params)
    for name, (weight, m, dim) in _weights(fn, params, moments).items():
        mask = masks.get(name)
        if mask is None:
            continue
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != weight.shape:
            got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(f"{fn}: masks[{name!r}] must be a bool tensor of shape {tuple(weight.shape)}, got {got}")
        pruned = ~mask.any(dim=1 - dim)  # the input columns pruned entirely
        if not bool(pruned.any()):
            continue
        w = weight.detach().to(torch.float64)
        wt = w if dim == 1 else w.T  # (out, in)
        mean = m.mean.detach().to(torch.float64).flatten().to(w.device)
        shift = wt[:, pruned] @ mean[pruned]
        bias_name = name[: -len("weight")] + "bias"
        bias = params.get(bias_name)
        if bias is None:
            out[bias_name] = shift.to(weight.dtype)
        elif bias.shape != shift.shape:
            raise ValueError(f"{fn}: {bias_name!r} must have one entry per output of {name!r}, "
                             f"{tuple(shift.shape)}, got {tuple(bias.shape)}")  # fmt: skip
        else:
            out[bias_name] = (bias.detach().to(torch.float64) + shift).to(bias.dtype)
    return out


def _weights(fn: str, params: Params, moments: object) -> dict[str, tuple[Tensor, Moments, int]]:
    """Each weight of ``moments`` checked: the weight, its moments and its input dim (1, or 0 for ``(in, out)``)."""
    check_params(fn, params)
    if not isinstance(moments, Mapping):
        raise TypeError(f"{fn}: moments must be a dict of fp.Moments (from fp.input_moments), "
                        f"got {type(moments).__name__}")  # fmt: skip
    out: dict[str, tuple[Tensor, Moments, int]] = {}
    for name, m in moments.items():
        if not isinstance(m, Moments):
            raise TypeError(f"{fn}: moments[{name!r}] must be fp.Moments (from fp.input_moments), got {type(m).__name__}")
        if name not in params:
            raise unknown_name(fn, f"moments name {name!r}, which params do not hold", name, list(params))
        if not name.endswith("weight"):
            raise ValueError(f"{fn}: moments[{name!r}] must be of a weight (a name ending in 'weight')")
        weight = params[name]
        if weight.dim() != 2:
            raise ValueError(f"{fn}: {name!r} must be a 2-D Linear or Conv1D weight, got shape {tuple(weight.shape)}")
        shapes = {(weight.shape[1],): 1, (weight.shape[0], 1): 0}
        if m.mean.shape != m.var.shape or tuple(m.var.shape) not in shapes:
            raise ValueError(
                f"{fn}: moments[{name!r}] must hold one value per input feature of the weight of shape "
                f"{tuple(weight.shape)}: ({weight.shape[1]},) for a Linear or ({weight.shape[0]}, 1) for a Conv1D, "
                f"got mean {tuple(m.mean.shape)} and var {tuple(m.var.shape)}"
            )
        out[name] = (weight, m, shapes[tuple(m.var.shape)])
    return out
