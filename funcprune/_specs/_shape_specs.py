"""Specs for mask shapes: :class:`NM`, :class:`Block` and :class:`PerSlice`.

Frozen dataclasses like the specs of ``_torch_specs.py``, validated when
built; each computes its mask with a kernel of ``_shape_kernels.py``.
All three act on the whole tensor and respect an earlier mask themselves,
so their ``pruning_type`` is ``"global"``: in a chain or a plan they see the
full tensor and its mask, and :func:`funcprune.global_unstructured` (which
ranks single entries across tensors) refuses them.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import ClassVar, final

import torch

from .._types import Mask, PruningType, Tensor
from .._validate import check_count, check_dim
from . import _shape_kernels as kernels
from ._spec import AmountSpec, Spec, named
from ._torch_specs import L1Unstructured, RandomUnstructured

__all__ = ["Block", "NM", "PerSlice", "check_dim_indexes"]


@final
@dataclass(frozen=True, slots=True)
class NM(Spec):
    """N:M sparsity: in every ``m`` consecutive entries along ``dim``, keeps the ``n`` largest.

    Entries are ranked by ``|score|``; ties go to the lower index, NaN is
    kept first. With an earlier mask, entries already pruned count among a
    group's ``m - n`` pruned: a group keeps ``min(n, entries still kept)``.
    2:4 along the input dim (``NM(2, 4)`` on a Linear weight) is the pattern
    sparse tensor cores run. A weight stored ``(in, out)`` (transformers'
    ``Conv1D``, GPT-2's layers) has its inputs along dim 0: use ``dim=0``,
    or a plan given ``input_dims=fp.input_dims(model)``, which shows the
    specs every weight as ``(out, in)``.

    Args:
        n: entries kept per group, ``0 <= n <= m``.
        m: the group's length, at least 1; it must divide the length along ``dim``.
        dim: the dim along which groups run (default ``-1``).

    Raises:
        TypeError: if ``n``, ``m`` or ``dim`` is not an int.
        ValueError: if ``m < 1`` or ``n`` is not in ``[0, m]``.

    >>> NM(2, 4).compute_mask(torch.tensor([[4.0, -1.0, 3.0, 2.0, 0.0, 0.0, 5.0, 0.0]]))
    tensor([[ True, False,  True, False, False, False,  True,  True]])
    """

    n: int
    m: int
    dim: int = -1

    def __post_init__(self) -> None:
        m = check_count("NM", "m", self.m, least=1)
        n = check_count("NM", "n", self.n, least=0)
        if n > m:
            raise ValueError(f"NM: n must be at most m (n kept of every m), got n={n} and m={m}")
        with named(self):
            check_dim(self.dim)

    @property
    def pruning_type(self) -> PruningType:
        return "global"

    def compute_mask(
        self, scores: Tensor, default_mask: Mask = None, *, generator: torch.Generator | None = None
    ) -> Tensor:
        check_dim_indexes(self, self.dim, scores)
        return kernels.n_m(int(self.n), int(self.m), self.dim, scores, default_mask)


def check_dim_indexes(spec: Spec, dim: int, scores: Tensor) -> None:
    """Refuse a ``dim`` that does not index ``scores``, naming the spec and the dim (an IndexError)."""
    if not isinstance(scores, Tensor):
        return  # refused with its own message after
    rank = scores.dim()
    if rank == 0:
        raise IndexError(
            f"{type(spec).__name__}: scores is 0-d (one value), which has no dim {dim} to run along; "
            "pass a tensor with at least one dim"
        )
    if not -rank <= dim < rank:
        raise IndexError(
            f"{type(spec).__name__}: dim={dim} does not index scores of shape {tuple(scores.shape)}: "
            f"expected {-rank} <= dim < {rank}"
        )


def _check_block_shape(shape: object) -> tuple[int, ...]:
    """``shape`` as a tuple of positive ints, or a clear error."""
    if not isinstance(shape, tuple | list) or not shape:
        raise TypeError(
            f"shape must be a non-empty tuple of positive ints, such as (1, 4) or (4, 4), got {shape!r}"
        )
    for size in shape:
        if isinstance(size, bool) or not isinstance(size, numbers.Integral):
            raise TypeError(f"shape must hold ints, got {shape!r} (an entry of type {type(size).__name__})")
        if size < 1:
            raise ValueError(f"shape must hold positive ints, got {shape!r}")
    return tuple(int(s) for s in shape)


@final
@dataclass(frozen=True, slots=True, repr=False)
class Block(AmountSpec):
    """Prunes whole blocks of ``shape``, those of smallest L2 norm.

    Blocks tile the last ``len(shape)`` dims of the scores (each of those
    lengths must be a multiple of the block's); every index of the dims
    before is a row of blocks of its own. Ties go to the lower block index
    (row-major over the grid of blocks).

    Args:
        amount: an ``int`` count of blocks, or a ``float`` fraction in
            [0, 1] of the blocks not yet entirely pruned.
        shape: the block's shape, such as ``(1, 4)`` or ``(4, 4)`` (required).
        sparsity: keyword-only, instead of ``amount``: the fraction of all
            blocks pruned after the call, counting those pruned before.

    Raises:
        TypeError: if ``amount`` is not a real number, or ``shape`` is
            missing or not a tuple of ints.
        ValueError: if ``amount`` is out of range or ``shape`` holds an
            entry below 1.

    >>> Block(1, shape=(1, 2)).compute_mask(torch.tensor([[3.0, 4.0, 0.5, 0.5]]))
    tensor([[ True,  True, False, False]])
    """

    shape: tuple[int, ...] = None  # type: ignore[assignment]  # required: a default only so that amount may have one
    _extra_fields: ClassVar[tuple[str, ...]] = ("shape",)

    def __post_init__(self) -> None:
        AmountSpec.__post_init__(self)
        with named(self):
            if self.shape is None:
                raise TypeError("shape (the block's shape, such as (1, 4) or (4, 4)) is required")
            object.__setattr__(self, "shape", _check_block_shape(self.shape))

    @property
    def pruning_type(self) -> PruningType:
        return "global"

    def compute_mask(
        self, scores: Tensor, default_mask: Mask = None, *, generator: torch.Generator | None = None
    ) -> Tensor:
        return kernels.blocks(self.target, self.shape, scores, default_mask)


@final
@dataclass(frozen=True, slots=True)
class PerSlice(Spec):
    """Applies ``spec`` within each slice along ``dim``, independently.

    The mask equals ``spec``'s mask computed on each slice
    ``scores.select(dim, i)`` (with the slice of the earlier mask) and
    stacked back: each slice prunes its own exact count. ``PerSlice(
    L1Unstructured(0.5), dim=0)`` prunes half of every output row of a
    Linear weight, as Wanda compares weights. :class:`~funcprune.L1Unstructured`
    and :class:`~funcprune.RandomUnstructured` are selected for all slices
    at once; any other spec runs on the slices under
    :func:`torch.func.vmap` (every built-in spec does; each slice draws its
    own random numbers). In eager mode a slice raises as the spec on it
    alone raises (an ``int`` amount above what an earlier mask left in
    that slice); inside a transform, where a count cannot raise, it prunes
    all that is left.

    Args:
        spec: the spec applied to each slice.
        dim: the dim whose indices are the slices (default ``0``).

    Raises:
        TypeError: if ``spec`` is not a funcprune spec or ``dim`` not an int.
        ValueError: from ``compute_mask``, where the spec raises on a slice
            (the message names the slice).

    >>> scores = torch.tensor([[1.0, 2.0, 3.0, 4.0], [40.0, 30.0, 20.0, 10.0]])
    >>> PerSlice(L1Unstructured(0.5)).compute_mask(scores)
    tensor([[False, False,  True,  True],
            [ True,  True, False, False]])
    """

    spec: Spec
    dim: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.spec, Spec):
            raise TypeError(f"PerSlice: spec must be a funcprune spec, got {self.spec!r} of type {type(self.spec).__name__}")
        with named(self):
            check_dim(self.dim)

    @property
    def pruning_type(self) -> PruningType:
        return "global"

    def compute_mask(
        self, scores: Tensor, default_mask: Mask = None, *, generator: torch.Generator | None = None
    ) -> Tensor:
        check_dim_indexes(self, self.dim, scores)
        spec = self.spec
        if isinstance(spec, L1Unstructured):
            # keys None: |scores|, never materialized where every slice is selected at once
            return kernels.per_slice_unstructured(spec.target, self.dim, None, scores, default_mask)
        if isinstance(spec, RandomUnstructured):
            device = generator.device if generator is not None else scores.device
            keys = torch.rand(scores.shape, generator=generator, dtype=scores.dtype, device=device)
            return kernels.per_slice_unstructured(spec.target, self.dim, keys.to(scores.device), scores, default_mask)

        def mask_of(s: Tensor, d: Mask) -> Tensor:
            return spec.compute_mask(s, d, generator=generator)

        # A PerSlice inside runs its slices under this one's vmap, where its counts are capped: in
        # eager mode, this one's slices then run one by one, each raising as it would alone.
        return kernels.per_slice(mask_of, self.dim, scores, default_mask, one_by_one=_holds_per_slice(spec))


def _holds_per_slice(spec: Spec) -> bool:
    """Whether ``spec`` is or chains a :class:`PerSlice` (at any depth)."""
    if isinstance(spec, PerSlice):
        return True
    steps = getattr(spec, "specs", None)
    return isinstance(steps, tuple) and any(isinstance(s, Spec) and _holds_per_slice(s) for s in steps)
