"""The pruned attribute (``module.<name> = mask * orig``) and its copy protocols.

Hook mode stores the pruned tensor as a plain attribute, recomputed by the
forward pre-hook. It is not a graph leaf, so torch cannot deep-copy it; compat
gives it two per-tensor protocol methods: a ``__deepcopy__``
(:class:`PrunedDeepcopy`) and a ``__getstate__`` that keeps the first out of
pickles, so that a saved pruned tensor is a plain tensor
(``torch.load(..., weights_only=True)`` accepts it).
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

import torch
from torch import nn

from .._torch_private import is_functorch_wrapped
from ._state import TorchBase

__all__ = ["PrunedDeepcopy", "set_pruned"]


class PrunedDeepcopy:
    """The ``__deepcopy__`` of a pruned attribute (``module.weight``).

    torch cannot deep-copy a tensor that is not a graph leaf, and the pruned
    attribute (``mask * orig``) is not one, so ``copy.deepcopy`` of a module
    pruned by ``torch.nn.utils.prune`` fails. This callable recomputes the
    attribute from the *copied* ``orig`` and ``mask`` instead (the ones the
    module's own copy holds, via ``memo``), so the copy's attribute is linked
    to the copy's parameter as the original is to the original's.

    It holds no reference to the module or the tensor (no reference cycle)
    and pickles with them.
    """

    __slots__ = ("method", "orig", "mask")

    def __init__(self, method: TorchBase, orig: torch.Tensor, mask: torch.Tensor) -> None:
        self.method = method
        self.orig = orig
        self.mask = mask

    def __getstate__(self) -> tuple[TorchBase, torch.Tensor, torch.Tensor]:
        return (self.method, self.orig, self.mask)

    def __setstate__(self, state: tuple[TorchBase, torch.Tensor, torch.Tensor]) -> None:
        self.method, self.orig, self.mask = state

    def __call__(self, memo: dict[int, Any]) -> torch.Tensor:
        method = copy.deepcopy(self.method, memo)
        orig = copy.deepcopy(self.orig, memo)
        mask = copy.deepcopy(self.mask, memo)
        name = method._tensor_name
        holder = nn.Module()  # the copies only, as apply_mask reads them
        holder.register_buffer(name + "_orig", orig)
        holder.register_buffer(name + "_mask", mask)
        try:
            pruned: torch.Tensor = method.apply_mask(holder)
        except AttributeError:  # a custom apply_mask that needs the real module
            pruned = mask.to(dtype=orig.dtype) * orig
        _attach_deepcopy(pruned, method, orig, mask)
        return pruned


class _PlainState:
    """The ``__getstate__`` of a pruned attribute: its state without compat's entries.

    torch pickles a tensor's ``__dict__`` (``Tensor.__reduce_ex__`` asks
    ``__getstate__`` for it, see ``torch._utils._get_obj_state``), so the
    per-tensor ``__deepcopy__`` would be saved with the tensor and refused by
    ``torch.load(weights_only=True)``. This callable returns the ``__dict__``
    without the two protocol entries; an empty one (as for any plain tensor)
    makes torch take its plain-tensor path: the pickle is a plain tensor's.
    It refers to its tensor weakly (no reference cycle).
    """

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = weakref.ref(tensor)

    def __call__(self) -> dict[str, Any]:
        tensor = self.tensor()
        state = {} if tensor is None else tensor.__dict__
        return {k: v for k, v in state.items() if k not in ("__deepcopy__", "__getstate__")}


def _attach_deepcopy(
    pruned: object, method: TorchBase, orig: object, mask: object
) -> None:
    """Give ``pruned`` its ``__deepcopy__`` where torch's would fail.

    Only for a tensor that needs one (``requires_grad``: not a graph leaf)
    computed from the module's real parameter, not from tensors swapped in
    by ``torch.func.functional_call`` or wrapped by a ``torch.func``
    transform (those leave a stale attribute that the next forward replaces).
    A ``__getstate__`` (:class:`_PlainState`) keeps it out of pickles.
    """
    if not (
        isinstance(pruned, torch.Tensor)
        and pruned.requires_grad
        and isinstance(orig, nn.Parameter)
        and isinstance(mask, torch.Tensor)
    ):
        return
    if not torch.compiler.is_compiling() and is_functorch_wrapped(pruned):
        return
    pruned.__deepcopy__ = PrunedDeepcopy(method, orig, mask)  # type: ignore[method-assign]
    pruned.__getstate__ = _PlainState(pruned)  # type: ignore[attr-defined]


def set_pruned(module: nn.Module, method: TorchBase, pruned: object) -> None:
    """Store the pruned tensor as the plain attribute ``module.<name>``.

    Exactly ``setattr(module, name, pruned)`` as torch does (RNN modules
    refresh their flat weights in ``__setattr__``), plus a per-tensor
    ``__deepcopy__`` so that ``copy.deepcopy`` of the module works.
    """
    name = method._tensor_name
    setattr(module, name, pruned)
    orig = module._parameters.get(name + "_orig")
    mask = module._buffers.get(name + "_mask")
    _attach_deepcopy(pruned, method, orig, mask)
