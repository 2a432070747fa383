"""Masks that pay off: channels the masks remove entirely, removed for real.

:func:`shrink` returns a physically smaller copy of a model, and
:func:`propagate` the closure of the masks it removes; which channel groups
go is decided by ``funcprune._graph``, and this module checks the
arguments, then builds the closure and the smaller copy (``README.md``).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from typing import TypeVar

import torch
from torch import nn

from .._dtensor import refuse_in
from .._graph import Cut, RoleKind, plan_removal, trace_channels
from .._names import check_masks, check_not_hooked
from .._types import Masks, Tensor
from ._checks import check_mask_dtypes, first_names, one_mask_per_parameter

__all__ = ["KeptChannelsWarning", "propagate", "shrink"]

_M = TypeVar("_M", bound=nn.Module)
#: How many layers a :class:`KeptChannelsWarning` names.
_LAYERS_SHOWN = 5


class KeptChannelsWarning(UserWarning):
    """Output channels that the masks prune entirely, but that shrink must keep.

    They stay in the shrunk model (their weights zero, their compute paid)
    and the closure adds nothing for them. The message names each layer,
    how many of its channels stay, and why: a model output, an op that
    reads all the channels (LayerNorm, a view with spelled-out sizes...),
    a channel coupled with one that another layer keeps.
    """

    __module__ = "funcprune"


def propagate(module: nn.Module, masks: Mapping[str, Tensor], example_inputs: object) -> Masks:
    """The closure of ``masks``: what :func:`shrink` removes, as masks.

    A channel goes when the masks prune it entirely and nothing keeps it
    (see :func:`shrink`); the closure adds, for each channel that goes, its
    bias entry, its BatchNorm (or InstanceNorm) weight and bias entries, its
    depthwise-convolution weights and bias, and the input columns that read
    it. It only ever adds pruned entries: every given mask is kept as it is
    or with more entries pruned, never revived. Channels that the masks
    prune entirely but that must stay are listed in a
    :class:`KeptChannelsWarning`, as :func:`shrink` lists them.

    Args:
        module: the model (not modified).
        masks: masks by parameter name (an alias of a tied Parameter is
            accepted), as for :func:`~funcprune.bake`: ``torch.bool``
            (``True`` = kept) or floating-point 0/1.
        example_inputs: the positional arguments of ``module.forward``: a
            tensor, or a tuple of tensors. The model runs once on them (on a
            copy, in eval mode) to learn every tensor's shape.

    Returns:
        A new dict of ``torch.bool`` masks, keyed and ordered like
        ``module.named_parameters()``: each given mask, with the closure's
        entries pruned, and a mask for each other parameter the closure
        prunes entries of. A given ``torch.bool`` mask to which the closure
        adds nothing is returned as the very tensor given; a float mask is
        returned converted (``mask != 0``), and a mask given under another
        name of a tied Parameter under its ``named_parameters()`` name.

    Raises:
        TypeError: if ``module`` is not a module, ``masks`` not a mapping of
            tensors, a mask neither ``torch.bool`` nor floating-point, or
            ``example_inputs`` not a tensor or a tuple of them.
        UnknownNameError: if a mask names no parameter of ``module``.
        ValueError: if ``module`` is pruned in hook mode, a mask does not
            fit its parameter, two names of a tied Parameter carry different
            masks, torch.fx cannot trace the model, the inputs do not run
            through it, or an op the analysis cannot reason about reads
            channels that would go (the message names the node).

    Warns:
        KeptChannelsWarning: if output channels that the masks prune
            entirely must stay.

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
    checked, cuts = _removal("propagate", module, masks, example_inputs)
    return _closure(module, checked, cuts)


def shrink(module: _M, masks: Mapping[str, Tensor], example_inputs: object) -> _M:
    """A new, smaller copy of ``module`` without the channels ``masks`` remove.

    The copy keeps the class and the ``forward`` of ``module``; its Linear,
    Conv, BatchNorm and InstanceNorm layers are smaller (parameters and
    running statistics sliced, ``out_features``, ``in_channels``,
    ``num_features``... updated), and every mask of the closure is applied
    to its parameters (pruned entries ``+0.0``, as :func:`~funcprune.bake`
    writes them, even where a weight is ``nan``), so in eval mode it
    computes, to float tolerance::

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
      tensor of per-channel entries, a divisor, ``log``, ``rsqrt`` or a
      negative power (infinite at zero: ``0 * inf`` is NaN), ``F.pad``,
      ``chunk`` or ``split`` along the channels, a layer whose parameters
      are shared or read directly in ``forward``;
    - each layer keeps at least one channel on each side.

    When channels that the masks prune entirely stay, a
    :class:`KeptChannelsWarning` says, per layer, how many and why.

    ``flatten``, ``nn.Flatten`` and ``x.view(x.size(0), -1)`` map a Conv
    channel to its block of the next Linear's columns; ``torch.cat`` along
    the channels concatenates them; elementwise ops (``clamp``, ``exp``,
    ``pow`` with a scalar exponent...) and ops over other dims (pooling,
    ``F.pad``, ``squeeze``, ``chunk``, ``x[..., 1:]``) pass them on. The
    graph comes from :func:`torch.fx.symbolic_trace` (traced in eval mode),
    so ``forward`` must be traceable. Nothing is built until the whole
    analysis succeeds, and ``module`` itself is never modified.

    Args:
        module: the trained model. It must not be pruned in hook mode
            (``torch.nn.utils.prune`` or ``funcprune.compat``).
        masks: masks by parameter name (an alias of a tied Parameter is
            accepted): ``torch.bool`` (``True`` = kept) or floating-point
            0/1, such as a :class:`~funcprune.Plan` with
            ``LnStructured(amount, n=2, dim=0)`` returns.
        example_inputs: the positional arguments of ``forward``: a tensor,
            or a tuple of tensors.

    Returns:
        A new module, of the class of ``module``, in its training mode.

    Raises:
        TypeError: as :func:`propagate` raises it.
        UnknownNameError: if a mask names no parameter of ``module``.
        ValueError: as :func:`propagate` raises it.

    Warns:
        KeptChannelsWarning: if output channels that the masks prune
            entirely must stay.

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
    checked, cuts = _removal("shrink", module, masks, example_inputs)
    closure = _closure(module, checked, cuts)
    result = copy.deepcopy(module)
    _zero_pruned_(result, closure)
    for name, cut in cuts.items():
        _cut_module(result.get_submodule(name), cut)
    return result


def _removal(
    fn: str, module: object, masks: object, example_inputs: object
) -> tuple[dict[str, Tensor], Mapping[str, Cut]]:
    """The masks as ``torch.bool``, and what each module keeps: every check, no change.

    Warns (:class:`KeptChannelsWarning`) if channels the masks prune entirely stay.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"{fn}: module must be a torch.nn.Module, got {type(module).__name__}")
    check_not_hooked(fn, module, then=f"{fn}(module, masks, example_inputs)")
    refuse_in(fn, dict(module.named_parameters()))
    names = first_names(module)
    params = dict(module.named_parameters(remove_duplicate=False))
    checked = one_mask_per_parameter(fn, names, check_masks(fn, params, check_mask_dtypes(fn, masks)))
    graph = trace_channels(fn, module, example_inputs)
    every_name = {alias: checked[first] for alias, first in names.items() if first in checked}
    removal = plan_removal(fn, graph, every_name)
    _warn_kept(fn, removal.kept)
    return checked, removal.cuts


def _warn_kept(fn: str, kept: Mapping[str, Mapping[str, int]]) -> None:
    """A :class:`KeptChannelsWarning` listing ``kept``, at most :data:`_LAYERS_SHOWN` layers."""
    if not kept:
        return
    total = sum(n for reasons in kept.values() for n in reasons.values())
    layers = [
        f"{name!r} keeps " + ", ".join(f"{n} ({why})" for why, n in reasons.items())
        for name, reasons in list(kept.items())[:_LAYERS_SHOWN]
    ]
    more = f"; and {len(kept) - _LAYERS_SHOWN} more layers" if len(kept) > _LAYERS_SHOWN else ""
    warnings.warn(
        f"{fn}: {total} output channel{'s' if total > 1 else ''} that the masks prune "
        f"entirely stay, weights zero but compute paid: {'; '.join(layers)}{more}. To silence "
        "this, leave such channels unpruned (an output layer: leave it out of the masks), or "
        "change what keeps them",
        KeptChannelsWarning,
        stacklevel=4,
    )


def _closure(module: nn.Module, masks: dict[str, Tensor], cuts: Mapping[str, Cut]) -> Masks:
    """The given masks, with every entry of a removed channel pruned."""
    params = dict(module.named_parameters())
    closure = dict(masks)
    for name, cut in cuts.items():
        for key, dim, keep, size in cut.slices(name):
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
def _zero_pruned_(module: nn.Module, masks: Masks) -> None:
    """Write ``+0.0`` into the pruned entries of ``module`` (a copy: nobody else holds it).

    As :func:`~funcprune.bake` does: ``+0.0`` even where a weight is ``nan`` or ``inf``.
    """
    params = dict(module.named_parameters())
    for name, mask in masks.items():
        params[name].masked_fill_(~mask, 0.0)


#: The attributes that record a layer's sizes: the output side's, then the input side's.
_SIZE_ATTRIBUTES: Mapping[RoleKind, tuple[str, ...]] = {
    "linear": ("out_features", "in_features"),
    "conv": ("out_channels", "in_channels"),
    "depthwise": ("out_channels", "in_channels", "groups"),
    "norm": ("num_features",),
}


@torch.no_grad()
def _cut_module(mod: nn.Module, cut: Cut) -> None:
    """Slice ``mod``'s tensors to the kept channels and update its size attributes."""
    for key, dim, keep, _ in cut.slices(""):
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
