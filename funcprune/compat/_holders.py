"""Which modules hold an object: the look-ups behind tying and parent checks.

A pruning call is given one submodule, yet two facts about the rest of the
model matter to it: whether the :class:`~torch.nn.Parameter` being pruned is
also held by another module (weight tying, :mod:`._tying`), and which
module reads a pruned child's tensors without calling the child
(:mod:`._parents`). Modules do not know who holds them, so both are found
from the other side with :func:`gc.get_referrers`: first the dicts that hold
the object, then the modules whose ``_parameters`` (or ``_modules``) those
dicts are. On Python 3.11 a module's ``__dict__`` may be inlined in the
object (then the module itself refers to the dict) or materialized (then its
``__dict__`` does, and one more level finds the module); both are handled.

A scan visits every object the garbage collector tracks (tens of
milliseconds in a large process); callers scan only when a cheap exact test
says they must, and look up several objects in one scan.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence

from torch import nn

__all__ = ["holders"]

Holder = tuple[nn.Module, str]


def holders(objs: Sequence[object], table: str) -> list[list[Holder]]:
    """The ``(module, key)`` pairs with ``module.<table>[key] is obj``, per object.

    Args:
        objs: the objects to look for (all found in the same scans).
        table: the module dict to search: ``"_parameters"`` or ``"_modules"``.

    Returns:
        One list per object of ``objs``, in its order; a module holding an
        object under two keys appears twice.
    """
    if not objs:
        return []
    wanted = {id(obj) for obj in objs}
    dicts = [
        ref
        for ref in gc.get_referrers(*objs)
        if isinstance(ref, dict) and any(id(value) in wanted for value in ref.values())
    ]
    found: dict[int, list[Holder]] = {id(obj): [] for obj in objs}
    for module in _owners(dicts, table):
        for key, value in getattr(module, table).items():
            if id(value) in found:
                found[id(value)].append((module, key))
    return [found[id(obj)] for obj in objs]


def _owners(dicts: list[dict[object, object]], table: str) -> list[nn.Module]:
    """The distinct modules whose ``table`` is one of ``dicts``."""
    if not dicts:
        return []
    tables = {id(d) for d in dicts}
    owners: dict[int, nn.Module] = {}
    namespaces: list[dict[str, object]] = []
    for ref in gc.get_referrers(*dicts):
        if isinstance(ref, nn.Module) and id(getattr(ref, table, None)) in tables:
            owners[id(ref)] = ref  # an inlined __dict__: the module itself refers to it
        elif isinstance(ref, dict) and id(ref.get(table)) in tables:
            namespaces.append(ref)  # a materialized __dict__, held by its module
    if namespaces:
        spaces = {id(space) for space in namespaces}
        for ref in gc.get_referrers(*namespaces):
            if isinstance(ref, nn.Module) and id(vars(ref)) in spaces:
                owners[id(ref)] = ref
    return list(owners.values())
