"""The short-rows path: many groups of a few keys (N:M), each entry ranked against its row.

Keys are compared as integer order codes (:func:`order_codes`), exactly,
ties to the lower index; a chunk of rows at a time (``README.md``).
"""

from __future__ import annotations

import torch

from .._types import Count, Mask, Tensor

__all__ = ["SHORT_ROW_MAX", "keep_in_short_rows", "key_of_code", "order_codes"]

#: Rows up to this long are ranked pairwise (``m * (m - 1)`` comparisons a row).
SHORT_ROW_MAX = 16
#: Rows ranked at a time: their keys, codes and ranks stay in cache.
_CHUNK_ROWS = 1 << 16

_INT = {16: torch.int16, 32: torch.int32, 64: torch.int64}
#: The order code of ``+inf`` per floating dtype; NaN gets the next one.
_INF_CODE = {torch.float16: 0x7C00, torch.bfloat16: 0x7F80, torch.float32: 0x7F800000,
             torch.float64: 0x7FF0000000000000}  # fmt: skip


def order_codes(keys: Tensor) -> Tensor:
    """Integer codes (of the keys' width) ordered as ``keys``: ``-0.0`` as ``0.0``, NaN above ``+inf``."""
    bits = torch.finfo(keys.dtype).bits
    raw = (keys + 0.0).view(_INT[bits])  # + 0.0 turns -0.0 into 0.0
    codes = raw ^ ((raw >> (bits - 1)) & ((1 << (bits - 1)) - 1))  # negatives: lower bits flipped
    return codes.masked_fill_(keys.isnan(), _INF_CODE[keys.dtype] + 1)


def key_of_code(code: int, dtype: torch.dtype) -> float | None:
    """The key of ``dtype`` whose :func:`order_codes` code is ``code`` (a NaN for NaN's code).

    ``None`` where no key of ``dtype`` has that code.
    """
    bits = torch.finfo(dtype).bits
    if not -(1 << (bits - 1)) <= code < 1 << (bits - 1):
        return None
    raw = code if code >= 0 else code ^ ((1 << (bits - 1)) - 1)
    key = torch.tensor([raw], dtype=_INT[bits]).view(dtype)
    return float(key) if int(order_codes(key)) == code else None


def keep_in_short_rows(rows: Tensor, k: Count, eligible: Mask) -> Tensor:
    """Per row of eager 2-D keys (at most :data:`SHORT_ROW_MAX` a row): kept flags once each
    row's ``k`` lowest eligible keys go.

    Args:
        rows: floating keys, one group a row.
        k: the count per row: an ``int``, or an integer tensor of one count per row.
        eligible: ``torch.bool`` flags of ``rows``' shape, or ``None`` for all.

    Returns:
        A new ``torch.bool`` tensor of ``rows``' shape.
    """
    length = rows.shape[1]
    kept = torch.empty(rows.shape, dtype=torch.bool, device=rows.device)
    counts = k if isinstance(k, int) or k.dim() == 0 else k.reshape(-1, 1)
    for start in range(0, rows.shape[0], _CHUNK_ROWS):
        stop = start + _CHUNK_ROWS
        flags = None if eligible is None else eligible[start:stop]
        codes = order_codes(rows[start:stop])
        if flags is not None:  # never counted below an eligible key
            codes.masked_fill_(flags.logical_not(), torch.iinfo(codes.dtype).max)
        rank = torch.zeros(codes.shape, dtype=torch.uint8, device=rows.device)
        for i in range(length):
            rank_i, code_i = rank[:, i], codes[:, i]
            for j in range(length):
                if j != i:  # j ranks below i: a lower code, or an equal one at a lower index
                    rank_i += codes[:, j] <= code_i if j < i else codes[:, j] < code_i
        out = kept[start:stop]
        torch.ge(rank, counts if isinstance(counts, int) else counts[start:stop], out=out)
        if flags is not None:
            out.logical_and_(flags)
    return kept
