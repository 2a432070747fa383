"""The ``"layers"`` unit groups of a model: whole blocks of its stacks that can go (depth).

A stack (``funcprune._payoff``'s ``stacks_of``: a ``ModuleList`` or
``Sequential`` of blocks of one class) gives a group of kind ``"layers"``,
named by its path, whose units are its blocks that can go: each block's
parameters are members of its unit alone (``Member(name, 0, rows, unit=u)``),
so a pruned unit has every parameter of its block pruned, which in a
pre-norm residual block makes it the identity. Which blocks can go is
tried as ``shrink`` removes them (the payoff's ``depthless``): one block of
each kind (its parameters' names and shapes) per stack, all at once, then
each alone where that fails; a kind whose block fails (a post-norm block,
BERT's ``LayerNorm(x + f(x))``) is no unit, and is said why where the
stack is a ``ModuleList`` (a ``Sequential`` of blocks that are no residual
blocks, torchvision's ``Conv2dNormActivation`` layers, is no stack of
layers a user looks for).
"""

from __future__ import annotations

from collections.abc import Set

import torch
from torch import nn

from .. import _graph as graph
from .._payoff import block_names, blocks_of, depthless, stacks_of
from .._units import Member, UnitGroup

__all__ = ["layer_groups"]


def layer_groups(
    fn: str, model: nn.Module, inputs: graph.Inputs, excluded: Set[str]
) -> tuple[dict[str, UnitGroup], dict[str, str]]:
    """The ``"layers"`` groups of ``model`` by stack path, and the stacks (or blocks) left out, with why."""
    params = dict(model.named_parameters())
    kinds: dict[str, dict[tuple[tuple[str, tuple[int, ...]], ...], list[int]]] = {}
    left: dict[str, str] = {}
    names_of: dict[str, list[list[str]]] = {}
    for path in stacks_of(model):
        blocks = blocks_of(model, path)
        if any(n in excluded for names in blocks for n in names):
            continue
        names_of[path] = blocks
        for i, (block, names) in enumerate(zip(block_names(model, path), blocks, strict=True)):
            if any(params[n].dim() == 0 for n in names):
                continue  # a scalar parameter: no member can say it
            prefix = f"{block}."
            signature = tuple((n.removeprefix(prefix), tuple(params[n].shape)) for n in names)
            kinds.setdefault(path, {}).setdefault(signature, []).append(i)
    trial = {n: torch.zeros(params[n].shape, dtype=torch.bool, device=params[n].device)
             for path, by_kind in kinds.items() for blocks in by_kind.values() for n in names_of[path][blocks[0]]}  # fmt: skip
    if not trial:
        return {}, left
    tried = depthless(fn, model, trial, inputs, {path: [b[0] for b in by_kind.values()] for path, by_kind in kinds.items()},
                      probe=True)  # fmt: skip
    groups: dict[str, UnitGroup] = {}
    for path, by_kind in kinds.items():
        if path in tried.config:  # shrink could not save what it makes
            left[path] = f"the config cannot say the depth without them ({tried.config[path]})"
            continue
        gone = set(tried.removed.get(path, ()))
        units = sorted(i for blocks in by_kind.values() if blocks[0] in gone for i in blocks)
        failed = [blocks[0] for blocks in by_kind.values() if blocks[0] not in gone]
        if failed:
            why = next(iter(tried.kept.values()), "removing it changes what the model computes")
            shown = ", ".join(block_names(model, path)[i] for i in failed[:3])
            left[path] = f"blocks like {shown}: {why}" if units else why
        if len(units) < 2:
            continue
        members = tuple(
            Member(n, 0, params[n].shape[0], unit=u) for u, i in enumerate(units) for n in names_of[path][i]
        )
        groups[path or "layers"] = UnitGroup("layers", len(units), members)
    return groups, {path: why for path, why in left.items() if isinstance(model.get_submodule(path), nn.ModuleList)}
