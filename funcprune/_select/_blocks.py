"""Blocks (the Block spec's): their norms, which blocks keep an entry, the mask from the kept blocks.

The passes over the whole tensor around a selection over blocks, fast where
exact (``funcprune._specs``' ``blocks`` calls them through this door: the
norms are the keys ranked, summed natively).

:func:`block_norms` gives, bit for bit, what ``torch.linalg.vector_norm``
gives for the blocks (the keys ``blocks`` ranks: a different rounding would
rank near-equal blocks differently). torch sums a block's squares in one
accumulator, in the block's row-major order (its generic reduction; a block
whose entries are one contiguous run goes through a vectorized reduction
instead, which stays torch's here), ``acc + v * v`` or, where its compiler
contracted that, ``fma(v, v, acc)``. Which of the two, per dtype, is found
once per process by comparing the native kernel with torch on a probe;
where neither matches, torch computes the norms. Half and bfloat16 blocks
are summed in float32 (as torch does) and rounded.

:func:`blocks_with_an_entry` and :func:`expand_blocks` read and write a
bool mask in one native pass each (``funcprune._native``'s ``block_any``
and ``block_expand``), else a block row's width at a time in torch: the
``b`` flags of a block along the last dim are one ``b``-byte word (``b`` of
1, 2, 4 or 8), so which blocks keep an entry is a max over words, and the
mask a word per block (``0x0101...`` times the block's flag), written once.
Elsewhere (other widths, more than 2-D blocks, masks that are not
contiguous, under a transform) both take the plain torch ops. All three
are eager-only fast paths: under ``vmap``, ``grad`` or ``torch.compile``
they run the torch ops they replace.
"""

from __future__ import annotations

import math

import torch

from .. import _native
from .._types import Mask, Tensor
from .._validate import is_concrete

__all__ = ["block_norms", "blocks_with_an_entry", "expand_blocks"]

#: Dtypes whose blocks the kernels sum: as they are, or in float32 (torch's accumulator for them).
_SUMMED_IN = {torch.float32: torch.float32, torch.float64: torch.float64,
              torch.float16: torch.float32, torch.bfloat16: torch.float32}  # fmt: skip
#: From this many entries a block that is the whole tensor is summed by several of torch's
#: threads (``at::internal::GRAIN_SIZE``): an order no kernel here follows.
_GRAIN = 32768
#: The word of each block width, and the word whose bytes are all 1.
_WORDS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_ONES = {1: 1, 2: 0x0101, 4: 0x01010101, 8: 0x0101010101010101}


def block_norms(scores: Tensor, shape: tuple[int, ...], view: list[int], inner: list[int]) -> Tensor:
    """``torch.linalg.vector_norm(scores.reshape(view), dim=inner)``, bit for bit; natively where it can be.

    ``view`` and ``inner`` as :func:`~._shape_kernels.block_view` gives them.
    """
    if is_concrete(scores):
        norms = _native_norms(scores.detach(), shape)
        if norms is not None:
            return norms.reshape([n for i, n in enumerate(view) if i not in inner])
    reduced: Tensor = torch.linalg.vector_norm(scores.reshape(view), dim=inner)
    return reduced


def _native_norms(scores: Tensor, shape: tuple[int, ...]) -> Tensor | None:
    """The blocks' norms, ``(rows of blocks, blocks a row)``, from the kernel; ``None``: torch's way."""
    summed = _SUMMED_IN.get(scores.dtype)
    if summed is None or not _generic(scores, shape) or not _native.plain(scores):
        return None
    fused = _scheme(scores.dtype)
    if fused is None:
        return None
    x = scores if scores.dtype == summed else scores.to(summed)
    a, b = (1, *shape)[-2:]
    norms = _native.block_norms(x, a, b, fused)
    return None if norms is None else norms.to(scores.dtype)


def _generic(scores: Tensor, shape: tuple[int, ...]) -> bool:
    """Whether torch sums these blocks with its generic reduction, in an order the kernel follows.

    Blocks of at most 2 dims, over a tensor with entries, whose entries are
    not one contiguous run (those torch reduces with vector lanes), and not
    one block the whole tensor from :data:`_GRAIN` entries on (several
    threads sum it).
    """
    if len(shape) > 2 or scores.numel() == 0:
        return False
    a, b = (1, *shape)[-2:]
    last = scores.shape[-1]
    run = (a == 1 and b > 1) or (b > 1 and b == last) or (a > 1 and b == 1 and last == 1)
    whole = math.prod(shape) == scores.numel()
    return not run and not (whole and scores.numel() >= _GRAIN)


#: Per dtype, whether torch fuses the multiply-add summing blocks (``None``: the kernel follows neither).
_SCHEMES: dict[torch.dtype, bool | None] = {}


def _scheme(dtype: torch.dtype) -> bool | None:
    """Whether torch fuses the multiply-add summing blocks of ``dtype`` (``None``: the kernel follows neither).

    A property of torch's build, found once per process and dtype on a
    probe: blocks of a few shapes and scales whose norms, summed one way or
    the other, differ in a good share of blocks (in float32 and float64;
    half and bfloat16 squares are exact in float32, so both ways agree).
    Not found (``None``, not remembered) while the kernels in use lack the
    block norms.
    """
    if dtype in _SCHEMES:
        return _SCHEMES[dtype]
    if _native.block_norms(torch.zeros(1, 1, dtype=_SUMMED_IN[dtype], device="cpu"), 1, 1, False) is None:
        return None  # no kernels in use (not built, or turned off here): nothing to find
    generator = torch.Generator().manual_seed(27)
    probes = []
    for (a, b), (rows, columns) in (((4, 4), (16, 24)), ((3, 5), (9, 40)), ((2, 9), (12, 18)), ((5, 1), (10, 7))):
        values = torch.randn(rows * a, columns * b, generator=generator, dtype=torch.float64, device="cpu")
        scale = torch.exp(torch.randn(rows * a, 1, generator=generator, dtype=torch.float64, device="cpu") * 4)
        probes.append(((a, b), (values * scale).to(dtype)))
    for fused in (False, True):
        agree = [_agrees(x, block, fused) for block, x in probes]
        if None in agree:
            return None
        if all(agree):
            _SCHEMES[dtype] = fused
            return fused
    _SCHEMES[dtype] = None
    return None


def _agrees(x: Tensor, block: tuple[int, int], fused: bool) -> bool | None:
    """Whether the kernel, summing as ``fused`` says, gives torch's norms for the blocks of ``x``.

    ``None`` where the kernels in use lack the block norms.
    """
    a, b = block
    expected = torch.linalg.vector_norm(x.reshape(x.shape[0] // a, a, x.shape[1] // b, b), dim=(1, 3))
    got = _native.block_norms(x.to(_SUMMED_IN[x.dtype]), a, b, fused)
    return None if got is None else torch.equal(got.to(x.dtype), expected)


# --- the mask, a block's width at a time --------------------------------------------------------


def _words(mask: Tensor, width: int) -> Tensor | None:
    """A contiguous bool mask's entries, ``width`` at a time along the last dim, as one word each."""
    if width not in _WORDS or not is_concrete(mask) or not mask.is_contiguous() or mask.numel() == 0:
        return None
    if mask.shape[-1] % width or mask.storage_offset() % width or any(s % width for s in mask.stride()[:-1]):
        return None
    return mask.view(torch.uint8).view(_WORDS[width])


def blocks_with_an_entry(mask: Tensor, shape: tuple[int, ...], grid: list[int]) -> Tensor | None:
    """Whether each block keeps an entry of ``mask`` (bool, of the grid's shape); ``None``: use torch."""
    a, b = (1, *shape)[-2:]
    if len(shape) <= 2 and is_concrete(mask) and mask.numel():
        found = _native.block_any(mask, a, b)
        if found is not None:
            return found.reshape(grid)
    words = None if len(shape) > 2 else _words(mask, b)
    if words is None or words.numel() == 0:
        return None
    per_row = words.reshape(-1, a, words.shape[-1])  # (rows of blocks, a, blocks a row)
    return per_row.amax(dim=1).ne(0).reshape(grid)


def expand_blocks(kept: Tensor, shape: tuple[int, ...], like: Tensor, default_mask: Mask) -> Tensor | None:
    """The mask of ``like``'s shape whose blocks are ``kept`` (bool, the grid), and ``default_mask``.

    ``None`` where the word-wise write does not apply: then use torch.
    """
    a, b = (1, *shape)[-2:]
    if len(shape) > 2 or not is_concrete(kept) or kept.numel() == 0:
        return None
    if default_mask is None or is_concrete(default_mask):
        written = _native.block_expand(kept.contiguous(), default_mask, a, b, like.shape)
        if written is not None:
            return written
    if b not in _WORDS:
        return None
    last = like.shape[-1]
    grid = kept.reshape(-1, 1, last // b)  # (rows of blocks, 1, blocks a row)
    flags = grid.view(torch.uint8).to(_WORDS[b]).mul_(_ONES[b]) if b > 1 else grid
    full = flags.expand(grid.shape[0], a, grid.shape[2])
    if default_mask is None:
        out = full.contiguous()
    else:
        earlier = _words(default_mask, b)
        if earlier is None or earlier.shape != like.shape[:-1] + (last // b,):
            return None
        out = torch.bitwise_and(full, earlier.reshape(full.shape))
    return out.view(torch.uint8).view(torch.bool).reshape(like.shape)
