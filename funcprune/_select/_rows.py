"""The long-rows path of exact bottom-k selection: many groups of many keys, every row at once.

``PerSlice`` prunes each slice of a weight on its own: thousands of groups
of thousands of keys. A ``kthvalue`` or a bracket per row costs a Python
round and a few torch calls per row; :func:`keep_in_rows` hands all rows to
one native pass instead (``funcprune._native``'s ``rows_keep``: per row a
strided sample brackets the k-th key, one pass counts below and collects
inside, a select over those finds it, one pass writes the flags), eagerly;
only ``_choose.py`` decides when it runs (``README.md``).
:func:`keep_in_ragged_rows` does the same for rows of their own lengths, one
per tensor (a plan's per-tensor selections, ``keep_each``), in one call.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import _native
from .._types import Count, Mask, Tensor

__all__ = ["RAGGED_DTYPES", "keep_in_ragged_rows", "keep_in_rows"]

#: Key dtypes the kernel takes as they are; half-width floats are widened to float32 first
#: (exactly, and in the same order: ``-0.0``, infinities and NaN stay what they are).
_NATIVE = (torch.float32, torch.float64)
_WIDENED = (torch.float16, torch.bfloat16)
#: The key dtypes :func:`keep_in_ragged_rows` takes.
RAGGED_DTYPES = _NATIVE + _WIDENED


def keep_in_rows(rows: Tensor, k: Count, eligible: Mask, *, absolute: bool = False) -> Tensor | None:
    """Per row of eager 2-D keys, kept flags once the row's ``k`` lowest eligible keys go.

    What :func:`~._choose.keep` gives for groups that are rows: in each row
    the ``k`` lowest eligible keys are pruned (a count capped to the row's
    eligible keys), ties to the lower index, NaN above every number, and
    the entries not eligible never kept.

    Args:
        rows: floating keys, one group a row, on the CPU and concrete.
        k: the count per row: an ``int``, a 0-d integer tensor, or one count per row.
        eligible: ``torch.bool`` flags of ``rows``' shape, or ``None`` for all.
        absolute: rank ``|rows|`` instead of ``rows`` (without computing them).

    Returns:
        A new ``torch.bool`` tensor of ``rows``' shape, or ``None`` where the
        native kernel does not apply (none built, another dtype or device):
        then the caller selects with torch.
    """
    if rows.dim() != 2 or rows.device.type != "cpu":
        return None
    if rows.dtype in _WIDENED:
        rows = rows.float()
    if rows.dtype not in _NATIVE:
        return None
    count = rows.shape[0]
    if isinstance(k, int):
        counts = torch.full((count,), max(0, min(k, rows.shape[1])), dtype=torch.int64, device=rows.device)
    elif k.numel() == 1:
        counts = k.reshape(1).to(rows.device, torch.int64).expand(count)
    else:
        counts = k.reshape(-1).to(rows.device, torch.int64)
    flags = None if eligible is None else eligible.contiguous()
    return _native.rows_keep(rows.contiguous().resolve_neg(), flags, absolute, counts.contiguous())


def keep_in_ragged_rows(
    rows: Sequence[Tensor],
    counts: Sequence[int],
    eligible: Sequence[Mask],
    available: Sequence[int],
    absolute: Sequence[bool],
) -> list[Tensor | None]:
    """Per row (any shape, read flat), kept flags once *its own* ``counts[r]`` lowest eligible keys go.

    What :func:`keep_in_rows` gives a row, for rows of their own lengths,
    dtypes and keys: all of them in one native call per key dtype and kind
    (``funcprune._native``'s ``ragged_keep``), each row one thread's, the
    longest first.

    Args:
        rows: eager CPU keys of :data:`RAGGED_DTYPES` (``|row|`` ranked where ``absolute``).
        counts: per row, how many eligible keys go (capped to the eligible ones).
        eligible: per row, ``torch.bool`` flags of as many entries, or ``None`` for all.
        available: per row, how many of its entries are eligible (exactly).
        absolute: per row, rank ``|row|`` instead of ``row``.

    Returns:
        Per row, new flat ``torch.bool`` flags, or ``None`` where the native
        kernel does not take the row (none built, another dtype or device):
        the caller selects that row another way.
    """
    kept: list[Tensor | None] = [None] * len(rows)
    batches: dict[tuple[torch.dtype, bool], list[int]] = {}
    keys: list[Tensor] = []
    for r, row in enumerate(rows):
        flat = row.reshape(-1)
        if flat.device.type != "cpu" or flat.dtype not in RAGGED_DTYPES:
            keys.append(flat)
            continue
        flat = flat.float() if flat.dtype in _WIDENED else flat  # exact, order kept
        keys.append(flat.contiguous().resolve_neg())
        batches.setdefault((flat.dtype, absolute[r]), []).append(r)
    for (_, magnitude), members in batches.items():
        flags = [_flat(eligible[r]) for r in members]
        got = _native.ragged_keep(
            [keys[r] for r in members], flags, magnitude, [counts[r] for r in members], [available[r] for r in members]
        )
        if got is not None:
            for r, flat_kept in zip(members, got, strict=True):
                kept[r] = flat_kept
    return kept


def _flat(eligible: Mask) -> Mask:
    return None if eligible is None else eligible.reshape(-1).contiguous()
