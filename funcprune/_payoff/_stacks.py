"""The stacks of a model: its runs of repeated blocks (a transformer's layers, a ResNet stage's blocks), by path.

Depth (``_depth.py``) removes their blocks; the masked model of a trial
zeroes entries block by block (``_smaller.py``); the structure reads a
model's kinds of blocks off them.
"""

from __future__ import annotations

from torch import nn

from .._torch_private import ConvNd

__all__ = ["block_names", "stacks_of"]


def stacks_of(model: nn.Module) -> dict[str, int]:
    """The stacks of ``model`` by path, each with its number of blocks (in the order of ``named_modules``).

    A stack is a ``ModuleList`` or ``Sequential`` of two blocks or more of one
    class, each holding a weight (a parameter of two dims or more: no list of
    norms), two of them alike at least (no list of stages of different
    widths, ConvNeXt's, whose blocks are the stacks), and in no block of
    another stack (the outermost: a transformer's layers, not the per-head
    norms inside them).
    """
    found: dict[str, int] = {}
    for path, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        if any(path.startswith(f"{outer}.") for outer in found):
            continue
        children = list(module.children())
        if len(children) < 2 or len({type(c) for c in children}) != 1 or isinstance(children[0], (nn.Linear, ConvNd)):
            continue
        if not all(any(p.dim() >= 2 for p in c.parameters()) for c in children):
            continue
        kinds = [tuple((n, tuple(p.shape)) for n, p in c.named_parameters()) for c in children]
        if len(set(kinds)) < len(kinds):  # two blocks alike at least: no list of stages of different widths
            found[path] = len(children)
    return found


def block_names(model: nn.Module, path: str) -> list[str]:
    """The names of the blocks of the stack at ``path``, as ``named_parameters`` prefixes them (``"model.layers.3"``)."""
    stack = model.get_submodule(path)
    return [f"{path}.{name}" if path else name for name, _ in stack.named_children()]
