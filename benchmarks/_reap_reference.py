"""REAP's expert saliency in float64, written after reap's own code, and llm-compressor's rule for the experts kept.

The reference rows of ``benchmarks/experts.py``; torch only, no funcprune,
no transformers, so that ``tests/test_benchmark_experts.py`` checks it alone.

:func:`update` follows CerebrasResearch/reap, ``src/reap/pruning_metrics.py``
(``update_pruning_state``) for the one statistic pruning reads, ``reap``:

- the gate is the softmax over the token's *full* router logits, divided
  by the sum of its routed experts' gates when ``renormalize`` (reap's
  ``renormalize_router_weights``, on by default where the model's config
  has ``norm_topk_prob``) and clamped below at float32's epsilon as reap
  does (in float64 here, where reap computes it in float32);
- a token counts for expert ``j`` when ``j`` is among its routed experts
  (``selected_experts``); padding (0 in ``valid``) is left out;
- per batch, expert ``j``'s value is the mean of ``gate_j * ||f_j||_2`` over
  its tokens, and batches are combined as reap's ``OnlineStatsTracker``
  combines them: means weighted by each batch's token count (an expert no
  token reached keeps 0).

:func:`retained` is llm-compressor 0.14's choice (``REAPSaliencyTracker.
compute_retained_experts`` for a router without expert groups): the
``drop`` lowest by ``torch.topk(largest=False)`` go, the rest stay in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class State:
    """One MoE layer's running REAP means and token counts (reap's ``OnlineStatsTracker``, in float64)."""

    experts: int
    mean: Tensor = field(init=False)
    count: Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.mean = torch.zeros(self.experts, dtype=torch.float64)
        self.count = torch.zeros(self.experts, dtype=torch.float64)


def update(
    state: State,
    activations: Tensor,
    selected: Tensor,
    logits: Tensor,
    *,
    renormalize: bool,
    valid: Tensor | None = None,
) -> None:
    """Add one batch to ``state``.

    Args:
        state: the layer's running values.
        activations: ``(experts, tokens, hidden)``: every expert's unweighted output on every token.
        selected: ``(tokens, top_k)`` integer: the experts each token is routed to.
        logits: ``(tokens, experts)``: the router's logits.
        renormalize: divide the gates by the sum of each token's routed gates.
        valid: ``(tokens,)``: 1 for a real token, 0 for padding; ``None``: all real.
    """
    activations, selected, logits = activations.double(), selected.long(), logits.double()
    if valid is not None:
        keep = valid.reshape(-1).bool()
        activations, selected, logits = activations[:, keep], selected[keep], logits[keep]
    gates = torch.softmax(logits, dim=1)
    if renormalize and selected.numel():
        gates = gates / gates.gather(1, selected).sum(dim=-1, keepdim=True)
        gates = gates.clamp(min=torch.finfo(torch.float32).eps)
    for j in range(state.experts):
        routed = (selected == j).any(dim=-1)
        n = int(routed.sum())
        if not n:
            continue
        batch_mean = (torch.linalg.vector_norm(activations[j, routed], dim=-1) * gates[routed, j]).mean()
        total = state.count[j] + n
        state.mean[j] += (batch_mean - state.mean[j]) * n / total
        state.count[j] = total


def retained(saliency: Tensor, drop: int) -> list[int]:
    """The experts llm-compressor 0.14 keeps: all but the ``drop`` of lowest ``saliency``, ascending."""
    gone = {int(i) for i in torch.topk(saliency, drop, largest=False).indices}
    return [i for i in range(saliency.shape[0]) if i not in gone]
