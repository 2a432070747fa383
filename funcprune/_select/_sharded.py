"""Exact bottom-k selection over shards held by several processes: only histograms cross.

:func:`keep_over_shards` (and :func:`keep_over_shards_each`, selections in
lockstep) give each process the kept flags of its blocks, together exactly
one process's flags on the whole; :func:`sum_over_shards` adds up counts
(``README.md``: what is sent, and how ties are cut).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, final

import torch
import torch.distributed as dist

from .._types import Mask, Tensor
from .._validate import is_concrete
from ._groups import CountOf, LocalShard
from ._radix import Part, Search, eligible_flags, kept_by_cut, new_part

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "Selection", "common_groups", "keep_over_shards", "keep_over_shards_each", "processes", "reduced_over",
    "select_codes", "sum_over_shards",
]  # fmt: skip


def keep_over_shards(
    keys: Sequence[Callable[[], Tensor]],
    eligible: Sequence[Mask],
    shards: Sequence[LocalShard],
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
    shards: Sequence[LocalShard]
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
    searches = [Search(parts, -(1 << (bits - 1)), (1 << (bits - 1)) - 1, s.k) for (parts, bits, _), s in zip(prepared, selections, strict=True)]  # fmt: skip
    _search_all(searches, groups, device)
    ties: dict[int, Search] = {}
    for i, (search, (parts, _, total)) in enumerate(zip(searches, prepared, strict=True)):
        cut, need, equal = search.result or (None, 0, 0)
        if cut is not None and need < equal:  # some ties at the cut stay: those of the highest positions
            for p in parts:
                p.codes = p.base + p.shard.positions(p.where)
            ties[i] = Search(parts, 0, max(total - 1, 0), need)
    _search_all(list(ties.values()), groups, device)
    out = []
    for i, (search, (parts, _, _)) in enumerate(zip(searches, prepared, strict=True)):
        cut = search.result[0] if search.result else None
        if cut is None:  # k == 0 or nothing eligible anywhere
            out.append([eligible_flags(p.block, p.eligible) for p in parts])
            continue
        tie = ties[i].result if i in ties else None
        last = tie[0] if tie is not None else None  # None: every tie goes
        out.append([kept_by_cut(p, cut, last) for p in parts])
    return out


def _prepared(selection: Selection) -> tuple[list[Part], int, int]:
    """The selection's parts (its keys computed and checked), the keys' widest bits, and the whole size."""
    blocks = [make() for make in selection.keys]
    if not all(map(is_concrete, [*blocks, *(e for e in selection.eligible if e is not None)])):
        raise RuntimeError(
            "selection over shards runs eagerly only: it communicates between processes, "
            "which vmap, grad and torch.compile cannot trace"
        )
    parts, base = [], 0
    for block, flags, shard in zip(blocks, selection.eligible, selection.shards, strict=True):
        parts.append(new_part(block, flags, shard, base))
        base += shard.numel
    return parts, max(torch.finfo(b.dtype).bits for b in blocks), base


def sum_over_shards(counts: Sequence[int], shards: Sequence[LocalShard], device: torch.device) -> int:
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
    return int(reduced_over(torch.tensor(mine, dtype=torch.int64, device=device), common_groups(shards)))


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
        shard = LocalShard((c.numel(),), (0,), (c.numel(),))
        parts.append(Part(none.double(), None, shard, 0, None, c, torch.arange(c.numel(), device=c.device)))
    search = Search(parts, lo, hi, need)
    _search_all([search], groups, device)
    assert search.result is not None
    return search.result


def _search_all(searches: Sequence[Search], groups: tuple[ProcessGroup | None, ...], device: torch.device) -> None:
    """Run ``searches`` to their results in lockstep: each round, ONE all-reduce of all their histograms.

    Every process runs the same searches, in the same order; a search that
    is done drops out, the same on every process (its result came from
    summed counts). One search sends what it would alone.
    """
    while active := [s for s in searches if s.result is None]:
        stacked = reduced_over(torch.stack([s.histogram(device) for s in active]), groups)
        for search, histogram in zip(active, stacked, strict=True):
            search.advance(histogram)


def common_groups(shards: Sequence[LocalShard]) -> tuple[ProcessGroup | None, ...]:
    kinds = {tuple(map(id, s.groups)): s.groups for s in shards}
    if len(kinds) != 1:
        raise ValueError(f"parts ranked jointly over shards must share their process groups, got {len(kinds)} kinds")
    return next(iter(kinds.values()))


def processes(shards: Sequence[LocalShard]) -> int:
    """How many processes the shards' groups span together."""
    return math.prod(dist.get_world_size(group) for group in common_groups(shards))


def reduced_over(
    values: Tensor, groups: tuple[ProcessGroup | None, ...], op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
) -> Tensor:
    """``values`` reduced (summed, or by ``op``; in place; returned) over each group in turn: over the
    processes they span together."""
    for group in groups:
        dist.all_reduce(values, op=op, group=group)
    return values
