"""Baking masks into a module: a new module whose weights hold the pruned values.

:func:`bake` is the way out of the functional API: a copy of the module
with every masked parameter replaced by its masked values, buffers kept; it
runs, saves and loads as an ordinary module (``README.md``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TypeVar, cast

import torch
from torch import nn

from .._experts import removed_experts, routers
from .._graph import copy_module
from .._names import check_masks, check_not_hooked
from .._types import Tensor
from .._validate import refuse_in
from ._checks import check_mask_dtypes, first_names, one_mask_per_parameter

__all__ = ["bake"]

_M = TypeVar("_M", bound=nn.Module)


def bake(module: _M, masks: Mapping[str, Tensor]) -> _M:
    """Return a new module of the same class whose parameters hold the masked values.

    The new module is ``copy.deepcopy(module)`` with the pruned entries of
    each masked parameter set to ``+0.0``; kept entries are bit for bit the
    original ones, and every parameter keeps its dtype, device and
    ``requires_grad``. Buffers, hooks and attributes are copied as they are.
    ``module`` is not changed, and the two share no tensor. A Parameter used
    under several names (tied weights, ``lm_head.weight = embed.weight``)
    stays one Parameter in the copy, masked once.

    Use :func:`bake` to export or deploy a pruned model, or to keep training
    the dense original while handing out pruned copies; it costs a copy of
    the module. :func:`~funcprune.apply_masks_` zeros the tensors of a dict in
    place instead (no copy): call it after ``optimizer.step()`` in a
    ``torch.optim`` loop, or on ``dict(model.named_parameters())`` to prune a
    model too large to copy, once nothing needs its dense weights any more.

    Args:
        module: the module to copy. It must not be pruned in hook mode
            (``torch.nn.utils.prune`` or ``funcprune.compat``).
        masks: masks keyed like ``module.named_parameters()`` (an alias of a
            tied Parameter is accepted): ``torch.bool`` (``True`` = kept), or
            floating-point 0/1 as torch's ``weight_mask`` buffers, meaning
            the same (1 kept, 0 pruned). A parameter without a mask is copied
            unchanged.

    Returns:
        The new module, of ``module``'s class. Pruned entries are ``+0.0``
        even where the weight was negative, ``inf`` or ``nan`` (the product
        that :func:`~funcprune.apply_masks` computes, like torch's hook,
        gives ``-0.0`` and ``nan`` there), so for finite weights it holds the
        values of ``apply_masks(params, masks)`` and computes the outputs of
        :func:`~funcprune.functional_call_masked`; except where the masks
        remove experts of a mixture-of-experts layer (a router row pruned
        entirely): the copy still routes tokens to them (with zero weights),
        where ``functional_call_masked`` and :func:`~funcprune.shrink` never
        do. ``bake`` warns then (``UserWarning``); ``shrink`` removes them.

    Raises:
        TypeError: if ``module`` is not a module, ``masks`` not a mapping of
            tensors, or a mask is neither ``torch.bool`` nor floating-point.
        UnknownNameError: if a mask names no parameter of ``module``; close
            names are suggested.
        ValueError: if a mask's shape or device differs from its
            parameter's, a float mask holds values other than 0 and 1, two
            names of one tied Parameter carry different masks,
            ``module`` is pruned in hook mode, or it cannot be copied (a
            layer under the deprecated ``torch.nn.utils.weight_norm``).

    >>> import torch, funcprune as fp
    >>> lin = torch.nn.Linear(3, 1, bias=False)
    >>> with torch.no_grad():
    ...     _ = lin.weight.copy_(torch.tensor([[0.5, -1.0, 2.0]]))
    >>> fp.bake(lin, {"weight": torch.tensor([[1.0, 0.0, 1.0]])}).weight.data
    tensor([[0.5000, 0.0000, 2.0000]])
    >>> lin.weight.data
    tensor([[ 0.5000, -1.0000,  2.0000]])
    """
    fn = "bake"
    if not isinstance(module, nn.Module):
        raise TypeError(f"{fn}: module must be a torch.nn.Module, got {type(module).__name__}")
    check_not_hooked(fn, module)
    refuse_in(fn, dict(module.named_parameters()))
    params = dict(module.named_parameters(remove_duplicate=False))
    checked = check_masks(fn, params, check_mask_dtypes(fn, masks))
    by_param = one_mask_per_parameter(fn, first_names(module), checked)
    baked = cast(_M, copy_module(fn, module))
    new_params = dict(baked.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for name, mask in by_param.items():
            new_params[name].masked_fill_(~mask, 0.0)
    _warn_routed(module, by_param)
    return baked


def _warn_routed(module: nn.Module, masks: Mapping[str, Tensor]) -> None:
    """Warn where the masks remove experts that the baked copy still routes to."""
    removed = {
        layer.module: removed_experts(masks[layer.weight], layer.least, layer.groups).nonzero().flatten().tolist()
        for layer in routers(module)
        if layer.weight in masks
    }
    removed = {path: experts for path, experts in removed.items() if experts}
    if removed:
        shown = ", ".join(f"{path!r} experts {experts}" for path, experts in list(removed.items())[:3])
        warnings.warn(
            f"bake: the masks prune router rows entirely, removing experts ({shown}"
            f"{', ...' if len(removed) > 3 else ''}); the baked copy still routes tokens to them (their "
            "weights are zero), so it computes something else than functional_call_masked, which never "
            "routes to a removed expert. shrink removes them",
            UserWarning,
            stacklevel=3,
        )
