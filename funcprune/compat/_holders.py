"""Which modules hold an object: the look-ups behind tying and parent checks.

Holders are found in the module trees a call is given (:func:`tree_holders`),
plus the ties compat saw earlier in a larger tree (:func:`remember_ties`).
The heap (:func:`heap_holders`, :func:`gc.get_referrers`) is searched only
for the parent of a ``MultiheadAttention``'s ``out_proj`` pruned by itself
for the first time (``README.md``).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterable, Sequence

from torch import nn

__all__ = ["heap_holders", "known_holders", "modules_under", "remember_ties", "tree_holders"]

Holder = tuple[nn.Module, str]


def modules_under(roots: Iterable[object]) -> list[nn.Module]:
    """The distinct modules of the trees of ``roots`` (non-modules skipped), in order."""
    found: dict[int, nn.Module] = {}
    for root in roots:
        if isinstance(root, nn.Module) and id(root) not in found:
            for module in root.modules():
                found.setdefault(id(module), module)
    return list(found.values())


def tree_holders(objs: Sequence[object], table: str, modules: Sequence[nn.Module]) -> list[list[Holder]]:
    """The ``(module, key)`` pairs of ``modules`` with ``module.<table>[key] is obj``, per object.

    Args:
        objs: the objects to look for.
        table: the module dict to search: ``"_parameters"`` or ``"_modules"``.
        modules: where to look (:func:`modules_under` of the call's modules).

    Returns:
        One list per object of ``objs``, in its order; a module holding an
        object under two keys appears twice.
    """
    found: dict[int, list[Holder]] = {id(obj): [] for obj in objs}
    if found:
        for module in modules:
            for key, value in getattr(module, table).items():
                if id(value) in found:
                    found[id(value)].append((module, key))
    return [found[id(obj)] for obj in objs]


#: Ties seen in a whole tree (install_masks_, global_unstructured): id of the
#: Parameter -> (the Parameter, weakly; its holders, weakly, with their keys).
_TIES: dict[int, tuple[weakref.ref[object], list[tuple[weakref.ref[nn.Module], str]]]] = {}


def remember_ties(param: object, holders: Sequence[Holder]) -> None:
    """Record that ``holders`` (two or more) share ``param``, as long as it lives."""
    key = id(param)

    def forget(_: object) -> None:
        _TIES.pop(key, None)

    _TIES[key] = (
        weakref.ref(param, forget),
        [(weakref.ref(module), name) for module, name in holders],
    )


def known_holders(param: object) -> list[Holder]:
    """The remembered holders of ``param`` that still hold it (pruned since, or not)."""
    entry = _TIES.get(id(param))
    if entry is None or entry[0]() is not param:
        return []
    alive: list[Holder] = []
    for ref, name in entry[1]:
        module = ref()
        if module is None:
            continue
        plain = name.removesuffix("_orig")
        for key in dict.fromkeys((plain, plain + "_orig", name)):
            if module._parameters.get(key) is param:
                alive.append((module, key))
    return alive


def heap_holders(objs: Sequence[object], table: str) -> list[list[Holder]]:
    """As :func:`tree_holders`, over every module on the heap (a scan of every object).

    Used only to find the ``MultiheadAttention`` of an ``out_proj`` pruned
    by itself (:mod:`._parents`): nothing else links a child to its parent.
    """
    if not objs:
        return []
    wanted = {id(obj) for obj in objs}
    dicts = [
        ref
        for ref in gc.get_referrers(*objs)
        if isinstance(ref, dict) and any(id(value) in wanted for value in ref.values())
    ]
    return tree_holders(objs, table, _owners(dicts, table))


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
