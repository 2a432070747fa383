"""Module state shared by the compat layer: hook lookup, batches, and the
snapshots that make every mutating call all-or-nothing (:func:`rollback`).

A :class:`Snapshot` records everything a pruning call may touch on one module
(its parameters, buffers, forward pre-hooks, the history of its pruning
containers, the plain attributes named, RNN flat weights and parameter
data, and the forward pre-hooks of the parents that read it directly, see
:mod:`._parents`); :meth:`Snapshot.restore` puts all of it back in place,
keeping the dicts' identities and orders. :func:`rollback` wraps a call in
snapshots of every module it may change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any

import torch.nn.utils.prune as torch_prune
from torch import nn

from ._parents import reading_parents, sync_refreshers

__all__ = [
    "Snapshot",
    "TorchBase",
    "TorchContainer",
    "batch",
    "in_batch",
    "pruning_hooks",
    "rollback",
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


#: Gives a module's ``parents`` argument of :class:`Snapshot` (``None``: look them up).
ParentsOf = Callable[[nn.Module], "list[tuple[nn.Module, str]] | None"]


def _look_up(module: nn.Module) -> None:
    return None


def _snapshots(
    modules: Iterable[tuple[nn.Module, str]], parents: ParentsOf = _look_up
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


@contextlib.contextmanager
def rollback(
    pairs: Iterable[tuple[nn.Module, str]], parents: ParentsOf = _look_up
) -> Iterator[None]:
    """All or nothing: undo every change to the modules of ``pairs`` if the block raises.

    Takes one :class:`Snapshot` per distinct module first. When the block
    completes, gives each module's parents the refreshers it needs
    (:func:`~._parents.sync_refreshers`); if anything raises (within the
    block or the syncing, ``KeyboardInterrupt`` included), restores the
    modules in reverse order and re-raises.

    Args:
        pairs: the ``(module, name)`` pairs the block may change.
        parents: gives each module's ``parents`` argument of :class:`Snapshot`
            (by default ``None``: look them up).

    >>> fc = nn.Linear(2, 2)
    >>> with contextlib.suppress(RuntimeError), rollback([(fc, "bias")]):
    ...     del fc._parameters["bias"]
    ...     raise RuntimeError("boom")
    >>> "bias" in fc._parameters
    True
    """
    saved = _snapshots(pairs, parents)
    try:
        yield
        for snapshot in saved:
            sync_refreshers(snapshot.module, snapshot.parents)
    except BaseException:
        for snapshot in reversed(saved):
            snapshot.restore()
        raise
