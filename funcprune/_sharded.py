"""Exact bottom-k selection over shards held by several processes.

A tensor (or a group of tensors ranked jointly) is split into blocks, each
process holding some. Every process calls :func:`keep_over_shards` with its
own blocks of the same parts, in the same order; each gets the kept flags of
its blocks, and together they are exactly what one process would compute on
the whole: the ``k`` lowest eligible keys pruned, ties pruned in order of the
global index (the flat index in the concatenation of the whole tensors), NaN
ranked above every number.

How: keys are mapped to integers that sort as the keys do (``-0.0`` equals
``0.0``, every NaN is one code above ``+inf``). A radix select narrows the
k-th code: each round every process histograms its remaining candidates into
:data:`BINS` bins, one ``all_reduce`` sums the histograms, and every process
keeps the candidates of the bin holding the k-th. Ties at that code are then
cut the same way on global positions. Nothing but fixed-size histograms
crosses processes: at most ``ceil(bits / 12)`` rounds for the keys (2 for
16-bit keys, 3 for 32-bit, 6 for 64-bit) and as many for the positions'
bits, whatever ``k`` and the tensors' sizes. No process gathers keys.
:func:`sum_over_shards` adds up per-block counts the same way (one
``all_reduce`` of one number), a replicated block counted once.

Locally, float32 and float64 blocks (contiguous, on the CPU) take the native
kernels (:mod:`._native`): the first round's histogram is counted straight
from the keys, no code written; a second pass writes the codes and indices
of the chosen bin's entries only (typically a few percent: the later
rounds' torch work) and the kept flags of all the others, so that the last
pass sets the flags of that bin's entries alone. Other blocks, or all where
the kernels are unavailable, code every entry in torch; both send the same
histograms and give the same flags. From
:data:`~._select.SHARDED_BRACKET_MIN_KEYS` keys per process, :mod:`._sharded_bracket`
runs first: a sample brackets the k-th key, so that one scan per block
collects only the keys the radix select (:func:`select_codes`) then ranks.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, TypeGuard, final

import torch
import torch.distributed as dist

from . import _native
from ._short_rows import key_of_code, order_codes
from ._types import Mask, Tensor
from ._validate import is_concrete

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.tensor import DTensor

__all__ = [
    "BINS", "CountOf", "Shard", "common_groups", "is_dtensor", "Selection", "keep_over_shards", "keep_over_shards_each", "processes", "radix_shift", "refuse_dtensors", "select_codes", "sum_over_shards", "summed_over",
]  # fmt: skip

#: Bits resolved per round, and the histogram's length (32 KiB of int64).
_RADIX_BITS = 12
BINS = 1 << _RADIX_BITS


def is_dtensor(t: object) -> TypeGuard[DTensor]:
    """Whether ``t`` is a DTensor; free (no import) while none can exist."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def refuse_dtensors(*tensors: object) -> None:
    """Refuse DTensors where whole tensors are expected (the kernels, selection).

    A DTensor's values there would be read as this process's block only, or
    gathered. :func:`funcprune.compute_mask` and the plans hand the kernels
    each process's block with a :class:`Shard` instead (``_dtensor.py``).

    Raises:
        TypeError: if any of ``tensors`` is a DTensor.
    """
    if any(map(is_dtensor, tensors)):
        raise TypeError(
            "compute_mask: got a DTensor where the kernels take whole tensors (a spec's own "
            "compute_mask method); call funcprune.compute_mask(spec, scores), a Plan or "
            "global_unstructured instead, which prune DTensors block by block, nothing gathered"
        )


@final
@dataclass(frozen=True, slots=True)
class Shard:
    """A block of a larger tensor; other processes of ``groups`` hold the rest.

    Attributes:
        shape: the whole tensor's shape.
        offsets: the index, along each dim, where this block starts.
        size: this block's shape.
        counted: ``False`` where another process holds the same block and
            counts it (a replicated tensor is counted on one process only).
        groups: the process groups over which the parts are ranked: counts
            are reduced over each in turn, so over the processes they span
            together (the mesh dims of a DTensor's mesh that shard it);
            ``None`` is the default group.
    """

    shape: tuple[int, ...]
    offsets: tuple[int, ...]
    size: tuple[int, ...]
    counted: bool = True
    groups: tuple[ProcessGroup | None, ...] = (None,)

    def __post_init__(self) -> None:
        if not len(self.shape) == len(self.offsets) == len(self.size):
            raise ValueError(
                f"Shard: shape {self.shape}, offsets {self.offsets} and size {self.size} "
                "must have one entry per dim"
            )
        for d, (n, o, s) in enumerate(zip(self.shape, self.offsets, self.size, strict=True)):
            if not (0 <= o and 0 <= s and o + s <= n):
                raise ValueError(
                    f"Shard: along dim {d} a block of {s} entries at offset {o} does not fit "
                    f"in the whole length {n}"
                )

    @property
    def numel(self) -> int:
        """How many entries the whole tensor has."""
        return math.prod(self.shape)

    def positions(self, local: Tensor) -> Tensor:
        """The whole tensor's flat indices of the block's flat indices ``local``."""
        position = torch.zeros_like(local)
        if not self.size:
            return position
        coords = torch.unravel_index(local, self.size)
        for c, o, n in zip(coords, self.offsets, self.shape, strict=True):
            position.mul_(n).add_(c + o)
        return position


@dataclass(slots=True)
class _Part:
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
    shard: Shard
    base: int  # global position of the part's first entry in the concatenation
    block_codes: Tensor | None  # the codes of the whole block, where the torch path computed them
    codes: Tensor | None  # codes of the candidates still in play (counted parts only); None: not yet coded
    where: Tensor  # their local flat indices (none while codes is None)
    pieces: Tensor | None = None  # the native first round's histogram, per piece of the block
    binned: tuple[Tensor, Tensor] | None = None  # native: the codes and indices of the first round's bin
    kept: Tensor | None = None  # native: kept flags of the entries outside that bin (False in it)


#: How many to prune, from how many are eligible over all processes (``resolve_count`` for an amount).
CountOf = Callable[[int], int]


def keep_over_shards(
    keys: Sequence[Callable[[], Tensor]],
    eligible: Sequence[Mask],
    shards: Sequence[Shard],
    k: int | CountOf,
) -> list[Tensor]:
    """Per block, 1-D kept flags: the ``k`` lowest eligible keys of all parts go.

    Args:
        keys: per part, computes this process's block of 1-D keys (floating,
            one common dtype across parts and processes).
        eligible: per part, 1-D ``torch.bool`` flags of the block; ``None``
            means all.
        shards: per part, where the block sits; one process group for all.
        k: how many entries to prune in all (capped at the number eligible),
            or the function that says it from the number eligible in all:
            that number rides along the first round's histogram, no
            all-reduce of its own.
    """
    return keep_over_shards_each([Selection(keys, eligible, shards, k)])[0]


@final
class Selection(NamedTuple):
    """One selection over shards, as :func:`keep_over_shards` takes it."""

    keys: Sequence[Callable[[], Tensor]]
    eligible: Sequence[Mask]
    shards: Sequence[Shard]
    k: int | CountOf


def keep_over_shards_each(selections: Sequence[Selection]) -> list[list[Tensor]]:
    """:func:`keep_over_shards` of each of ``selections`` (independent groups), rounds in lockstep.

    Each round all-reduces the histograms of every selection still
    searching at once (one ``all_reduce`` of ``n x BINS`` int64), so ``n``
    per-tensor selections cost the rounds of one, not ``n`` times them.
    Every process passes the same selections in the same order; all share
    their process groups.
    """
    if not selections:
        return []
    groups = common_groups([shard for selection in selections for shard in selection.shards])
    prepared = [_prepared(selection) for selection in selections]
    device = prepared[0][0][0].block.device
    searches = [_Search(parts, -(1 << (bits - 1)), (1 << (bits - 1)) - 1, s.k) for (parts, bits, _), s in zip(prepared, selections, strict=True)]  # fmt: skip
    _search_all(searches, groups, device)
    ties: dict[int, _Search] = {}
    for i, (search, (parts, _, total)) in enumerate(zip(searches, prepared, strict=True)):
        cut, need, equal = search.result or (None, 0, 0)
        if cut is not None and need < equal:  # some ties at the cut stay: those of the highest positions
            for p in parts:
                p.codes = p.base + p.shard.positions(p.where)
            ties[i] = _Search(parts, 0, max(total - 1, 0), need)
    _search_all(list(ties.values()), groups, device)
    out = []
    for i, (search, (parts, _, _)) in enumerate(zip(searches, prepared, strict=True)):
        cut = search.result[0] if search.result else None
        if cut is None:  # k == 0 or nothing eligible anywhere
            out.append([_flags(p.block, p.eligible) for p in parts])
            continue
        tie = ties[i].result if i in ties else None
        last = tie[0] if tie is not None else None  # None: every tie goes
        out.append([_survivors(p, cut, last) for p in parts])
    return out


def _prepared(selection: Selection) -> tuple[list[_Part], int, int]:
    """The selection's parts (its keys computed and checked), the keys' widest bits, and the whole size."""
    blocks = [make() for make in selection.keys]
    if not all(map(is_concrete, [*blocks, *(e for e in selection.eligible if e is not None)])):
        raise RuntimeError(
            "selection over shards runs eagerly only: it communicates between processes, "
            "which vmap, grad and torch.compile cannot trace"
        )
    parts, base = [], 0
    for block, flags, shard in zip(blocks, selection.eligible, selection.shards, strict=True):
        parts.append(_part(block, flags, shard, base))
        base += shard.numel
    return parts, max(torch.finfo(b.dtype).bits for b in blocks), base


def sum_over_shards(counts: Sequence[int], shards: Sequence[Shard], device: torch.device) -> int:
    """The sum over all processes of ``counts``, one per block, counted blocks only.

    Every process calls it with its own blocks of the same parts, in the same
    order (as :func:`keep_over_shards`); each gets the same total. A block
    that another process also holds (``counted=False``) adds nothing here.

    Args:
        counts: per block, a Python ``int`` (such as its unpruned entries).
        shards: per block, where it sits; one process group for all.
        device: where the one-number tensor that crosses processes lives.
    """
    mine = sum(c for c, s in zip(counts, shards, strict=True) if s.counted)
    return int(summed_over(torch.tensor(mine, dtype=torch.int64, device=device), common_groups(shards)))


def select_codes(
    codes: Sequence[Tensor],
    lo: int,
    hi: int,
    need: int,
    groups: tuple[ProcessGroup | None, ...],
    device: torch.device,
) -> tuple[int | None, int, int]:
    """The ``need``-th smallest of all processes' ``codes`` (int64, all in ``[lo, hi]``), by the radix select.

    Every process calls it with its own codes (any number of tensors, none
    included); the histograms that cross processes live on ``device``, the
    same on every process (a CUDA group's collectives take CUDA tensors).
    Returns that code, its rank among the codes equal to it and how many
    are equal to it (over all processes), or ``None`` where ``need`` is 0
    or there are no codes.
    """
    parts = []
    for c in codes:
        none = torch.empty(0, dtype=torch.int64, device=c.device)
        shard = Shard((c.numel(),), (0,), (c.numel(),))
        parts.append(_Part(none.double(), None, shard, 0, None, c, torch.arange(c.numel(), device=c.device)))
    return _radix_select(parts, lo, hi, need, groups, device)


def _part(block: Tensor, eligible: Mask, shard: Shard, base: int) -> _Part:
    """A checked part, its candidates the eligible entries (none where another process counts), not yet coded."""
    _check_block(block, eligible, shard)
    none = torch.empty(0, dtype=torch.int64, device=block.device)
    return _Part(block, eligible, shard, base, None, None if shard.counted else none, none)


def _code(part: _Part) -> tuple[Tensor, Tensor]:
    """The torch path: the codes of the whole block, and the candidates' codes and indices."""
    codes = order_codes(part.block).to(torch.int64)
    part.block_codes, part.pieces = codes, None
    if part.eligible is None:  # every entry: the block's codes as they are, no copy
        return codes, torch.arange(part.block.numel(), device=part.block.device)
    where = part.eligible.nonzero().squeeze(1)
    return codes[where], where


def _histogram(part: _Part, shift: int, base: int) -> Tensor:
    """The part's candidates counted per bin of ``(code >> shift) - base``."""
    if part.codes is None:  # every eligible entry, not yet coded: the first round
        bits = torch.finfo(part.block.dtype).bits
        if shift == bits - _RADIX_BITS and base == -(BINS >> 1):  # the bins are the codes' top bits
            part.pieces = _native.code_histogram(part.block, part.eligible)
            if part.pieces is not None:
                return part.pieces.sum(0)
        part.codes, part.where = _code(part)
    return torch.bincount((part.codes >> shift) - base, minlength=BINS)


def _narrow(part: _Part, shift: int, base: int, b: int) -> None:
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
class _Search:
    """One radix select in progress: the ``need``-th smallest code of all processes' ``parts`` in ``[lo, hi]``.

    ``need`` may be a function of how many codes are in play over all
    processes (the first round's histogram's sum). ``result``, once found:
    the code, its rank among the codes equal to it, and how many are equal
    to it; the code is ``None`` when ``need`` is 0 or nothing is in play.
    """

    parts: list[_Part]
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


def _search_all(searches: Sequence[_Search], groups: tuple[ProcessGroup | None, ...], device: torch.device) -> None:
    """Run ``searches`` to their results in lockstep: each round, ONE all-reduce of all their histograms.

    Every process runs the same searches, in the same order; a search that
    is done drops out, the same on every process (its result came from
    summed counts). One search sends what it would alone.
    """
    while active := [s for s in searches if s.result is None]:
        stacked = summed_over(torch.stack([s.histogram(device) for s in active]), groups)
        for search, histogram in zip(active, stacked, strict=True):
            search.advance(histogram)


def _radix_select(
    parts: list[_Part],
    lo: int,
    hi: int,
    need: int | CountOf,
    groups: tuple[ProcessGroup | None, ...],
    device: torch.device,
) -> tuple[int | None, int, int]:
    """The result of one :class:`_Search` (the ``need``-th smallest code of ``parts``, in ``[lo, hi]``)."""
    search = _Search(parts, lo, hi, need)
    _search_all([search], groups, device)
    assert search.result is not None
    return search.result


def radix_shift(lo: int, hi: int) -> int:
    """The least shift putting every integer of ``[lo, hi]`` into :data:`BINS` bins."""
    shift = max(0, (hi - lo).bit_length() - _RADIX_BITS)
    while (hi >> shift) - (lo >> shift) >= BINS:
        shift += 1
    return shift


def _survivors(part: _Part, cut: int, last: int | None) -> Tensor:
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
    return _flags(part.block, part.eligible).logical_and_(pruned.logical_not_())


def _native_survivors(part: _Part, cut: int) -> Tensor | None:
    """:func:`_survivors` where every tie goes, by the native kernel; ``None`` where it does not apply.

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


def _flags(block: Tensor, eligible: Mask) -> Tensor:
    return torch.ones_like(block, dtype=torch.bool) if eligible is None else eligible.clone()


def _check_block(block: Tensor, eligible: Mask, shard: Shard) -> None:
    if not block.is_floating_point() or block.dim() != 1:
        raise TypeError(
            f"keys over shards must be 1-D floating tensors, got {block.dtype} of shape {tuple(block.shape)}"
        )
    if block.numel() != math.prod(shard.size):
        raise ValueError(f"a block of {block.numel()} keys does not match its shard's size {shard.size}")
    if eligible is not None and eligible.shape != block.shape:
        raise ValueError(
            f"eligible flags of shape {tuple(eligible.shape)} do not match keys of shape "
            f"{tuple(block.shape)}"
        )


def common_groups(shards: Sequence[Shard]) -> tuple[ProcessGroup | None, ...]:
    kinds = {tuple(map(id, s.groups)): s.groups for s in shards}
    if len(kinds) != 1:
        raise ValueError(f"parts ranked jointly over shards must share their process groups, got {len(kinds)} kinds")
    return next(iter(kinds.values()))


def processes(shards: Sequence[Shard]) -> int:
    """How many processes the shards' groups span together."""
    return math.prod(dist.get_world_size(group) for group in common_groups(shards))


def summed_over(values: Tensor, groups: tuple[ProcessGroup | None, ...]) -> Tensor:
    """``values`` summed (in place; returned) over each group in turn: over the processes they span."""
    for group in groups:
        dist.all_reduce(values, group=group)
    return values
