"""Module surgery shared by the compat layer: hook lookup, the pruned
attribute, and snapshots that make every mutating call all-or-nothing.

A :class:`Snapshot` records everything a pruning call may touch on one module
(its parameters, buffers, forward pre-hooks, the history of its pruning
containers, the plain attributes named, RNN flat weights and parameter
data, and the forward pre-hooks of the parents that read it directly, see
:mod:`._parents`); :meth:`Snapshot.restore` puts all of it back in place,
keeping the dicts' identities and orders.

The pruned attribute carries two per-tensor protocol methods: a
``__deepcopy__`` (torch cannot deep-copy it) and a ``__getstate__`` that
keeps the first out of pickles, so that a saved pruned tensor is a plain
tensor (``torch.load(..., weights_only=True)`` accepts it).
"""

from __future__ import annotations

import contextlib
import copy
import types
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

from ._parents import reading_parents

__all__ = [
    "Snapshot",
    "TorchBase",
    "TorchContainer",
    "batch",
    "in_batch",
    "pruning_hooks",
    "set_pruned",
    "snapshots",
]

#: torch's base class: compat's methods subclass it, so this one check
#: recognises hooks installed by either library.
TorchBase = torch_prune.BasePruningMethod
TorchContainer = torch_prune.PruningContainer


_BATCH: ContextVar[bool] = ContextVar("funcprune_compat_batch", default=False)


@contextlib.contextmanager
def batch() -> Iterator[None]:
    """Prune several tensors in one call (``global_unstructured``, ``install_masks_``).

    Within it, ``BasePruningMethod.apply`` leaves two module-wide tasks to its
    caller, which does them once for all its tensors: the check for tied
    Parameters (:mod:`._tying`; ``install_masks_`` hooks tied users on
    purpose) and the parents' refreshers (:mod:`._parents`), snapshots
    included.
    """
    token = _BATCH.set(True)
    try:
        yield
    finally:
        _BATCH.reset(token)


def in_batch() -> bool:
    """Whether the current call runs within :func:`batch`."""
    return _BATCH.get()


def pruning_hooks(module: nn.Module, name: str) -> list[tuple[int, TorchBase]]:
    """The ``(key, hook)`` pairs of ``module``'s pruning hooks acting on ``name``.

    Hooks of ``torch.nn.utils.prune`` and of ``funcprune.compat`` both count.
    """
    return [
        (key, hook)
        for key, hook in module._forward_pre_hooks.items()
        if isinstance(hook, TorchBase) and hook._tensor_name == name
    ]


class _PrunedDeepcopy:
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
        holder = types.SimpleNamespace(**{name + "_orig": orig, name + "_mask": mask})
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
    if not torch.compiler.is_compiling() and torch._C._functorch.is_functorch_wrapped_tensor(
        pruned
    ):
        return
    pruned.__deepcopy__ = _PrunedDeepcopy(method, orig, mask)  # type: ignore[method-assign]
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


class Snapshot:
    """What a pruning call may change on ``module``, to undo it on failure.

    Args:
        module: the module about to be changed.
        names: the plain attributes (pruned tensors) to record as well.
        parents: the ``(parent, attribute)`` pairs of the parents whose
            refreshers the call may change (:mod:`._parents`); found with
            :func:`~._parents.reading_parents` by default.
    """

    def __init__(
        self,
        module: nn.Module,
        names: Iterable[str] = (),
        parents: list[tuple[nn.Module, str]] | None = None,
    ) -> None:
        self.module = module
        self.parameters = dict(module._parameters)
        self.data = [(p, p.data) for p in module._parameters.values() if p is not None]
        self.buffers = dict(module._buffers)
        self.non_persistent = set(module._non_persistent_buffers_set)
        self.hooks = dict(module._forward_pre_hooks)
        self.histories = [
            (hook, hook._pruning_methods)
            for hook in module._forward_pre_hooks.values()
            if isinstance(hook, TorchContainer)
        ]
        missing = object()
        self.attrs = {name: module.__dict__.get(name, missing) for name in names}
        self.missing = missing
        flat = module.__dict__.get("_flat_weights")
        self.flat = list(flat) if isinstance(flat, list) else None
        self.parents = reading_parents(module) if parents is None else parents
        self.parent_hooks = [(p, dict(p._forward_pre_hooks)) for p, _ in self.parents]

    def restore(self) -> None:
        """Put the module back exactly as it was when the snapshot was taken."""
        module = self.module
        _refill(module._parameters, self.parameters)
        for param, data in self.data:
            if (param.data_ptr(), param.shape, param.stride()) != (
                data.data_ptr(),
                data.shape,
                data.stride(),
            ):
                param.data = data
        _refill(module._buffers, self.buffers)
        module._non_persistent_buffers_set.clear()
        module._non_persistent_buffers_set.update(self.non_persistent)
        _refill(module._forward_pre_hooks, self.hooks)
        for hook, history in self.histories:
            hook._pruning_methods = history
        for name, value in self.attrs.items():
            if value is self.missing:
                module.__dict__.pop(name, None)
            else:
                module.__dict__[name] = value
        flat = module.__dict__.get("_flat_weights")
        if self.flat is not None and isinstance(flat, list):
            flat[:] = self.flat
        for parent, hooks in self.parent_hooks:
            _refill(parent._forward_pre_hooks, hooks)


def _refill(target: dict[Any, Any], saved: dict[Any, Any]) -> None:
    target.clear()
    target.update(saved)


def snapshots(
    modules: Iterable[tuple[nn.Module, str]],
    parents: Callable[[nn.Module], list[tuple[nn.Module, str]] | None] = lambda module: None,
) -> list[Snapshot]:
    """One snapshot per distinct module of ``(module, name)`` pairs.

    Args:
        modules: the ``(module, name)`` pairs about to be changed.
        parents: gives each module's ``parents`` argument of :class:`Snapshot`
            (``None``: look them up).
    """
    names: dict[int, tuple[nn.Module, set[str]]] = {}
    for module, name in modules:
        names.setdefault(id(module), (module, set()))[1].add(name)
    return [Snapshot(module, attrs, parents(module)) for module, attrs in names.values()]
