"""Mask shapes: N:M groups (``NM``), whole blocks (``Block``), a spec per slice (``PerSlice``).

The parity reference is ``torch.ao.pruning.WeightNormSparsifier`` (read in
``torch/ao/pruning/sparsifier/weight_norm_sparsifier.py``, torch 2.13). Its
``update_mask`` on a 2-D weight (it only handles Linear-like weights: it
works on ``data.shape[-2:]`` with ``avg_pool2d``/``unfold``) does this:

- ``ww = weight * weight`` (the default L2 norm; ``norm=1`` uses ``|w|``),
  where ``weight`` is the *currently masked* weight (``orig * mask``, read
  through the parametrization).
- ``sparsity_level <= 0`` or ``zeros_per_block == 0``: every entry kept;
  ``sparsity_level >= 1`` with ``zeros_per_block`` = the block's size: every
  entry pruned.
- Otherwise a *tensor mask* over blocks: ``avg_pool2d(ww, kernel=stride=
  block, ceil_mode=True)`` gives each block the mean of its squares (for a
  block cut by the edge, the mean over its in-bounds entries: ``ceil_mode``
  pads, and the divisor counts only the entries inside); the blocks are
  numbered row-major over the grid; ``k = round(sparsity_level * blocks)``
  (Python's round, half to even) clamped to ``[0, blocks - 1]``, so a level
  below 1 never prunes every block and a level of 0.99 on 10 blocks prunes
  9; ``topk(k, largest=False)`` picks the blocks pruned. A level ``>= 1``
  gives an all-pruned tensor mask. Ordering by the mean of squares is
  ordering by the L2 norm for blocks of one size.
- If ``zeros_per_block`` is below the block's size, a *block mask* too: the
  weight padded with NaN to whole blocks, ``unfold``-ed, and in every block
  the ``zeros_per_block`` smallest squares are pruned (``topk``, NaN
  largest); the result is ``tensor_mask | block_mask``. With
  ``sparsity_level=1.0`` the tensor mask prunes everything, so the result is
  the block mask alone: that is N:M with ``sparse_block_shape=(1, m)`` and
  ``zeros_per_block = m - n`` (or ``(m, 1)`` for groups down the columns).
  With a level below 1 it is N:M inside the lowest-norm blocks only, which
  no single funcprune spec expresses.
- Ties: whatever ``torch.topk`` returns (on CPU, all-equal blocks and
  all-equal entries go from the *higher* index); NaN counts as the largest
  in both masks, so it is pruned last.
- A length that the block does not divide: the tensor mask takes the partial
  blocks at the edge (mean over what is inside); the block mask keeps the
  padded shape, so N:M on a non-divisible weight yields a mask larger than
  the weight, which fails on the next access of the weight.
- A later ``step()`` recomputes the mask from scratch on the masked weight:
  a higher level prunes the zeroed blocks first (a cumulative target), but a
  lower level revives blocks.

Where funcprune deliberately differs: ties go to the *lower* index (block
index row-major, or index within an N:M group); lengths that the block (or
``m``) does not divide are refused with a ``ValueError``; nothing is ever
revived (an earlier mask is a ``default_mask``, and ``Block(sparsity=...)``
prunes nothing once the target is reached); ``Block``'s float ``amount`` is
``round(amount * blocks left)`` without the ``blocks - 1`` clamp (so
``Block(0.99, ...)`` on 10 blocks prunes 10); any rank, and any number of
block dims, is accepted. With distinct norms and divisible shapes the masks
are equal: ``Block(count, shape)`` with ``count`` the sparsifier's
``clamp(round(level * blocks), 0, blocks - 1)`` (``blocks`` at level 1,
``0`` at level 0), and ``NM(n, m)`` with ``zeros_per_block = m - n`` at
level 1.

The properties compare against small loop references written here (N:M and
blocks) and, for ``PerSlice``, against the loop that defines it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.ao.pruning.sparsifier.weight_norm_sparsifier import WeightNormSparsifier
from torch.func import vmap

import funcprune as fp

Tensor = torch.Tensor
NAN = float("nan")
#: A quarter of the profile's examples, for the properties that call torch.ao.
FEW = settings(max_examples=max(10, settings().max_examples // 4))


def pruned(mask: Tensor) -> int:
    return int((~mask).sum())


def _scores(shape: Sequence[int], seed: int, kind: int) -> Tensor:
    """Normal scores (kind 0), small ints with many ties (1), or ints with NaN (2)."""
    g = torch.Generator().manual_seed(seed)
    if kind == 0:
        return torch.randn(tuple(shape), generator=g)
    scores = torch.randint(-3, 4, tuple(shape), generator=g).float()
    if kind == 2:
        scores[torch.rand(tuple(shape), generator=g) < 0.15] = NAN
    return scores


def _default(shape: Sequence[int], seed: int, keep: float) -> Tensor | None:
    """A random earlier mask keeping about ``keep`` of the entries; None at keep 1."""
    if keep >= 1:
        return None
    return torch.rand(tuple(shape), generator=torch.Generator().manual_seed(seed + 1)) < keep


def _rank(value: float, index: int) -> tuple[bool, float, int]:
    """The order in which entries (or blocks) go: lowest first, lower index first, NaN last."""
    return (math.isnan(value), 0.0 if math.isnan(value) else abs(value), index)


def nm_reference(scores: Tensor, default: Tensor | None, n: int, m: int, dim: int) -> Tensor:
    """N:M as the contract says, one group at a time in plain Python."""
    moved = scores.movedim(dim, -1)
    kept_before = torch.ones_like(moved, dtype=torch.bool) if default is None else default.movedim(dim, -1)
    rows: list[list[bool]] = []
    for values, kept in zip(moved.reshape(-1, m).tolist(), kept_before.reshape(-1, m).tolist(), strict=True):
        left = [i for i in range(m) if kept[i]]
        goes = sorted(left, key=lambda i: _rank(values[i], i))[: max(0, len(left) - n)]
        rows.append([kept[i] and i not in goes for i in range(m)])
    return torch.tensor(rows, dtype=torch.bool).reshape(moved.shape).movedim(-1, dim)


def block_reference(
    scores: Tensor, default: Tensor | None, shape: tuple[int, ...], count: Callable[[int, int], int]
) -> Tensor:
    """Blocks as the contract says: ``count(left, total)`` blocks go, smallest L2 norm first.

    Blocks are enumerated row-major (leading indices, then the block grid)
    and sliced out one by one; the squared norm is summed in float64.
    """
    lead = scores.shape[: scores.dim() - len(shape)]
    grid = [length // size for length, size in zip(scores.shape[len(lead) :], shape, strict=True)]
    where: list[tuple[int | slice, ...]] = []
    for index in itertools.product(*map(range, lead), *map(range, grid)):
        at, cell = index[: len(lead)], index[len(lead) :]
        where.append(at + tuple(slice(c * s, (c + 1) * s) for c, s in zip(cell, shape, strict=True)))
    keys = [float((scores[w].double() ** 2).sum()) for w in where]
    left = [i for i, w in enumerate(where) if default is None or bool(default[w].any())]
    goes = sorted(left, key=lambda i: _rank(keys[i], i))[: count(len(left), len(where))]
    mask = torch.ones_like(scores, dtype=torch.bool) if default is None else default.clone()
    for i in goes:
        mask[where[i]] = False
    return mask


def blocks_left(scores: Tensor, mask: Tensor | None, block: tuple[int, ...]) -> int:
    """Blocks with at least one entry kept."""
    if mask is None:
        return scores.numel() // math.prod(block)
    view: list[int] = list(mask.shape[: mask.dim() - len(block)])
    for length, size in zip(mask.shape[len(view) :], block, strict=True):
        view += [length // size, size]
    inner = tuple(range(mask.dim() - len(block), mask.dim() + len(block)))[1::2]
    return int(mask.reshape(view).any(dim=inner).sum())


def slice_reference(spec: fp.Spec, dim: int, scores: Tensor, default: Tensor | None) -> Tensor:
    """PerSlice's definition: the spec on each slice along ``dim``, stacked back."""
    return torch.stack(
        [
            spec.compute_mask(scores.select(dim, i), None if default is None else default.select(dim, i))
            for i in range(scores.shape[dim])
        ],
        dim,
    )


def checked(spec: fp.Spec, scores: Tensor, default: Tensor | None) -> Tensor:
    """``fp.compute_mask``, asserting a new bool mask that revives nothing and left its inputs alone."""
    before = (scores.clone(), None if default is None else default.clone())
    mask = fp.compute_mask(spec, scores, default)
    assert torch.equal(scores.isnan(), before[0].isnan()) and torch.equal(scores.nan_to_num(), before[0].nan_to_num())
    assert default is None or (before[1] is not None and torch.equal(default, before[1]))
    assert mask.dtype == torch.bool and mask.shape == scores.shape
    assert default is None or not (mask & ~default).any()  # never revives
    assert default is None or mask.data_ptr() != default.data_ptr()
    return mask


# --- torch.ao's WeightNormSparsifier: parity -------------------------------------------


class OneLinear(nn.Module):
    """A model with one bias-free Linear ``fc`` holding ``weight``."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        self.fc = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        with torch.no_grad():
            self.fc.weight.copy_(weight)


def ao_prepared(
    weight: Tensor, level: float, block: tuple[int, int], zeros_per_block: int | None = None
) -> tuple[WeightNormSparsifier, OneLinear]:
    """A sparsifier prepared on ``OneLinear(weight)`` and stepped once."""
    model = OneLinear(weight)
    sparsifier = WeightNormSparsifier(sparsity_level=level, sparse_block_shape=block, zeros_per_block=zeros_per_block)
    sparsifier.prepare(model, [{"tensor_fqn": "fc.weight"}])  # type: ignore[no-untyped-call]
    sparsifier.step()
    return sparsifier, model


def ao_mask(model: OneLinear) -> Tensor:
    """The sparsifier's mask, read from the parametrization (bool or float 0/1 there)."""
    mask = getattr(model.fc.parametrizations, "weight")[0].mask
    assert isinstance(mask, Tensor)
    return mask.bool()


def ao_block_count(level: float, blocks: int) -> int:
    """How many blocks the sparsifier prunes at ``level`` (zeros_per_block = the block's size)."""
    if level <= 0:
        return 0
    if level >= 1:
        return blocks
    return max(0, min(blocks - 1, round(level * blocks)))


def distinct_magnitudes(shape: tuple[int, int], seed: int) -> Tensor:
    """Entries with distinct ``|value|`` (1/numel apart) and random signs."""
    g = torch.Generator().manual_seed(seed)
    numel = shape[0] * shape[1]
    magnitudes = (torch.randperm(numel, generator=g) + 1).float() / numel
    signs = torch.randint(0, 2, (numel,), generator=g).float() * 2 - 1
    return (magnitudes * signs).reshape(shape)


def distinct_block_norms(shape: tuple[int, int], block: tuple[int, int], seed: int) -> Tensor:
    """Random entries scaled so that the blocks' L2 norms are 1, 2, ... in random order."""
    g = torch.Generator().manual_seed(seed)
    rows, cols = shape[0] // block[0], shape[1] // block[1]
    cells: Tensor = torch.randn(rows, cols, block[0] * block[1], generator=g)
    norms = (torch.randperm(rows * cols, generator=g) + 1).float().reshape(rows, cols, 1)
    cells = cells / torch.linalg.vector_norm(cells, dim=-1, keepdim=True) * norms
    return cells.reshape(rows, cols, *block).permute(0, 2, 1, 3).reshape(shape)


NM_PAIRS = [(2, 4), (1, 4), (4, 8), (1, 2), (0, 4), (4, 4)]


@pytest.mark.parametrize(("n", "m"), NM_PAIRS)
@FEW
@given(rows=st.integers(1, 6), groups=st.integers(1, 4), seed=st.integers(0, 10_000), dim=st.sampled_from([-1, 0]))
def test_nm_equals_torch_ao_zeros_per_block_at_level_one(n: int, m: int, rows: int, groups: int, seed: int, dim: int) -> None:
    """NM(n, m) along the input dim is the sparsifier's (1, m) blocks with m - n zeros; along dim 0, (m, 1)."""
    shape, block = ((rows, m * groups), (1, m)) if dim == -1 else ((m * groups, rows), (m, 1))
    weight = distinct_magnitudes(shape, seed)
    _, model = ao_prepared(weight, 1.0, block, zeros_per_block=m - n)
    got = checked(fp.NM(n, m, dim=dim), weight, None)
    assert torch.equal(got, ao_mask(model))
    assert pruned(got) == (m - n) * rows * groups


def test_nm_with_nan_equals_torch_ao() -> None:
    """One NaN per group at most: both keep it first."""
    weight = distinct_magnitudes((4, 8), 0)
    weight[0, 1] = weight[2, 4] = weight[3, 7] = NAN
    _, model = ao_prepared(weight, 1.0, (1, 4), zeros_per_block=3)
    got = checked(fp.NM(1, 4), weight, None)
    assert torch.equal(got, ao_mask(model))
    assert bool(got[0, 1] and got[2, 4] and got[3, 7])


BLOCKS = [(1, 4), (4, 4), (2, 8), (4, 1)]
LEVELS = [0.0, 0.1, 0.25, 0.5, 0.7, 0.9, 0.99, 1.0]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("weight_shape", [(8, 16), (12, 24)])
@pytest.mark.parametrize("block", BLOCKS)
def test_block_equals_torch_ao_on_distinct_norms(block: tuple[int, int], weight_shape: tuple[int, int], level: float) -> None:
    """Block(count, shape) == the sparsifier at ``level``, count = ao_block_count(level, blocks)."""
    weight = distinct_block_norms(weight_shape, block, seed=sum(weight_shape) + block[0])
    _, model = ao_prepared(weight, level, block)
    expected = ao_mask(model)
    blocks = weight.numel() // (block[0] * block[1])
    count = ao_block_count(level, blocks)
    assert torch.equal(checked(fp.Block(count, block), weight, None), expected)
    assert pruned(expected) == count * block[0] * block[1]
    by_fraction = checked(fp.Block(level, block), weight, None)
    assert pruned(by_fraction) == round(level * blocks) * block[0] * block[1]  # no "blocks - 1" clamp
    if round(level * blocks) == count:  # every level here but 0.99
        assert torch.equal(by_fraction, expected)
        assert torch.equal(checked(fp.Block(sparsity=level, shape=block), weight, None), expected)


def test_block_with_nan_equals_torch_ao() -> None:
    weight = distinct_block_norms((8, 8), (2, 2), 1)
    weight[0, 0] = weight[5, 6] = NAN
    _, model = ao_prepared(weight, 0.75, (2, 2))
    got = checked(fp.Block(12, (2, 2)), weight, None)
    assert torch.equal(got, ao_mask(model))
    assert bool(got[0, 0] and got[5, 6])  # NaN blocks go last


def test_a_second_step_to_a_higher_level_equals_a_sparsity_target() -> None:
    """torch.ao re-scores the masked weight; Block(sparsity=) on weight * mask folds the same."""
    weight = distinct_block_norms((8, 16), (1, 4), 2)
    sparsifier, model = ao_prepared(weight, 0.25, (1, 4))
    first = ao_mask(model)
    assert torch.equal(checked(fp.Block(sparsity=0.25, shape=(1, 4)), weight, None), first)
    sparsifier.groups[0]["sparsity_level"] = 0.5
    sparsifier.step()
    second = checked(fp.Block(sparsity=0.5, shape=(1, 4)), weight * first, first)
    assert torch.equal(second, ao_mask(model))


def test_torch_ao_revives_at_a_lower_level_and_funcprune_does_not() -> None:
    weight = distinct_block_norms((8, 16), (1, 4), 3)
    sparsifier, model = ao_prepared(weight, 0.5, (1, 4))
    first = ao_mask(model).clone()
    sparsifier.groups[0]["sparsity_level"] = 0.25
    sparsifier.step()
    assert (ao_mask(model) & ~first).any()  # torch.ao revives
    assert torch.equal(checked(fp.Block(sparsity=0.25, shape=(1, 4)), weight * first, first), first)


def test_torch_ao_pads_shapes_that_funcprune_refuses() -> None:
    weight = distinct_magnitudes((4, 6), 4)
    _, model = ao_prepared(weight, 0.5, (1, 4))
    assert ao_mask(model).shape == (4, 6)  # partial blocks at the edge, ranked by their mean
    with pytest.raises(ValueError, match=r"\(1, 4\).*6|6.*\(1, 4\)"):
        fp.compute_mask(fp.Block(0.5, (1, 4)), weight)
    _, model = ao_prepared(weight, 1.0, (1, 4), zeros_per_block=2)
    assert ao_mask(model).shape == (4, 8)  # the padded shape: not a mask of the weight
    with pytest.raises(ValueError, match=r"(?s)(?=.*\b6\b)(?=.*\b4\b)"):
        fp.compute_mask(fp.NM(2, 4), weight)


# --- NM: properties ------------------------------------------------------------------


@st.composite
def nm_cases(draw: st.DrawFn) -> tuple[Tensor, Tensor | None, int, int, int]:
    """Scores (ties and NaN included), an earlier mask or None, and n, m, dim that fit."""
    m = draw(st.integers(1, 5))
    n = draw(st.integers(0, m))
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    dim = draw(st.integers(-len(shape), len(shape) - 1))
    shape[dim] = m * draw(st.integers(1, 3))
    seed = draw(st.integers(0, 10_000))
    keep = draw(st.sampled_from([1.0, 0.8, 0.4]))
    return _scores(shape, seed, seed % 3), _default(shape, seed, keep), n, m, dim


@given(case=nm_cases())
def test_nm_equals_the_group_by_group_reference(case: tuple[Tensor, Tensor | None, int, int, int]) -> None:
    scores, default, n, m, dim = case
    got = checked(fp.NM(n, m, dim=dim), scores, default)
    assert torch.equal(got, nm_reference(scores, default, n, m, dim))
    kept = got.movedim(dim, -1).reshape(-1, m).sum(1)
    left = (torch.ones_like(got) if default is None else default).movedim(dim, -1).reshape(-1, m).sum(1)
    assert torch.equal(kept, left.clamp(max=n))  # exactly n kept per group, or all that was left


def test_nm_ties_go_to_the_lower_index_and_nan_last() -> None:
    ones = torch.ones(2, 8)
    assert checked(fp.NM(2, 4), ones, None).tolist() == [[False, False, True, True] * 2] * 2
    default = torch.tensor([[True, True, True, False, True, True, True, True]] * 2)
    assert checked(fp.NM(2, 4), ones, default)[0].tolist() == [False, True, True, False, False, False, True, True]
    scores = torch.tensor([NAN, 5.0, -1.0, 2.0, NAN, NAN, 9.0, 0.0])
    # NaN is kept before any number; two NaN tie, and the lower index goes first
    assert checked(fp.NM(1, 4), scores, None).tolist() == [True, False, False, False, False, True, False, False]
    assert checked(fp.NM(2, 4), scores, None).tolist() == [True, True, False, False, True, True, False, False]


def test_nm_along_another_dim_equals_nm_on_the_transpose() -> None:
    scores = torch.randn(8, 3, 5, generator=torch.Generator().manual_seed(5))
    along_0 = checked(fp.NM(1, 4, dim=0), scores, None)
    assert torch.equal(along_0, checked(fp.NM(1, 4, dim=-1), scores.movedim(0, -1), None).movedim(-1, 0))
    assert torch.equal(along_0, checked(fp.NM(1, 4, dim=-3), scores, None))


# --- Block: properties ------------------------------------------------------------------


@st.composite
def block_cases(draw: st.DrawFn) -> tuple[Tensor, Tensor | None, tuple[int, ...]]:
    """Integer scores (exact norms, many ties; NaN sometimes), an earlier mask, a block shape."""
    block = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    lead = draw(st.lists(st.integers(1, 3), max_size=3 - len(block)))
    shape = lead + [b * draw(st.integers(1, 3)) for b in block]
    seed = draw(st.integers(0, 10_000))
    keep = draw(st.sampled_from([1.0, 0.9, 0.5, 0.2]))
    return _scores(shape, seed, 1 + seed % 2), _default(shape, seed, keep), block


@given(case=block_cases(), value=st.floats(0, 1), how=st.sampled_from(["count", "fraction", "sparsity"]))
@example(case=(torch.ones(2, 8), None, (1, 2)), value=0.5, how="fraction")  # all tied: the lower half goes
def test_block_equals_the_block_by_block_reference(
    case: tuple[Tensor, Tensor | None, tuple[int, ...]], value: float, how: str
) -> None:
    scores, default, block = case
    total, left = scores.numel() // math.prod(block), blocks_left(scores, default, block)
    count: Callable[[int, int], int]
    if how == "count":
        spec, count = fp.Block(int(value * left), block), lambda left, total: int(value * left)
    elif how == "fraction":
        spec, count = fp.Block(value, block), lambda left, total: round(value * left)
    else:
        spec, count = fp.Block(sparsity=value, shape=block), lambda left, total: max(0, round(value * total) - (total - left))
    got = checked(spec, scores, default)
    expected = block_reference(scores, default, block, count)
    assert torch.equal(got, expected)
    assert total - blocks_left(scores, got, block) == total - left + count(left, total)  # the exact count


def test_block_ties_go_to_the_lower_block_and_nan_last() -> None:
    got = checked(fp.Block(3, (2, 2)), torch.ones(4, 4), None)
    assert got.tolist() == [[False] * 4, [False] * 4, [False, False, True, True], [False, False, True, True]]
    scores = torch.tensor([[NAN, 0.0, 1.0, 1.0, 0.0, 0.0]])
    assert checked(fp.Block(2, (2,)), scores, None).tolist() == [[True, True, False, False, False, False]]
    stacked = torch.ones(3, 2, 4)  # leading dims: every index is its own row of blocks
    assert checked(fp.Block(2, (2,)), stacked, None)[0].tolist() == [[False, False, False, False], [True] * 4]


def test_block_counts_only_blocks_with_an_entry_left() -> None:
    scores = torch.arange(1.0, 17.0).reshape(4, 4)
    default = torch.ones(4, 4, dtype=torch.bool)
    default[0, 0] = False  # block 0 partly pruned: still eligible
    default[2:, :2] = False  # block 2 entirely pruned: gone
    half = checked(fp.Block(0.5, (2, 2)), scores, default)  # round(0.5 * 3) = 2 of blocks 0, 1, 3
    assert half[:2].sum() == 0 and bool(half[2:, 2:].all())
    target = checked(fp.Block(sparsity=0.5, shape=(2, 2)), scores, default)  # 2 of 4 in all: 1 more
    assert target[:2, :2].sum() == 0 and bool(target[:2, 2:].all()) and bool(target[2:, 2:].all())
    assert torch.equal(checked(fp.Block(sparsity=0.25, shape=(2, 2)), scores, default), default)


# --- PerSlice: properties ------------------------------------------------------------------

INNER: list[fp.Spec] = [
    fp.Identity(),
    fp.L1Unstructured(0.3),
    fp.L1Unstructured(1.0),
    fp.L1Unstructured(2),
    fp.L1Unstructured(sparsity=0.6),
    fp.NM(1, 2),
    fp.NM(2, 4),
    fp.NM(1, 2, dim=0),
    fp.chain(fp.L1Unstructured(0.25), fp.NM(1, 2)),
    fp.chain(fp.NM(2, 4), fp.L1Unstructured(sparsity=0.8)),
]


@given(
    spec=st.sampled_from(INNER),
    shape=st.lists(st.sampled_from([2, 4]), min_size=2, max_size=3),
    dim=st.integers(-3, 2),
    seed=st.integers(0, 10_000),
    keep=st.sampled_from([1.0, 0.8, 0.4]),
)
@example(spec=fp.Identity(), shape=[2, 4], dim=1, seed=0, keep=1.0)  # a mask that ignores the scores
def test_per_slice_equals_the_loop_over_slices(spec: fp.Spec, shape: list[int], dim: int, seed: int, keep: float) -> None:
    dim = dim % len(shape)
    scores, default = _scores(shape, seed, seed % 3), _default(shape, seed, keep)
    try:
        expected = slice_reference(spec, dim, scores, default)
    except ValueError:  # an int amount beyond what a slice has left, or m not dividing a slice
        with pytest.raises(ValueError):
            fp.compute_mask(fp.PerSlice(spec, dim=dim), scores, default)
        return
    assert torch.equal(checked(fp.PerSlice(spec, dim=dim), scores, default), expected)


@pytest.mark.parametrize("amount", [0.5, 0.0, 1.0, 3])
def test_per_slice_prunes_its_exact_count_in_every_slice(amount: float) -> None:
    g = torch.Generator().manual_seed(6)
    scores = torch.randint(0, 3, (5, 4, 6), generator=g).float()  # heavy ties
    default = torch.rand(5, 4, 6, generator=g) < torch.tensor([1.0, 0.9, 0.6, 0.4, 0.2]).reshape(5, 1, 1)
    default[:, 0, :4] = True  # 4 or more left in every slice
    left = default.flatten(1).sum(1).tolist()
    count = [amount if isinstance(amount, int) else round(amount * x) for x in left]  # half to even
    for spec in (fp.L1Unstructured(amount), fp.RandomUnstructured(amount)):
        got = checked(fp.PerSlice(spec), scores, default)
        assert [x - int(kept.sum()) for x, kept in zip(left, got, strict=True)] == count


@pytest.mark.parametrize(
    ("inner", "count"), [(fp.RandomUnstructured(0.3), 3), (fp.chain(fp.RandomUnstructured(0.3), fp.L1Unstructured(2)), 5)]
)
def test_per_slice_random_specs_draw_from_the_generator_each_slice_its_own(inner: fp.Spec, count: int) -> None:
    scores = torch.randn(4, 10, generator=torch.Generator().manual_seed(15))
    spec = fp.PerSlice(inner)
    first = fp.compute_mask(spec, scores, generator=torch.Generator().manual_seed(0))
    assert torch.equal(first, fp.compute_mask(spec, scores, generator=torch.Generator().manual_seed(0)))
    assert not torch.equal(first, fp.compute_mask(spec, scores, generator=torch.Generator().manual_seed(1)))
    assert [pruned(row) for row in first] == [count] * 4
    assert not all(torch.equal(first[0], row) for row in first[1:])  # not one draw for every slice


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize(
    "inner",
    [fp.Identity(), fp.chain(), fp.CustomFromMask(torch.tensor([True, False])), fp.NM(2, 2), fp.chain(fp.L1Unstructured(0.0))],
    ids=repr,
)
def test_per_slice_of_a_mask_that_ignores_the_scores_along_any_dim(inner: fp.Spec, dim: int) -> None:
    """torch.func.vmap cannot put an output that does not depend on the input at out_dims > 0
    (it expands without unsqueezing: pytorch/pytorch#178425, fixed for -1 in #178495)."""
    for shape in [(2, 2)] if isinstance(inner, fp.CustomFromMask) else [(2, 4), (3, 2, 4)]:
        scores = torch.randn(shape, generator=torch.Generator().manual_seed(16))
        assert torch.equal(checked(fp.PerSlice(inner, dim=dim), scores, None), slice_reference(inner, dim, scores, None))
    scores = torch.randn(2, 2)
    if isinstance(inner, fp.CustomFromMask) and dim == 1:  # the mask of every column is (True, False)
        assert checked(fp.PerSlice(inner, dim=1), scores, None).tolist() == [[True, True], [False, False]]


def test_per_slice_ties_go_to_the_lower_index_within_each_slice() -> None:
    got = checked(fp.PerSlice(fp.L1Unstructured(2), dim=1), torch.ones(3, 2), None)
    assert got.tolist() == [[False, False], [False, False], [True, True]]
    scores = torch.tensor([[NAN, 1.0, 0.5], [2.0, NAN, NAN]])  # NaN last; of two NaN the lower index goes
    assert checked(fp.PerSlice(fp.L1Unstructured(2)), scores, None).tolist() == [[True, False, False], [False, False, True]]


def test_per_slice_targets_count_each_slices_earlier_pruning() -> None:
    scores = torch.randn(3, 10, generator=torch.Generator().manual_seed(7))
    default = torch.ones(3, 10, dtype=torch.bool)
    default[0, :8] = False  # row 0 is past the target already
    default[1, :3] = False
    got = checked(fp.PerSlice(fp.L1Unstructured(sparsity=0.5)), scores, default)
    assert [pruned(row) for row in got] == [8, 5, 5]
    assert torch.equal(got[0], default[0])


# --- vmap, compile ------------------------------------------------------------------

BATCHED: list[fp.Spec] = [
    fp.NM(2, 4),
    fp.NM(1, 2, dim=0),
    fp.Block(0.5, (2, 2)),
    fp.Block(2, (4,)),
    fp.Block(sparsity=0.6, shape=(1, 4)),
    fp.PerSlice(fp.L1Unstructured(0.5)),
    fp.PerSlice(fp.L1Unstructured(sparsity=0.7), dim=1),
    fp.PerSlice(fp.NM(2, 4)),
    fp.PerSlice(fp.chain(fp.L1Unstructured(0.25), fp.NM(1, 2)), dim=1),
]


def _batch(seed: int, ties: bool) -> tuple[Tensor, Tensor]:
    """Stacked scores (6, 4, 8) and stacked earlier masks, each element its own sparsity."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(-2, 3, (6, 4, 8), generator=g).float() if ties else torch.randn(6, 4, 8, generator=g)
    keep = torch.tensor([1.0, 0.9, 0.8, 0.6, 0.5, 0.3]).reshape(6, 1, 1)
    masks = torch.rand(6, 4, 8, generator=g) < keep
    masks[:, :, ::4] = True  # a block of every kind, and a slice of every kind, keeps an entry
    return scores, masks


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("spec", BATCHED, ids=repr)
def test_vmap_equals_a_loop_over_the_batch(spec: fp.Spec, ties: bool) -> None:
    scores, masks = _batch(8, ties)
    batched = vmap(lambda s, m: fp.compute_mask(spec, s, m))(scores, masks)
    assert torch.equal(batched, torch.stack([fp.compute_mask(spec, s, m) for s, m in zip(scores, masks, strict=True)]))
    first = vmap(lambda s: fp.compute_mask(spec, s))(scores)
    assert torch.equal(first, torch.stack([fp.compute_mask(spec, s) for s in scores]))


@pytest.mark.parametrize("amount", [0.5, 2])
def test_vmap_of_a_random_spec_per_slice_keeps_the_counts(amount: float) -> None:
    scores, masks = _batch(9, ties=False)
    left = masks.sum(-1)  # per element and slice (dim 0 of (4, 8): rows of 8)
    expected = (left * amount).round().long() if isinstance(amount, float) else torch.full_like(left, amount)
    for spec in (fp.PerSlice(fp.RandomUnstructured(amount)), fp.PerSlice(fp.chain(fp.RandomUnstructured(amount)))):
        with pytest.raises(RuntimeError, match="randomness"):  # vmap's randomness= flag rules, as for every spec
            vmap(lambda s, m: fp.compute_mask(spec, s, m))(scores, masks)
        got = vmap(lambda s, m: fp.compute_mask(spec, s, m), randomness="different")(scores, masks)
        assert not (got & ~masks).any()
        assert torch.equal(left - got.sum(-1), expected)


@pytest.mark.parametrize(
    "spec", [fp.NM(2, 4), fp.Block(0.5, (2, 2)), fp.PerSlice(fp.L1Unstructured(0.3))], ids=repr
)
def test_compile_fullgraph_equals_eager(spec: fp.Spec) -> None:
    """One graph per spec (the inductor's first compile takes seconds), with and without an earlier mask."""
    torch._dynamo.reset()
    scores, masks = _batch(10, ties=True)
    compiled = torch.compile(lambda s, m: (fp.compute_mask(spec, s), fp.compute_mask(spec, s, m)), fullgraph=True)
    for s, m in zip(scores[:2], masks[:2], strict=True):
        first, folded = compiled(s, m)
        assert torch.equal(first, fp.compute_mask(spec, s)) and torch.equal(folded, fp.compute_mask(spec, s, m))


@pytest.mark.parametrize("spec", [fp.NM(2, 4), fp.Block(0.5, (2, 2)), fp.PerSlice(fp.NM(1, 4), dim=1)], ids=repr)
def test_grad_through_prune_is_zero_where_pruned(spec: fp.Spec) -> None:
    w = torch.randn(4, 8, generator=torch.Generator().manual_seed(17))
    g = torch.func.grad(lambda w: (fp.prune(spec, w) ** 2).sum())(w)
    assert torch.equal(g, 2 * w * fp.compute_mask(spec, w))


# --- composition ------------------------------------------------------------------


@pytest.mark.parametrize(
    "steps",
    [
        (fp.L1Unstructured(0.3), fp.NM(2, 4)),
        (fp.NM(2, 4), fp.L1Unstructured(0.3)),
        (fp.Block(0.25, (2, 4)), fp.NM(2, 4)),
        (fp.PerSlice(fp.L1Unstructured(0.5)), fp.Block(sparsity=0.5, shape=(1, 4)), fp.NM(1, 4)),
    ],
    ids=repr,
)
def test_chain_equals_applying_each_step_by_hand(steps: tuple[fp.Spec, ...]) -> None:
    t = torch.randn(8, 16, generator=torch.Generator().manual_seed(11))
    for default in (None, torch.rand(8, 16, generator=torch.Generator().manual_seed(12)) > 0.2):
        mask = checked(steps[0], t, default)
        for step in steps[1:]:
            mask = checked(step, t * mask, mask)
        assert torch.equal(checked(fp.chain(*steps), t, default), mask)


def test_shape_specs_act_on_the_whole_tensor_and_chain_with_unstructured_specs() -> None:
    for spec in (fp.NM(2, 4), fp.Block(0.5, shape=(2, 2)), fp.PerSlice(fp.L1Unstructured(0.5))):
        assert spec.pruning_type == "global"  # they take the whole tensor and its mask
    assert fp.chain(fp.L1Unstructured(0.3), fp.NM(2, 4)).pruning_type == "global"
    got = checked(fp.chain(fp.L1Unstructured(0.3), fp.NM(2, 4)), torch.randn(4, 8), None)
    assert int(got.reshape(-1, 4).sum(1).max()) <= 2


@pytest.mark.parametrize(
    "spec",
    [fp.LnStructured(1, n=2, dim=0), fp.RandomStructured(1, dim=-1), fp.chain(fp.L1Unstructured(1), fp.LnStructured(1, 2))],
    ids=repr,
)
def test_per_slice_takes_structured_specs_too(spec: fp.Spec) -> None:
    scores = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(3))
    got = checked(fp.PerSlice(spec, dim=1), scores, None)
    assert got.shape == scores.shape
    if not isinstance(spec, fp.RandomStructured):  # deterministic: the loop is the reference
        want = torch.stack([checked(spec, scores.select(1, i), None) for i in range(4)], 1)
        assert torch.equal(got, want)


def _params() -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(13)
    shapes = {"fc.weight": (8, 16), "fc.bias": (8,), "conv.weight": (4, 2, 4, 4), "head.weight": (3, 8)}
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def test_plan_rules_with_shape_specs_equal_compute_mask() -> None:
    params = _params()
    plan = fp.Plan({
        "fc.weight": [fp.L1Unstructured(0.3), fp.NM(2, 4)],
        "conv.weight": fp.Block(0.5, (2, 2)),
        "head.weight": fp.PerSlice(fp.L1Unstructured(sparsity=0.5)),
    })  # fmt: skip
    masks = plan(params)
    assert set(masks) == {"fc.weight", "conv.weight", "head.weight"}
    w = params["fc.weight"]
    first = checked(fp.L1Unstructured(0.3), w, None)
    assert torch.equal(masks["fc.weight"], checked(fp.NM(2, 4), w * first, first))
    assert torch.equal(masks["conv.weight"], checked(fp.Block(0.5, (2, 2)), params["conv.weight"], None))
    assert torch.equal(masks["head.weight"], slice_reference(fp.L1Unstructured(sparsity=0.5), 0, params["head.weight"], None))
    stacked = {name: torch.stack([t, -2 * t.flip(0), t.roll(1, 0)]) for name, t in params.items()}
    batched = vmap(plan)(stacked)
    for i in range(3):
        single = plan({name: t[i] for name, t in stacked.items()})
        assert all(torch.equal(batched[name][i], single[name]) for name in single)


def test_plan_with_scores_ranks_the_given_scores_unmasked() -> None:
    params = _params()
    g = torch.Generator().manual_seed(14)
    scores = {"fc.weight": torch.rand(8, 16, generator=g), "conv.weight": torch.rand(4, 2, 4, 4, generator=g)}
    plan = fp.Plan({"fc.weight": [fp.L1Unstructured(0.3), fp.NM(2, 4)], "conv.weight": fp.Block(sparsity=0.5, shape=(4, 4))})
    masks = plan(params, scores=scores)
    first = checked(fp.L1Unstructured(0.3), scores["fc.weight"], None)
    assert torch.equal(masks["fc.weight"], checked(fp.NM(2, 4), scores["fc.weight"], first))
    assert torch.equal(masks["conv.weight"], checked(fp.Block(sparsity=0.5, shape=(4, 4)), scores["conv.weight"], None))
    assert not torch.equal(masks["fc.weight"], plan(params)["fc.weight"])


def test_sparsity_targets_round_after_round() -> None:
    params = _params()
    plan = fp.Plan({"conv.weight": fp.Block(sparsity=0.5, shape=(2, 2)), "fc.weight": fp.PerSlice(fp.L1Unstructured(sparsity=0.25))})
    masks = plan(params)
    assert pruned(masks["conv.weight"]) == 64 and [pruned(row) for row in masks["fc.weight"]] == [4] * 8
    again = plan(params, masks)
    assert all(torch.equal(again[name], masks[name]) for name in masks)  # already there: nothing more
    further = fp.Plan({"conv.weight": fp.Block(sparsity=0.75, shape=(2, 2))})(params, masks)
    assert pruned(further["conv.weight"]) == 96 and not (further["conv.weight"] & ~masks["conv.weight"]).any()


# --- specs as values, and bad input ------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [fp.NM(2, 4), fp.NM(1, 8, dim=0), fp.Block(0.5, (1, 4)), fp.Block(3, (2, 2)), fp.Block(sparsity=0.9, shape=(4,)),
     fp.PerSlice(fp.L1Unstructured(0.5)), fp.PerSlice(fp.NM(2, 4), dim=1)],
    ids=repr,
)  # fmt: skip
def test_specs_are_frozen_values_with_a_repr_that_evaluates(spec: fp.Spec) -> None:
    assert eval(repr(spec), dict(vars(fp))) == spec
    assert dataclasses.is_dataclass(spec) and not isinstance(spec, type)
    assert hash(spec) == hash(dataclasses.replace(spec))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(spec, dataclasses.fields(spec)[0].name, None)


def test_replace_validates_and_counts_are_not_fractions() -> None:
    assert dataclasses.replace(fp.NM(2, 4), n=1) == fp.NM(1, 4)
    with pytest.raises(ValueError, match=r"(?s)(?=.*\bn\b)(?=.*\b5\b)"):
        dataclasses.replace(fp.NM(2, 4), n=5)
    assert fp.Block(1, (1, 4)) != fp.Block(1.0, (1, 4))


def _raises(kind: type[Exception] | tuple[type[Exception], ...], match: str, call: Callable[[], object]) -> None:
    with pytest.raises(kind, match=match):
        call()


BAD_SPECS = [
    pytest.param(lambda: fp.NM(True, 4), TypeError, r"NM.*\bn\b.*True", id="NM(True, 4)"),
    pytest.param(lambda: fp.NM(2, True), TypeError, r"NM.*\bm\b.*True", id="NM(2, True)"),
    pytest.param(lambda: fp.NM(2.0, 4), TypeError, r"NM.*\bn\b.*2\.0", id="NM(2.0, 4)"),  # type: ignore[arg-type]
    pytest.param(lambda: fp.NM(2, "4"), TypeError, r"NM.*\bm\b.*'4'", id='NM(2, "4")'),  # type: ignore[arg-type]
    pytest.param(lambda: fp.NM(2, 0), ValueError, r"NM.*\bm\b.*\b0\b", id="NM(2, 0)"),
    pytest.param(lambda: fp.NM(-1, 4), ValueError, r"NM.*\bn\b.*-1", id="NM(-1, 4)"),
    pytest.param(lambda: fp.NM(5, 4), ValueError, r"(?s)NM(?=.*\bn\b.*5)(?=.*\bm\b.*4)", id="NM(5, 4)"),
    pytest.param(lambda: fp.NM(2, 4, dim=1.5), TypeError, r"NM.*dim.*1\.5", id="NM(2, 4, dim=1.5)"),  # type: ignore[arg-type]
    pytest.param(lambda: fp.Block(0.5), TypeError, r"Block.*shape", id="Block(0.5)"),
    pytest.param(lambda: fp.Block(0.5, None), TypeError, r"Block.*shape", id="Block(0.5, None)"),  # type: ignore[arg-type]
    pytest.param(lambda: fp.Block(0.5, 4), TypeError, r"Block.*shape.*4", id="Block(0.5, 4)"),  # type: ignore[arg-type]
    pytest.param(lambda: fp.Block(0.5, "14"), TypeError, r"Block.*shape.*'14'", id='Block(0.5, "14")'),  # type: ignore[arg-type]
    pytest.param(lambda: fp.Block(0.5, (1.5, 4)), TypeError, r"Block.*shape.*1\.5", id="Block(0.5, (1.5, 4))"),  # type: ignore[arg-type]
    pytest.param(lambda: fp.Block(0.5, (True, 4)), TypeError, r"Block.*shape.*True", id="Block(0.5, (True, 4))"),
    pytest.param(lambda: fp.Block(0.5, (0, 4)), ValueError, r"Block.*shape.*\(0, 4\)", id="Block(0.5, (0, 4))"),
    pytest.param(lambda: fp.Block(0.5, (2, -1)), ValueError, r"Block.*shape.*-1", id="Block(0.5, (2, -1))"),
    pytest.param(lambda: fp.Block(0.5, ()), (TypeError, ValueError), r"Block.*shape", id="Block(0.5, ())"),
    pytest.param(lambda: fp.Block(None, (1, 4)), TypeError, r"amount.*None", id="Block(None, (1, 4))"),
    pytest.param(lambda: fp.Block(True, (1, 4)), TypeError, r"amount.*True", id="Block(True, (1, 4))"),
    pytest.param(lambda: fp.Block(1.5, (1, 4)), ValueError, r"amount=1\.5", id="Block(1.5, (1, 4))"),
    pytest.param(lambda: fp.Block(-1, (1, 4)), ValueError, r"amount=-1", id="Block(-1, (1, 4))"),
    pytest.param(lambda: fp.Block(0.5, (1, 4), sparsity=0.5), TypeError, r"Block.*amount.*sparsity", id="Block(0.5, (1, 4), sparsity=0.5)"),
    pytest.param(lambda: fp.Block(sparsity=1.5, shape=(1, 4)), ValueError, r"Block.*sparsity.*1\.5", id="Block(sparsity=1.5, shape=(1, 4))"),
    pytest.param(lambda: fp.PerSlice(0.5), TypeError, r"PerSlice.*spec.*0\.5", id="PerSlice(0.5)"),  # type: ignore[arg-type]
    pytest.param(lambda: fp.PerSlice(fp.L1Unstructured(0.5), dim="0"), TypeError, r"PerSlice.*dim.*'0'", id='PerSlice(L1Unstructured(0.5), dim="0")'),  # type: ignore[arg-type]
]  # fmt: skip


@pytest.mark.parametrize(("call", "kind", "match"), BAD_SPECS)
def test_bad_hyper_parameters_are_refused_by_name(
    call: Callable[[], object], kind: type[Exception] | tuple[type[Exception], ...], match: str
) -> None:
    _raises(kind, match, call)


BAD_CALLS: list[tuple[fp.Spec, tuple[int, ...], type[Exception], str]] = [
    (fp.NM(2, 4), (3, 6), ValueError, r"(?s)(?=.*\b6\b)(?=.*\b4\b)"),  # the length along dim is not a multiple of m
    (fp.NM(2, 4, dim=0), (6, 8), ValueError, r"(?s)(?=.*\b6\b)(?=.*\b4\b)"),
    (fp.NM(2, 4, dim=2), (3, 8), IndexError, r"\b2\b"),
    (fp.NM(2, 4, dim=-3), (3, 8), IndexError, r"-3"),
    (fp.Block(0.5, (1, 2, 2)), (2, 8), ValueError, r"\(1, 2, 2\)"),
    (fp.Block(0.5, (1, 3)), (3, 8), ValueError, r"(?s)(?=.*\(1, 3\))(?=.*\b8\b)"),
    (fp.Block(0.5, (2, 4)), (3, 8), ValueError, r"(?s)(?=.*\(2, 4\))(?=.*\b3\b)"),
    (fp.Block(20, (1, 2)), (2, 8), ValueError, r"amount=20.*\b8\b"),
    (fp.PerSlice(fp.L1Unstructured(0.5), dim=2), (3, 4), IndexError, r"\b2\b"),
    (fp.PerSlice(fp.L1Unstructured(5)), (3, 4), ValueError, r"amount=5.*\b4\b"),
    (fp.PerSlice(fp.NM(2, 4)), (4, 6), ValueError, r"(?s)(?=.*\b6\b)(?=.*\b4\b)"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "shape", "kind", "match"), BAD_CALLS, ids=[repr(c[:2]) for c in BAD_CALLS])
def test_scores_that_do_not_fit_are_refused_by_name(
    spec: fp.Spec, shape: tuple[int, ...], kind: type[Exception], match: str
) -> None:
    _raises(kind, match, lambda: fp.compute_mask(spec, torch.randn(shape)))
    _raises(kind, match, lambda: fp.Plan({"w": spec})({"w": torch.randn(shape)}))


def test_an_int_amount_beyond_a_slices_unpruned_count_is_a_value_error() -> None:
    default = torch.ones(3, 4, dtype=torch.bool)
    default[1, 2:] = False  # slice 1 has 2 left
    with pytest.raises(ValueError, match=r"amount=3.*\b2\b"):
        fp.compute_mask(fp.PerSlice(fp.L1Unstructured(3)), torch.randn(3, 4), default)


@pytest.mark.parametrize(
    "spec", [fp.NM(2, 4), fp.Block(0.5, (1, 4)), fp.PerSlice(fp.L1Unstructured(0.5))], ids=repr
)
def test_ranking_several_tensors_jointly_is_refused(spec: fp.Spec) -> None:
    params = {"a": torch.randn(2, 8), "b": torch.randn(4, 4)}
    name = type(spec).__name__
    with pytest.raises(TypeError, match=name):
        fp.global_unstructured(["a", "b"], spec)(params)
    with pytest.raises(TypeError, match=name):
        fp.compute_joint_masks(spec, list(params.values()))


@pytest.mark.parametrize(
    "inner",
    [fp.L1Unstructured(2), fp.Block(2, (1,)), fp.chain(fp.L1Unstructured(2)), fp.LnStructured(2, n=1, dim=0)],
    ids=repr,
)
def test_per_slice_raises_in_eager_mode_as_the_slice_alone_does(inner: fp.Spec) -> None:
    scores = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0))
    earlier = torch.ones(3, 4, 5, dtype=torch.bool)
    earlier[1, :3] = False  # slice 1 keeps 1 row of 5 entries: fewer than 2 of anything but entries
    if not isinstance(inner, fp.LnStructured):
        earlier[1, 3, 1:] = False  # and 1 entry
    with pytest.raises(ValueError) as alone:
        inner.compute_mask(scores[1], earlier[1])
    with pytest.raises(ValueError) as sliced:
        fp.PerSlice(inner).compute_mask(scores, earlier)
    assert str(alone.value) in str(sliced.value)
    if isinstance(inner, fp.L1Unstructured):
        return  # selected for all slices at once, with the counts known: torch's message, under vmap too
    assert str(sliced.value).startswith("PerSlice: slice 1: ")
    capped = torch.func.vmap(lambda s: fp.PerSlice(inner).compute_mask(s, earlier))(scores[None])
    assert not bool(capped[0, 1].any())  # inside a transform the count is capped: the slice is emptied


def test_a_per_slice_inside_a_per_slice_raises_in_eager_mode_as_its_slice_alone_does() -> None:
    scores = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0))
    earlier = torch.ones(3, 4, 5, dtype=torch.bool)
    earlier[1, 2, 1:] = False  # one inner slice keeps 1 entry: the outer slice keeps many
    for inner in (fp.PerSlice(fp.L1Unstructured(2)), fp.chain(fp.PerSlice(fp.Block(2, (1,))))):
        with pytest.raises(ValueError, match="PerSlice: slice 1: .*amount=2"):
            fp.PerSlice(inner).compute_mask(scores, earlier)
    loose = fp.PerSlice(fp.PerSlice(fp.L1Unstructured(1)))
    expected = torch.stack([fp.PerSlice(fp.L1Unstructured(1)).compute_mask(scores[i], earlier[i]) for i in range(3)])
    assert torch.equal(loose.compute_mask(scores, earlier), expected)


def test_per_slice_over_empty_slices_answers_as_each_slice_alone() -> None:
    scores, earlier = torch.zeros(2, 3, 0), torch.ones(2, 3, 0, dtype=torch.bool)
    spec = fp.LnStructured(0.5, n=math.inf, dim=0)
    expected = torch.stack([spec.compute_mask(scores[i], earlier[i]) for i in range(2)])
    assert torch.equal(fp.PerSlice(spec).compute_mask(scores, earlier), expected)
