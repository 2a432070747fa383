"""Hook mode's reparametrization of a tensor, and its undoing.

Pruning ``name`` the first time moves the parameter to ``name + "_orig"``
(the very same :class:`~torch.nn.Parameter`), registers the mask as the
buffer ``name + "_mask"``, stores ``mask * orig`` as the plain attribute
``name`` and installs the method itself as a forward pre-hook. Pruning it
again folds the new method into a container that takes the old hook's place
among the forward pre-hooks (torch moves it to the end).
:func:`unreparametrize` puts the Parameter back under ``name``.

Both change the module step by step, as torch does; their callers undo a
failure with :func:`~._state.rollback`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ._pruned import set_pruned
from ._state import TorchBase, TorchContainer

__all__ = ["reparametrize", "unreparametrize"]

Tensor = torch.Tensor


def reparametrize(
    module: nn.Module,
    name: str,
    method: TorchBase,
    old: tuple[int, TorchBase] | None,
    importance_scores: Tensor | None,
    wrap: Callable[[TorchBase], TorchContainer],
) -> TorchBase:
    """Prune ``module.<name>`` with ``method``: the body of ``BasePruningMethod.apply``.

    Args:
        module: the module holding the tensor.
        name: the tensor's name (``method._tensor_name``).
        method: the new method.
        old: the ``(key, hook)`` of the hook already pruning ``name``, if any.
        importance_scores: scores of the tensor's shape, or ``None`` (the
            tensor itself: the currently pruned one when re-pruning).
        wrap: makes a container holding an old hook that is not one.

    Returns:
        The hook: ``method``, or the container now holding it.

    Raises:
        AssertionError: if ``importance_scores`` has another shape (torch's message).
    """
    hook = method if old is None else _add_to(old[1], method, wrap)
    orig = getattr(module, name)
    scores = _importance(module, name, orig, importance_scores)
    if not isinstance(hook, TorchContainer):
        module.register_parameter(name + "_orig", orig)
        del module._parameters[name]
        default_mask = torch.ones_like(orig)
    else:
        mask_so_far = getattr(module, name + "_mask")
        default_mask = mask_so_far.detach().clone(memory_format=torch.contiguous_format)
    mask = hook.compute_mask(scores, default_mask=default_mask)
    module.register_buffer(name + "_mask", mask)
    set_pruned(module, hook, hook.apply_mask(module))
    if old is None:
        module.register_forward_pre_hook(hook)
    else:
        module._forward_pre_hooks[old[0]] = hook  # the old hook's place
    return hook


def _add_to(
    old: TorchBase, method: TorchBase, wrap: Callable[[TorchBase], TorchContainer]
) -> TorchContainer:
    """The container of ``old``'s history with ``method`` appended."""
    container = old if isinstance(old, TorchContainer) else wrap(old)
    container.add_pruning_method(method)
    return container


def _importance(module: nn.Module, name: str, orig: Tensor, importance_scores: Tensor | None) -> Tensor:
    """``importance_scores``, checked against the tensor's shape, or the tensor."""
    if importance_scores is None:
        return orig
    if importance_scores.shape != orig.shape:
        raise AssertionError(
            f"importance_scores should have the same shape as parameter "
            f"{name} of {module}, got {importance_scores.shape} vs {orig.shape}"
        )
    return importance_scores


def unreparametrize(module: nn.Module, name: str, values: Tensor | None = None) -> None:
    """Make ``name_orig`` the parameter ``name`` again and drop ``name_mask``.

    The same :class:`~torch.nn.Parameter` comes back, holding ``values``
    (the pruned tensor, for ``remove``) or its own unpruned values. The hook
    is the caller's to remove.

    Raises:
        KeyError: if ``name_orig`` or ``name_mask`` is missing (as torch's ``remove``).
    """
    if hasattr(module, name):
        delattr(module, name)
    orig = module._parameters[name + "_orig"]
    if values is not None:
        orig.data = values.data  # type: ignore[union-attr]  # torch fails alike on None
    del module._parameters[name + "_orig"]
    del module._buffers[name + "_mask"]
    setattr(module, name, orig)  # RNNs refresh _flat_weights here
