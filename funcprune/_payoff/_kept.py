"""What shrink keeps that the masks prune entirely, said: :class:`KeptChannelsWarning` and its messages."""

from __future__ import annotations

import warnings
from collections.abc import Mapping

__all__ = ["CHANGES_OUTPUTS", "KeptChannelsWarning", "warn_blocks_kept", "warn_kept"]

#: How many layers a :class:`KeptChannelsWarning` names.
LAYERS_SHOWN = 5
#: Why a group stays whose removal changed the model's outputs on the example inputs.
CHANGES_OUTPUTS = (
    "removing them changes the model's outputs on the example inputs (a size the code spells out "
    "or reads off a shape: x.view(-1, 400), x / x.shape[1], x[..., :4]...)"
)


class KeptChannelsWarning(UserWarning):
    """Output channels that the masks prune entirely, but that shrink must keep.

    They stay in the shrunk model (their weights zero, their compute paid)
    and the closure adds nothing for them. The message names each layer,
    how many of its channels stay, and why: a model output, an op that
    reads all the channels (LayerNorm, a reduction...), a size the code
    spells out, a channel coupled with one that another layer keeps.
    """

    __module__ = "funcprune"


def warn_blocks_kept(fn: str, kept: Mapping[str, str]) -> None:
    """A :class:`KeptChannelsWarning` naming the blocks whose every parameter the masks prune, that stay."""
    if kept:
        blocks = ", ".join(repr(b) for b in list(kept)[:LAYERS_SHOWN]) + (" ..." if len(kept) > LAYERS_SHOWN else "")
        warnings.warn(
            f"{fn}: {len(kept)} block{'s' if len(kept) > 1 else ''} whose every parameter the masks prune "
            f"stay{'s' if len(kept) == 1 else ''}, weights zero but compute paid: {blocks}: {next(iter(kept.values()))}",
            KeptChannelsWarning,
            stacklevel=4,
        )


def warn_kept(fn: str, kept: Mapping[str, Mapping[str, int]]) -> None:
    """A :class:`KeptChannelsWarning` listing ``kept``, at most :data:`LAYERS_SHOWN` layers."""
    if not kept:
        return
    total = sum(n for reasons in kept.values() for n in reasons.values())
    layers = [
        f"{name!r} keeps " + ", ".join(f"{n} ({why})" for why, n in reasons.items())
        for name, reasons in list(kept.items())[:LAYERS_SHOWN]
    ]
    more = f"; and {len(kept) - LAYERS_SHOWN} more layers" if len(kept) > LAYERS_SHOWN else ""
    warnings.warn(
        f"{fn}: {total} output channel{'s' if total > 1 else ''} that the masks prune "
        f"entirely stay, weights zero but compute paid: {'; '.join(layers)}{more}. To silence "
        "this, leave such channels unpruned (an output layer: leave it out of the masks), or "
        "change what keeps them",
        KeptChannelsWarning,
        stacklevel=4,
    )
