"""Which weights a one-shot run prunes, and each one's spec: uniform, a mapping of sparsities, or OWL's.

Everything here is checked before any calibration batch runs, but OWL's
sparsities, which come from the dense model's Wanda scores
(:func:`owl_specs`, once the capture pass collected its input norms).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from torch import nn

from .._criteria import owl_sparsity
from .._experts import routers
from .._names import not_a_parameter
from .._specs import NM, L1Unstructured, PerSlice, Spec
from .._targets import prunable
from .._types import Tensor, is_conv1d
from ._layers import RepeatedLayers

__all__ = ["check_groups", "owl_specs", "specs_of", "weights_named"]


def weights_named(
    fn: str,
    model: nn.Module,
    layers: RepeatedLayers,
    names: Iterable[str] | None,
    params: Mapping[str, Tensor],
    method: object,
    linear_only: bool,
    expert_dims: Mapping[str, int | None],
) -> list[str]:
    """The weights to prune, checked: by default :func:`prunable`'s inside the layers, experts included.

    ``expert_dims``: the model's stacked expert parameters, each with its
    slices' input dim or ``None`` (:func:`~funcprune._expert_linears.expert_input_dims`).
    The default is ``prunable(model, experts=True)`` inside the layers, the
    routers left out (PhiMoE's is a Linear). ``linear_only`` (a method that
    collects statistics of the weights' inputs) refuses a weight that is
    neither a Linear's or ``Conv1D``'s nor a stacked expert weight read as
    one Linear weight per expert; the error shows ``method`` as the caller
    gave it.
    """
    if names is None:
        ours = tuple(layers.prefix(i) for i in range(len(layers.modules)))
        dense = {r.weight for r in routers(model)}
        return [n for n in prunable(model, experts=True) if n.startswith(ours) and n not in dense]
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise TypeError(f"{fn}: names must be a list of parameter names or None, got {names!r}")
    chosen = list(dict.fromkeys(names))
    for i, name in enumerate(chosen):
        if not isinstance(name, str):
            raise TypeError(f"{fn}: names[{i}] must be a str, got {type(name).__name__}")
        if name not in params:
            raise not_a_parameter(fn, model, name, params)
        if name in expert_dims:
            if linear_only and expert_dims[name] is None:
                raise ValueError(
                    f"{fn}: {name!r} is a stacked parameter of an experts module whose eager forward does not read "
                    f"its slices as Linear weights (F.linear(x, W[e]) or x @ W[e]: a bias, or a layout read "
                    f"otherwise); method={method!r} prunes Linear weights and expert weights read so, from "
                    "their inputs (method='magnitude' takes any)"
                )
        elif linear_only:
            path, _, attr = name.rpartition(".")
            owner = model.get_submodule(path)
            if attr != "weight" or not (isinstance(owner, nn.Linear) or is_conv1d(owner)):
                raise ValueError(
                    f"{fn}: {name!r} belongs to a {type(owner).__name__}; method={method!r} prunes the weights "
                    "of Linear and transformers' Conv1D layers, from their inputs (method='magnitude' takes any)"
                )
    return chosen


def specs_of(fn: str, spec: Spec, chosen: list[str], allocation: object) -> dict[str, Spec]:
    """Each weight's spec: ``spec``, or ``spec`` at the sparsity ``allocation`` gives it (OWL's: later)."""
    if allocation is None or allocation == "uniform" or allocation == "owl":
        if allocation == "owl":
            _fraction(fn, spec)  # refuses a spec without one, before any batch runs
        return dict.fromkeys(chosen, spec)
    if not isinstance(allocation, Mapping):
        raise TypeError(f"{fn}: allocation must be None, 'uniform', 'owl' or a mapping of names to sparsities, "
                        f"got {allocation!r}")  # fmt: skip
    extra = [n for n in allocation if n not in chosen]
    if extra:
        raise ValueError(f"{fn}: allocation has a sparsity for {extra[0]!r}, which is not a weight pruned here "
                         "(names, or by default the Linear and Conv1D weights of the blocks); leave it out")  # fmt: skip
    missing = [n for n in chosen if n not in allocation]
    if missing:
        raise ValueError(f"{fn}: allocation has no sparsity for {missing[0]!r} (and {len(missing) - 1} more "
                         "weights pruned); give one for every name pruned")  # fmt: skip
    _fraction(fn, spec)
    out = {}
    for name in chosen:
        value = allocation[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ValueError(f"{fn}: allocation[{name!r}] must be a sparsity in [0, 1], got {value!r}")
        out[name] = _at(spec, float(value))
    return out


def check_groups(
    fn: str,
    specs: dict[str, Spec],
    params: Mapping[str, Tensor],
    dims: Mapping[str, int],
    experts: Mapping[str, int],
) -> None:
    """Refuse, before any batch runs, an N:M spec whose groups do not divide a weight's (or expert slice's) inputs."""
    for name, spec in specs.items():
        if isinstance(spec, NM):
            w = params[name]
            if name in experts:
                inputs = w.shape[1 + experts[name]]
            else:
                inputs = w.shape[dims[name]] if name in dims else w.shape[-1]
            if inputs % spec.m:
                raise ValueError(f"{fn}: {name!r} has {inputs} inputs, not a multiple of the spec's m={spec.m}: "
                                 f"{spec!r} cannot group them; leave it out of names")  # fmt: skip


def owl_specs(
    fn: str,
    spec: Spec,
    params: dict[str, Tensor],
    norms: dict[str, Tensor],
    layers: RepeatedLayers,
    experts: Mapping[str, int],
) -> dict[str, Spec]:
    """OWL's spec per weight, averaging the spec's fraction over the blocks.

    A stacked expert weight counts as its experts' Linear weights, each
    slice scored with its own expert's norms (``experts``: the stacked
    names), and gets its block's sparsity, as every weight of the block.
    """
    fraction = _fraction(fn, spec)
    count = len(layers.modules)

    def block_of(name: str) -> str:
        return next(layers.prefix(i) for i in range(count) if name.startswith(layers.prefix(i)))

    weights: dict[str, Tensor] = {}
    per: dict[str, Tensor] = {}
    for name, w in params.items():
        if name in experts:  # one weight per expert: "name[e]", in its block
            weights.update({f"{name}[{e}]": w[e] for e in range(w.shape[0])})
            per.update({f"{name}[{e}]": norms[name][e] for e in range(w.shape[0])})
        else:
            weights[name], per[name] = w, norms[name]
    targets = owl_sparsity(weights, per, fraction, blocks=block_of)
    return {name: _at(spec, targets[f"{name}[0]" if name in experts else name]) for name in params}


def _fraction(fn: str, spec: Spec) -> float:
    """The fraction an allocation replaces: ``spec``'s, an ``L1Unstructured`` float, alone or per slice."""
    inner = spec.spec if isinstance(spec, PerSlice) else spec
    if isinstance(inner, L1Unstructured):
        fraction = inner.amount if inner.sparsity is None else inner.sparsity
        if isinstance(fraction, float):
            return fraction
    raise ValueError(f"{fn}: an allocation other than uniform sets each weight's fraction: spec must be "
                     f"L1Unstructured(fraction) or PerSlice(L1Unstructured(fraction), dim=0), got {spec!r}")  # fmt: skip


def _at(spec: Spec, sparsity: float) -> Spec:
    """``spec`` (checked by :func:`_fraction`) pruning the fraction ``sparsity`` instead of its own."""
    at = L1Unstructured(sparsity)
    return PerSlice(at, dim=spec.dim) if isinstance(spec, PerSlice) else at
