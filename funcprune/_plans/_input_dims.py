"""Weights stored ``(in, out)``: how plans show them to the specs as ``(out, in)``.

A plan's ``input_dims`` (what :func:`~funcprune.input_dims` gives) says
where each weight's input features run. A weight whose input dim is 0
(transformers' ``Conv1D``, ``ConvTranspose``) has its dims 0 and 1 swapped
before the specs see it, its scores and earlier mask alike, and its mask
swapped back (contiguous): so ``NM(2, 4)`` groups along the inputs and
``LnStructured(dim=0)`` prunes output channels of a Linear and a
``Conv1D`` alike. Shapes only decide, never values: plans stay pure (vmap,
DTensor).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import overload

from .._types import Tensor

__all__ = ["Swapped", "as_seen", "as_stored", "check_input_dims", "check_swappable", "input_dims_repr"]

#: The names of the weights whose input dim is 0, sorted: what a plan keeps of its ``input_dims``.
Swapped = tuple[str, ...]


def check_input_dims(fn: str, input_dims: object) -> Swapped:
    """``input_dims`` checked: the names whose input dim is 0 (those of 1 change nothing)."""
    if input_dims is None:
        return ()
    if not isinstance(input_dims, Mapping):
        raise TypeError(
            f"{fn}: input_dims must be a mapping of parameter names to input dims (0 or 1) or None, "
            f"got {type(input_dims).__name__}; fp.input_dims(model) makes one"
        )
    for name, dim in input_dims.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"{fn}: input_dims keys must be non-empty parameter names, got {name!r}")
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"{fn}: input_dims[{name!r}] must be an int (0 or 1), got {dim!r}")
        if dim not in (0, 1):
            raise ValueError(
                f"{fn}: input_dims[{name!r}] must be 0 or 1, got {dim}: plans show the specs every "
                "weight as (out, in, ...), swapping dims 0 and 1 of a weight whose input features "
                "run along dim 0 (a Conv1D's); another input dim is not supported"
            )
    return tuple(sorted(name for name, dim in input_dims.items() if dim == 0))


def input_dims_repr(swapped: Swapped) -> str:
    """The keyword as a plan's repr writes it: ``""`` where there is none."""
    return f", input_dims={dict.fromkeys(swapped, 0)!r}" if swapped else ""


def check_swappable(fn: str, name: str, param: Tensor) -> None:
    """Refuse a weight of fewer than 2 dims said to hold its inputs along dim 0."""
    if param.dim() < 2:
        raise ValueError(
            f"{fn}: input_dims[{name!r}] is 0 but the parameter {name!r} has shape "
            f"{tuple(param.shape)}: a weight whose input features run along dim 0 has 2 dims or more "
            "(in, out, ...); leave it out of input_dims"
        )


@overload
def as_seen(t: Tensor, swapped: bool) -> Tensor: ...
@overload
def as_seen(t: Tensor | None, swapped: bool) -> Tensor | None: ...
def as_seen(t: Tensor | None, swapped: bool) -> Tensor | None:
    """``t`` as the specs see it: dims 0 and 1 swapped where ``swapped`` (a view)."""
    return t.transpose(0, 1) if swapped and t is not None else t


def as_stored(mask: Tensor, swapped: bool) -> Tensor:
    """A mask computed on the seen layout, back in the weight's (contiguous)."""
    return mask.transpose(0, 1).contiguous() if swapped else mask
