"""Applying masks: masked parameters, a masked ``functional_call``, training.

Dicts keyed like ``named_parameters()`` in, new dicts out (the functions
ending in ``_`` update in place); a missing mask means "not pruned"; the
pure functions work under ``vmap``, ``grad`` and ``torch.compile``. How to
keep pruned weights at zero while training: ``README.md``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, TypeVar, final

import torch
from torch import nn

from .._dtensor import check_layouts, check_not_fsdp
from .._experts import never_routed
from .._names import check_masks, check_params, unknown_name
from .._types import Params, Tensor
from ._multiply import as_multiplier, masked_multiply

__all__ = [
    "Multipliers",
    "to_multipliers",
    "apply_masks",
    "apply_masks_",
    "functional_call_masked",
    "mask_gradients",
    "mask_gradients_",
]


#: Only :func:`to_multipliers` builds :class:`Multipliers`: its values are checked.
_CHECKED = object()


@final
class Multipliers(Mapping[str, Tensor]):
    """Masks converted once into 0/1 multipliers in their parameters' dtypes.

    Build it with :func:`to_multipliers`. Every function that takes masks
    (:func:`apply_masks`, :func:`functional_call_masked`,
    :func:`mask_gradients` and the in-place ones) uses these tensors as they
    are: no conversion and no value check per call, which makes a masked
    training step as cheap as torch's hook mode (``torch.bool`` masks pay
    a conversion per step, a few percent on a CPU), at 4x the memory of
    ``torch.bool`` masks (float32). It is an immutable mapping holding its
    own copies, so later writes to the masks it was built from do not reach
    it. Names and shapes are still checked on every call.
    """

    __slots__ = ("_tensors",)
    _tensors: dict[str, Tensor]

    def __init__(self, tensors: Mapping[str, Tensor], _token: object = None) -> None:
        if _token is not _CHECKED:
            raise TypeError(
                "Multipliers: build it with funcprune.to_multipliers(params, masks), "
                "which checks the masks"
            )
        self._tensors = dict(tensors)

    def __getitem__(self, name: str) -> Tensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __repr__(self) -> str:
        body = ", ".join(f"{n!r}: <{tuple(t.shape)} {t.dtype}>" for n, t in self._tensors.items())
        return f"Multipliers({{{body}}})"


def to_multipliers(params: Params, masks: Mapping[str, Tensor]) -> Multipliers:
    """Check ``masks`` once and convert them to multipliers for a training loop.

    Args:
        params: tensors keyed like ``named_parameters()``; each multiplier
            takes its parameter's dtype and must fit its shape and device.
        masks: masks by name: ``torch.bool``, or numbers holding only 0
            and 1 (checked here, once, in eager mode).

    Returns:
        A :class:`Multipliers` (an immutable mapping of new tensors) to pass
        wherever masks go, every step, instead of ``masks``.

    Raises:
        UnknownNameError: if a mask names no parameter.
        ValueError: if a mask does not fit its parameter or holds values
            other than 0 and 1.
        TypeError: if an argument is not a mapping of tensors.

    >>> import torch, funcprune as fp
    >>> params = {"w": torch.tensor([1.0, -2.0, 3.0])}
    >>> mult = fp.to_multipliers(params, {"w": torch.tensor([True, False, True])})
    >>> mult
    Multipliers({'w': <(3,) torch.float32>})
    >>> fp.apply_masks(params, mult)
    {'w': tensor([1., -0., 3.])}
    """
    check_params("to_multipliers", params)
    check_layouts("to_multipliers", params, masks)
    checked = check_masks("to_multipliers", params, masks)
    return Multipliers(
        {name: as_multiplier(m, params[name].dtype, copy=True) for name, m in checked.items()}, _CHECKED
    )


def _checked(
    fn: str, params: Params, masks: Mapping[str, Tensor], strict: bool
) -> dict[str, Tensor]:
    check_params(fn, params)
    if isinstance(masks, Multipliers):  # checked when built: shapes and names only
        check_layouts(fn, params, masks._tensors, bool_masks=False)
        checked = check_masks(fn, params, masks._tensors, keep_dtype=True, values=False)
    else:
        check_layouts(fn, params, masks)
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
        masks: masks by name: ``torch.bool`` (1 byte an entry, and all
            that autograd keeps of it; converted to the parameter's dtype
            on each call, a chunk at a time), 0/1 numbers as torch's
            buffers (their values are checked on each call, in eager mode),
            or :class:`Multipliers` from :func:`to_multipliers` (checked
            once, used as they are: the fastest in a training loop). A name
            without a mask keeps its tensor unchanged (the very same object).
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
        name: masked_multiply(p, checked[name]) if name in checked else p
        for name, p in params.items()
    }


_Out = TypeVar("_Out", covariant=True)


class Forward(Protocol[_Out]):
    """A module whose ``forward`` returns ``_Out`` (its annotation types the result)."""

    def forward(self, *args: Any, **kwargs: Any) -> _Out: ...


def functional_call_masked(
    module: Forward[_Out],
    params: Params,
    masks: Mapping[str, Tensor],
    args: Any,
    kwargs: dict[str, Any] | None = None,
    *,
    buffers: Mapping[str, Tensor] | None = None,
    strict: bool = False,
) -> _Out:
    """Run ``module`` on masked ``params`` through :func:`torch.func.functional_call`.

    The module itself is not touched: ``apply_masks(params, masks)`` and the
    buffers replace its tensors for this one call.

    In a mixture-of-experts model (a transformers MoE layer: a router and
    its stacked experts), an expert whose router row the masks prune
    entirely is removed: it is never routed to (its router logit is
    ``-inf``), as in the model :func:`~funcprune.shrink` makes without it.
    At least ``top_k`` experts stay routed.

    Args:
        module: the module whose ``forward`` runs.
        params: its parameters by name (all or some of them; the others
            are taken from the module, and masked where ``masks`` has
            their names).
        masks: masks by name, as in :func:`apply_masks`.
        args: the positional argument(s) of ``forward``: one value, or a
            tuple of them.
        kwargs: keyword arguments of ``forward``.
        buffers: buffers by name (such as the second dict of
            :func:`torch.func.stack_module_state` under ``vmap``); the
            module's own buffers by default.
        strict: passed to :func:`apply_masks`.

    Returns:
        What ``module(*args, **kwargs)`` returns, typed as its ``forward``
        is annotated (``Any`` for an unannotated forward).

    >>> import torch, funcprune as fp
    >>> lin = torch.nn.Linear(2, 1, bias=False)
    >>> params = {"weight": torch.tensor([[2.0, 3.0]])}
    >>> fp.functional_call_masked(lin, params, {"weight": torch.tensor([[True, False]])},
    ...                           torch.ones(1, 2))
    tensor([[2.]])
    """
    net = _check_module_names(module, params, masks, buffers)
    if isinstance(params, Mapping) and isinstance(masks, Mapping):  # a masked parameter left out: the module's
        missing = {n: p for n, p in net.named_parameters(remove_duplicate=False) if n in masks and n not in params}
        params = {**missing, **params} if missing else params
    masked = apply_masks(params, masks, strict=strict)
    tensors = dict(net.named_buffers()) if buffers is None else dict(buffers)
    tensors.update(masked)
    with never_routed(net, masks):
        out: _Out = torch.func.functional_call(net, tensors, args, kwargs)
    return out


def _check_module_names(
    module: object, params: Params, masks: object, buffers: object
) -> nn.Module:
    """``module``, after refusing names that are no tensor of it (torch would ignore them)."""
    fn = "functional_call_masked"
    if not isinstance(module, nn.Module):
        raise TypeError(f"{fn}: module must be a torch.nn.Module, got {type(module).__name__}")
    check_not_fsdp(fn, module)
    known = [n for n, _ in module.named_parameters(remove_duplicate=False)]
    known += [n for n, _ in module.named_buffers(remove_duplicate=False)]
    names = set(known)
    for what, given in (("params", params), ("masks", masks), ("buffers", buffers)):
        if not isinstance(given, Mapping):
            continue  # None, or refused with its own message by the checks after
        for name in given:
            if name not in names:
                problem = f"{what} has the key {name!r}, which is no tensor of the module"
                raise unknown_name(fn, problem, name, known)
    return module



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
        name: masked_multiply(g, checked[name]) if name in checked else g
        for name, g in grads.items()
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
    checked = _checked("apply_masks_", params, masks, False)
    for name in checked:
        _check_writable("apply_masks_", f"params[{name!r}]", params[name])
    for name, mask in checked.items():
        params[name].mul_(as_multiplier(mask, params[name].dtype))


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
    checked = _checked("mask_gradients_", params, masks, False)
    for name in checked:
        grad = params[name].grad
        if grad is not None:
            _check_writable("mask_gradients_", f"params[{name!r}].grad", grad)
    for name, mask in checked.items():
        grad = params[name].grad
        if grad is not None:
            grad.mul_(as_multiplier(mask, grad.dtype))


def _check_writable(fn: str, what: str, tensor: Tensor) -> None:
    """Refuse, before anything is written, a tensor that cannot be written in place."""
    if tensor.is_inference() and not torch.is_inference_mode_enabled():
        problem = "is an inference tensor (made under torch.inference_mode), which cannot be written outside it"
    elif any(stride == 0 and size > 1 for stride, size in zip(tensor.stride(), tensor.shape, strict=True)):
        problem = "is an expanded view (several entries share one memory location), which cannot be written in place"
    else:
        return
    raise ValueError(
        f"{fn}: {what} {problem}; nothing was written. Pass a tensor that can be written "
        "(a clone), or use the pure version, which returns new tensors"
    )
