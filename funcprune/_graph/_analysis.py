"""The channel analysis of a model: which channels go together, which stay, and which parameter slices go with them.

:func:`analyze` exports the model (``_export.py``), walks its graph
(``_walk.py`` with the handlers of ``_ops.py``) and reads the result off the
atoms: each *group* (coupled atoms, named by its smallest atom) with the
slices that make it (its rows: output channels) and the reasons it stays,
and, for each parameter or buffer index, the groups it belongs to.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, final

from torch import nn

from .._experts import Router, routers
from ._atoms import Related, Slice
from ._export import Exported, Inputs, export_model
from ._ops import OPS
from ._walk import NodeFailed, Walk

__all__ = ["Analysis", "Attention", "Experts", "UnreachedWarning", "analyze", "warn_unreached"]


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
            everywhere; a router's ``top_k`` experts, or its :attr:`~.Router.least`
            where it routes by expert groups).
        unseen: the parameters in which the walk sees no channel, though an op
            reads them (a weight computed from them by a parametrization or a
            hook: spectral_norm's ``weight_orig``), with the op.
        read: the groups that a layer reads as its input channels (weight columns).
        unreached: the parameters that nothing in the graph reads: the example
            inputs never reach the code that uses them (a second task head
            chosen by a keyword argument), so no channel of theirs is known.
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
    read: frozenset[int] = frozenset()
    unreached: tuple[str, ...] = ()
    #: What is computed once from the analysis and asked for again (``own_indices``'s), by what it is.
    derived: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


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
    by_atoms = atoms.related()
    for name, node in walk.read_directly.items():  # a parameter read as a value: its channels stay
        for atoms_of in by_atoms.get(name, {}).values():
            for group in atoms_of.values():
                for atom in (group,) if isinstance(group, int) else group:
                    atoms.blocked.setdefault(atom, f"{node} reads {name!r} directly")
    made: dict[int, list[Slice]] = {}
    for atom, made_by in atoms.producers.items():
        made.setdefault(roots[atom], []).append(made_by)
    related: dict[str, dict[int, dict[int, frozenset[int]]]] = {}
    own: dict[int, dict[tuple[str, int], list[int]]] = {}  # own_indices', made in the same pass
    of_group: dict[frozenset[int], frozenset[int]] = {}  # each group of atoms' roots, made once (many indices share it)
    of_root: dict[int, frozenset[int]] = {}  # an index of one atom (most of them): its group, by its root
    for t, dims in by_atoms.items():
        by_dim: dict[int, dict[int, frozenset[int]]] = {}
        related[t] = by_dim
        for d, by in dims.items():
            by_index: dict[int, frozenset[int]] = {}
            by_dim[d] = by_index
            alone: dict[int, list[int]] = {}  # this dim's indices of one group, by the group
            for i, group in by.items():
                if isinstance(group, int):  # one atom (most indices)
                    root = roots[group]
                    groups = of_root.get(root)
                    if groups is None:
                        groups = of_root[root] = frozenset((root,))
                    by_index[i] = groups
                    alone.setdefault(root, []).append(i)
                    continue
                key = frozenset(group)
                groups = of_group.get(key)
                if groups is None:
                    groups = of_group[key] = frozenset([roots[a] for a in group])
                by_index[i] = groups
                if len(groups) == 1:
                    (root,) = groups
                    alone.setdefault(root, []).append(i)
            for root, indices in alone.items():
                own.setdefault(root, {})[(t, d)] = indices
    for feet in own.values():
        for indices in feet.values():
            indices.sort()
    return Analysis(
        exported.model,
        inputs,
        {root: tuple(dict.fromkeys(slices)) if len(slices) > 1 else tuple(slices) for root, slices in made.items()},
        related,
        _by_root(atoms.blocked, roots),
        _by_root(atoms.refused, roots),
        atoms.why_coupled(roots),
        tuple(_attention(walk, roots)),
        tuple(_experts(layers, related)),
        {(layer.weight, 0): layer.least for layer in layers},
        {name: node for name, node in walk.read_directly.items() if name not in related},
        frozenset(roots[a] for a in atoms.read),
        _unreached(exported),
        {"own_indices": own},
    )


class UnreachedWarning(UserWarning):
    """Parameters that the example inputs never reach: which channels they read is unknown.

    A second task head chosen by a keyword argument, a branch the inputs do
    not take: the analysis sees only the code the example inputs run, so a
    shrunk model may fail, or compute something else, on inputs that reach
    these parameters. Pass example inputs that reach every path (or prune a
    model without them).
    """

    __module__ = "funcprune"


#: How many parameters an :class:`UnreachedWarning` names.
_NAMED = 6


def warn_unreached(fn: str, analysis: Analysis, *, stacklevel: int) -> None:
    """An :class:`UnreachedWarning` naming the parameters of ``analysis`` its example inputs never reach."""
    if not analysis.unreached:
        return
    names = ", ".join(repr(n) for n in analysis.unreached[:_NAMED])
    more = f" and {len(analysis.unreached) - _NAMED} more" if len(analysis.unreached) > _NAMED else ""
    warnings.warn(
        f"{fn}: the example inputs never reach {names}{more}: which channels they read is unknown, and the "
        f"result is checked only on the paths the inputs take; code that reaches them (a second head chosen by "
        "an argument, another branch) may fail or compute something else. Pass example inputs that reach every "
        "path",
        UnreachedWarning,
        stacklevel=stacklevel + 1,
    )


def _unreached(exported: Exported) -> tuple[str, ...]:
    """The parameters whose placeholders nothing reads, in the order of the model's parameters."""
    read = {name for node, name in exported.tensors.items() if node.users}
    return tuple(name for name, _ in exported.model.named_parameters() if name not in read)


def _by_root(reasons: Mapping[int, str], roots: list[int]) -> dict[int, str]:
    out: dict[int, str] = {}
    for atom, why in sorted(reasons.items()):
        out.setdefault(roots[atom], why)
    return out


def _attention(walk: Walk, roots: list[int]) -> list[Attention]:
    """The attention ops: each op whose batch positions carry heads (``walk.heads``), once per set of heads.

    The heads lie along the batch dims whose groups vary (``(batch, heads)``, or one dim of ``batch *
    heads``, cut at the period of its groups); an attention's scores and output (two matmuls, or one
    ``scaled_dot_product_attention``) give the same heads, recorded once.
    """
    found: dict[tuple[int, ...], Attention] = {}
    for node, ids in walk.heads.items():  # each head's atom when the op ran: its own, before later ops coupled them
        varying = [d for d in range(ids.dim()) if not bool((ids == ids.narrow(d, 0, 1)).all())]
        if not varying:
            continue
        index = tuple(slice(None) if d in varying else 0 for d in range(ids.dim()))
        sequence = ids[index].reshape(-1).tolist()
        atoms = sequence[: _period(sequence)] if len(varying) == 1 else sequence
        heads = tuple(roots[a] if a >= 0 else -1 for a in atoms)
        if heads not in found:
            found[heads] = Attention(node.name, str(node.meta.get("funcprune_module", "")), heads, len(set(heads) - {-1}))
    return list(found.values())


def _period(sequence: list[int]) -> int:
    """The shortest period of ``sequence`` that divides its length (``batch * heads`` laid out batch-major)."""
    n = len(sequence)
    for p in range(1, n + 1):
        if n % p == 0 and sequence == sequence[:p] * (n // p):
            return p
    return n


def _experts(layers: tuple[Router, ...], related: Related) -> list[Experts]:
    found = []
    for layer in layers:
        by_index = related.get(layer.weight, {}).get(0, {})
        if len(by_index) == layer.count:
            found.append(Experts(layer, tuple(min(by_index[e]) for e in range(layer.count))))
    return found
