"""Which groups the masks remove from an :class:`~._analysis.Analysis`, and what every tensor keeps.

A group goes when the masks prune every slice that makes it (each row of
each layer whose output channels are its atoms) and nothing keeps it; an
index of a tensor goes when every group it belongs to goes. Kept, whatever
the masks say: a blocked group (a model output, a divisor...: the analysis
records the reason), a group coupled with a channel that some layer keeps,
and the first index of a tensor side that would lose them all (torch cannot
run a layer without channels). A group that would go but that an op the
analysis cannot reason about reads is refused: :func:`plan_removal` raises a
ValueError naming the op.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import final

import torch

from .._types import Tensor
from ._analysis import Analysis
from ._atoms import Slice

__all__ = ["Removal", "closure", "dropped_indices", "kept_indices", "own_indices", "plan_removal"]


@final
@dataclass(frozen=True, slots=True)
class Removal:
    """What the masks remove.

    Attributes:
        removed: the groups that go.
        candidates: the groups the masks prune entirely (those that go, and
            those kept for a reason below).
        kept: for each layer (module) whose output channels the masks prune
            entirely but that stay, how many stay for each reason.
    """

    removed: frozenset[int]
    candidates: frozenset[int]
    kept: Mapping[str, Mapping[str, int]]


def plan_removal(
    fn: str, analysis: Analysis, masks: Mapping[str, Tensor], sizes: Mapping[str, tuple[int, ...]],
    *, vetoed: Mapping[int, str] | None = None,
) -> Removal:  # fmt: skip
    """The groups that ``masks`` (``torch.bool``, by first name) remove, and what stays.

    Args:
        fn: the public function asking, for messages.
        analysis: the model's channel analysis.
        masks: the masks.
        sizes: the shape of each parameter and buffer, by first name.
        vetoed: groups to keep anyway, with the reason (those whose removal
            changed the model's outputs).

    Raises:
        ValueError: if an op the analysis cannot reason about reads a group that would go.
    """
    empty = _EmptyIndices(masks)
    touched: dict[int, list[bool]] = {}  # each group the masks prune a slice of: which of its slices (one pass)
    candidates: set[int] = set()
    for group, slices in analysis.made.items():
        flags = [empty.has(s) for s in slices]
        if any(flags):
            touched[group] = flags
            if all(flags):
                candidates.add(group)
    why: dict[int, str] = {}
    for group, flags in touched.items():
        if group not in candidates:
            keeper = analysis.made[group][flags.index(False)]
            why[group] = analysis.coupled.get(group) or f"coupled with channels that {_module(keeper.tensor)!r} keeps"
    removed = set(candidates) - set(analysis.blocked) - set(vetoed or {})
    why.update(analysis.blocked)
    why.update(vetoed or {})
    why.update(_keep_least(analysis, removed, sizes))
    _refuse_unknown(fn, analysis, removed)
    kept = _kept(analysis, touched, removed, why)
    for name, node in analysis.unseen.items():
        mask = masks.get(name)
        rows = 0 if mask is None or mask.dim() < 2 else int((~mask.flatten(1).any(1)).sum())
        if rows:
            reason = f"{node} computes with {name!r}: no channel of it can be followed (a parametrization, a hook...)"
            kept.setdefault(_module(name), {})[reason] = rows
    return Removal(frozenset(removed), frozenset(candidates), kept)


class _EmptyIndices:
    """Whether the masks prune a slice whole (every entry of its index): one ``any`` per mask and dim, read as a
    list, instead of one ``select(...).any()`` per slice (394,000 of them, 2.3 s, on a 1.1B Llama)."""

    def __init__(self, masks: Mapping[str, Tensor]) -> None:
        self._masks = masks
        self._flags: dict[tuple[str, int], list[bool] | None] = {}

    def has(self, s: Slice) -> bool:
        key = (s.tensor, s.dim)
        if key not in self._flags:
            self._flags[key] = _empty_indices(self._masks.get(s.tensor), s.dim)
        flags = self._flags[key]
        return flags is not None and flags[s.index]


def _empty_indices(mask: Tensor | None, dim: int) -> list[bool] | None:
    """For each index of ``mask``'s dim ``dim``, whether it prunes every entry there (``None``: no such dim)."""
    if mask is None or mask.dim() <= dim:
        return None
    others = tuple(d for d in range(mask.dim()) if d != dim)
    if not others:
        return (~mask.bool()).tolist()
    if any(mask.shape[d] == 0 for d in others):  # nothing to keep at any index
        return [True] * mask.shape[dim]
    # a bool mask's bytes are 0 or 1: their largest over the other dims is ``any``, read at the memory's speed
    # (torch's ``any`` over bool runs about 15x slower here)
    alive = mask.view(torch.uint8).amax(dim=others) if mask.dtype == torch.bool else mask.any(dim=others)
    flags: list[bool] = (alive == 0).tolist()
    return flags


def _module(tensor: str) -> str:
    return tensor.rpartition(".")[0]


def _keep_least(analysis: Analysis, removed: set[int], sizes: Mapping[str, tuple[int, ...]]) -> dict[int, str]:
    """Keep the first indices' groups of any tensor dim that would keep too few (in place).

    One index at least (torch runs no layer without channels); a router's
    ``top_k`` experts (``analysis.least``).
    """
    restored: dict[int, str] = {}
    changed = True
    while changed:
        changed = False
        for tensor, dims in analysis.related.items():
            shape = sizes.get(tensor)
            for dim, by_index in dims.items():
                if shape is None or len(by_index) < shape[dim] or not shape[dim]:
                    continue
                least = min(analysis.least.get((tensor, dim), 1), shape[dim])
                gone = sorted(i for i, groups in by_index.items() if groups <= removed)
                for index in gone[: max(0, least - (shape[dim] - len(gone)))]:
                    removed.difference_update(by_index[index])
                    for group in by_index[index]:
                        restored[group] = (
                            f"every layer keeps a channel, and the masks prune all the channels of "
                            f"{tensor!r} along dim {dim}"
                            if least == 1
                            else f"{tensor!r} keeps {least} indices along dim {dim} (top_k experts are routed to)"
                        )
                    changed = True
    restored.update(_even(analysis, removed))
    return restored


def _even(analysis: Analysis, removed: set[int]) -> dict[int, str]:
    """Keep, in each expert group of a router that routes by groups, the first experts beyond what the group that
    loses fewest loses (in place), as :func:`~funcprune._experts.removed_experts` does in the masked model."""
    restored: dict[int, str] = {}
    for layer in analysis.experts:
        router, parts = layer.router, layer.router.groups
        if parts == 1:
            continue
        each = router.count // parts
        runs = [layer.groups[p * each : (p + 1) * each] for p in range(parts)]
        gone = [[g for g in run if g in removed] for run in runs]
        allowed = min(min(len(g) for g in gone), each - router.least // parts)
        for run in gone:
            for group in run[: len(run) - allowed]:
                removed.discard(group)
                restored[group] = (
                    f"the router {router.module!r} routes by {parts} expert groups, which lose experts evenly "
                    f"({allowed} each here, keeping {router.least // parts} at least)"
                )
    return restored


def _refuse_unknown(fn: str, analysis: Analysis, removed: set[int]) -> None:
    """Refuse, naming the op, if an op the analysis cannot reason about reads channels that go."""
    refused = sorted(g for g in removed if g in analysis.refused)
    if not refused:
        return
    op = analysis.refused[refused[0]]
    shown = [f"{_module(s.tensor)}[{s.index}]" for g in refused if analysis.refused[g] == op for s in analysis.made[g]]
    text = ", ".join(shown[:6]) + (", ..." if len(shown) > 6 else "")
    raise ValueError(
        f"{fn}: {op} reads output channels that the masks prune entirely ({text}), and "
        f"{fn} cannot tell how it uses them, so it cannot prove that removing them keeps the "
        "outputs; nothing was changed. Keep these channels (leave part of each weight row "
        "unpruned), or write that part of forward with ops funcprune follows (activations, "
        "add, cat, flatten, pooling, Linear, Conv, BatchNorm, attention)"
    )


def _kept(analysis: Analysis, touched: Mapping[int, list[bool]], removed: set[int],
          why: Mapping[int, str]) -> dict[str, dict[str, int]]:  # fmt: skip
    """Per layer, the entirely pruned output channels that stay, counted by reason (``touched``: the groups the
    masks prune a slice of, which of their slices, in the order of ``analysis.made``)."""
    kept: dict[str, dict[str, int]] = {}
    for group, flags in touched.items():
        if group in removed:
            continue
        for s, pruned in zip(analysis.made[group], flags, strict=True):
            if pruned:
                counts = kept.setdefault(_module(s.tensor), {})
                reason = why.get(group, "kept")
                counts[reason] = counts.get(reason, 0) + 1
    return kept


def own_indices(analysis: Analysis) -> dict[int, dict[tuple[str, int], list[int]]]:
    """For each group, the indices of each tensor's dims that belong to it alone, ascending (read-only).

    Those go when the group goes by itself (an index shared by several
    groups, a per-head-dim norm's weight, goes only when all of them go).
    :func:`~._analysis.analyze` makes them in the pass that relates indices
    to groups, once (``structure``, its checks and ``shrink`` each ask: 0.08
    s each on a ResNet-18, when each made them again).
    """
    own: dict[int, dict[tuple[str, int], list[int]]] = analysis.derived["own_indices"]  # made by analyze
    return own


def kept_indices(analysis: Analysis, removed: Iterable[int], sizes: Mapping[str, tuple[int, ...]]) -> dict[str, dict[int, list[int]]]:
    """For each tensor that loses something, the indices each of its dims keeps."""
    removed = set(removed)
    out: dict[str, dict[int, list[int]]] = {}
    for tensor, dims in analysis.related.items():
        shape = sizes.get(tensor)
        if shape is None:
            continue
        for dim, by_index in dims.items():
            gone = {i for i, groups in by_index.items() if groups <= removed}
            if gone:
                out.setdefault(tensor, {})[dim] = [i for i in range(shape[dim]) if i not in gone]
    return out


def closure(masks: Mapping[str, Tensor], keep: Mapping[str, Mapping[int, list[int]]], params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``masks`` with every entry of a removed index pruned (parameters only), in ``params``' order."""
    out = dict(masks)
    for name, dims in keep.items():
        param = params.get(name)
        if param is None:
            continue
        mask = out.get(name)
        mask = torch.ones_like(param, dtype=torch.bool) if mask is None else mask.clone()
        for dim, kept in dims.items():
            mask.index_fill_(dim, dropped_indices(kept, param.shape[dim]).to(mask.device), False)
        out[name] = mask
    return {name: out[name] for name in params if name in out}


def dropped_indices(kept: Sequence[int], size: int) -> Tensor:
    """The indices of ``range(size)`` that ``kept`` (one dim's, from :func:`kept_indices`) leaves out, ascending."""
    dropped = torch.ones(size, dtype=torch.bool)
    dropped[list(kept)] = False
    return dropped.nonzero().flatten()
