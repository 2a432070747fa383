"""The radix select's local side: one process's candidates, counted per bin and narrowed round by round.

A :class:`Search` never communicates: ``_sharded.py`` sums its histograms
across processes (``README.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import _native
from .._types import Mask, Tensor
from ._groups import CountOf, LocalShard
from ._short_rows import key_of_code, order_codes

__all__ = [
    "BINS", "Part", "Search", "check_block", "eligible_flags", "kept_by_cut", "new_part", "radix_shift",
]  # fmt: skip

#: Bits resolved per round, and the histogram's length (32 KiB of int64).
_RADIX_BITS = 12
BINS = 1 << _RADIX_BITS


@dataclass(slots=True)
class Part:
    """One process's view of a part while the cut is searched.

    A counted part starts with every eligible entry in play and no code
    computed (``codes`` ``None``, ``where`` empty). The first round then
    histograms it with the native kernels straight from the keys (``pieces``
    holds the per-piece counts), and collects the codes and indices of the
    chosen bin's entries only (``binned``), writing the kept flags of all
    the others on the way (``kept``): the last pass then sets the flags of
    the bin's entries alone. Where the kernels do not apply, the torch path
    codes the whole block (``block_codes``) and selects from that.
    """

    block: Tensor  # this process's keys of the part
    eligible: Mask
    shard: LocalShard
    base: int  # global position of the part's first entry in the concatenation
    block_codes: Tensor | None  # the codes of the whole block, where the torch path computed them
    codes: Tensor | None  # codes of the candidates still in play (counted parts only); None: not yet coded
    where: Tensor  # their local flat indices (none while codes is None)
    pieces: Tensor | None = None  # the native first round's histogram, per piece of the block
    binned: tuple[Tensor, Tensor] | None = None  # native: the codes and indices of the first round's bin
    kept: Tensor | None = None  # native: kept flags of the entries outside that bin (False in it)


def new_part(block: Tensor, eligible: Mask, shard: LocalShard, base: int) -> Part:
    """A checked part, its candidates the eligible entries (none where another process counts), not yet coded."""
    check_block(block.dtype, block.shape, eligible, shard)
    none = torch.empty(0, dtype=torch.int64, device=block.device)
    return Part(block, eligible, shard, base, None, None if shard.counted else none, none)


def _code(part: Part) -> tuple[Tensor, Tensor]:
    """The torch path: the codes of the whole block, and the candidates' codes and indices."""
    codes = order_codes(part.block).to(torch.int64)
    part.block_codes, part.pieces = codes, None
    if part.eligible is None:  # every entry: the block's codes as they are, no copy
        return codes, torch.arange(part.block.numel(), device=part.block.device)
    where = part.eligible.nonzero().squeeze(1)
    return codes[where], where


def _histogram(part: Part, shift: int, base: int) -> Tensor:
    """The part's candidates counted per bin of ``(code >> shift) - base``."""
    if part.codes is None:  # every eligible entry, not yet coded: the first round
        bits = torch.finfo(part.block.dtype).bits
        if shift == bits - _RADIX_BITS and base == -(BINS >> 1):  # the bins are the codes' top bits
            part.pieces = _native.code_histogram(part.block, part.eligible)
            if part.pieces is not None:
                return part.pieces.sum(0)
        part.codes, part.where = _code(part)
    return torch.bincount((part.codes >> shift) - base, minlength=BINS)


def _narrow(part: Part, shift: int, base: int, b: int) -> None:
    """Keeps the part's candidates in bin ``b`` of ``(code >> shift) - base``."""
    if part.codes is None:
        if part.pieces is not None:
            collected = _native.code_collect(part.block, part.eligible, b, part.pieces[:, b])
            part.pieces = None
            if collected is not None:
                part.codes, part.where, part.kept = collected
                part.binned = (part.codes, part.where)
                return
        part.codes, part.where = _code(part)
    inside = (part.codes >> shift) == base + b
    part.codes, part.where = part.codes[inside], part.where[inside]


@dataclass(slots=True)
class Search:
    """One radix select in progress: the ``need``-th smallest code of all processes' ``parts`` in ``[lo, hi]``.

    ``need`` may be a function of how many codes are in play over all
    processes (the first round's histogram's sum). ``result``, once found:
    the code, its rank among the codes equal to it, and how many are equal
    to it; the code is ``None`` when ``need`` is 0 or nothing is in play.
    """

    parts: list[Part]
    lo: int
    hi: int
    need: int | CountOf
    result: tuple[int | None, int, int] | None = None
    first: bool = True
    rank: int = 0
    shift: int = 0
    base: int = 0

    def histogram(self, device: torch.device) -> Tensor:
        """This process's counts of its candidates per bin of the range still open."""
        self.shift = radix_shift(self.lo, self.hi)
        self.base = self.lo >> self.shift
        histogram = torch.zeros(BINS, dtype=torch.int64, device=device)
        for p in self.parts:
            histogram += _histogram(p, self.shift, self.base)
        return histogram

    def advance(self, histogram: Tensor) -> None:
        """Narrow to the bin holding the code sought, from every process's counts summed."""
        if self.first:
            in_play = int(histogram.sum())
            self.rank = min(self.need(in_play) if callable(self.need) else self.need, in_play)
            self.first = False
            if self.rank == 0:
                self.result = None, 0, 0
                return
        cumulative = histogram.cumsum(0)
        b = int(torch.searchsorted(cumulative, self.rank))
        self.rank -= int(cumulative[b - 1]) if b else 0
        equal = int(histogram[b])
        shift, base = self.shift, self.base
        self.lo, self.hi = max(self.lo, (base + b) << shift), min(self.hi, ((base + b + 1) << shift) - 1)
        for p in self.parts:
            _narrow(p, shift, base, b)
        if self.lo == self.hi:
            self.result = self.lo, self.rank, equal


def radix_shift(lo: int, hi: int) -> int:
    """The least shift putting every integer of ``[lo, hi]`` into :data:`BINS` bins."""
    shift = max(0, (hi - lo).bit_length() - _RADIX_BITS)
    while (hi >> shift) - (lo >> shift) >= BINS:
        shift += 1
    return shift


def kept_by_cut(part: Part, cut: int, last: int | None) -> Tensor:
    """Kept flags of a block: pruned below ``cut``, and at it up to position ``last``."""
    if part.kept is not None and part.binned is not None:  # the native path: flags but for the bin's entries
        kept, (codes, where) = part.kept, part.binned
        kept.scatter_(0, where, codes > cut)
        if last is not None:
            ties = where[codes == cut]
            kept[ties[part.base + part.shard.positions(ties) > last]] = True
        return kept
    if part.block_codes is None and last is None:  # never coded (a replica): the native pass if it applies
        flags = _native_survivors(part, cut)
        if flags is not None:
            return flags
    codes = order_codes(part.block).to(torch.int64) if part.block_codes is None else part.block_codes
    pruned = codes < cut
    at_cut = (codes == cut).nonzero().squeeze(1)
    if last is not None:
        at_cut = at_cut[part.base + part.shard.positions(at_cut) <= last]
    pruned[at_cut] = True
    return eligible_flags(part.block, part.eligible).logical_and_(pruned.logical_not_())


def _native_survivors(part: Part, cut: int) -> Tensor | None:
    """:func:`kept_by_cut` where every tie goes, by the native kernel; ``None`` where it does not apply.

    Kept: the eligible keys above the key whose code is ``cut`` (codes and
    keys compare alike, ``-0.0`` equal to ``0.0``, NaN above every number),
    none where ``cut`` is NaN's code.
    """
    value = key_of_code(cut, part.block.dtype)
    if value is None:
        return None
    if math.isnan(value):  # nothing codes above NaN
        return torch.zeros(part.block.shape, dtype=torch.bool, device=part.block.device)
    return _native.survivors(part.block, part.eligible, False, value, None)


def eligible_flags(block: Tensor, eligible: Mask) -> Tensor:
    return torch.ones_like(block, dtype=torch.bool) if eligible is None else eligible.clone()


def check_block(dtype: torch.dtype, shape: torch.Size, eligible: Mask, shard: LocalShard) -> None:
    """Refuse a part whose keys (of ``dtype`` and ``shape``) are no 1-D floats, or do not fit its shard or flags."""
    if not dtype.is_floating_point or len(shape) != 1:
        raise TypeError(f"keys over shards must be 1-D floating tensors, got {dtype} of shape {tuple(shape)}")
    if shape[0] != math.prod(shard.size):
        raise ValueError(f"a block of {shape[0]} keys does not match its shard's size {shard.size}")
    if eligible is not None and eligible.shape != shape:
        raise ValueError(
            f"eligible flags of shape {tuple(eligible.shape)} do not match keys of shape {tuple(shape)}"
        )
