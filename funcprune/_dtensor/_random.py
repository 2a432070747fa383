"""Random specs on DTensors: one agreed seed, and keys hashed from it and each unit's global index.

A mask depends only on the seed, the whole tensor's shape and the earlier
mask: the same for any world size and placement, never one process's
``torch.rand`` draws (``README.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from .._select import KeyPart, LocalShard, Target, keep_jointly, resolve_count
from .._specs import keep_all
from .._types import Tensor
from ._layout import Layout, LocalBlock, all_reduce

__all__ = ["Seed", "agreed", "count_of", "random_unstructured", "uniform"]


# --- seeds and keys for the random specs -------------------------------------------------------


_MASK64 = (1 << 64) - 1


def _signed(value: int) -> int:
    """``value`` modulo 2**64 as a signed 64-bit integer (torch's int64)."""
    value &= _MASK64
    return value - (1 << 64) if value >> 63 else value


_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _shifted(z: Tensor, s: int) -> Tensor:
    """``z >> s`` as unsigned 64-bit integers (a logical shift of int64 values)."""
    return (z >> s).bitwise_and_((1 << (64 - s)) - 1)


def uniform(seed: int, index: Tensor) -> Tensor:
    """One float64 in ``[0, 1)`` per int64 ``index``: splitmix64's output ``index + 1`` from state ``seed``.

    The top 53 bits of ``mix(seed + (index + 1) * 0x9E3779B97F4A7C15)``
    (wrapping 64-bit arithmetic), exactly as the reference generator; a
    counter-based draw, so any block of indices is drawn on its own.
    """
    z = index * _signed(_GAMMA)
    z.add_(_signed(seed + _GAMMA))
    z.bitwise_xor_(_shifted(z, 30)).mul_(_MIX1)
    z.bitwise_xor_(_shifted(z, 27)).mul_(_MIX2)
    z.bitwise_xor_(_shifted(z, 31))
    return _shifted(z, 11).to(torch.float64).mul_(2.0**-53)


class Seed:
    """One 64-bit draw from ``generator`` (torch's default CPU generator if ``None``), undoable."""

    def __init__(self, generator: torch.Generator | None) -> None:
        self._generator = torch.default_generator if generator is None else generator
        self._state = self._generator.get_state()
        drawn = torch.randint(
            -(2**63), 2**63 - 1, (1,), dtype=torch.int64, generator=self._generator,
            device=self._generator.device,
        )  # fmt: skip
        self.value = int(drawn)

    def undo(self) -> None:
        """Put the generator back as it was before the draw."""
        self._generator.set_state(self._state)


def _first(layout: Layout) -> bool:
    """Whether this process is the mesh's first (whose seed every process takes)."""
    return not any(layout.coordinate)


def agreed(numbers: Sequence[int] | Tensor, seed: Seed, layout: Layout, device: torch.device) -> tuple[Tensor, int]:
    """``numbers`` summed over the processes, and the first process's seed: one ``all_reduce``."""
    head = torch.as_tensor(numbers, dtype=torch.int64, device=device).reshape(-1)
    mine = torch.tensor([seed.value if _first(layout) else 0], dtype=torch.int64, device=device)
    summed = all_reduce(torch.cat([head, mine]), layout.mesh)
    return summed[:-1], int(summed[-1])


def count_of(target: Target, unpruned: int, total: int, seed: Seed | None) -> int:
    """:func:`resolve_count`, putting the generator back if nothing is drawn for (k == 0, or refused)."""
    try:
        k = resolve_count(target, unpruned, total)
    except Exception:
        if seed is not None:
            seed.undo()
        raise
    assert isinstance(k, int)
    if k == 0 and seed is not None:
        seed.undo()
    return k


# --- RandomUnstructured --------------------------------------------------------------------


def random_unstructured(
    target: Target, blocks: Sequence[LocalBlock], shards: Sequence[LocalShard] | None, generator: torch.Generator | None
) -> list[Tensor]:
    """This process's blocks of the masks of ``RandomUnstructured(target)`` over the group ``blocks``.

    Each entry's key is :func:`uniform` of the agreed seed and its index in
    the concatenation of the whole (flattened) tensors; the ``k`` lowest
    keys of the unpruned entries go, over the shards when ``shards``.
    """
    device = blocks[0].scores.device
    flags = [None if b.mask is None else b.mask.reshape(-1) for b in blocks]
    counts = [b.scores.numel() if f is None else int(f.sum()) for b, f in zip(blocks, flags, strict=True)]
    seed = Seed(generator)
    mine = sum(c for c, b in zip(counts, blocks, strict=True) if shards is None or b.layout.counted)
    summed, value = agreed([] if shards is None else [mine], seed, blocks[0].layout, device)
    unpruned = sum(counts) if shards is None else int(summed[0])
    k = count_of(target, unpruned, sum(math.prod(b.layout.shape) for b in blocks), seed)
    if k == 0:
        return [keep_all(b.scores, b.mask) for b in blocks]
    parts, base = [], 0
    for i, (b, f) in enumerate(zip(blocks, flags, strict=True)):
        shard = None if shards is None else shards[i]
        where = LocalShard(b.layout.shape, b.layout.offsets, b.layout.size)
        positions = where.positions(torch.arange(b.scores.numel(), device=device))  # in the whole tensor
        parts.append(KeyPart(positions + base, _keyed(value), f, shard))
        base += math.prod(b.layout.shape)
    kept = keep_jointly(parts, k)
    return [m.reshape(b.scores.shape) for m, b in zip(kept, blocks, strict=True)]


def _keyed(seed: int) -> Callable[[Tensor], Tensor]:
    def keys(index: Tensor) -> Tensor:
        return uniform(seed, index)

    return keys
