"""Which channel groups the masks remove from a :class:`~._values.ChannelGraph`.

:func:`plan_removal` reads the masks against the graph and returns what each
layer keeps (a :class:`Cut` per layer), refusing a removal that an unknown
op reads; what stays whatever the masks say is listed in ``README.md``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import final

from ._values import ChannelGraph, RoleKind
from .._types import Tensor

__all__ = ["Cut", "Removal", "plan_removal"]

#: The role kinds whose weight rows are output channels.
_ROW_KINDS = ("linear", "conv", "depthwise")


@final
@dataclass(frozen=True, slots=True)
class Cut:
    """The output rows and input columns that one module keeps (``None``: all of them)."""

    kind: RoleKind
    keep_out: tuple[int, ...] | None
    keep_in: tuple[int, ...] | None
    out_size: int
    in_size: int

    def slices(self, name: str) -> Iterator[tuple[str, int, tuple[int, ...], int]]:
        """``(tensor, dim, kept indices, size)`` for each tensor of module ``name`` it slices."""
        if self.keep_out is not None:
            for tensor in ("weight", "bias", "running_mean", "running_var"):
                yield f"{name}.{tensor}", 0, self.keep_out, self.out_size
        if self.keep_in is not None and self.kind in ("linear", "conv"):
            yield f"{name}.weight", 1, self.keep_in, self.in_size


@final
@dataclass(frozen=True, slots=True)
class Removal:
    """What the masks remove from a channel graph.

    Attributes:
        removed: the groups that go, by the atom that names each.
        cuts: what each module that loses channels keeps.
        kept: for each layer whose output channels the masks prune entirely
            but that stay, how many stay for each reason.
    """

    removed: frozenset[int]
    cuts: Mapping[str, Cut]
    kept: Mapping[str, Mapping[str, int]]


def plan_removal(fn: str, graph: ChannelGraph, masks: Mapping[str, Tensor]) -> Removal:
    """The groups that ``masks`` (``torch.bool``, by parameter name) remove, and what stays.

    Args:
        fn: the public function asking, for messages.
        graph: the channel graph of the model.
        masks: the masks, under every name of each masked parameter.

    Raises:
        ValueError: if an op the analysis cannot reason about reads a group that would go.
    """
    pruned = _pruned_rows(graph, masks)
    keepers = _keepers(graph, pruned)
    removed = set(graph.roots) - set(graph.blocked) - set(keepers)
    restored = _keep_one_per_layer(graph, removed)
    _refuse_unknown(fn, graph, removed)
    why = {**{r: f"coupled with channels that {n!r} keeps" for r, n in keepers.items()},
           **restored, **graph.blocked}  # fmt: skip
    kept = _kept(graph, pruned, removed, why)
    return Removal(frozenset(removed), _cuts(graph, removed), kept)


def _pruned_rows(graph: ChannelGraph, masks: Mapping[str, Tensor]) -> dict[str, list[bool]]:
    """For each Linear and Conv with a weight mask, which of its output rows are all pruned."""
    rows: dict[str, list[bool]] = {}
    for name in [n for n, r in graph.roles.items() if r.kind in _ROW_KINDS] + [*graph.fixed]:
        mask = masks.get(f"{name}.weight")
        if mask is not None and mask.dim() > 1:
            rows[name] = (~mask.flatten(1).any(1)).tolist()
    return rows


def _keepers(graph: ChannelGraph, pruned: Mapping[str, list[bool]]) -> dict[int, str]:
    """For each group a layer keeps a channel of, the first such layer."""
    keepers: dict[int, str] = {}
    for atom, (name, row) in graph.produced.items():
        if not (name in pruned and pruned[name][row]):
            keepers.setdefault(graph.roots[atom], name)
    return keepers


def _keep_one_per_layer(graph: ChannelGraph, removed: set[int]) -> dict[int, str]:
    """Keep the first channel of any layer side that would lose them all (in place).

    Returns the groups kept so, each with the reason.
    """
    restored: dict[int, str] = {}
    changed = True
    while changed:
        changed = False
        for name, role in graph.roles.items():
            for side, atoms in (("output", role.out_atoms), ("input", role.in_atoms or ())):
                if atoms and all(graph.roots[a] in removed for a in atoms):
                    removed.discard(graph.roots[atoms[0]])
                    restored[graph.roots[atoms[0]]] = (
                        f"every layer keeps a channel, and the masks prune all the {side} "
                        f"channels of {name!r}"
                    )
                    changed = True
    return restored


def _refuse_unknown(fn: str, graph: ChannelGraph, removed: set[int]) -> None:
    """Refuse, naming the node, if an op shrink cannot reason about reads channels that go."""
    refused = sorted(root for root in removed if root in graph.unknown)
    if not refused:
        return
    node = graph.unknown[refused[0]]
    group = [
        f"{name}[{row}]"
        for atom, (name, row) in graph.produced.items()
        if graph.roots[atom] in refused and graph.unknown.get(graph.roots[atom]) == node
    ]
    shown = ", ".join(group[:6]) + (", ..." if len(group) > 6 else "")
    raise ValueError(
        f"{fn}: {node} reads output channels that the masks prune entirely ({shown}), and "
        f"{fn} cannot tell how it uses them, so it cannot prove that removing them keeps the "
        "outputs; nothing was changed. Keep these channels (leave part of each weight row "
        "unpruned), or write that part of forward with ops funcprune follows (activations, "
        "add, cat, flatten, pooling, Linear, Conv, BatchNorm)"
    )


def _kept(
    graph: ChannelGraph, pruned: Mapping[str, list[bool]], removed: set[int],
    why: Mapping[int, str],
) -> dict[str, dict[str, int]]:  # fmt: skip
    """Per layer, the entirely pruned output channels that stay, counted by reason."""
    kept: dict[str, dict[str, int]] = {}
    for name, rows in pruned.items():
        role = graph.roles.get(name)
        for row in (r for r, is_pruned in enumerate(rows) if is_pruned):
            root = graph.roots[role.out_atoms[row]] if role is not None else None
            if root in removed:
                continue
            reason = graph.fixed[name] if root is None else why.get(root, "kept")
            counts = kept.setdefault(name, {})
            counts[reason] = counts.get(reason, 0) + 1
    return kept


def _cuts(graph: ChannelGraph, removed: set[int]) -> dict[str, Cut]:
    """What each module keeps, for the modules that lose something."""
    cuts: dict[str, Cut] = {}
    for name, role in graph.roles.items():
        keep_out = _kept_indices(graph, role.out_atoms, removed)
        in_atoms = role.in_atoms or ()
        keep_in = _kept_indices(graph, in_atoms, removed)
        if len(keep_out) == len(role.out_atoms) and len(keep_in) == len(in_atoms):
            continue
        cuts[name] = Cut(
            role.kind,
            keep_out if len(keep_out) < len(role.out_atoms) else None,
            keep_in if len(keep_in) < len(in_atoms) else None,
            len(role.out_atoms),
            len(in_atoms),
        )
    return cuts


def _kept_indices(
    graph: ChannelGraph, atoms: tuple[int, ...], removed: set[int]
) -> tuple[int, ...]:
    """The positions in ``atoms`` of the channels that stay."""
    return tuple(i for i, a in enumerate(atoms) if graph.roots[a] not in removed)
