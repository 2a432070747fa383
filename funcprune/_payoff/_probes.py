"""Probes: copies of a model without some groups, run and thrown away, that say what can go.

:func:`removable` is ``structure``'s trial (one unit of each group removed
at once; where that fails, the search finds which); :func:`breaking` is
``shrink``'s search for the groups whose removal changes the outputs. A
probe's copy shares the model's tensors, cut to views where what a dim
keeps is one run, and its masked model's tensors are copies with zeros
written where the groups go (:func:`~._smaller.probing`): a trial costs what
it changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from torch import nn

from .._graph import Analysis
from .._types import Tensor
from ._smaller import built, masked_outputs, probing, tensor_shapes
from ._verify import Failure, Later, mismatch, search, shape_changes

__all__ = ["breaking", "removable"]


def removable(module: nn.Module, analysis: Analysis, trial: Mapping[str, Sequence[int]]) -> dict[str, str]:
    """The entries of ``trial`` whose groups cannot go, each with why; the others go (checked).

    ``trial`` maps names (unit groups) to groups of ``analysis`` (of
    ``module``) to remove. They are removed all at once from a copy of
    ``module``, as :func:`shrink` removes them, and the smaller copy is
    checked against the masked model on the analysis' example inputs;
    where that fails, halving finds the entries whose removal does it, and
    each one's reason is what removing it alone gives (an error the copy
    raises, or how far its outputs are from the masked model's).
    """
    sizes = tensor_shapes(module)

    def fails(names: Sequence[str]) -> Failure | None:
        return _probe(module, analysis, {}, {g for name in names for g in trial[name]}, sizes)

    names = list(trial)
    failed = fails(names) if names else None
    if failed is None:
        return {}
    shapes = shape_changes(analysis)
    alike = {name: tuple(shapes.get(g, ()) for g in trial[name]) for name in names}
    tensors = {name: {t for changes in alike[name] for t, _, _ in changes} for name in names}
    found = search(names, alike.__getitem__, fails, lambda name, module: _under(tensors[name], module), failed)
    return {name: failure.why for name, failure in found.items()}


def breaking(
    module: nn.Module, analysis: Analysis, masks: Mapping[str, Tensor], removed: Sequence[int],
    sizes: Mapping[str, tuple[int, ...]], failed: Failure,
) -> list[int]:  # fmt: skip
    """The groups of ``removed`` whose removal changes the outputs (:func:`search`), the rest removable.

    ``failed``: how the copy without all of them fails the check (the caller's, not probed again).
    """

    def fails(groups: Sequence[int]) -> Failure | None:
        return _probe(module, analysis, masks, groups, sizes)

    shapes = shape_changes(analysis)
    tensors = {g: {t for t, _, _ in shapes.get(g, ())} for g in removed}
    return sorted(search(list(removed), lambda g: shapes.get(g, ()), fails, lambda g, module: _under(tensors[g], module),
                        failed))  # fmt: skip


def _under(tensors: Iterable[str], module: str) -> bool:
    """Whether one of ``tensors`` (names) belongs to the module at path ``module`` (``""``: the model, every one)."""
    return any(not module or t.startswith(module + ".") for t in tensors)


def _probe(
    module: nn.Module, analysis: Analysis, masks: Mapping[str, Tensor], groups: Iterable[int],
    sizes: Mapping[str, tuple[int, ...]],
) -> Failure | None:  # fmt: skip
    """How a probe's copy of ``module`` without ``groups`` (``masks`` closed over them) fails the check, or ``None``.

    The copy is cut to views where it can (a tensor that keeps one run of indices); if that copy fails and holds
    a tensor that is not contiguous, the failure is the one of a copy cut to new tensors (a model may read a
    weight as contiguous: ``weight.view(...)``).
    """
    removed = sorted(set(groups))
    keep, closed, dropped = probing(analysis, masks, removed, sizes)
    made: list[Any] = []

    def reference() -> Any:  # made once, if a copy runs
        if not made:
            made.append(masked_outputs(analysis, closed, dropped))
        return made[0]

    small, _ = built(module, analysis, keep, closed, removed, probe=True, masked=set(masks), views=True)
    failure = mismatch(small, analysis.inputs, Later(reference))  # (none if it raises)
    if failure is not None and not all(t.is_contiguous() for t in [*small.parameters(), *small.buffers()]):
        del small
        small, _ = built(module, analysis, keep, closed, removed, probe=True, masked=set(masks))
        failure = mismatch(small, analysis.inputs, Later(reference))
    return failure
