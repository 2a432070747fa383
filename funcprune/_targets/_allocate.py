"""Allocations: how a total sparsity is split across tensors.

An allocation is a ``dict[str, float]`` (name -> target sparsity) whose
numel-weighted mean is the total asked for; only shapes are read, so meta
tensors work. ``README.md`` shows one turned into a plan.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Iterable

from .._names import check_params, match_names
from .._types import Params
from .._validate import check_sparsity

__all__ = ["uniform_sparsity", "erk_sparsity"]


def uniform_sparsity(params: Params, sparsity: float) -> dict[str, float]:
    """The same sparsity for every tensor.

    Args:
        params: the tensors, keyed like ``named_parameters()`` (only their
            shapes are read).
        sparsity: the target, a float in [0, 1].

    Returns:
        ``{name: sparsity}`` for every name, in the order of ``params``.

    Raises:
        TypeError: if ``params`` is not a mapping of names to tensors or
            ``sparsity`` not a real number.
        ValueError: if ``sparsity`` is outside [0, 1].

    >>> import torch, funcprune as fp
    >>> fp.uniform_sparsity({"a": torch.empty(4, 4), "b": torch.empty(8)}, 0.5)
    {'a': 0.5, 'b': 0.5}
    """
    check_params("uniform_sparsity", params)
    sparsity = check_sparsity("uniform_sparsity", "sparsity", sparsity)
    return {name: sparsity for name in params}


def erk_sparsity(
    params: Params, sparsity: float, *, power: float = 1.0, dense: Collection[str] = ()
) -> dict[str, float]:
    """Erdős–Rényi-Kernel sparsities (Evci et al. 2020, "Rigging the Lottery").

    Each tensor's density (1 - sparsity) is proportional to
    ``(sum(shape) / prod(shape)) ** power``: for a conv weight
    ``(out, in, kh, kw)``, ``(out + in + kh + kw) / (out * in * kh * kw)``.
    Small tensors and tensors with few connections per unit stay denser.
    The factor is chosen so that the total density, weighted by numel, is
    ``1 - sparsity``. A tensor whose density would exceed 1 is kept dense
    (sparsity 0.0) and the factor recomputed for the others, repeatedly,
    until none does (RigL's algorithm).

    A 1-D tensor of size ``n`` scores ``n / n = 1``, at least as much as any
    tensor whose dimensions are all 2 or more, so biases and norm scales are
    the first kept dense. A 0-d tensor counts as shape ``(1,)``; an empty
    tensor (a 0 in its shape) has nothing to prune and gets 0.0. With
    ``power=0`` every tensor scores 1: the allocation is uniform (but for
    the ``dense`` ones).

    Args:
        params: the tensors, keyed like ``named_parameters()`` (only their
            shapes are read).
        sparsity: the total target, a float in [0, 1].
        power: the exponent of the score, a real number >= 0 (default 1.0;
            RigL's ``erk_power_scale``).
        dense: names or glob patterns (as in :class:`~funcprune.Plan`) of
            tensors to keep dense. They count in the total, so the others
            prune more.

    Returns:
        ``{name: sparsity}`` for every name, in the order of ``params``,
        whose numel-weighted mean is ``sparsity`` up to float rounding.

    Raises:
        TypeError: if an argument has the wrong type.
        ValueError: if ``sparsity`` or ``power`` is out of range, or the
            target cannot be reached because too much is kept dense (the
            message says the most that can be pruned).
        UnknownNameError: if a name in ``dense`` matches no tensor.

    >>> import torch, funcprune as fp
    >>> params = {"conv.weight": torch.empty(16, 3, 3, 3), "conv.bias": torch.empty(16),
    ...           "fc.weight": torch.empty(10, 64, device="meta")}
    >>> {n: round(s, 4) for n, s in fp.erk_sparsity(params, 0.8).items()}
    {'conv.weight': 0.8822, 'conv.bias': 0.0, 'fc.weight': 0.7645}
    >>> fp.erk_sparsity(params, 0.9, dense=["conv.*"])
    Traceback (most recent call last):
    ...
    ValueError: erk_sparsity: sparsity=0.9 cannot be reached: with 448 of the 1088 entries kept dense,
    at most 0.5882352941176471 can be pruned
    """
    fn = "erk_sparsity"
    check_params(fn, params)
    sparsity = check_sparsity(fn, "sparsity", sparsity)
    power = _check_power(fn, power)
    names = tuple(params)
    sizes = {name: math.prod(params[name].shape) for name in names}
    kept = {
        name
        for pattern in _dense_patterns(fn, dense)
        for name in match_names(fn, "dense name", pattern, names)
    }
    total = sum(sizes.values())
    prunable = sum(size for name, size in sizes.items() if name not in kept)
    most = prunable / total if total else 0.0
    if sparsity > most:
        why = (
            f"with {total - prunable} of the {total} entries kept dense" if total else "params has no entries"
        )
        raise ValueError(
            f"{fn}: sparsity={sparsity!r} cannot be reached: {why}, at most {most!r} can be pruned"
        )
    log_scores = {
        name: power * (math.log(sum(params[name].shape or (1,))) - math.log(size))
        for name, size in sizes.items()
        if size and name not in kept
    }
    found = _erk(log_scores, {name: sizes[name] for name in log_scores}, total, sparsity)
    return {name: found.get(name, 0.0) for name in names}


def _check_power(fn: str, power: object) -> float:
    if isinstance(power, bool) or not isinstance(power, numbers.Real):
        raise TypeError(f"{fn}: power must be a real number >= 0, got {power!r}")
    if not 0.0 <= float(power) < math.inf:
        raise ValueError(f"{fn}: power must be a finite real number >= 0, got {power!r}")
    return float(power)


def _dense_patterns(fn: str, dense: object) -> tuple[str, ...]:
    if isinstance(dense, str) or not isinstance(dense, Iterable):
        raise TypeError(
            f"{fn}: dense must be a collection of names, got {dense!r}"
            + (f"; write ({dense!r},)" if isinstance(dense, str) else "")
        )
    patterns = tuple(dense)
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise TypeError(f"{fn}: dense must hold names (str), got {pattern!r}")
    return patterns


def _erk(
    log_scores: dict[str, float], sizes: dict[str, int], total: int, sparsity: float
) -> dict[str, float]:
    """RigL's ERK loop over the tensors that may be pruned (``log_scores``).

    With ``S`` the tensors still sparse, ``N_S`` their entries and
    ``W = sum(score_j * n_j)`` over ``S``, tensor ``i`` of ``S`` gets density
    ``score_i * (N_S - sparsity * total) / W``, i.e. sparsity
    ``sum_j n_j (score_j - score_i) / W + score_i * total / W * sparsity``,
    evaluated in that form (with :func:`math.fsum`, tensors grouped by score)
    so that equal scores give exact zeros and a tiny target stays accurate.
    Scores are taken relative to the largest in ``S`` (from their logs), so
    that no power overflows or underflows them all. Tensors whose sparsity
    comes out negative (density above 1) leave ``S``. The others' densities
    only grow when one leaves (the budget left for them grows faster than
    their weight), so no tensor that left would come back: the loop ends
    with the set of RigL's one-at-a-time loop, in fewer rounds.
    """
    sparse = dict(sizes)
    while sparse:
        top = max(log_scores[name] for name in sparse)
        scores = {name: math.exp(log_scores[name] - top) for name in sparse}
        by_score: dict[float, int] = {}
        for name, size in sparse.items():
            by_score[scores[name]] = by_score.get(scores[name], 0) + size
        weight = math.fsum(score * size for score, size in by_score.items())
        found = {
            score: math.fsum(size * (other - score) for other, size in by_score.items()) / weight
            + score * total / weight * sparsity
            for score in by_score
        }
        too_dense = [name for name in sparse if found[scores[name]] < 0.0]
        if not too_dense:
            return {name: min(1.0, found[scores[name]]) for name in sparse}
        for name in too_dense:
            del sparse[name]
    return {}
