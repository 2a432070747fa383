"""A model's unit groups, read off its channel analysis and tried: :func:`structure`.

The units are read off the analysis (``_read.py``); each unit group is
tried as ``shrink`` would remove one of its units, whole blocks and a
hidden channel too, on the model or on a copy with fewer blocks
(:func:`_on_copy`), and what cannot go is left out, with one
:class:`UnitsLeftOutWarning` saying why.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import final

from torch import nn

from .. import _graph as graph
from .._collector import paused
from .._names import check_not_hooked
from .._payoff import hidden_of, removable
from .._targets import output_parameters
from .._torch_private import ConvNd
from .._units import Structure, UnitGroup
from .._validate import refuse_in
from ._hidden import hidden_group
from ._layers import layer_groups
from ._read import Found, found_units
from ._shadow import on_meta, shadow_structure, shallow_copy, standing_for

__all__ = ["UnitsLeftOutWarning", "structure"]


def structure(model: nn.Module, example_inputs: object, *, outputs: bool = False) -> Structure:
    """The structural units of ``model``: MLP channels, attention heads, KV groups, experts, layers, hidden size.

    The model is exported and analyzed as :func:`~funcprune.shrink` does
    (a copy, in eval mode, run on ``example_inputs``), and every group of
    channels that can go becomes a *unit*. Units alike (same kind, same
    parameters) form a :class:`~funcprune.UnitGroup`, named by the module
    they live in:

    - ``"channels"``: the hidden channels of an MLP (a gated MLP's
      ``gate_proj`` and ``up_proj`` rows with the ``down_proj`` column;
      GPT-2's ``c_fc`` column and ``c_proj`` row), or of any Linear or Conv
      whose outputs another layer reads and can go;
    - ``"heads"``: attention heads (the query, key and value rows of a head
      and the output projection's columns that read it), read off what the
      graph computes, whatever runs it (SDPA, eager matmul and softmax,
      BLOOM's ``baddbmm``, MLA's split of ``kv_b_proj``);
    - ``"kv_groups"``: under grouped-query attention, a key/value head with
      the query heads that read it (heads alone cannot go: the query
      heads of one KV group go together with it);
    - ``"experts"``: the experts of a mixture-of-experts layer (each
      expert's index of the stacked expert weights with its row of the
      router's weight). A removed expert is never routed to; at least
      ``top_k`` experts stay (the group's ``least``). The hidden channels
      of the experts are no units: their weights are stacked in one tensor
      (one width for all experts), which torch's grouped matmul, that
      transformers runs them with, needs in multiples of 16 bytes.

    What is listed can go: one unit of every group is removed from a copy
    of the model, as :func:`~funcprune.shrink` removes it, and the copy is
    checked against the masked model on the example inputs; groups whose
    removal fails are left out. The copy shares the model's tensors, cut to
    views where what stays is one run (the last unit goes). In a stack of
    repeated blocks, the groups of the first two blocks of each kind and of
    the last block are tried, and those of the other blocks stand by the
    same group of the first block of their kind (blocks of one kind as for
    a model on the meta device, below): a block whose code depends on its
    index alone is not told apart, and :func:`~funcprune.shrink`, which
    checks what it builds, keeps what breaks it, with a warning. What
    stays whatever the masks say is left out too: the model's outputs,
    channels read by an op the analysis cannot follow, and a unit that is
    all of a layer's side (an attention with one KV group).

    Two kinds cut the other axes, pruned only where a plan names them:

    - ``"layers"``: each stack of repeated blocks (a ``ModuleList`` of one
      class) is a group named by its path, whose units are the blocks that
      can go (a pre-norm residual block, zeroed, is the identity; post-norm
      blocks are left out, with a warning); each block's parameters are
      members of its unit alone (``Member.unit``);
    - ``"hidden"``: the channels of the residual stream, one group named
      ``"hidden"`` (the embedding's columns, the norms on the stream, the
      columns of what reads it and the rows of what writes it), where
      ``shrink`` can correct the norms that span them (RMS norms); where it
      cannot (LayerNorm), :attr:`~funcprune.Structure.left_out` says why,
      and a plan asked for them repeats it. So are the channels an output
    layer makes (BERT's pooler), as :func:`~funcprune.prunable` leaves
    output layers out, unless ``outputs=True``.

    A transformers model built on the meta device (shapes, no values: one
    too large to instantiate) is read off a smaller copy with values: each
    stack keeps the first two blocks of each kind of block (modules,
    attributes, tensors and per-layer config entries agreeing) and its last
    one, the copy is built from the config on the CPU (seeded) and analyzed,
    and its groups are mapped onto every block of their kind: the result is
    the structure of the model with values. Example inputs on meta are read
    as seeded random values (token ids below ``vocab_size``, masks of ones).
    Warnings say they were read on the copy.

    Args:
        model: the model (not modified). Not in hook mode, no DTensors. On
            the meta device: a transformers model (see above).
        example_inputs: the inputs of ``forward``, as for :func:`~funcprune.shrink`:
            a tensor, a tuple of positional arguments, or a dict of keyword
            arguments (transformers models run with ``use_cache=False``).
        outputs: whether the channels of output layers (a transformers
            model's task head, its pooler, its output embeddings) are units.

    Returns:
        A :class:`~funcprune.Structure`: group names to unit groups, in the
        order of the model's parameters.

    Raises:
        TypeError: if ``model`` is not a module or ``example_inputs`` not
            a tensor, a tuple of tensors or a dict.
        ValueError: if the model is pruned in hook mode, does not run on
            the inputs, or cannot be exported; a model on the meta device
            that is no transformers model, that its config does not build
            with fewer blocks, or whose blocks of one kind give different
            groups.

    Warns:
        UnitsLeftOutWarning: naming what a user would look for and does not
            get, and why: groups whose removal fails, the heads of an
            attention that cannot go, repeated blocks with no unit.
        UnreachedWarning: naming the parameters the example inputs never
            reach.

    >>> import torch, funcprune as fp
    >>> from torch import nn
    >>> mlp = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    >>> s = fp.structure(mlp, torch.randn(1, 4))
    >>> s
    Structure(0: 6 channels)
    >>> s["0"].members
    (Member(name='0.weight', dim=0, width=1, start=0), Member(name='0.bias', dim=0, width=1, start=0), Member(name='2.weight', dim=1, width=1, start=0))
    """
    fn = "structure"
    if not isinstance(model, nn.Module):
        raise TypeError(f"{fn}: model must be a torch.nn.Module, got {type(model).__name__}")
    check_not_hooked(fn, model, then=f"{fn}(model, example_inputs)")
    refuse_in(fn, dict(model.named_parameters()))
    if not isinstance(outputs, bool):
        raise TypeError(f"{fn}: outputs must be a bool, got {outputs!r}")
    if on_meta(model):  # no values to run on: read off a smaller copy with values
        return shadow_structure(fn, model, example_inputs, outputs, lambda m, x, o: structure(m, x, outputs=o))
    with paused():  # hundreds of thousands of small objects made: no collection walks the model for each few hundred
        return _structure(fn, model, example_inputs, outputs)


def _structure(fn: str, model: nn.Module, example_inputs: object, outputs: bool) -> Structure:
    """:func:`structure` of a model with values, its arguments checked."""
    memo = graph.analyzed(fn, model, graph.as_inputs(fn, model, example_inputs))
    analysis = memo.analysis
    graph.warn_unreached(fn, analysis, stacklevel=2)
    heads = set() if outputs else output_parameters(model)
    excluded = {name for name, p in model.named_parameters() if id(p) in heads}
    found = found_units(analysis, {name: tuple(p.shape) for name, p in model.named_parameters()}, excluded)
    standing = standing_for(model, list(found.groups))  # a block's groups tried once per kind of block
    representatives = list(dict.fromkeys(standing.values()))
    trials = _on_copy(fn, model, analysis, found, representatives, outputs) if _SHALLOW_TRIALS else None
    if trials is None:  # tried on the model itself
        tried = removable(model, analysis, {name: _tried_units(*found.groups[name]) for name in representatives})
        layers, stacks_left = layer_groups(fn, model, analysis.inputs, excluded)
        hidden, why = hidden_group(fn, model, analysis)
    else:
        tried, layers, stacks_left = trials.tried, trials.layers, trials.stacks_left
        hidden, why = trials.hidden, trials.hidden_why
    failed = {name: tried[by] for name, by in standing.items() if by in tried}
    left = {name: f"removing one changes what the model computes ({why})" for name, why in failed.items()}
    groups = {name: group for name, (group, _) in found.groups.items() if name not in failed}
    _warn_left_out(fn, model, analysis, found, left, groups, stacks_left)
    groups.update({(f"{name}#layers" if name in groups else name): g for name, g in layers.items()})
    if hidden is not None:
        groups["hidden" if "hidden" not in groups else "hidden#2"] = hidden
    found_structure = Structure(groups, {"hidden": why} if why is not None else {})
    object.__setattr__(found_structure, "_analyzed", memo)  # for shrink(..., structure=): never pickled or compared
    return found_structure


#: Whether the trials of a deep model run on a copy with fewer blocks (:func:`_on_copy`); tests compare both ways.
_SHALLOW_TRIALS = True


def _tried_units(group: UnitGroup, units: Sequence[int]) -> Sequence[int]:
    """The units of a group its trial removes: the last (of each part, where parts lose evenly), which the probe
    cuts to views."""
    return units[len(units) // group.parts - 1 :: len(units) // group.parts]


@final
@dataclass(frozen=True, slots=True)
class _Trials:
    """What the trials of :func:`structure` found, by the full model's names.

    Attributes:
        tried: each unit group tried whose removal fails, with why.
        layers: the ``"layers"`` groups, by stack.
        stacks_left: the stacks (or blocks) of no ``"layers"`` unit, with why.
        hidden: the ``"hidden"`` group, or ``None``.
        hidden_why: why there is none.
    """

    tried: dict[str, str]
    layers: dict[str, UnitGroup]
    stacks_left: dict[str, str]
    hidden: UnitGroup | None
    hidden_why: str | None


def _on_copy(
    fn: str, model: nn.Module, analysis: graph.Analysis, found: Found, representatives: Sequence[str], outputs: bool
) -> _Trials | None:  # fmt: skip
    """The trials of a deep transformers model run on a copy with fewer blocks (its shadow's, sharing its tensors),
    mapped back; ``None`` where there is no such copy or its groups are not the model's.

    Every trial already stands one block of each kind for the others (:func:`standing_for`); on the copy, the
    blocks that are not tried are gone too, so each run costs a few blocks, not the model. The copy is analyzed
    and taken only where each group tried is the model's, renamed (members, widths, parts), and the hidden
    channels are as many and lie in the same tensors; what a trial says about the copy is said of the model, its
    texts renamed.
    """
    shallow = shallow_copy(fn, model)
    if shallow is None:
        return None
    small = shallow.model
    try:
        small_analysis = graph.analyze(fn, small, analysis.inputs)
    except ValueError:
        return None
    heads = set() if outputs else output_parameters(small)
    excluded = {name for name, p in small.named_parameters() if id(p) in heads}
    shapes = {name: tuple(p.shape) for name, p in small.named_parameters()}
    in_copy = found_units(small_analysis, shapes, excluded)
    names: dict[str, str] = {}
    for name in representatives:
        there = shallow.to_copy(name)
        if there is None or there not in in_copy.groups:
            return None
        if shallow.group_in_copy(found.groups[name][0]) != in_copy.groups[there][0]:  # members, widths, parts...
            return None
        names[name] = there
    full_hidden = hidden_of(analysis, {name: tuple(p.shape) for name, p in model.named_parameters()})
    copy_hidden = hidden_of(small_analysis, shapes)
    if (full_hidden is None) != (copy_hidden is None):
        return None
    if full_hidden is not None and copy_hidden is not None:  # as many channels, in the copy's share of the tensors
        kept = [(there, dim) for name, dim in full_hidden.members if (there := shallow.to_copy(name)) is not None]
        if full_hidden.size != copy_hidden.size or kept != list(copy_hidden.members):
            return None
    text = shallow.mapping.text
    tried = removable(small, small_analysis, {names[n]: _tried_units(*in_copy.groups[names[n]]) for n in representatives})
    layers, stacks_left = layer_groups(fn, small, analysis.inputs, excluded)
    hidden, why = hidden_group(fn, model, analysis, (small, small_analysis))
    return _Trials(
        {name: text(tried[names[name]]) for name in representatives if names[name] in tried},
        {name: shallow.mapping.layers(name, group) for name, group in layers.items()},
        {path: text(reason) for path, reason in stacks_left.items()},
        hidden,
        None if why is None else text(why),
    )


def _warn_left_out(
    fn: str, model: nn.Module, analysis: graph.Analysis, found: Found, left: Mapping[str, str],
    listed: Mapping[str, UnitGroup], stacks: Mapping[str, str],
) -> None:  # fmt: skip
    """One :class:`UnitsLeftOutWarning` naming what a user would look for and does not get, and why.

    The heads of each attention op that none of the listed groups holds, the
    unit groups whose trial removal failed, and each repeated block (a layer
    of a ``ModuleList``) holding layers of which no unit was found.
    """
    lines = [f"{name!r} ({found.groups[name][0].kind}): {why}" for name, why in left.items()]
    lines += [f"the blocks of {path!r} (layers): {why}" for path, why in stacks.items()]
    units = {u for name in listed for u in found.groups[name][1]}
    failed = {u for name in left for u in found.groups[name][1]}  # said already, as their group
    for attention in analysis.attention:
        heads = [g for g in attention.heads if g >= 0]
        if heads and not any(g in units or g in failed for g in heads):
            why = next((found.left_out[g] for g in heads if g in found.left_out), "they are no unit")
            lines.append(f"the heads of {attention.module or 'the model'!r}: {why}")
    blocks = _repeated_blocks(model)
    inside_of = _groups_inside(analysis, blocks)
    for block in blocks:
        inside = inside_of[block]
        if inside and not any(g in units for g in inside):  # no unit made by a layer of the block
            reasons = list(dict.fromkeys(found.left_out[g] for g in inside if g in found.left_out))
            lines.append(f"no unit in {block!r}: {'; '.join(reasons[:3]) or 'nothing in it can go'}")
    if not listed and not lines and analysis.made:
        lines.append("no group of channels can go (each is an output, or read by an op that keeps it)")
    if lines:
        more = [f"and {len(lines) - _SHOWN} more"] if len(lines) > _SHOWN else []
        text = "; ".join(lines[:_SHOWN] + more)
        warnings.warn(f"{fn}: left out, since they cannot be removed: {text}", UnitsLeftOutWarning, stacklevel=3)


def _groups_inside(analysis: graph.Analysis, blocks: list[str]) -> dict[str, list[int]]:
    """For each block path, the groups (in the analysis' order) made by a tensor inside it: each tensor's name
    looked up by its prefixes, once (not every block against every group's slices)."""
    wanted = set(blocks)
    out: dict[str, list[int]] = {block: [] for block in blocks}
    within: dict[str, list[str]] = {}  # each tensor's blocks (a few hundred names; a 1B model has 300,000 groups)
    for group, slices in analysis.made.items():
        seen: set[str] = set()
        for tensor in dict.fromkeys(s.tensor for s in slices):
            found = within.get(tensor)
            if found is None:
                parts = tensor.split(".")
                found = within[tensor] = [p for p in (".".join(parts[:k]) for k in range(1, len(parts))) if p in wanted]
            for prefix in found:
                if prefix not in seen:
                    seen.add(prefix)
                    out[prefix].append(group)
    return out


#: How many things a :class:`UnitsLeftOutWarning` names.
_SHOWN = 8


class UnitsLeftOutWarning(UserWarning):
    """What :func:`structure` leaves out that a user would look for, and why.

    The heads of an attention that cannot go (a norm across all of them, a
    per-head tensor computed from the head count such as ALiBi slopes, per-head
    modules), unit groups whose removal, tried on the example inputs, changes
    what the model computes (a size the code spells out, a head count read
    from somewhere shrink cannot update), and repeated blocks in which no unit
    was found, with the op that stopped the analysis.
    """

    __module__ = "funcprune"


def _repeated_blocks(model: nn.Module) -> list[str]:
    """The paths of the repeated blocks of ``model``: children of a ``ModuleList`` or ``Sequential`` of a class
    that two of them share at least (no layer itself), each holding a Linear or a Conv (a transformer's layers)."""
    layers = (nn.Linear, ConvNd)
    found: list[str] = []
    for path, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(module.named_children())
        counts: dict[type, int] = {}
        for _, child in children:
            counts[type(child)] = counts.get(type(child), 0) + 1
        for name, child in children:
            if counts[type(child)] < 2 or isinstance(child, layers):
                continue
            if any(isinstance(m, layers) for m in child.modules()):
                found.append(f"{path}.{name}" if path else name)
    return found
