"""DTensor kernels for ``LnStructured`` and ``RandomStructured``: one tensor's channels, block by block.

Channel norms are taken where the channels lie whole, else reduced across
the processes that share them (exact for ``n`` = ``inf``, ``-inf``, ``0``);
channels are then ranked over shards. What is exact and what crosses
processes, case by case: ``README.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .._select import WHOLE, Group, keep
from .._specs import (
    LnStructured,
    RandomStructured,
    check_matrix_norm,
    keep_all,
    ln_structured,
    unpruned_units,
)
from .._types import Mask, NormOrder, Tensor
from .._validate import validate_dim_range, validate_structured
from ._cuts import box, cut_dim, moved
from ._layout import Layout, LocalBlock, all_reduce
from ._random import Seed, agreed, count_of, uniform

__all__ = ["check_layout", "structured"]


# --- where the channels lie ------------------------------------------------------------


def _cutting(layout: Layout, d: int) -> tuple[int, ...]:
    """The mesh dims whose ``Shard`` placement cuts the tensor's dim ``d`` (non-negative)."""
    return tuple(i for i in layout.span if _cut_dim(layout, i) == d)


def _cut_dim(layout: Layout, i: int) -> int | None:
    """The tensor dim (non-negative) that mesh dim ``i`` cuts; ``None`` where it replicates."""
    return cut_dim(layout.placements[i], len(layout.shape))


def _across(layout: Layout, d: int) -> tuple[int, ...]:
    """The mesh dims that cut the tensor along another dim than ``d``: a channel's entries lie across them."""
    along = _cutting(layout, d)
    return tuple(i for i in layout.span if i not in along)


def check_layout(fn: str, what: str, spec: object, layout: Layout) -> None:
    """Refuse, before any work, a spec that cannot be computed from this layout's blocks.

    Only ``LnStructured(n='nuc')`` of a 3-dim tensor sharded along another dim
    than the channels': a nuclear norm is no sum of per-process parts. (A
    ``dim`` out of range, or ``'nuc'`` of another number of dims, is left to
    the kernel, which raises as on one process.)

    Raises:
        NotImplementedError: naming the spec, the layout and what works.
    """
    if not isinstance(spec, LnStructured) or spec.n != "nuc":
        return
    ndim = len(layout.shape)
    if ndim != 3 or not -ndim <= spec.dim < ndim or not _across(layout, spec.dim % ndim):
        return  # other shapes get the kernel's own error
    cut = sorted({d for i in _across(layout, spec.dim % ndim) if (d := _cut_dim(layout, i)) is not None})
    raise NotImplementedError(
        f"{fn}: {what} is a DTensor sharded along dim {' and '.join(map(str, cut))} ({layout}), and {spec!r} takes each "
        f"channel's nuclear norm over the other dims, which no sum of per-process parts gives; on "
        f"DTensors n='nuc' works where the channels' dim ({spec.dim % ndim}) is the only sharded dim or "
        "the tensor is replicated; use a vector norm (n=2, n='fro', n=1, ...) or shard along the "
        "channels' dim"
    )


def _channel_layout(layout: Layout, d: int) -> Layout:
    """The layout of a tensor's channel vector: cut by the mesh dims that cut its dim ``d``, whole along the others."""
    from torch.distributed.tensor import Replicate

    along = _cutting(layout, d)
    placements = tuple(moved(p, 0) if i in along else Replicate() for i, p in enumerate(layout.placements))
    shape = (layout.shape[d],)
    cut = box(shape, tuple(layout.mesh.shape), layout.coordinate, placements)
    assert cut is not None  # dim d is cut as the tensor's is, and that is a box
    return Layout(layout.mesh, placements, shape, cut[0], cut[1], layout.coordinate, along)


# --- LnStructured and RandomStructured ----------------------------------------------------


def structured(spec: LnStructured | RandomStructured, block: LocalBlock, generator: torch.Generator | None) -> Tensor:
    """This process's block of the mask ``spec`` gives for the DTensor ``block`` (see the module)."""
    scores, mask, layout = block
    whole = block.whole()  # torch's checks, on the whole shape
    validate_structured(whole)
    validate_dim_range(whole, spec.dim)
    if isinstance(spec, LnStructured):
        check_matrix_norm(spec.n, whole)
    d = spec.dim % whole.dim()
    if whole.numel() == 0:
        return _empty(spec, block)
    if isinstance(spec, LnStructured) and not layout.sharded:  # a whole copy: one process's kernel
        return ln_structured(spec.target, spec.n, spec.dim, scores, mask)
    vector = _channel_layout(layout, d)
    if isinstance(spec, LnStructured):
        kept = _ln_channels(spec, block, d, vector)
    else:
        kept = _random_channels(spec, block, d, vector, generator)
    if kept is None:
        return keep_all(scores, mask)
    shape = [1] * scores.dim()
    shape[d] = scores.shape[d]
    kept = kept.reshape(shape)
    return kept.expand(scores.shape).contiguous() if mask is None else kept & mask


def _empty(spec: LnStructured | RandomStructured, block: LocalBlock) -> Tensor:
    """A whole tensor of no entries: one process's kernel on an empty tensor (its errors), nothing sent."""
    scores, mask, layout = block
    empty = torch.zeros(layout.shape, dtype=scores.dtype, device=scores.device)
    earlier = None if mask is None else torch.zeros(layout.shape, dtype=torch.bool, device=scores.device)
    spec.compute_mask(empty, earlier, generator=torch.Generator(device=scores.device))
    return torch.ones(scores.shape, dtype=torch.bool, device=scores.device)


def _others(scores: Tensor, d: int) -> list[int]:
    return [i for i in range(scores.dim()) if i != d]


def _ln_channels(spec: LnStructured, block: LocalBlock, d: int, vector: Layout) -> Tensor | None:
    """Kept flags of this process's channels (``vector``'s block); ``None``: none pruned.

    Norms are taken where the channels lie whole, else reduced across the
    processes that share them. Channels cut across processes are then
    ranked over them, after ONE ``all_reduce`` of the count of channels
    still unpruned with a flag saying whether a process failed to compute
    its norms (a nuclear norm's SVD of non-finite values): then every
    process raises, none is left waiting in the select.
    """
    scores, mask, layout = block
    across, failure = _across(layout, d), None
    if across:
        keys, eligible = _norms_across(spec.n, block, d, across)
    else:
        eligible = None if mask is None else unpruned_units("structured", mask, d)
        try:
            keys = torch.norm(scores, p=spec.n, dim=_others(scores, d))
        except RuntimeError as e:
            failure = e
    unpruned, failed = _unpruned_channels(vector, eligible, failure is not None, scores.device)
    k = count_of(spec.target, unpruned, layout.shape[d], None)  # an amount refused first, as on one process
    if k == 0:
        return None
    if failure is not None:
        raise failure
    if failed:
        raise _failed_elsewhere(spec)
    return keep(keys, k, eligible, group=vector.shard(vector.span) if vector.sharded else WHOLE)


def _unpruned_channels(vector: Layout, eligible: Mask, failure: bool, device: torch.device) -> tuple[int, bool]:
    """The channels still unpruned, and whether a process failed: summed over the mesh where channels are cut."""
    mine = vector.size[0] if eligible is None else int(eligible.sum())
    if not vector.sharded:  # every process holds every channel's key
        return mine, failure
    summed = all_reduce(torch.tensor([mine if vector.counted else 0, failure], dtype=torch.int64, device=device), vector.mesh)
    return int(summed[0]), bool(summed[1])


def _random_channels(
    spec: RandomStructured, block: LocalBlock, d: int, vector: Layout, generator: torch.Generator | None
) -> Tensor | None:
    """Kept flags of this process's channels (``vector``'s block) drawn at random; ``None``: none pruned.

    The seed rides along the first ``all_reduce``: with the count of
    unpruned channels where they are cut across processes, else with the
    per-channel counts of entries still kept where those are cut (a
    channel is unpruned where any process keeps an entry of it).
    """
    scores, mask, layout = block
    seed = Seed(generator)
    group: Group = WHOLE
    if vector.sharded:
        eligible = None if mask is None else unpruned_units("structured", mask, d)
        across = _across(layout, d)
        if mask is not None and across:  # a channel's entries lie across processes
            eligible = all_reduce(mask.sum(dim=_others(scores, d), dtype=torch.int64), layout.mesh, across) != 0
        mine = vector.size[0] if eligible is None else int(eligible.sum())
        summed, value = agreed([mine if vector.counted else 0], seed, layout, scores.device)
        unpruned, group = int(summed[0]), vector.shard(vector.span)
    else:
        counts: Sequence[int] | Tensor = []
        if mask is not None and layout.sharded:
            counts = mask.sum(dim=_others(scores, d), dtype=torch.int64)
        summed, value = agreed(counts, seed, layout, scores.device)
        eligible = None
        if mask is not None:
            eligible = summed != 0 if layout.sharded else unpruned_units("structured", mask, d)
        unpruned = vector.size[0] if eligible is None else int(eligible.sum())
    k = count_of(spec.target, unpruned, layout.shape[d], seed)
    if k == 0:
        return None
    start = vector.offsets[0]
    keys = uniform(value, torch.arange(start, start + vector.size[0], device=scores.device))
    return keep(keys, k, eligible, group=group)


#: Codes of NaN in the max and min reductions: above every other code, below every other.
_NAN_ABOVE = 0x7FF8000000000000  # a quiet NaN's bits: above +inf's (0x7FF0...)
_NAN_BELOW = -1


def _norms_across(n: NormOrder, block: LocalBlock, d: int, across: tuple[int, ...]) -> tuple[Tensor, Mask]:
    """The L``n`` norm of each of this process's channels and (with a mask) whether it is unpruned.

    A channel's entries lie across the processes along the mesh dims
    ``across``: one ``all_reduce`` over each of those dims combines their
    parts. See the module for how the norm is formed; NaN propagates as in
    torch.
    """
    scores, mask, layout = block
    channels, others = scores.shape[d], _others(scores, d)
    dtype, device = scores.dtype, scores.device
    held = scores.numel() > 0  # an uneven cut leaves some processes no entries of the other dims
    if n in (math.inf, -math.inf):
        largest = n == math.inf
        if held:  # in the scores' dtype: exact, NaN kept
            magnitudes = scores.abs()
            extreme = (magnitudes.amax(dim=others) if largest else magnitudes.amin(dim=others)).to(torch.float64)
        else:
            extreme = torch.full((channels,), 0.0 if largest else math.inf, dtype=torch.float64, device=device)
        codes = extreme.contiguous().view(torch.int64).clone()
        codes[extreme.isnan()] = _NAN_ABOVE if largest else _NAN_BELOW
        rows = [codes]
        if mask is not None:  # any entry kept: the max of the flags, or the min of their negation
            kept_any = mask.any(dim=others).to(torch.int64)
            rows.append(kept_any if largest else 1 - kept_any)
        op = dist.ReduceOp.MAX if largest else dist.ReduceOp.MIN
        reduced = all_reduce(torch.stack(rows), layout.mesh, across, op)
        nan = reduced[0] == (_NAN_ABOVE if largest else _NAN_BELOW)
        norms = reduced[0].view(torch.float64).masked_fill(nan, math.nan).to(dtype)  # exact: values of dtype
        eligible = None if mask is None else (reduced[1] != 0 if largest else reduced[1] == 0)
        return norms, eligible
    if n == 0:
        partial = (scores != 0).sum(dim=others, dtype=torch.float64)
    else:
        p = 2.0 if n == "fro" else float(n)
        partial = scores.abs().to(torch.float64)  # a new tensor: the scores stay as they are
        if p != 1:
            partial.pow_(p)
        partial = partial.sum(dim=others)
    rows = [partial]
    if mask is not None:
        rows.append(mask.sum(dim=others, dtype=torch.float64))
    reduced = all_reduce(torch.stack(rows), layout.mesh, across)
    eligible = None if mask is None else reduced[1] != 0
    accumulate = torch.float64 if dtype == torch.float64 else torch.float32  # torch's accumulation dtype
    total = reduced[0].to(accumulate)  # rounded once, overflowing or underflowing where torch's sum would
    if n == 0 or n == 1:
        return total.to(dtype), eligible
    p = 2.0 if n == "fro" else float(n)
    root = total.to(torch.float64)
    root = root.sqrt() if p == 2 else root.pow(1 / p)
    return root.to(accumulate).to(dtype), eligible


def _failed_elsewhere(spec: LnStructured) -> RuntimeError:
    """What a process raises when another one of its mesh failed to compute its channels' norms."""
    return RuntimeError(
        f"{spec!r}: another process of the mesh failed to compute its channels' norms (its own "
        "error says why); no process computed a mask"
    )
