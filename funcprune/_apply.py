"""Applying masks: masked parameters, a masked ``functional_call``, training.

Everything here takes dicts keyed like ``named_parameters()`` and, except for
the functions ending in ``_``, returns new dicts and never writes into its
inputs. A missing mask means "not pruned". The pure functions work under
``torch.func.vmap``, ``torch.func.grad`` and ``torch.compile``: a masked
entry is ``param * mask`` as in torch's forward pre-hook, so its gradient is
zero.

Keeping pruned weights at zero while training:

- in a functional loop, run the model on ``apply_masks(params, masks)`` (or
  through :func:`functional_call_masked`): the gradients of pruned entries
  are zero, and :func:`mask_gradients` makes sure of it for gradients that
  come from elsewhere; re-apply the masks after the update if the update
  adds anything else (weight decay, momentum from before pruning);
- with a ``torch.optim`` optimizer, call :func:`mask_gradients_` after
  ``backward()`` and :func:`apply_masks_` after ``step()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ._names import check_masks, check_params
from ._types import Params

Tensor = torch.Tensor

__all__ = [
    "apply_masks",
    "apply_masks_",
    "functional_call_masked",
    "mask_gradients",
    "mask_gradients_",
]


def _checked(
    fn: str, params: Params, masks: Mapping[str, Tensor], strict: bool
) -> dict[str, Tensor]:
    check_params(fn, params)
    checked = check_masks(fn, params, masks, keep_dtype=True)
    if strict:
        missing = [name for name in params if name not in checked]
        if missing:
            raise ValueError(
                f"{fn}: strict=True and no mask was given for {missing!r}; pass strict=False "
                "to leave parameters without a mask unpruned"
            )
    return checked


def apply_masks(
    params: Params, masks: Mapping[str, Tensor], *, strict: bool = False
) -> dict[str, Tensor]:
    """Return a new dict of ``params``, each multiplied by its mask.

    Args:
        params: tensors keyed like ``named_parameters()``.
        masks: masks by name: ``torch.bool`` (1 byte an entry; converted
            to the parameter's dtype on each call), or 0/1 numbers as torch's
            buffers (used as they are when in the parameter's dtype: the
            fastest in a training loop, at 4x the memory; their values are
            checked once per tensor version, in eager mode). A name without
            a mask keeps its tensor unchanged (the very same object).
        strict: if ``True``, every parameter must have a mask.

    Returns:
        A new dict in the order of ``params``: ``param * mask``, exactly
        what torch's forward pre-hook computes, so pruned entries are 0 and
        get zero gradient.

    Raises:
        UnknownNameError: (a ``KeyError`` and ``ValueError``) if a mask names
            no parameter; close names are suggested.
        ValueError: if a mask's shape or device does not fit its parameter,
            a numeric mask holds values other than 0 and 1, or ``strict`` and
            a parameter has no mask.
        TypeError: if an argument is not a mapping of tensors.

    >>> import torch, funcprune as fp
    >>> params = {"w": torch.tensor([1.0, -2.0, 3.0]), "b": torch.tensor([0.5])}
    >>> fp.apply_masks(params, {"w": torch.tensor([True, False, True])})
    {'w': tensor([1., -0., 3.]), 'b': tensor([0.5000])}
    """
    checked = _checked("apply_masks", params, masks, strict)
    return {
        name: p * checked[name].to(p.dtype) if name in checked else p for name, p in params.items()
    }


def functional_call_masked(
    module: nn.Module,
    params: Params,
    masks: Mapping[str, Tensor],
    args: Any,
    kwargs: dict[str, Any] | None = None,
    *,
    buffers: Mapping[str, Tensor] | None = None,
    strict: bool = False,
) -> Any:
    """Run ``module`` on masked ``params`` through :func:`torch.func.functional_call`.

    The module itself is not touched: ``apply_masks(params, masks)`` and the
    buffers replace its tensors for this one call.

    Args:
        module: the module whose ``forward`` runs.
        params: its parameters by name (all or some of them; the others
            are taken from the module).
        masks: masks by name, as in :func:`apply_masks`.
        args: the positional argument(s) of ``forward``: one value, or a
            tuple of them.
        kwargs: keyword arguments of ``forward``.
        buffers: buffers by name (such as the second dict of
            :func:`torch.func.stack_module_state` under ``vmap``); the
            module's own buffers by default.
        strict: passed to :func:`apply_masks`.

    Returns:
        What ``module(*args, **kwargs)`` returns.

    >>> import torch, funcprune as fp
    >>> lin = torch.nn.Linear(2, 1, bias=False)
    >>> params = {"weight": torch.tensor([[2.0, 3.0]])}
    >>> fp.functional_call_masked(lin, params, {"weight": torch.tensor([[True, False]])},
    ...                           torch.ones(1, 2))
    tensor([[2.]])
    """
    masked = apply_masks(params, masks, strict=strict)
    tensors = dict(module.named_buffers()) if buffers is None else dict(buffers)
    tensors.update(masked)
    return torch.func.functional_call(module, tensors, args, kwargs)


def mask_gradients(grads: Params, masks: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Return new gradients with the pruned entries set to zero.

    For gradients that do not come through masked parameters (an
    unmasked forward, scores, a sum of gradients...). Pure; works under
    the ``torch.func`` transforms.

    Args:
        grads: gradients keyed like the parameters (from
            :func:`torch.func.grad`, for instance).
        masks: masks by name, as in :func:`apply_masks`.

    >>> import torch, funcprune as fp
    >>> fp.mask_gradients({"w": torch.tensor([0.1, 0.2])}, {"w": torch.tensor([False, True])})
    {'w': tensor([0.0000, 0.2000])}
    """
    checked = _checked("mask_gradients", grads, masks, False)
    return {
        name: g * checked[name].to(g.dtype) if name in checked else g for name, g in grads.items()
    }


@torch.no_grad()
def apply_masks_(params: Params, masks: Mapping[str, Tensor]) -> None:
    """Zero the pruned entries of ``params`` in place (``param.mul_(mask)``).

    Call it after ``optimizer.step()`` so that weight decay, momentum or an
    unmasked forward never bring a pruned weight back. It mutates the
    tensors (``nn.Parameter`` objects included) and returns nothing.

    >>> import torch, funcprune as fp
    >>> w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    >>> fp.apply_masks_({"w": w}, {"w": torch.tensor([True, False])})
    >>> w
    Parameter containing:
    tensor([1., 0.], requires_grad=True)
    """
    for name, mask in _checked("apply_masks_", params, masks, False).items():
        params[name].mul_(mask.to(params[name].dtype))


@torch.no_grad()
def mask_gradients_(params: Params, masks: Mapping[str, Tensor]) -> None:
    """Zero the pruned entries of each parameter's ``.grad`` in place.

    Call it between ``loss.backward()`` and ``optimizer.step()``.
    Parameters whose ``.grad`` is ``None`` are skipped.

    >>> import torch, funcprune as fp
    >>> w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    >>> (w * w).sum().backward()
    >>> fp.mask_gradients_({"w": w}, {"w": torch.tensor([True, False])})
    >>> w.grad
    tensor([2., 0.])
    """
    for name, mask in _checked("mask_gradients_", params, masks, False).items():
        grad = params[name].grad
        if grad is not None:
            grad.mul_(mask.to(grad.dtype))
