"""How sparse a weight must be for its sparse layout to run faster than the dense masked weight, measured.

:data:`CSR_BREAK_EVEN` and :data:`BSR_BREAK_EVEN` are the break-even
sparsities measured on a CPU (``benchmarks/_sparse_breakeven.py``);
:func:`check_break_even` warns (:class:`SlowSparseWarning`) or raises for
the weights below them, as ``to_sparse`` asks.
"""

from __future__ import annotations

import warnings
from typing import Literal, NamedTuple, final

from .._specs import kept_blocks
from .._types import Masks, Tensor

__all__ = ["BSR_BREAK_EVEN", "BSR_MEASURED_BLOCK", "CSR_BREAK_EVEN", "BreakEven", "SlowSparseWarning", "check_break_even"]


class SlowSparseWarning(UserWarning):
    """A sparse weight that runs slower than its dense masked weight (below break-even)."""

    __module__ = "funcprune"


@final
class BreakEven(NamedTuple):
    """The sparsity from which a layout's ``F.linear`` beats the dense masked weight.

    One value per batch regime measured (the rows of ``x``: a single
    example, and 64 of them); :func:`to_sparse` warns below the larger one,
    where the layout is slower than dense in at least one regime.
    """

    batch_1: float
    batch_64: float

    @property
    def sparsity(self) -> float:
        """The sparsity from which the layout beat dense in every regime measured."""
        return max(self.batch_1, self.batch_64)


# Measured with ``python benchmarks/_sparse_breakeven.py`` on 2026-11-21: torch 2.13.0+cpu
# (MKL 2024.2), Python 3.11.7, an x86_64 "Intel(R) Xeon(R) Processor" (AVX-512) VM with
# 2 cores shared with other jobs, 1 torch thread, 4096x4096 float32 weights, F.linear
# without bias under inference_mode; speedup = dense masked time / sparse time, the
# median of 11 interleaved repetitions. Two runs; sparsity where the speedup crosses 1:
#
#   sparsity         50%    70%    80%    90%    95%    99%   break-even
#   csr    batch 1   0.63x  1.49x  2.85x  5.49x  10.8x  62.6x  60.7%, 63.9%
#   csr    batch 64  0.15x  0.22x  0.35x  0.73x  1.51x  6.48x  92.1%, 92.6%
#   bsr16  batch 1   0.65x  1.56x  2.64x  5.37x  10.7x  50.0x  59.9%, 57.1%
#   bsr16  batch 64  0.12x  0.21x  0.31x  0.61x  1.16x  4.97x  93.8%, 93.7%
#   bsr32  batch 1   0.64x  1.52x  2.28x  4.66x  9.80x  62.8x  60.2%, 65.1%
#   bsr32  batch 64  0.13x  0.22x  0.33x  0.64x  1.25x  5.48x  93.3%, 93.3%
#
# (BSR sparsity: the fraction of blocks pruned, with masks of whole random blocks.)
# With torch's own ``to_sparse_csr()`` (int64 indices) CSR at batch 1 is 0.31x at 50%,
# 2.7x at 90%, break-even 80-82%: hence the int32 indices of ``_compressed``. Values are
# rounded up. No GPU was available: CUDA is not measured, and these values apply there too.

#: CSR (``layout="csr"``): break-even as the fraction of entries pruned.
CSR_BREAK_EVEN = BreakEven(batch_1=0.65, batch_64=0.93)
#: BSR (``layout="bsr"``, blocks of 16x16 or 32x32): break-even as the fraction of blocks pruned.
BSR_BREAK_EVEN = BreakEven(batch_1=0.65, batch_64=0.94)
#: The smallest block side BSR's break-even was measured with; smaller blocks always warn.
BSR_MEASURED_BLOCK = 16


def _sparsity(mask: Tensor, block: tuple[int, int]) -> float:
    """The fraction of the blocks (CSR: of the entries) that ``mask`` prunes entirely."""
    kept = kept_blocks(mask, block)
    return 1.0 - int(kept.sum()) / max(1, kept.numel())


def check_break_even(
    fn: str, masks: Masks, layout: Literal["csr", "bsr", "semi_structured"], block: tuple[int, int],
    action: Literal["warn", "raise", "allow"],
) -> None:
    """Warn, raise or pass for the weights below ``layout``'s break-even sparsity.

    BSR's break-even was measured with blocks of 16x16 and 32x32 entries;
    with smaller blocks no sparsity is known to be fast enough (4x4 blocks
    ran at 0.2-0.3x dense at 95-97% for 64 rows), so every weight is reported.
    """
    if action == "allow" or layout == "semi_structured":
        return  # 2:4 is always 50%: no sparsity to compare
    measured = CSR_BREAK_EVEN if layout == "csr" else BSR_BREAK_EVEN
    if layout == "bsr" and min(block) < BSR_MEASURED_BLOCK:
        listed = ", ".join(map(repr, masks))
        where = (
            f"blocks of {block[0]}x{block[1]} entries, smaller than the {BSR_MEASURED_BLOCK}x"
            f"{BSR_MEASURED_BLOCK} from which BSR's break-even was measured (4x4 blocks were slower "
            "than dense even at 95-97% sparsity)"
        )
    else:
        slow = {n: s for n, m in masks.items() if (s := _sparsity(m, block)) < measured.sparsity}
        what = "blocks pruned" if layout == "bsr" else "pruned"
        listed = ", ".join(f"{n!r} ({s:.0%} {what})" for n, s in slow.items())
        where = (
            f"below the break-even sparsity of layout={layout!r}, where F.linear with it was slower "
            f"than dense ({measured.batch_1:.0%} for a single input row, {measured.batch_64:.0%} "
            "for 64 rows, measured on a CPU)"
        )
    if not listed:
        return
    message = (
        f"{fn}: {listed}: {where}; keep those weights dense (leave them out of masks), or pass "
        "below_break_even='allow'"
    )
    if action == "raise":
        raise ValueError(message)
    warnings.warn(message, SlowSparseWarning, stacklevel=3)
