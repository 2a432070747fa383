"""The ``"hidden"`` unit group of a model: the channels of its residual stream (its hidden size).

The payoff's ``hidden_of`` reads them off the channel analysis (one group
that the norms couple whole: the embedding's columns, every norm on the
stream, the input columns of the layers that read it, the output rows of
those that write it); they are units only where removing some is exact, as
``shrink`` removes them (the payoff's ``narrowed``: each RMS norm's weight
and epsilon corrected for the channels it no longer averages over): one
channel is removed on trial (where stacked experts need their widths in
multiples of 16 bytes, as many as that takes) and the copy checked against
the masked model. Where they are no units (a LayerNorm, which centres by
the mean, spans them; the model has no norm), the structure says why for
the kind, which a plan asked for hidden channels repeats.
"""

from __future__ import annotations

from torch import nn

from .. import _graph as graph
from .._payoff import hidden_of, narrowed
from .._units import Member, UnitGroup

__all__ = ["hidden_group"]


def hidden_group(
    fn: str, model: nn.Module, analysis: graph.Analysis, tried_on: tuple[nn.Module, graph.Analysis] | None = None
) -> tuple[UnitGroup | None, str | None]:
    """The ``"hidden"`` group of ``model``, or why it has none.

    ``tried_on``: a copy with fewer blocks and its analysis, whose hidden channels are those of ``model``
    (the caller checked), to try the removal on instead of ``model``.
    """
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    found = hidden_of(analysis, shapes)
    if found is None:
        return None, "no group of channels spans the residual stream whole (no norm couples one)"
    # stacked experts run in torch's grouped matmul, which needs widths in multiples of 16 bytes: remove as many
    align = max(1, 16 // next(model.parameters()).element_size()) if analysis.experts else 1
    on, on_analysis = tried_on if tried_on is not None else (model, analysis)
    trial = narrowed(fn, on, {}, on_analysis, channels=range(found.size - align, found.size))
    if trial.why is not None:
        return None, trial.why
    members = tuple(Member(name, dim, 1) for name, dim in found.members)
    return UnitGroup("hidden", found.size, members), None
