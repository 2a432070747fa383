"""The channel analysis of a model: which channels go together, which stay, and which parameter slices go with them.

:func:`analyze` exports the model (``_export.py``), walks its graph
(``_walk.py`` with the handlers of ``_ops.py``) and reads the result off the
atoms: each *group* (coupled atoms, named by its smallest atom) with the
slices that make it (its rows: output channels) and the reasons it stays,
and, for each parameter or buffer index, the groups it belongs to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import final

import torch
from torch import nn

from .._experts import Router, routers
from ._atoms import Related, Slice
from ._export import Inputs, export_model
from ._ops import OPS
from ._walk import NodeFailed, Walk

__all__ = ["Analysis", "Attention", "Experts", "analyze"]


@final
@dataclass(frozen=True, slots=True)
class Attention:
    """One attention op: where it runs, the group of each of its query heads, and how many groups (KV heads) they form."""

    node: str
    module: str
    heads: tuple[int, ...]  # the group of each query head
    kv_heads: int


@final
@dataclass(frozen=True, slots=True)
class Experts:
    """One MoE layer: its router and experts, and the group of each expert (its router row)."""

    router: Router
    groups: tuple[int, ...]


@final
@dataclass(frozen=True, slots=True)
class Analysis:
    """What the analysis found (groups are named by their smallest atom).

    Attributes:
        model: the analyzed copy of the model (eval mode).
        inputs: the example inputs it ran on.
        made: for each group, the slices that make its atoms (output rows or channels).
        related: for each tensor and dim, the groups each index belongs to.
        blocked: the groups that stay whatever the masks say, and why.
        refused: the groups an op the analysis cannot reason about reads (that op).
        coupled: for groups made all-or-nothing along an axis, the op that did it.
        attention: the attention ops, with their heads' groups.
        experts: the MoE layers, with their experts' groups.
        least: for a tensor's dim, how many indices must stay (at least one
            everywhere; a router's ``top_k`` experts).
        unseen: the parameters in which the walk sees no channel, though an op
            reads them (a weight computed from them by a parametrization or a
            hook: spectral_norm's ``weight_orig``), with the op.
    """

    model: nn.Module
    inputs: Inputs
    made: Mapping[int, tuple[Slice, ...]]
    related: Related
    blocked: Mapping[int, str]
    refused: Mapping[int, str]
    coupled: Mapping[int, str]
    attention: tuple[Attention, ...]
    experts: tuple[Experts, ...]
    least: Mapping[tuple[str, int], int]
    unseen: Mapping[str, str]


def analyze(fn: str, module: nn.Module, inputs: Inputs) -> Analysis:
    """The channel analysis of ``module`` on ``inputs`` (a copy of it, in eval mode).

    Raises:
        ValueError: if the model fails on the inputs, cannot be exported, or
            an op's handler fails on a graph stranger than it expects (naming the node).
    """
    exported = export_model(fn, module, inputs)
    layers = routers(exported.model)
    walk = Walk(exported, OPS, layers)
    try:
        walk.run()
    except NodeFailed as e:
        raise ValueError(f"{fn}: cannot follow the channels through {e}") from None
    atoms = walk.atoms
    roots = atoms.roots()
    for name, node in walk.read_directly.items():  # a parameter read as a value: its channels stay
        for by_index in atoms.related().get(name, {}).values():
            for group in by_index.values():
                for atom in group:
                    atoms.blocked.setdefault(atom, f"{node} reads {name!r} directly")
    made: dict[int, list[Slice]] = {}
    for atom, slices in atoms.producers.items():
        made.setdefault(roots[atom], []).extend(slices)
    related = {
        t: {d: {i: frozenset(roots[a] for a in group) for i, group in by.items()} for d, by in dims.items()}
        for t, dims in atoms.related().items()
    }
    return Analysis(
        exported.model,
        inputs,
        {root: tuple(dict.fromkeys(slices)) for root, slices in made.items()},
        related,
        _by_root(atoms.blocked, roots),
        _by_root(atoms.refused, roots),
        atoms.why_coupled(roots),
        tuple(_attention(walk, roots)),
        tuple(_experts(layers, related)),
        {(layer.weight, 0): layer.top_k for layer in layers},
        {name: node for name, node in walk.read_directly.items() if name not in related},
    )


def _by_root(reasons: Mapping[int, str], roots: list[int]) -> dict[int, str]:
    out: dict[int, str] = {}
    for atom, why in sorted(reasons.items()):
        out.setdefault(roots[atom], why)
    return out


def _attention(walk: Walk, roots: list[int]) -> list[Attention]:
    found = []
    for node, ids in walk.ids.items():
        if getattr(node.target, "overloadpacket", None) is not torch.ops.aten.scaled_dot_product_attention or ids is None:
            continue
        heads = ids.shape[-3]
        groups = tuple(roots[int(a)] if int(a) >= 0 else -1 for a in ids.movedim(-3, 0).reshape(heads, -1).amax(1))
        found.append(Attention(node.name, str(node.meta.get("funcprune_module", "")), groups, len(set(groups))))
    return found


def _experts(layers: tuple[Router, ...], related: Related) -> list[Experts]:
    found = []
    for layer in layers:
        by_index = related.get(layer.weight, {}).get(0, {})
        if len(by_index) == layer.count:
            found.append(Experts(layer, tuple(min(by_index[e]) for e in range(layer.count))))
    return found
