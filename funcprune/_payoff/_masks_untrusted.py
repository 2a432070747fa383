"""What a masks file or a packed dict claims, read as untrusted: every number bounded before it is used.

A file is small, but its metadata may claim anything: a size of 10**30, a
bool for an int, JSON nested too deep to parse. :func:`checked_size`,
:func:`checked_sizes` and :func:`checked_shape` admit only the ints and
shapes torch can hold, before anything proportional to them is visited or
allocated; :func:`shown` cuts a value to what a message can show. A reader
that finds a record wrong calls :func:`bad`, which raises :class:`Corrupt`;
``load_masks`` and ``unpack_masks`` turn it into a ``ValueError`` that names
the file (or the packed dict's entry). :func:`compact_json` writes records.
"""

from __future__ import annotations

import json
import math
from typing import NoReturn

__all__ = ["MAX_NUMEL", "Corrupt", "bad", "checked_shape", "checked_size", "checked_sizes", "compact_json", "shown"]

#: The most a size, and the product of a shape's nonzero sizes, may be: torch's int64 (a shape torch can hold).
MAX_NUMEL = 2**63 - 1

#: How many characters of a value an error message shows.
_SHOWN = 200


class Corrupt(Exception):
    """A reason why a file, or a packed dict's entry, is not as :func:`save_masks` or :func:`pack_masks` writes it."""


def bad(detail: str) -> NoReturn:
    raise Corrupt(detail)


def shown(value: object) -> str:
    """``repr(value)``, cut to a length a message can show (and safe on values nested too deep to show)."""
    try:
        shown = repr(value)
    except RecursionError:
        return f"a {type(value).__name__} nested too deep to show"
    return shown if len(shown) <= _SHOWN else shown[:_SHOWN] + "..."


def checked_size(value: object) -> int:
    """``value`` if it is an int from 0 to 2**63 - 1 (not a bool)."""
    if type(value) is not int or not 0 <= value <= MAX_NUMEL:
        bad(f"expected an int from 0 to 2**63 - 1, got {shown(value)}")
    return value


def checked_sizes(value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        bad(f"expected a list of ints >= 0, got {shown(value)}")
    return tuple(checked_size(v) for v in value)


def checked_shape(value: object) -> tuple[int, ...]:
    """``value`` as a shape torch can hold: sizes >= 0 whose nonzero ones multiply to at most 2**63 - 1."""
    shape = checked_sizes(value)
    if math.prod(max(n, 1) for n in shape) > MAX_NUMEL:
        bad(f"the shape {list(shape)} is larger than torch can hold (its sizes multiply past 2**63 - 1)")
    return shape


def compact_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))
