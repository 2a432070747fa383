"""OWL's layerwise sparsities: layers with more outliers keep more weights.

:func:`owl_sparsity` turns Wanda's scores (:func:`funcprune.wanda`) into one
target sparsity per repeated block, as OWL does (Yin et al. 2023, "Outlier
Weighed Layerwise Sparsity (OWL)", ``lib/prune_all.py`` of luuyin/OWL).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Mapping

import torch

from .._names import check_params
from .._types import Params, Tensor, is_dtensor
from .._validate import check_sparsity
from ._scores import _along, _input_dim, _weight_for_norms

__all__ = ["owl_sparsity"]

_NUMERIC = re.compile(r"[0-9]+")
#: How far rounding may push a target past [0, 1] before it counts as leaving it.
_SLACK = 1e-12


def owl_sparsity(
    params: Params,
    input_norms: Mapping[str, Tensor],
    sparsity: float,
    *,
    lam: float = 0.08,
    m: float = 5,
    blocks: Callable[[str], str] | None = None,
) -> dict[str, float]:
    """Per-block sparsities from outlier ratios: OWL (Yin et al. 2023).

    As ``prune_wanda_outlier`` in OWL's code: each group of weights (OWL's
    "layer", one decoder block: all its Linear weights together) gets the
    share of its Wanda scores ``|W[i, j]| * norm[j]`` strictly above ``m``
    times their mean, the mean and the share taken over the scores of all the
    group's weights together (in percent, which the scaling below makes
    moot). These outlier ratios ``r`` are scaled to span ``2 * lam``,
    ``d = (r - min(r)) / (max(r) - min(r)) * 2 * lam``, and each group's
    sparsity is ``sparsity - (d - mean(d))``: a group with more outliers
    keeps more (OWL's density ``d - mean(d) + 1 - sparsity``). The mean is
    unweighted over the groups, as in OWL, so the groups' targets average
    to ``sparsity``; with groups of equal size (a model's identical decoder
    blocks) that is also the mean weighted by entries. Pass only the
    blocks' weights, as OWL prunes (not ``lm_head``): a tensor outside the
    blocks is a group of its own, counted as one block.

    The targets span exactly ``2 * lam`` and contain ``sparsity``, but are
    not centred on it (the paper's ``[S - lam, S + lam]``): OWL's code
    shifts by the mean, so a group may get down to ``sparsity - 2 * lam``
    or up to ``sparsity + 2 * lam`` (strictly inside). Where a target
    leaves [0, 1] this raises, where OWL clips: clipping would move the
    mean off ``sparsity`` (a target past 0 or 1 by ``1e-12`` at most, a
    rounding, is set to it). ``2 * lam <= min(sparsity, 1 - sparsity)`` is
    sure to fit. With a single group, ``lam=0``, or all outlier ratios equal
    (where OWL divides by ``max - min = 0``), every target is ``sparsity``.

    Groups: by default a name's group is its prefix up to and including
    its last purely numeric component, the repeated block holding it
    (``"model.layers.3"`` for ``"model.layers.3.mlp.up_proj.weight"``,
    ``"transformer.h.0"`` for GPT-2's); a name with no numeric component is
    a group of its own. Nested numbered modules make smaller groups (the
    experts of an MoE block, ``"...mlp.experts.3"``): pass ``blocks`` to
    group otherwise. Every tensor of a group gets the group's target.

    Scores are computed in ``float64`` on each weight's device, a tensor at
    a time (no block's scores are held together), and scale each weight
    along its input dim as :func:`funcprune.wanda` does.

    Args:
        params: the weights to allocate, keyed like ``named_parameters()``,
            each of 2 dims or more (not DTensors: gather them first).
        input_norms: the norms of every weight's input features, as
            :func:`funcprune.input_norms` returns them: 1-D ``(in,)`` for a
            Linear weight ``(out, in)``, a column ``(in, 1)`` for a
            ``Conv1D`` weight ``(in, out)``. A factor common to all of
            them changes nothing (OWL's are divided by the square root of
            the number of calibration sequences). Extra names are ignored.
        sparsity: the mean target over the groups, a float in [0, 1].
        lam: the span of the targets is ``2 * lam``, a real >= 0 (OWL's
            ``Lamda``, 0.08 by default).
        m: the outlier threshold, in multiples of the group's mean score, a
            real > 0 (OWL's ``Hyper_m``: 5 in its README's LLaMA commands,
            3 by default in its ``main.py``).
        blocks: ``name -> group key`` (a str), or ``None`` (above).

    Returns:
        ``{name: sparsity}`` for every name, in the order of ``params``.

    Raises:
        TypeError: if an argument has the wrong type, a tensor is not
            floating-point or is a DTensor, or ``blocks`` returns no str.
        ValueError: if ``sparsity``, ``lam`` or ``m`` is out of range, a
            name of ``params`` has no norms, norms do not fit their weight,
            a weight or its norms hold NaN, inf or (norms) negative values,
            a group has no entries, or a target leaves [0, 1].

    >>> import torch, funcprune as fp
    >>> spiky = torch.ones(4, 4)
    >>> spiky[0, 0] = 40.0  # one outlier of 16 in block 0: 6.25 %, none in block 1
    >>> params = {"layers.0.fc.weight": spiky, "layers.1.fc.weight": torch.ones(4, 4)}
    >>> norms = {name: torch.ones(4) for name in params}
    >>> {n: round(s, 6) for n, s in fp.owl_sparsity(params, norms, 0.5, m=3).items()}
    {'layers.0.fc.weight': 0.42, 'layers.1.fc.weight': 0.58}
    """
    fn = "owl_sparsity"
    check_params(fn, params)
    sparsity = check_sparsity(fn, "sparsity", sparsity)
    lam = _real(fn, "lam", lam, ">= 0", lambda v: v >= 0.0)
    m = _real(fn, "m", m, "> 0", lambda v: v > 0.0)
    if blocks is not None and not callable(blocks):
        raise TypeError(f"{fn}: blocks must be a callable name -> str or None, got {blocks!r}")
    if not isinstance(input_norms, Mapping):
        raise TypeError(
            f"{fn}: input_norms must be a mapping of names to tensors, got "
            f"{type(input_norms).__name__}; fp.input_norms(module, batches, names) makes one"
        )
    missing = [name for name in params if name not in input_norms]
    if missing:
        shown = ", ".join(map(repr, missing[:8])) + (", ..." if len(missing) > 8 else "")
        raise ValueError(
            f"{fn}: input_norms has no norms for {len(missing)} name(s) of params: {shown}; "
            "expected norms for every weight (fp.input_norms(module, batches, list(params)))"
        )
    groups: dict[str, list[tuple[Tensor, Tensor]]] = {}
    keys: dict[str, str] = {}
    for name in params:
        weight, norms = _checked(fn, name, params, input_norms[name])
        keys[name] = key = _group(fn, name, blocks)
        groups.setdefault(key, []).append((weight, norms))
    ratios = {key: _outlier_ratio(fn, key, pairs, m) for key, pairs in groups.items()}
    targets = _targets(fn, ratios, sparsity, lam)
    return {name: targets[keys[name]] for name in params}


def _real(fn: str, argument: str, value: object, expected: str, ok: Callable[[float], bool]) -> float:
    """``value`` as a float, refusing anything but a finite real number for which ``ok`` holds."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{fn}: {argument} must be a real number {expected}, got {value!r}")
    if not (math.isfinite(float(value)) and ok(float(value))):
        raise ValueError(f"{fn}: {argument} must be a finite real number {expected}, got {value!r}")
    return float(value)


def _checked(fn: str, name: str, params: Params, norms: object) -> tuple[Tensor, Tensor]:
    """The weight and its norms shaped to scale it along its input dim, detached, after every check."""
    weight = _weight_for_norms(fn, name, norms, params)  # tensor, floating, >= 2 dims, same device
    assert isinstance(norms, torch.Tensor)
    if is_dtensor(weight) or is_dtensor(norms):
        raise TypeError(
            f"{fn}: params[{name!r}] or its norms is a DTensor; pass the whole tensor "
            "(.full_tensor() on every process)"
        )
    dim = _input_dim(fn, name, weight, norms, None)
    if not bool(torch.isfinite(weight).all()):
        raise ValueError(f"{fn}: the parameter {name!r} holds NaN or inf; expected finite weights")
    if not bool((torch.isfinite(norms) & (norms >= 0)).all()):
        raise ValueError(
            f"{fn}: input_norms[{name!r}] holds NaN, inf or negative values; expected finite norms >= 0"
        )
    return weight.detach(), _along(norms.detach().flatten(), dim, weight.dim())


def _group(fn: str, name: str, blocks: Callable[[str], str] | None) -> str:
    """The group of ``name``: ``blocks(name)``, else its prefix through its last numeric component."""
    if blocks is not None:
        key: object = blocks(name)
        if not isinstance(key, str):
            raise TypeError(f"{fn}: blocks({name!r}) must return a str, got {key!r}")
        return key
    parts = name.split(".")
    last = max((i for i, part in enumerate(parts) if _NUMERIC.fullmatch(part)), default=None)
    return name if last is None else ".".join(parts[: last + 1])


def _outlier_ratio(fn: str, key: str, pairs: list[tuple[Tensor, Tensor]], m: float) -> float:
    """OWL's ``check_outlier_mean``: the percent of the group's scores above ``m`` times their mean."""

    def scores(weight: Tensor, norms: Tensor) -> Tensor:
        return weight.to(torch.float64).abs() * norms.to(torch.float64)

    total = sum(w.numel() for w, _ in pairs)
    if total == 0:
        raise ValueError(f"{fn}: the group {key!r} has no entries; expected weights with entries")
    mean = math.fsum(float(scores(w, n).sum()) for w, n in pairs) / total
    above = sum(int((scores(w, n) > mean * m).sum()) for w, n in pairs)
    return above / total * 100


def _targets(fn: str, ratios: dict[str, float], sparsity: float, lam: float) -> dict[str, float]:
    """Each group's target from the outlier ratios: OWL's min-max scaling to ``2 * lam``, shifted."""
    low, high = min(ratios.values(), default=0.0), max(ratios.values(), default=0.0)
    if lam == 0.0 or low == high:  # no group, one, or OWL's 0 / 0
        return dict.fromkeys(ratios, sparsity)
    scaled = {key: (r - low) / (high - low) * 2 * lam for key, r in ratios.items()}
    mean = math.fsum(scaled.values()) / len(scaled)
    targets = {key: sparsity - (d - mean) for key, d in scaled.items()}
    for key, target in targets.items():
        if not -_SLACK <= target <= 1 + _SLACK:
            raise ValueError(
                f"{fn}: the group {key!r} gets sparsity {target!r}, outside [0, 1] (sparsity="
                f"{sparsity!r}, lam={lam!r}: OWL's targets span 2 * lam around the mean, up to 2 * "
                "lam from it); pass a smaller lam (2 * lam <= min(sparsity, 1 - sparsity) always "
                "fits). funcprune refuses rather than clip, which would move the mean off sparsity"
            )
    return {key: min(1.0, max(0.0, target)) for key, target in targets.items()}
