"""Kernels: one small pure function per built-in method, computing its mask.

A kernel takes the method's hyper-parameters, importance ``scores``, an
optional ``default_mask`` and (for random methods) a generator, and returns a
new ``torch.bool`` mask of the scores' shape. With a default mask the method
acts on the part of the tensor still unpruned, exactly as torch's
``PruningContainer`` does: unpruned entries for unstructured methods,
channels not entirely pruned for structured ones, everything for a custom
mask. A float amount is a fraction of that part; nothing pruned earlier is
ever revived. Which entries go is decided by :mod:`funcprune._select`, through its door.

Kernels know nothing of spec classes: each spec's ``compute_mask`` calls its
kernel with its fields.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch

from .._select import (
    KeyPart,
    LocalShard,
    Target,
    keep,
    keep_each,
    keep_jointly,
    magnitude_of,
    resolve_count,
)
from .._types import Count, Mask, NormOrder, Tensor
from .._validate import (
    check_same_shape,
    is_concrete,
    refuse_dtensors,
    validate_dim_range,
    validate_structured,
)

__all__ = [
    "as_bool",
    "check_matrix_norm",
    "custom_from_mask",
    "keep_all",
    "l1_part",
    "l1_unstructured",
    "l1_unstructured_jointly",
    "ln_structured",
    "random_structured",
    "random_unstructured",
    "structured_by_keys",
    "unpruned_count",
    "unpruned_units",
]


def as_bool(mask: Mask) -> Mask:
    """A default mask as ``torch.bool`` (numbers: nonzero means kept)."""
    return mask if mask is None or mask.dtype == torch.bool else mask != 0


def unpruned_count(scores: Tensor, eligible: Mask, total: int) -> Count:
    """How many units are still unpruned: a Python int wherever it can be.

    A tensor only where the values cannot be read (under a transform); the
    random kernels draw per unpruned unit, as torch does, where it is an int.
    Every amount kernel counts here first, so DTensors, whose counts would be
    this process's only, are refused here.
    """
    refuse_dtensors("compute_mask", scores, eligible)
    if eligible is None:
        return total
    if is_concrete(scores) and is_concrete(eligible):
        return int(torch.count_nonzero(eligible))  # a bool sum costs ~25x more
    return eligible.sum()


def _rand(n: int, generator: torch.Generator | None, dtype: torch.dtype | None = None,
          device: torch.device | str = "cpu") -> Tensor:  # fmt: skip
    """``n`` uniform draws, as torch's pruning methods draw them."""
    return torch.rand(n, generator=generator, dtype=dtype, device=device)


def _scatter_draws(draws: Tensor, eligible: Tensor, fill: float) -> Tensor:
    """Lay ``draws``, made for the eligible units only, over all units in order.

    The eager counterpart of ``t[eligible] = draws`` (torch draws one number
    per unpruned unit); ``fill`` elsewhere.
    """
    out = torch.full(eligible.shape, fill, dtype=draws.dtype, device=draws.device)
    return out.masked_scatter(eligible.to(draws.device), draws)


def keep_all(scores: Tensor, default_mask: Mask) -> Tensor:
    """A new mask that prunes nothing more than ``default_mask``."""
    refuse_dtensors("compute_mask", scores, default_mask)
    default_mask = as_bool(default_mask)
    if default_mask is None:
        return torch.ones(scores.shape, dtype=torch.bool, device=scores.device)
    return default_mask.clone(memory_format=torch.contiguous_format)


# --- unstructured -----------------------------------------------------------


KeysOf = Callable[[Tensor, Mask, Count], Tensor]


def _unstructured(keys_of: KeysOf, amount: Target, scores: Tensor, default_mask: Mask) -> Tensor:
    """Prune the ``amount`` lowest keys among the unpruned entries."""
    default_mask = as_bool(default_mask)
    eligible = None if default_mask is None else default_mask.reshape(-1)  # the kept entries
    unpruned = unpruned_count(scores, eligible, scores.numel())
    k = resolve_count(amount, unpruned, scores.numel())
    if isinstance(k, int) and k == 0:  # torch draws nothing then either
        return keep_all(scores, default_mask)
    keys = keys_of(scores, eligible, unpruned)
    return keep(keys, k, eligible).reshape(scores.shape)


def l1_unstructured(amount: Target, scores: Tensor, default_mask: Mask) -> Tensor:
    """Prune the ``amount`` unpruned entries of smallest ``|scores|``."""
    return l1_unstructured_jointly(amount, [scores], [default_mask])[0]


def l1_unstructured_jointly(
    amount: Target,
    scores: Sequence[Tensor],
    default_masks: Sequence[Mask],
    *,
    shards: Sequence[LocalShard] | None = None,
    separately: bool = False,
) -> list[Tensor]:
    """:func:`l1_unstructured` over several tensors ranked as if concatenated.

    ``|scores|`` is computed part by part, in the group's promoted dtype, as
    torch's concatenation ranks it (an fp32 tensor beside an fp16 one is
    compared in fp32); the group is never concatenated on the eager path.

    With ``shards`` (one per tensor), each tensor is this process's block of
    a larger one, the rest held by other processes that call this too: the
    amount counts the whole tensors' units, and the ``k`` entries pruned are
    those of the whole group (eager only; ``funcprune._select``).

    With ``separately`` (and no shards), each tensor is ranked on its own
    instead, the amount applying to each: :func:`l1_unstructured` of every
    tensor, selected all at once where they are eager (a plan's per-tensor
    rule; ``funcprune._select``'s ``keep_each``).
    """
    if separately:
        if shards is not None:
            raise ValueError("l1_unstructured_jointly: shards are ranked jointly, not separately")
        return _l1_unstructured_each(amount, scores, default_masks)
    dtype = functools.reduce(torch.promote_types, (s.dtype for s in scores))
    defaults = [as_bool(d) for d in default_masks]
    blocks: Sequence[LocalShard | None] = [None] * len(scores) if shards is None else shards
    parts = [l1_part(s, d, dtype, b) for s, d, b in zip(scores, defaults, blocks, strict=True)]
    if shards is not None:  # the unpruned count comes with the selection's first all-reduce
        total = sum(b.numel for b in shards)
        kept = keep_jointly(parts, lambda unpruned: _count(resolve_count(amount, unpruned, total)))
        return [m.reshape(s.shape) for m, s in zip(kept, scores, strict=True)]
    unpruned, total = _unpruned_in_group(scores, defaults)
    k = resolve_count(amount, unpruned, total)
    if isinstance(k, int) and k == 0:
        return [keep_all(s, d) for s, d in zip(scores, defaults, strict=True)]
    kept = keep_jointly(parts, k)
    return [m.reshape(s.shape) for m, s in zip(kept, scores, strict=True)]


def _l1_unstructured_each(amount: Target, scores: Sequence[Tensor], default_masks: Sequence[Mask]) -> list[Tensor]:
    """:func:`l1_unstructured` of each tensor, the eager ones' selections made together."""
    defaults = [as_bool(d) for d in default_masks]
    if len(defaults) != len(scores):
        raise ValueError(f"got {len(scores)} score tensors but {len(defaults)} default masks")
    if not all(is_concrete(t) for t in (*scores, *defaults) if t is not None):
        return [l1_unstructured(amount, s, d) for s, d in zip(scores, defaults, strict=True)]
    masks: list[Tensor | None] = []  # None: selected below
    parts, counts, available = [], [], []
    for s, d in zip(scores, defaults, strict=True):
        part = l1_part(s, d, s.dtype, None)
        unpruned = _count(unpruned_count(s, part.eligible, s.numel()))
        k = _count(resolve_count(amount, unpruned, s.numel()))
        if k == 0:  # as l1_unstructured: nothing selected
            masks.append(keep_all(s, d))
            continue
        masks.append(None)
        parts.append(part)
        counts.append(k)
        available.append(unpruned)
    selected = iter(keep_each(parts, counts, available))
    return [next(selected).reshape(s.shape) if m is None else m for m, s in zip(masks, scores, strict=True)]


def _count(k: Count) -> int:
    """``k`` as the Python ``int`` it is (``resolve_count`` of Python ints)."""
    assert isinstance(k, int)
    return k


def _unpruned_in_group(scores: Sequence[Tensor], defaults: Sequence[Mask]) -> tuple[Count, int]:
    """The group's unpruned entries and its size."""
    counts = [
        unpruned_count(s, None if d is None else d.reshape(-1), s.numel())
        for s, d in zip(scores, defaults, strict=True)
    ]
    unpruned: Count = 0
    for c in counts:
        unpruned = unpruned + c
    return unpruned, sum(s.numel() for s in scores)


def l1_part(scores: Tensor, default: Mask, dtype: torch.dtype, shard: LocalShard | None) -> KeyPart:
    """The keys of ``|scores|`` in ``dtype`` (computed on demand), eligible where ``default`` keeps."""
    def magnitudes(t: Tensor) -> Tensor:
        return t.abs().to(dtype)  # |x| is exact in any dtype; so is widening

    eligible = None if default is None else default.reshape(-1)
    key = magnitude_of if scores.dtype == dtype else magnitudes
    return KeyPart(scores.detach().reshape(-1), key, eligible, shard)


def random_unstructured(
    amount: Target, scores: Tensor, default_mask: Mask, generator: torch.Generator | None
) -> Tensor:
    """Prune ``amount`` random unpruned entries, drawing as torch draws."""

    def keys(s: Tensor, eligible: Mask, unpruned: Count) -> Tensor:
        # torch draws one number per *unpruned* entry and prunes the largest.
        if eligible is not None and isinstance(unpruned, int):  # eager: draw as torch does
            drawn = _rand(unpruned, generator, s.dtype, s.device)
            return -_scatter_draws(drawn, eligible, 0.0)
        return -_rand(s.numel(), generator, s.dtype, s.device)

    return _unstructured(keys, amount, scores, default_mask)


# --- structured -------------------------------------------------------------


ChannelKeysOf = Callable[[Tensor, int, list[int], Mask, Count], Tensor]


def _channels(scores: Tensor, dim: int) -> tuple[int, list[int]]:
    """``dim`` made non-negative, and the other dims (torch's checks first)."""
    validate_structured(scores)
    validate_dim_range(scores, dim)
    d = dim % scores.dim()
    return d, [i for i in range(scores.dim()) if i != d]


def _structured(
    keys_of: ChannelKeysOf, amount: Target, dim: int, scores: Tensor, default_mask: Mask
) -> Tensor:
    """Prune the ``amount`` lowest-key channels among those not all pruned."""
    default_mask = as_bool(default_mask)
    d, others = _channels(scores, dim)
    n_channels = scores.shape[d]
    eligible = None
    if default_mask is not None:
        eligible = unpruned_units("structured", default_mask, d)
    unpruned = unpruned_count(scores, eligible, n_channels)
    k = resolve_count(amount, unpruned, n_channels)
    if isinstance(k, int) and k == 0:  # torch draws nothing then either
        return keep_all(scores, default_mask)
    kept = keep(keys_of(scores, d, others, eligible, unpruned), k, eligible)
    shape = [1] * scores.dim()
    shape[d] = n_channels
    kept = kept.reshape(shape)
    if default_mask is None:
        return kept.expand(scores.shape).contiguous()
    return kept & default_mask


def check_matrix_norm(n: object, scores: Tensor) -> None:
    """Refuse a matrix norm the channels' shape cannot take, whatever the amount."""
    if n == "nuc" and scores.dim() != 3 or n == "fro" and scores.dim() > 3:
        need = "exactly 3 dims" if n == "nuc" else "at most 3 dims"
        raise ValueError(
            f"LnStructured: n={n!r} needs scores with {need} (a matrix norm over the dims "
            f"other than dim), got shape {tuple(scores.shape)}; use a number such as n=2"
        )


def ln_structured(
    amount: Target, n: NormOrder, dim: int, scores: Tensor, default_mask: Mask
) -> Tensor:
    """Prune the ``amount`` remaining channels along ``dim`` of smallest L``n`` norm."""
    _channels(scores, dim)
    check_matrix_norm(n, scores)

    def keys(s: Tensor, d: int, others: list[int], eligible: Mask, unpruned: Count) -> Tensor:
        norm: Tensor = torch.norm(s, p=n, dim=others)
        return norm

    return _structured(keys, amount, dim, scores, default_mask)


def random_structured(
    amount: Target, dim: int, scores: Tensor, default_mask: Mask,
    generator: torch.Generator | None,
) -> Tensor:  # fmt: skip
    """Prune ``amount`` random remaining channels along ``dim``, drawing as torch."""

    def keys(s: Tensor, d: int, others: list[int], eligible: Mask, unpruned: Count) -> Tensor:
        # torch draws one default-dtype CPU number per remaining channel and
        # prunes the smallest.
        device = generator.device if generator is not None else "cpu"
        if eligible is not None and isinstance(unpruned, int):  # eager: draw as torch does
            drawn = _rand(unpruned, generator, device=device)
            return _scatter_draws(drawn, eligible, 0.0).to(s.device)
        return _rand(s.shape[d], generator, device=device).to(s.device)

    return _structured(keys, amount, dim, scores, default_mask)


# --- a given mask -------------------------------------------------------------


def custom_from_mask(mask: Tensor, scores: Tensor, default_mask: Mask) -> Tensor:
    """Prune where ``mask`` (``torch.bool``) is ``False``, on top of ``default_mask``."""
    check_same_shape(
        "CustomFromMask", "the spec's mask", mask.shape, "the scores", scores.shape, plural=True
    )
    refuse_dtensors("compute_mask", mask, scores, default_mask)
    default_mask = as_bool(default_mask)
    mask = mask.to(scores.device)
    return mask.clone() if default_mask is None else mask & default_mask


# --- the part a method acts on, and channels ranked by given keys -------------


def unpruned_units(
    pruning_type: str, mask: Tensor, dim: int = 0, ndim: int | None = None
) -> Mask:
    """Flags of the units that a method of ``pruning_type`` acts on, on top of ``mask``.

    The rule of torch's ``PruningContainer`` (the fold acts on the same part):

    - ``"unstructured"``: the entries still kept (``mask`` is 1, or
      ``True``), as flags of ``mask``'s shape;
    - ``"structured"``: the channels along ``dim`` that are not entirely
      pruned (their entries do not sum to 0), one flag per channel;
    - ``"global"``: every unit: ``None``.

    Args:
        pruning_type: ``"unstructured"``, ``"structured"`` or ``"global"``.
        mask: the mask so far (``torch.bool``, or numbers as torch's masks).
        dim: the channels' dim, non-negative (``"structured"`` only).
        ndim: the dims ``0 .. ndim - 1`` to sum over, but ``dim``
            (``"structured"`` only): ``mask``'s own by default; torch's
            container takes the number of dims of the scores.

    Returns:
        ``torch.bool`` flags, or ``None`` for every unit.

    Raises:
        ValueError: if ``pruning_type`` is none of the three (torch's message).

    >>> unpruned_units("structured", torch.tensor([[1.0, 0.0], [0.0, 0.0]]), 0)
    tensor([ True, False])
    """
    if pruning_type == "unstructured":
        return mask if mask.dtype == torch.bool else mask == 1
    if pruning_type == "structured":
        n_dims = mask.dim() if ndim is None else ndim
        return mask.sum(dim=[d for d in range(n_dims) if d != dim]) != 0
    if pruning_type == "global":
        return None
    raise ValueError(f"Unrecognized PRUNING_TYPE {pruning_type}")


def structured_by_keys(
    amount: Target, dim: int, keys: Tensor, scores: Tensor, default_mask: Mask
) -> Tensor:
    """Prune the ``amount`` remaining channels along ``dim`` of lowest ``keys``.

    For a channel criterion computed outside the kernels, such as a norm
    that :func:`torch.norm` takes but :class:`~funcprune.LnStructured`
    refuses (``funcprune.compat`` computes it as torch does).

    Args:
        amount: an ``int`` count or a ``float`` fraction of the remaining channels.
        dim: the channels' dim.
        keys: one key per channel (``scores.shape[dim]`` of them); lower goes first.
        scores: gives the mask's shape and device only (any dtype).
        default_mask: an earlier mask of ``scores``' shape, or ``None``.

    Returns:
        A new ``torch.bool`` mask of ``scores``' shape.

    >>> structured_by_keys(1, 0, torch.tensor([2.0, 1.0]), torch.zeros(2, 2), None)
    tensor([[ True,  True],
            [False, False]])
    """

    def keys_of(s: Tensor, d: int, others: list[int], eligible: Mask, unpruned: Count) -> Tensor:
        return keys

    return _structured(keys_of, amount, dim, scores, default_mask)
