"""``expert_stats``: what each expert of a mixture-of-experts model does on calibration tokens (REAP's statistics).

For every MoE layer (:func:`~funcprune._experts.routers`: a router beside
an experts module whose weights are stacked), the calibration batches run
through the model once each, and two hooks read the layer as it runs:

- the router's output gives the token's full router logits ``(tokens,
  experts)`` (the first tensor of its output with one column per expert:
  what every transformers 5 router returns first);
- the experts module's call, ``experts(hidden_states, top_k_index,
  top_k_weights)`` as transformers 5 makes it, gives the tokens and the
  experts the model routes each of them to. The experts module is then
  called once more, on every (token, expert) pair routed, with weight 1:
  its own code gives each expert's unweighted output ``f_j(x)``, whatever
  its activation, bias or layout.

The statistics follow CerebrasResearch/reap, ``src/reap/pruning_metrics.py``
(``update_pruning_state``): the gate value ``g_j(x)`` is the softmax over
the *full* router logits (optionally renormalised over the routed top-k,
reap's ``renormalize_router_weights``), and each expert's statistics are
over the tokens routed to it; its per-batch means are combined weighted by
each batch's routed-token counts (reap's ``OnlineStatsTracker``), which is
the mean over every routed token of every batch, computed here as one sum
over one count in ``float64``. Padding (0 in a batch's ``attention_mask``)
is left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .._criteria import Call, calls, token_rows
from .._experts import Router, routers
from .._families import takes_use_cache
from .._types import Tensor

__all__ = ["EXPERT_STATISTICS", "expert_stats", "super_experts"]

#: The statistics of :func:`expert_stats`, one ``float64`` value per expert each.
EXPERT_STATISTICS = ("frequency", "weighted_frequency", "ean_sum", "ean_mean", "reap", "max_activation")


def expert_stats(model: nn.Module, batches: Iterable[object], *, renormalize: bool = False) -> dict[str, dict[str, Tensor]]:
    """Per MoE layer and per expert, what the router sends it and what it gives back, over calibration batches.

    Each MoE layer is named as its ``"experts"`` unit group of
    :func:`~funcprune.structure` (the module holding the router and the
    experts, ``"model.layers.0.mlp"``), so its values are ready to be a
    plan's ``unit_scores``. For expert ``j``, over the calibration tokens
    the model routes to ``j`` (padding left out), with ``g_j(x)`` the
    softmax over the token's full router logits (reap's gate, whatever the
    model's own: DeepSeek's sigmoid gates too) and ``f_j(x)`` the expert's
    output before it is weighted:

    - ``"frequency"``: how many tokens it was routed;
    - ``"weighted_frequency"``: the sum of ``g_j(x)`` (reap's ``weighted_expert_frequency_sum``);
    - ``"ean_sum"``: the sum of ``||f_j(x)||_2`` (expert activation norm);
    - ``"ean_mean"``: their mean, ``ean_sum / frequency``;
    - ``"reap"``: the mean of ``g_j(x) * ||f_j(x)||_2`` (Lasby et al. 2025, REAP);
    - ``"max_activation"``: the largest entry of ``f_j(x)`` (reap's
      ``max_activations``, which finds super experts: :func:`super_experts`).

    An expert no token was routed to has ``frequency`` 0 and every other
    value 0, as in reap. These follow CerebrasResearch/reap's
    ``src/reap/pruning_metrics.py`` (``update_pruning_state``, its gate,
    renormalisation and combination of batches: the means are over every
    routed token of every batch), computed in ``float64`` throughout. Which
    tokens go to which expert is what the model itself routes: the top-k
    of the softmax for Mixtral, Qwen and OLMoE (reap's ``topk`` of the
    logits), and DeepSeek's group-limited, bias-corrected choice (where
    reap's ``topk`` of the raw logits would differ).

    The model runs once per batch (``use_cache=False`` where it takes it),
    unmodified, under ``torch.no_grad``: one batch's activations are held
    at a time, and per layer only its counts and sums.

    Args:
        model: the model, with MoE layers whose experts' weights are stacked
            (transformers 5's Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V3,
            GraniteMoE, PhiMoE...). ``model.eval()`` first, as for calibration.
        batches: calibration batches, as :func:`~funcprune.oneshot` takes
            them (a dict with ``input_ids`` and optionally
            ``attention_mask``, a tensor, or a tuple of arguments). Consumed
            once.
        renormalize: divide each token's gates by the sum of its routed
            experts' gates (reap's ``renormalize_router_weights``; its
            clamp at ``float32``'s epsilon kept), as Mixtral, and Qwen with
            ``norm_topk_prob``, weigh the experts' outputs.

    Returns:
        ``{layer: {statistic: float64 tensor of one value per expert}}``, on the CPU.

    Raises:
        TypeError: if ``model`` is not a module, ``renormalize`` not a bool,
            or a batch is none of the forms above.
        ValueError: if the model has no MoE layer with stacked experts,
            there are no batches or no real token, or a layer's router or
            experts are not called the transformers 5 way.
    """
    fn = "expert_stats"
    if not isinstance(model, nn.Module):
        raise TypeError(f"{fn}: model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(renormalize, bool):
        raise TypeError(f"{fn}: renormalize must be a bool, got {renormalize!r}")
    layers = routers(model)
    if not layers:
        raise ValueError(
            f"{fn}: {type(model).__name__} has no MoE layer with stacked experts (a router beside an experts "
            "module whose weights have one leading entry per expert, as transformers 5 builds them)"
        )
    watched = [_Watched(fn, layer, renormalize) for layer in layers]
    handles = []
    for w in watched:
        handles.append(model.get_submodule(w.layer.module).register_forward_hook(w.after_router))
        handles.append(model.get_submodule(w.layer.experts).register_forward_pre_hook(w.before_experts, with_kwargs=True))
    seen, real = 0, 0
    try:
        with torch.no_grad():
            for call in calls(fn, batches):
                seen += 1
                for w in watched:
                    w.tokens = call.tokens
                real += int(call.tokens.sum()) if call.tokens is not None else 1
                _forward(model, call)
    finally:
        for handle in handles:
            handle.remove()
    if not seen:
        raise ValueError(f"{fn}: batches must hold at least one batch, got none")
    if not real:
        raise ValueError(f"{fn}: the batches hold no real tokens (their attention_mask is 0 everywhere)")
    return {w.name: w.result() for w in watched}


def _forward(model: nn.Module, call: Call) -> None:
    kwargs = dict(call.kwargs)
    if takes_use_cache(model):
        kwargs.setdefault("use_cache", False)
    model(*call.args, **kwargs)


@dataclass
class _Watched:
    """One MoE layer's hooks and running sums."""

    fn: str
    layer: Router
    renormalize: bool
    tokens: Tensor | None = None
    logits: Tensor | None = None
    inside: bool = False
    sums: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        count = self.layer.count
        self.sums = {
            "frequency": torch.zeros(count, dtype=torch.float64),
            "weighted_frequency": torch.zeros(count, dtype=torch.float64),
            "ean_sum": torch.zeros(count, dtype=torch.float64),
            "reap_sum": torch.zeros(count, dtype=torch.float64),
            "max_activation": torch.zeros(count, dtype=torch.float64),
        }

    @property
    def name(self) -> str:
        """The layer's name: the module holding its router and its experts (the structure's group name)."""
        return _common(self.layer.module, self.layer.experts)

    def after_router(self, module: nn.Module, args: Any, out: object) -> None:
        if self.inside:
            return
        candidates = out if isinstance(out, (tuple, list)) else (out,)
        count = self.layer.count
        for value in candidates:
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() >= 2 and value.shape[-1] == count:
                self.logits = value.detach().reshape(-1, count)
                return
        raise ValueError(
            f"{self.fn}: the router {self.layer.module!r} returned no tensor of one logit per expert ({count}); "
            "expected its router logits first, as transformers 5's routers return them"
        )

    def before_experts(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.inside:
            return
        hidden, index, weights = _routed(self.fn, self.layer, args, kwargs)
        logits, self.logits = self.logits, None
        if logits is None or logits.shape[0] != hidden.shape[0]:
            got = "no router logits" if logits is None else f"router logits for {logits.shape[0]} tokens"
            raise ValueError(
                f"{self.fn}: the experts {self.layer.experts!r} ran on {hidden.shape[0]} tokens after {got}; "
                "expected the router to run on the same tokens just before"
            )
        real = token_rows(self.fn, f"the experts {self.layer.experts!r}", hidden.shape[0], self.tokens)
        if real is not None:
            hidden, index, logits = hidden[real], index[real], logits[real]
        gates = torch.softmax(logits.to(torch.float64), dim=-1)
        count = self.layer.count
        routed = (index >= 0) & (index < count)  # an index of ``count`` routes nowhere (transformers' padding slot)
        if self.renormalize and index.numel():
            chosen = gates.gather(1, index.clamp(0, count - 1)) * routed
            gates = (gates / chosen.sum(-1, keepdim=True)).clamp(min=torch.finfo(torch.float32).eps)
        token, slot = routed.nonzero(as_tuple=True)
        expert = index[token, slot]
        if not expert.numel():
            return
        self.inside = True
        try:
            ones = torch.ones((expert.shape[0], 1), dtype=weights.dtype, device=weights.device)
            out = module(hidden[token], expert[:, None], ones)
        finally:
            self.inside = False
        f = out.detach().to(torch.float64).reshape(expert.shape[0], -1)
        norms = torch.linalg.vector_norm(f, dim=-1)
        g = gates[token, expert]
        where = expert.cpu()
        s = self.sums
        s["frequency"].index_add_(0, where, torch.ones_like(norms).cpu())
        s["weighted_frequency"].index_add_(0, where, g.cpu())
        s["ean_sum"].index_add_(0, where, norms.cpu())
        s["reap_sum"].index_add_(0, where, (g * norms).cpu())
        s["max_activation"].scatter_reduce_(0, where, f.amax(-1).cpu(), "amax")

    def result(self) -> dict[str, Tensor]:
        s = self.sums
        frequency = s["frequency"]
        some = frequency > 0
        per = frequency.clamp(min=1)
        return {
            "frequency": frequency.clone(),
            "weighted_frequency": s["weighted_frequency"].clone(),
            "ean_sum": s["ean_sum"].clone(),
            "ean_mean": torch.where(some, s["ean_sum"] / per, 0.0),
            "reap": torch.where(some, s["reap_sum"] / per, 0.0),
            # reap starts each expert's maximum at 0 and raises it: an expert whose outputs are all negative keeps 0
            "max_activation": s["max_activation"].clone(),
        }


def _common(a: str, b: str) -> str:
    """The innermost module path holding both ``a`` and ``b``."""
    common = []
    for x, y in zip(a.split("."), b.split("."), strict=False):
        if x != y:
            break
        common.append(x)
    return ".".join(common)


def _routed(fn: str, layer: Router, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Tensor, Tensor, Tensor]:
    """The experts call's ``(hidden_states, top_k_index, top_k_weights)``, checked."""
    values = [*args, *kwargs.values()]
    if len(values) < 3 or not all(isinstance(v, torch.Tensor) for v in values[:3]):
        raise ValueError(
            f"{fn}: the experts {layer.experts!r} were called with {len(values)} arguments; expected "
            "(hidden_states, top_k_index, top_k_weights), as transformers 5 calls its experts"
        )
    hidden, index, weights = values[:3]
    if hidden.dim() != 2 or index.dim() != 2 or index.shape[0] != hidden.shape[0] or index.is_floating_point():
        raise ValueError(
            f"{fn}: the experts {layer.experts!r} were called with hidden states {tuple(hidden.shape)} and indices "
            f"{tuple(index.shape)} ({index.dtype}); expected (tokens, hidden) and integer (tokens, top_k)"
        )
    return hidden.detach(), index, weights


def super_experts(
    stats: Mapping[str, Mapping[str, Tensor]], *, quantile: float = 0.995, times: float = 10.0, last_layers: bool = False,
) -> dict[str, Tensor]:  # fmt: skip
    """Which experts are *super experts*: those of outlying maximum activation, as reap finds them to keep them.

    reap's ``get_super_expert_indices`` (``src/reap/model_util.py``): over
    every layer's ``"max_activation"`` together, the threshold is the larger
    of their ``quantile`` (99.5%) and their largest value over ``times``
    (10); an expert whose maximum activation exceeds it is a super expert.
    Unless ``last_layers`` (reap's ``perserve_outliers``), only the first
    75% of the layers (``int(0.75 * layers)``, in ``stats``'s order) have
    any. Give the result to :func:`~funcprune.structured`'s ``protect`` to
    keep them.

    Args:
        stats: :func:`expert_stats`'s result (or any ``{layer: {"max_activation": tensor}}``).
        quantile: the quantile, in ``(0, 1]``.
        times: the divisor of the largest maximum activation, positive.
        last_layers: whether the last quarter of the layers may have super experts.

    Returns:
        ``{layer: bool tensor of one flag per expert}``.

    >>> import torch, funcprune as fp
    >>> stats = {"a": {"max_activation": torch.tensor([1.0, 2.0, 300.0])},
    ...          "b": {"max_activation": torch.tensor([1.0, 1.0, 1.0])}}
    >>> {k: v.tolist() for k, v in fp.super_experts(stats, last_layers=True).items()}
    {'a': [False, False, True], 'b': [False, False, False]}
    """
    fn = "super_experts"
    if not isinstance(quantile, (int, float)) or not 0 < quantile <= 1:
        raise ValueError(f"{fn}: quantile must be a number in (0, 1], got {quantile!r}")
    if not isinstance(times, (int, float)) or not times > 0:
        raise ValueError(f"{fn}: times must be a positive number, got {times!r}")
    if not stats:
        raise ValueError(f"{fn}: stats must hold at least one layer, got none")
    values = []
    for name, layer in stats.items():
        value = layer.get("max_activation") if isinstance(layer, Mapping) else None
        if not isinstance(value, torch.Tensor) or value.dim() != 1:
            raise ValueError(f"{fn}: stats[{name!r}] must hold a 1-D 'max_activation' tensor (from fp.expert_stats)")
        values.append(value.to(torch.float64))
    joined = torch.cat(values)
    threshold = max(torch.quantile(joined, quantile).item(), joined.max().item() / times)
    allowed = len(values) if last_layers else int(len(values) * 0.75)
    return {
        name: (value > threshold) & (i < allowed)
        for i, (name, value) in enumerate(zip(stats, values, strict=True))
    }
