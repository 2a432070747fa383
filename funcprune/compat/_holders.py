"""Which modules hold an object: the look-ups behind tying and parent checks.

Found from the other side with :func:`gc.get_referrers` (a heap scan, run
only when a cheap exact test says it must; ``README.md``).
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
