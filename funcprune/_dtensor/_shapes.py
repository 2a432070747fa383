"""DTensor kernels for the mask shapes: ``NM``, ``Block`` and ``PerSlice``, block by block.

Each works where the layout lets every group be computed from blocks as
they lie; other layouts are refused before any work (``check_*``),
on every process alike. Block norms are summed in torch's order for the
whole tensor (:func:`block_norms`), so masks equal one process's bit for
bit (``README.md``).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .._select import LocalShard, keep, resolve_count, sum_over_shards
from .._specs import (
    NM,
    Block,
    PerSlice,
    block_view,
    check_dim_indexes,
    keep_all,
    kept_blocks,
)
from .._specs import blocks as one_process_blocks
from .._specs import n_m as one_process_n_m
from .._types import Tensor
from ._layout import Layout, LocalBlock, agree_on_failure

__all__ = ["block_norms", "blocks", "check_blocks_cut", "check_n_m_cut", "check_slices_whole", "n_m", "per_slice"]


# --- checks before any work: groups the layout would cut ----------------------------------------
#
# Decided from every process's block (Layout.boxes), so all processes decide alike. A shape the
# spec refuses on one process (a dim out of range, a length m or the block does not divide) is
# left to the kernel, which raises one process's error.


def check_n_m_cut(fn: str, what: str, spec: NM, layout: Layout) -> None:
    """Refuse an ``NM`` whose groups of ``m`` the layout cuts across processes.

    Raises:
        NotImplementedError: naming the spec, the layout and what works.
    """
    ndim = len(layout.shape)
    if -ndim <= spec.dim < ndim and not layout.shape[spec.dim] % spec.m:
        _check_aligned(fn, what, spec, layout, {spec.dim % ndim: spec.m})


def check_blocks_cut(fn: str, what: str, spec: Block, layout: Layout) -> None:
    """Refuse a ``Block`` whose blocks the layout cuts across processes.

    Raises:
        NotImplementedError: naming the spec, the layout and what works.
    """
    ndim = len(layout.shape)
    if len(spec.shape) <= ndim:
        tiled = dict(enumerate(spec.shape, start=ndim - len(spec.shape)))
        if not any(layout.shape[d] % size for d, size in tiled.items()):
            _check_aligned(fn, what, spec, layout, tiled)


def check_slices_whole(fn: str, what: str, spec: PerSlice, layout: Layout) -> None:
    """Refuse a ``PerSlice`` whose slices the layout cuts across processes.

    Raises:
        NotImplementedError: naming the spec, the layout and what works.
    """
    ndim = len(layout.shape)
    if -ndim <= spec.dim < ndim:
        _check_whole_slices(fn, what, spec, layout)


def _held(layout: Layout) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The boxes of every process that hold an entry (an empty block holds no group)."""
    return [(offsets, size) for offsets, size in layout.boxes() if math.prod(size)]


def _check_aligned(fn: str, what: str, spec: NM | Block, layout: Layout, units: dict[int, int]) -> None:
    """Refuse unless every block starts and ends on multiples of ``units[d]`` along each dim ``d``."""
    for d, unit in units.items():
        cuts = sorted({(o[d], o[d] + s[d]) for o, s in _held(layout) if o[d] % unit or s[d] % unit})
        if not cuts:
            continue
        whole = f"groups of {unit} consecutive entries" if isinstance(spec, NM) else f"blocks of shape {spec.shape}"
        raise NotImplementedError(
            f"{fn}: {what} is a DTensor laid out as {layout}; along dim {d} (of length "
            f"{layout.shape[d]}) its blocks include {', '.join(f'{a}:{b}' for a, b in cuts)}, which do "
            f"not start and end on multiples of {unit}, so {spec!r} would have to move weights "
            f"between processes to see whole {whole}. On DTensors it works where every process's "
            f"block starts and ends on multiples of {unit} along dim {d}: shard another dim, or "
            "choose sizes whose cut (torch.chunk's) falls on such multiples"
        )


def _check_whole_slices(fn: str, what: str, spec: PerSlice, layout: Layout) -> None:
    """Refuse unless every block holds whole slices along ``spec.dim``."""
    d = spec.dim % len(layout.shape)
    held = _held(layout)
    cut = [e for e in range(len(layout.shape)) if e != d and any(s[e] != layout.shape[e] for _, s in held)]
    if cut:
        raise NotImplementedError(
            f"{fn}: {what} is a DTensor laid out as {layout}, whose blocks cut dim {cut[0]}, so "
            f"the slices of {spec!r} along dim {d} are split across processes; each slice would "
            "have to be ranked across processes, which funcprune does not do. On DTensors "
            f"PerSlice works where each process holds whole slices: shard dim {d} (the slices' "
            "dim) or replicate the tensor"
        )


# --- NM and PerSlice: each process on its own ------------------------------------------------


def n_m(spec: NM, block: LocalBlock) -> Tensor:
    """This process's block of the mask of ``spec``: the one-process kernel on the block (checked cut)."""
    scores, mask, layout = block
    check_dim_indexes(spec, spec.dim, block.whole())
    one_process_n_m(spec.m, spec.m, spec.dim, block.whole(), None)  # its errors on the whole shape
    if not math.prod(layout.shape):  # no entry anywhere (the empty blocks' cut was not checked)
        return keep_all(scores, mask)
    return one_process_n_m(spec.n, spec.m, spec.dim, scores, mask)


def per_slice(spec: PerSlice, block: LocalBlock, generator: torch.Generator | None) -> Tensor:
    """This process's block of the mask of ``spec``: the one-process kernel on the block (whole slices).

    A process holding no slice of a tensor that has some runs the inner
    spec on one slice of zeros first, so that it raises the errors of the
    slices' shape with the others. One holding a single slice of several
    runs it beside a copy of that slice: torch then reduces the slice (the
    inner spec's norms) in the order it takes among the others, as
    :func:`block_norms` explains (one slice alone is contiguous where the
    whole's are strided, and one output may be split across threads).
    A slice may fail where others do not (an ``int`` amount larger than
    what an earlier mask left in it, a nuclear norm's SVD of non-finite
    values): the processes agree on failing (one ``all_reduce`` of one
    number), so that none is left waiting in a later collective.
    """
    scores, mask, layout = block
    check_dim_indexes(spec, spec.dim, block.whole())  # one process's error on the whole shape
    if not layout.sharded:  # whole copies: every process fails alike, or none does
        return _slices(spec, block, generator)
    failure: Exception | None = None
    kept = None
    try:
        kept = _slices(spec, block, generator)
    except (ValueError, IndexError, RuntimeError) as e:
        failure = e
    agree_on_failure(failure, layout.mesh, layout.span, lambda: _failed_elsewhere(spec))
    assert kept is not None  # no process failed
    return kept


def _failed_elsewhere(spec: PerSlice) -> ValueError:
    """What a process raises when another one of its mesh could not prune its slices."""
    return ValueError(
        f"{spec!r}: another process of the mesh could not prune its slices (its own error says "
        "why); no process computed a mask"
    )


def _slices(spec: PerSlice, block: LocalBlock, generator: torch.Generator | None) -> Tensor:
    """:func:`per_slice` on this process's block, nothing communicated."""
    scores, mask, layout = block
    d = spec.dim % scores.dim()
    held, slices = scores.shape[d], layout.shape[d]
    if held == 0 and slices > 0:
        sizes = [1 if i == d else n for i, n in enumerate(layout.shape)]
        spec.compute_mask(torch.zeros(sizes, dtype=scores.dtype, device=scores.device), None, generator=generator)
    if held == 1 and slices > 1:
        pair = None if mask is None else torch.cat([mask, mask], dim=d)
        kept = spec.compute_mask(torch.cat([scores, scores], dim=d), pair, generator=generator)
        return kept.narrow(d, 0, 1).contiguous()
    return spec.compute_mask(scores, mask, generator=generator)


# --- Block: blocks ranked across processes ----------------------------------------------------


def blocks(spec: Block, block: LocalBlock) -> Tensor:
    """This process's block of the mask of ``spec`` (checked cut): its blocks ranked across processes."""
    scores, mask, layout = block
    block_view(spec.shape, block.whole())  # one process's errors on the whole shape
    if not math.prod(layout.shape):  # no entry anywhere: one process's count (its errors), nothing sent
        empty = torch.zeros(layout.shape, dtype=scores.dtype, device=scores.device)
        one_process_blocks(spec.target, spec.shape, empty, None)
        return keep_all(scores, mask)
    if not layout.sharded:  # a whole copy on every process: one process's kernel
        return one_process_blocks(spec.target, spec.shape, scores, mask)
    norms = block_norms(scores, spec.shape, layout.shape)
    eligible = None if mask is None else kept_blocks(mask, spec.shape)
    shard = _grid(layout, spec.shape)
    unpruned = shard.numel
    if eligible is not None:
        unpruned = sum_over_shards([int(eligible.sum())], [shard], scores.device)
    k = resolve_count(spec.target, unpruned, shard.numel)
    assert isinstance(k, int)  # from Python ints
    if k == 0:
        return keep_all(scores, mask)
    kept = keep(norms, k, eligible, group=shard)
    view, inner = block_view(spec.shape, scores)
    for d in inner:
        kept = kept.unsqueeze(d)
    kept = kept.expand(view).reshape(scores.shape)
    return kept if mask is None else kept & mask


def _grid(layout: Layout, shape: tuple[int, ...]) -> LocalShard:
    """Where this process's block norms sit in the grid of all blocks' norms (ranked over ``layout.span``)."""
    units = (1,) * (len(layout.shape) - len(shape)) + shape
    return dataclasses.replace(
        layout.shard(layout.span),
        shape=tuple(n // u for n, u in zip(layout.shape, units, strict=True)),
        offsets=tuple(o // u for o, u in zip(layout.offsets, units, strict=True)),
        size=tuple(s // u for s, u in zip(layout.size, units, strict=True)),
    )


def block_norms(scores: Tensor, shape: tuple[int, ...], whole: tuple[int, ...]) -> Tensor:
    """The L2 norm of each block of ``shape`` in ``scores``, a block of a tensor of shape ``whole``.

    Bit for bit what ``torch.linalg.vector_norm`` gives for those blocks on
    the whole (contiguous) tensor. torch sums a block's entries in flat
    order, but with vector lanes where the block's dims coalesce into one
    contiguous run (block dim ``j`` joins the one before where the tensor
    is one block long along ``j``), and split across threads where the
    reduction has one output. So a block one block long along a dim where
    the whole is longer is copied with a gap after that dim (the same
    order, no coalescing), and a single block is reduced as two outputs
    (one of them a view of the other).
    """
    view, inner = block_view(shape, scores)
    lead = scores.dim() - len(shape)
    gapped = [lead < d and scores.shape[d] == shape[d - lead] != whole[d] for d in range(scores.dim())]
    if any(gapped):
        strides, step = [0] * scores.dim(), 1
        for d in reversed(range(scores.dim())):
            strides[d] = step
            step *= max(scores.shape[d] + gapped[d], 1)
        values = torch.empty_strided(scores.shape, strides, dtype=scores.dtype, device=scores.device)
        values = values.copy_(scores).view(view)
    else:
        values = scores.contiguous().view(view)
    grid = [n for i, n in enumerate(view) if i not in inner]
    if math.prod(grid) == 1 and math.prod(whole) > math.prod(shape):
        pair = values.unsqueeze(0).expand(2, *values.shape)
        norms: Tensor = torch.linalg.vector_norm(pair, dim=[d + 1 for d in inner])
        return norms[0]
    norms = torch.linalg.vector_norm(values, dim=inner)
    return norms
