"""``remove`` and ``is_pruned``: pruning made permanent, and whether a module is pruned.

Same names, signatures, behaviour and exceptions as torch's functions. Both
also recognise modules pruned by ``torch.nn.utils.prune``; :func:`remove`
makes a tied Parameter permanent in every holder together (see
:mod:`._tying`), all or nothing.
"""

from __future__ import annotations

from collections import Counter

from torch import nn

from ._functions import M
from ._state import TorchBase, pruning_hooks, rollback
from ._tying import forget_removal, remember_removal, removed_before, removed_together

__all__ = ["is_pruned", "remove"]


def remove(module: M, name: str) -> M:
    """Make the pruning of ``module.<name>`` permanent and drop its hook.

    The same :class:`~torch.nn.Parameter` object becomes ``module.<name>``
    again, holding the pruned values; ``name_orig``, ``name_mask`` and the
    hook go away. Works on modules pruned by ``torch.nn.utils.prune`` too.

    A tied Parameter (``lm_head.weight = embedding.weight``) pruned in
    every holder, as ``global_unstructured`` over all of them and
    ``install_masks_`` prune it, is made permanent in every holder that
    compat sees (as pruning sees them: ``module``'s tree and the ties compat
    hooked): each holds the same plain Parameter again, with the pruned
    values, where torch would leave the others hooked over the Parameter
    that this holder now trains whole. A later ``remove`` of another of
    those holders returns it unchanged, so a loop over the pairs pruned
    works as with torch.

    Raises:
        ValueError: if ``module.<name>`` is not pruned, or another holder of
            its tied Parameter is pruned with another mask (one Parameter
            cannot hold both; nothing is changed).

    >>> import torch, funcprune.compat as prune
    >>> m = prune.random_unstructured(torch.nn.Linear(5, 7), name="weight", amount=0.2)
    >>> m = prune.remove(m, name="weight")
    >>> sorted(name for name, _ in m.named_parameters())
    ['bias', 'weight']
    """
    found = pruning_hooks(module, name)
    if not found:
        if removed_before(module, name):  # made permanent by the remove of another holder of its tie
            return module
        raise ValueError(
            f"Parameter '{name}' of module {module} has to be pruned before pruning can be removed"
        )
    pairs = removed_together("remove", module, name)  # module's first, then the other holders of a tie
    going = Counter(id(holder) for holder, _ in pairs)  # how many of each module's pruning hooks go
    lasts = {
        id(holder): sum(isinstance(hook, TorchBase) for hook in holder._forward_pre_hooks.values()) == going[id(holder)]
        for holder, _ in pairs
    }
    with rollback(pairs, lambda holder: None if lasts[id(holder)] else []):  # parents: if the last
        for holder, tensor in pairs:
            key, hook = pruning_hooks(holder, tensor)[0]
            hook.remove(holder)
            del holder._forward_pre_hooks[key]
    forget_removal(pairs)
    remember_removal(pairs[1:])
    return module


def is_pruned(module: nn.Module) -> bool:
    """Whether ``module`` or a submodule has a pruning hook (torch's or ours).

    >>> import torch, funcprune.compat as prune
    >>> m = torch.nn.Linear(5, 7)
    >>> prune.is_pruned(m)
    False
    >>> _ = prune.random_unstructured(m, name="weight", amount=0.2)
    >>> prune.is_pruned(m)
    True
    """
    for _, submodule in module.named_modules():
        for hook in submodule._forward_pre_hooks.values():
            if isinstance(hook, TorchBase):
                return True
    return False
