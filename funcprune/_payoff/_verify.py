"""Checking a smaller model against the masked one, and finding what breaks it.

:func:`mismatch` runs a smaller copy in eval mode on the example inputs and
says how it fails to compute what the masked model computes (an error it
raises, and where; or how far its outputs are): float64 outputs to 1e-9 of
their largest magnitude, others to ``rtol=1e-4``. :func:`search` finds the
items (groups of channels, unit groups) whose removal makes that check
fail, in a few probes: items that change the same shapes alike
(:func:`shape_changes`: the channels of one layer) go as one part first,
and where removing one of a failing class alone raises, all of them do.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, final

import torch
from torch import nn

from .._graph import Analysis, Inputs, own_indices, run
from .._torch_private import tree_leaves
from .._types import Tensor

__all__ = ["Failure", "Later", "differ_in_eval", "evaluating", "mismatch", "outputs_in_eval", "search", "shape_changes"]


def differ_in_eval(small: nn.Module, inputs: Inputs, reference: Any) -> str | None:
    """Why ``small``, run in eval mode on ``inputs``, computes something else than ``reference`` (or ``None``)."""
    found = mismatch(small, inputs, reference)
    return None if found is None else found.why


@final
@dataclass(frozen=True, slots=True)


class Failure:
    """Why a smaller model fails the check, and where it raised (``None``: it ran, and computes something else).

    ``module``: the path of the innermost module of the smaller model that was running when it raised (``None``:
    it did not raise, or raised outside every module's ``forward``).
    """

    why: str
    where: str | None = None
    module: str | None = None


@final
@dataclass(frozen=True, slots=True)
class Later:
    """A reference computed only if the smaller model runs (a probe that raises needs none)."""

    make: Callable[[], Any]


def mismatch(small: nn.Module, inputs: Inputs, reference: Any, *, float64: tuple[float, float] | None = None) -> Failure | None:
    """How ``small``, run in eval mode on ``inputs``, fails to compute ``reference`` (or ``None``).

    Each submodule's training flag is restored afterwards. ``float64``: the
    ``rtol`` and ``atol`` (times the largest magnitude) of float64 outputs,
    if not :data:`_FLOAT64_TOLERANCE`. A :class:`Later` reference is made
    once ``small`` has run (not where it raised).
    """
    try:
        outputs = _in_eval(small, inputs)
    except Exception as e:  # a size spelled out in the code no longer fits
        frames = traceback.extract_tb(e.__traceback__)
        where = f"{type(e).__name__} at {frames[-1].filename}:{frames[-1].lineno}" if frames else type(e).__name__
        return Failure(f"{type(e).__name__}: {e}", where, _raised_in(small, e))
    if isinstance(reference, Later):
        reference = reference.make()
    why = _differ(outputs, reference, float64 or _FLOAT64_TOLERANCE)
    return None if why is None else Failure(why)


def _raised_in(small: nn.Module, e: BaseException) -> str | None:
    """The path of the innermost module of ``small`` whose code (``self``) was on the stack where ``e`` was raised."""
    paths = {id(m): path for path, m in small.named_modules()}
    found = None
    tb = e.__traceback__
    while tb is not None:
        path = paths.get(id(tb.tb_frame.f_locals.get("self")))
        if path is not None:
            found = path
        tb = tb.tb_next
    return found


def outputs_in_eval(fn: str, small: nn.Module, inputs: Inputs) -> Any:
    """What ``small`` (a smaller model, unchecked) computes on ``inputs`` in eval mode, or a ValueError saying
    that it fails there."""
    try:
        return _in_eval(small, inputs)
    except Exception as e:
        raise ValueError(
            f"{fn}: the smaller model fails on the example inputs ({type(e).__name__}: {e}); with check=True, "
            f"{fn} finds the channels whose removal breaks it and keeps them"
        ) from e


def _in_eval(module: nn.Module, inputs: Inputs) -> Any:
    """``module`` run on ``inputs`` in eval mode, each submodule's training flag restored after."""
    with evaluating(module):
        return run(module, inputs)


@contextlib.contextmanager
def evaluating(module: nn.Module) -> Iterator[None]:
    """Within: ``module`` in eval mode; after, each submodule's training flag as it was."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode


_T = TypeVar("_T")


def search(
    items: Sequence[_T], shape_of: Callable[[_T], object], fails: Callable[[Sequence[_T]], Failure | None],
    inside: Callable[[_T, str], bool] | None = None, failed: Failure | None = None,
) -> dict[_T, Failure]:  # fmt: skip
    """The items whose removal fails the check, each with its failure; the others pass, removed together.

    A probe removes the items found good so far and a part of the others.
    Items that change the same shapes by the same counts (``shape_of``: the
    channels of one layer, alike) go first as one part each, halved over such
    classes, so that a few probes clear every layer that is fine. Where a
    probe raises inside a module (:attr:`Failure.module`) and ``inside`` says
    that some of its parts change tensors of that module but not all, those
    parts are set aside first instead (the others probed next): a model whose
    every block of one kind raises (heads that ``nn.MultiheadAttention``
    cannot lose) takes a probe per block, not a halving per block. In a class
    that fails, where removing its first item alone raises an error, removing
    any other alone raises too (shapes are all the error can depend on: a size
    the code spells out), and the whole class fails; otherwise its items are
    halved one by one. What is found is checked by probes either way: the
    items that go pass together, and each that fails, failed on top of them.
    No set is probed twice: where one part of a failing set passes, the
    rest on top of it is that set again, and its failure is known.
    ``failed``: how removing every item fails, where a probe already said.
    """
    known: dict[frozenset[_T], Failure | None] = {} if failed is None else {frozenset(items): failed}

    def probe(removed: Sequence[_T]) -> Failure | None:
        key = frozenset(removed)
        if key not in known:
            known[key] = fails(removed)
        return known[key]

    classes: dict[object, list[_T]] = {}
    for item in items:
        classes.setdefault(shape_of(item), []).append(item)
    good: list[_T] = []
    bad: dict[_T, Failure] = {}
    todo: list[list[list[_T]]] = [list(classes.values())]
    while todo:
        parts = todo.pop()
        failure = probe(good + [item for part in parts for item in part])
        if failure is None:
            good.extend(item for part in parts for item in part)
        elif len(parts) > 1:
            todo.extend(_split(parts, failure.module, inside))
        else:
            bad.update(_search_alike(parts[0], failure, good, probe))
    return bad


def _split(parts: list[list[_T]], module: str | None, inside: Callable[[_T, str], bool] | None) -> list[list[list[_T]]]:
    """``parts`` in two, the one to probe next last: those that change the module that raised and the others, or
    (where that tells nothing) halves."""
    if module is not None and inside is not None:
        near = [part for part in parts if any(inside(item, module) for item in part)]
        if 0 < len(near) < len(parts):
            return [near, [part for part in parts if not any(inside(item, module) for item in part)]]
    return [parts[len(parts) // 2 :], parts[: len(parts) // 2]]


def _search_alike(
    alike: list[_T], failed: Failure, good: list[_T], fails: Callable[[Sequence[_T]], Failure | None]
) -> dict[_T, Failure]:
    """The items of one class whose removal fails (on top of ``good``, extended with those that pass)."""
    alone = fails(good + alike[:1]) if len(alike) > 1 else failed
    if alone is not None and (len(alike) == 1 or alone.where is not None):
        return dict.fromkeys(alike, alone)
    bad: dict[_T, Failure] = {}
    todo: list[list[_T]] = [alike]
    while todo:
        part = todo.pop()
        failure = fails(good + part)
        if failure is None:
            good.extend(part)
        elif len(part) == 1:
            bad[part[0]] = failure
        else:
            todo.extend([part[len(part) // 2 :], part[: len(part) // 2]])
    return bad


def shape_changes(analysis: Analysis) -> dict[int, tuple[tuple[str, int, int], ...]]:
    """For each group, the shapes its removal alone changes: (tensor, dim, how many indices) each, sorted."""
    return {
        group: tuple(sorted((tensor, dim, len(indices)) for (tensor, dim), indices in feet.items()))
        for group, feet in own_indices(analysis).items()
    }


#: (rtol, atol relative to the output's largest magnitude) of the check in float64: far above its rounding
#: (a shrunk ShuffleNet differs by 4e-16), far below a channel read in the wrong place (2e-4 there).
_FLOAT64_TOLERANCE = (1e-9, 1e-9)


def _differ(outputs: Any, reference: Any, float64: tuple[float, float]) -> str | None:
    """Why two model outputs differ beyond rounding, or ``None``.

    Float64 outputs are compared to :data:`_FLOAT64_TOLERANCE`, other
    floating outputs to ``rtol=1e-4`` and ``atol=1e-5`` times their largest
    magnitude (at least 1).
    """
    got = tree_leaves(outputs)
    want = tree_leaves(reference)
    if len(got) != len(want):
        return f"{len(got)} outputs against {len(want)}"
    for a, b in zip(got, want, strict=True):
        if not isinstance(a, Tensor) or not isinstance(b, Tensor):
            continue
        if a.shape != b.shape:
            return f"an output of shape {tuple(a.shape)} against {tuple(b.shape)}"
        if a.is_floating_point():
            scale = float(b.abs().nan_to_num(posinf=0, neginf=0).max()) if b.numel() else 0.0
            if b.dtype == torch.float64:
                rtol, atol = float64[0], float64[1] * scale
            else:
                rtol, atol = 1e-4, 1e-5 * max(1.0, scale)
            if a.dtype != b.dtype or not torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
                return f"outputs differ by up to {float((a.double() - b.double()).abs().nan_to_num().max()):.3g}"
        elif not torch.equal(a, b):
            return "integer outputs differ"
    return None
