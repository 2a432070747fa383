"""Parents that read a pruned child's tensors without calling the child.

``MultiheadAttention`` reads ``out_proj.weight`` directly, so a pruned
``out_proj`` is refreshed by a :class:`RefreshChild` pre-hook on its parent
(pytorch/pytorch#69353, #78109; ``README.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.nn.utils.prune as torch_prune
from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

from ._holders import heap_holders, modules_under, tree_holders

__all__ = ["RefreshChild", "reading_parents", "sync_refreshers"]

#: The children each parent class reads without calling them.
_READ_DIRECTLY: tuple[tuple[type[nn.Module], str], ...] = ((nn.MultiheadAttention, "out_proj"),)


class RefreshChild:
    """A parent's forward pre-hook that recomputes its child's pruned tensors.

    Args:
        child: the child's attribute name in the parent (``"out_proj"``).
    """

    __slots__ = ("child",)

    def __init__(self, child: str) -> None:
        self.child = child

    def __getstate__(self) -> str:
        return self.child

    def __setstate__(self, state: str) -> None:
        self.child = state

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.child!r})"

    def __call__(self, module: nn.Module, inputs: Any) -> None:
        """Run the pruning hooks of ``module.<child>`` (if any), as its call would."""
        child = module._modules.get(self.child)
        if child is None:
            return
        for hook in list(child._forward_pre_hooks.values()):
            if isinstance(hook, torch_prune.BasePruningMethod):
                hook(child, ())


def reading_parents(
    module: nn.Module, within: Sequence[nn.Module] = ()
) -> list[tuple[nn.Module, str]]:
    """The ``(parent, attribute)`` pairs of parents that read ``module`` directly.

    Only a ``NonDynamicallyQuantizableLinear`` can have one: other modules
    cost nothing here. Its parent is looked for in the trees of ``within``
    (the modules of the call) first; where none reads it there, on the heap
    (one scan, see :mod:`._holders`): nothing else links a child to its parent.
    """
    if not isinstance(module, NonDynamicallyQuantizableLinear):
        return []
    readers = _readers(tree_holders([module], "_modules", modules_under(within))[0])
    return readers or _readers(heap_holders([module], "_modules")[0])


def _readers(holders: list[tuple[nn.Module, str]]) -> list[tuple[nn.Module, str]]:
    return [
        (parent, key)
        for parent, key in holders
        if any(isinstance(parent, cls) and key == attr for cls, attr in _READ_DIRECTLY)
    ]


def sync_refreshers(module: nn.Module, parents: list[tuple[nn.Module, str]]) -> None:
    """Give each of ``parents`` one :class:`RefreshChild` iff ``module`` is pruned."""
    pruned = any(
        isinstance(hook, torch_prune.BasePruningMethod)
        for hook in module._forward_pre_hooks.values()
    )
    for parent, key in parents:
        if parent._modules.get(key) is not module:
            continue
        hooks = parent._forward_pre_hooks
        present = [k for k, h in hooks.items() if isinstance(h, RefreshChild) and h.child == key]
        if pruned and not present:
            parent.register_forward_pre_hook(RefreshChild(key))
        elif not pruned:
            for hook_key in present:
                del hooks[hook_key]
