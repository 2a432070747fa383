"""Masks that pay off: channels the masks remove entirely, removed for real.

:func:`shrink` returns a new, physically smaller copy of a model: every
output channel of a Linear or a Conv that the masks prune entirely (its
whole weight row or filter) goes, together with everything that only serves
it: its bias entry, the entries of a following BatchNorm (affine parameters
and running statistics), the weights of a following depthwise convolution,
and the matching input columns of every layer that reads it (the next
Linear's input features, the next Conv's input channels, a flattened Conv
channel's block of Linear columns).

:func:`propagate` is its functional counterpart: the *closure* of the masks,
where those entries count as pruned too. The shrunk model computes what the
dense model computes on the closure's masked parameters, in eval mode, to
float tolerance::

    shrink(model, masks, x)(x) == functional_call_masked(model, params,
                                      propagate(model, masks, x), x)

Dependencies come from the model's ``torch.fx`` graph
(:mod:`funcprune._graph`), not from the order of its modules. Channels that
are *coupled* (the two sides of a residual ``add``, the parts of a ``cat``)
go only where every layer that makes them prunes them. Some channels stay,
however pruned: those of the model's inputs and outputs, those read by a
norm whose statistics span them (LayerNorm, GroupNorm), by a grouped
convolution, by a ``view``/``reshape`` that spells sizes out, or by code
that reads the channel count (``x.shape[1]``). An op the analysis cannot
reason about (``permute``, ``matmul``, a custom leaf module...) is refused
with an error naming its node, when it reads channels that would go; the
masks that keep those channels are accepted. Each layer keeps at least one
channel on each side (torch cannot run a Conv with none): when the masks
prune them all, the first one stays.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import final

import torch
from torch import nn

from ._graph import ChannelGraph, RoleKind, trace_channels
from ._multiply import as_multiplier
from ._names import check_masks
from ._types import Masks, Tensor

__all__ = ["propagate", "shrink"]


@final
@dataclass(frozen=True, slots=True)
class _Cut:
    """The output rows and input columns that one module keeps (``None``: all of them)."""

    kind: RoleKind
    keep_out: tuple[int, ...] | None
    keep_in: tuple[int, ...] | None
    out_size: int
    in_size: int


def propagate(module: nn.Module, masks: Mapping[str, Tensor], example_inputs: object) -> Masks:
    """The closure of ``masks``: what :func:`shrink` removes, as masks.

    A channel goes when the masks prune it entirely and nothing keeps it
    (see :func:`shrink`); the closure adds, for each channel that goes, its
    bias entry, its BatchNorm (or InstanceNorm) weight and bias entries, its
    depthwise-convolution weights and bias, and the input columns that read
    it. It only ever adds pruned entries: every given mask is kept as it is
    or with more entries pruned, never revived.

    Args:
        module: the model (not modified).
        masks: masks by parameter name, as for
            :func:`~funcprune.apply_masks` (``torch.bool`` or 0/1 numbers).
        example_inputs: the positional arguments of ``module.forward``: a
            tensor, or a tuple of tensors. The model runs once on them (on a
            copy, in eval mode) to learn every tensor's shape.

    Returns:
        A new dict of ``torch.bool`` masks in ``named_parameters()`` order:
        every given mask (the same tensor where the closure adds nothing),
        and a mask for each parameter the closure prunes entries of.

    Raises:
        TypeError: if ``module`` is not a module, ``masks`` not a mapping of
            tensors, or ``example_inputs`` not a tensor or a tuple of them.
        UnknownNameError: if a mask names no parameter of ``module``.
        ValueError: if a mask does not fit its parameter, torch.fx cannot
            trace the model, the inputs do not run through it, or an op the
            analysis cannot reason about reads channels that would go (the
            message names the node).

    >>> import torch, funcprune as fp
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> masks = {"0.weight": torch.tensor([[True] * 4, [False] * 4, [True] * 4])}
    >>> closure = fp.propagate(model, masks, torch.randn(1, 4))
    >>> closure["0.bias"]
    tensor([ True, False,  True])
    >>> closure["2.weight"]
    tensor([[ True, False,  True],
            [ True, False,  True]])
    """
    checked, cuts = _plan("propagate", module, masks, example_inputs)
    return _closure(module, checked, cuts)


def shrink(module: nn.Module, masks: Mapping[str, Tensor], example_inputs: object) -> nn.Module:
    """A new, smaller copy of ``module`` without the channels ``masks`` remove.

    The copy keeps the class and the ``forward`` of ``module``; its Linear,
    Conv, BatchNorm and InstanceNorm layers are smaller (parameters and
    running statistics sliced, ``out_features``, ``in_channels``,
    ``num_features``... updated), and every mask of the closure is applied
    to its parameters, so in eval mode it computes, to float tolerance::

        functional_call_masked(module, dict(module.named_parameters()),
                               propagate(module, masks, example_inputs), inputs)

    A channel (an output channel of a Linear or a Conv) goes when its weight
    row is entirely pruned, in every layer it is coupled with (a residual
    ``add`` or ``mul`` couples the channels of both sides), unless something
    keeps it:

    - the model's inputs and outputs keep their shapes;
    - LayerNorm, GroupNorm, RMSNorm, softmax or a reduction across the
      channels read all of them;
    - a grouped convolution (``1 < groups < in_channels``) keeps its
      channels; depthwise ones (``groups == in_channels``) shrink with their
      input;
    - a ``view``/``reshape`` that spells sizes out (``x.view(-1, 400)``),
      code that reads the channel count (``x.shape[1]``), arithmetic with a
      tensor of per-channel entries, a layer whose parameters are shared or
      read directly in ``forward``;
    - each layer keeps at least one channel on each side.

    ``flatten``, ``nn.Flatten`` and ``x.view(x.size(0), -1)`` map a Conv
    channel to its block of the next Linear's columns; ``torch.cat`` along
    the channels concatenates them. The graph comes from
    :func:`torch.fx.symbolic_trace` (traced in eval mode), so ``forward``
    must be traceable. Nothing is built until the whole analysis succeeds,
    and ``module`` itself is never modified.

    Args:
        module: the trained model.
        masks: masks by parameter name (``torch.bool`` or 0/1 numbers), such
            as a :class:`~funcprune.Plan` with
            ``LnStructured(amount, n=2, dim=0)`` returns.
        example_inputs: the positional arguments of ``forward``: a tensor,
            or a tuple of tensors.

    Returns:
        A new module, of the class of ``module``, in its training mode.

    Raises:
        TypeError: if ``module`` is not a module, ``masks`` not a mapping of
            tensors, or ``example_inputs`` not a tensor or a tuple of them.
        UnknownNameError: if a mask names no parameter of ``module``.
        ValueError: if a mask does not fit its parameter, torch.fx cannot
            trace the model, the inputs do not run through it, or an op the
            analysis cannot reason about reads channels that would go (the
            message names the node).

    >>> import torch, funcprune as fp
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    >>> masks = fp.Plan({"0.weight": fp.LnStructured(0.75, n=2, dim=0)})(
    ...     dict(model.named_parameters()))
    >>> small = fp.shrink(model, masks, torch.randn(1, 8))
    >>> small
    Sequential(
      (0): Linear(in_features=8, out_features=4, bias=True)
      (1): ReLU()
      (2): Linear(in_features=4, out_features=2, bias=True)
    )
    """
    checked, cuts = _plan("shrink", module, masks, example_inputs)
    closure = _closure(module, checked, cuts)
    result = copy.deepcopy(module)
    _bake(result, closure)
    for name, cut in cuts.items():
        _cut_module(result.get_submodule(name), cut)
    return result


def _plan(
    fn: str, module: object, masks: object, example_inputs: object
) -> tuple[dict[str, Tensor], dict[str, _Cut]]:
    """The masks as ``torch.bool``, and what each module keeps: every check, no change."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"{fn}: module must be a torch.nn.Module, got {type(module).__name__}")
    checked = check_masks(fn, dict(module.named_parameters()), masks)
    graph = trace_channels(fn, module, example_inputs)
    removed = _removed_groups(fn, graph, checked)
    return checked, _cuts(graph, removed)


def _pruned_rows(graph: ChannelGraph, masks: Mapping[str, Tensor]) -> dict[str, list[bool]]:
    """For each Linear and Conv with a weight mask, which of its output rows are all pruned."""
    rows: dict[str, list[bool]] = {}
    for name, role in graph.roles.items():
        mask = masks.get(f"{name}.weight")
        if role.kind in ("linear", "conv") and mask is not None:
            rows[name] = (~mask.flatten(1).any(1)).tolist()
    return rows


def _removed_groups(fn: str, graph: ChannelGraph, masks: Mapping[str, Tensor]) -> set[int]:
    """The channel groups that go: pruned by every layer that makes them, kept by nothing."""
    pruned = _pruned_rows(graph, masks)
    kept = set(graph.blocked)
    for atom, (name, row) in graph.produced.items():
        if not (name in pruned and pruned[name][row]):
            kept.add(graph.roots[atom])
    removed = set(graph.roots) - kept
    _keep_one_per_layer(graph, removed)
    _refuse_unknown(fn, graph, removed)
    return removed


def _keep_one_per_layer(graph: ChannelGraph, removed: set[int]) -> None:
    """Keep the first channel of any layer side that would lose them all (in place)."""
    changed = True
    while changed:
        changed = False
        for role in graph.roles.values():
            for atoms in (role.out_atoms, role.in_atoms or ()):
                if atoms and all(graph.roots[a] in removed for a in atoms):
                    removed.discard(graph.roots[atoms[0]])
                    changed = True


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


def _kept(graph: ChannelGraph, atoms: tuple[int, ...], removed: set[int]) -> tuple[int, ...]:
    return tuple(i for i, a in enumerate(atoms) if graph.roots[a] not in removed)


def _cuts(graph: ChannelGraph, removed: set[int]) -> dict[str, _Cut]:
    """What each module keeps, for the modules that lose something."""
    cuts: dict[str, _Cut] = {}
    for name, role in graph.roles.items():
        keep_out = _kept(graph, role.out_atoms, removed)
        in_atoms = role.in_atoms or ()
        keep_in = _kept(graph, in_atoms, removed)
        if len(keep_out) == len(role.out_atoms) and len(keep_in) == len(in_atoms):
            continue
        cuts[name] = _Cut(
            role.kind,
            keep_out if len(keep_out) < len(role.out_atoms) else None,
            keep_in if len(keep_in) < len(in_atoms) else None,
            len(role.out_atoms),
            len(in_atoms),
        )
    return cuts


def _slices(name: str, cut: _Cut) -> Iterator[tuple[str, int, tuple[int, ...], int]]:
    """``(parameter, dim, kept indices, size)`` for each tensor of the module a cut slices."""
    if cut.keep_out is not None:
        for tensor in ("weight", "bias", "running_mean", "running_var"):
            yield f"{name}.{tensor}", 0, cut.keep_out, cut.out_size
    if cut.keep_in is not None and cut.kind in ("linear", "conv"):
        yield f"{name}.weight", 1, cut.keep_in, cut.in_size


def _closure(module: nn.Module, masks: dict[str, Tensor], cuts: dict[str, _Cut]) -> Masks:
    """The given masks, with every entry of a removed channel pruned."""
    params = dict(module.named_parameters())
    closure = dict(masks)
    for name, cut in cuts.items():
        for key, dim, keep, size in _slices(name, cut):
            if key not in params:
                continue
            mask = closure.get(key)
            mask = torch.ones_like(params[key], dtype=torch.bool) if mask is None else mask.clone()
            dropped = torch.ones(size, dtype=torch.bool, device=mask.device)
            dropped[list(keep)] = False
            mask.index_fill_(dim, dropped.nonzero().flatten(), False)
            closure[key] = mask
    return {name: closure[name] for name in params if name in closure}


@torch.no_grad()
def _bake(module: nn.Module, masks: Masks) -> None:
    """Multiply the masks into ``module``'s parameters (a copy: nobody else holds them)."""
    params = dict(module.named_parameters())
    for name, mask in masks.items():
        params[name].mul_(as_multiplier(mask, params[name].dtype))


#: The attributes that record a layer's sizes: the output side's, then the input side's.
_SIZE_ATTRIBUTES: Mapping[RoleKind, tuple[str, ...]] = {
    "linear": ("out_features", "in_features"),
    "conv": ("out_channels", "in_channels"),
    "depthwise": ("out_channels", "in_channels", "groups"),
    "norm": ("num_features",),
}


@torch.no_grad()
def _cut_module(mod: nn.Module, cut: _Cut) -> None:
    """Slice ``mod``'s tensors to the kept channels and update its size attributes."""
    for key, dim, keep, _ in _slices("", cut):
        attr = key[1:]
        old = getattr(mod, attr, None)
        if not isinstance(old, Tensor):
            continue
        new = old.index_select(dim, torch.tensor(keep, dtype=torch.long, device=old.device))
        is_param = isinstance(old, nn.Parameter)
        setattr(mod, attr, nn.Parameter(new, old.requires_grad) if is_param else new)
    out_side, *in_side = _SIZE_ATTRIBUTES[cut.kind]
    if cut.keep_out is not None:
        setattr(mod, out_side, len(cut.keep_out))
    if cut.keep_in is not None:
        for attr in in_side:
            setattr(mod, attr, len(cut.keep_in))
