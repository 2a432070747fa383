"""Sums of ``float64`` tensors whose bits depend neither on the order of the terms nor on how they were grouped.

A plain running sum ``((a + b) + c) + d`` rounds after every addition, so
two processes that each sum their own calls and then add their totals,
``(a + b) + (c + d)``, get other last bits than one process over all four.
:class:`ExactSum` keeps, per entry, the terms' digits on a fixed grid of
bins instead (the *binned* summation of Demmel and Nguyen, "Fast
reproducible floating-point summation", ARITH 2013, and of ReproBLAS):

- bin ``j`` holds multiples of its quantum ``2 ** (j * W)``, ``W`` =
  :data:`WIDTH` bits. A term ``x`` belongs to the lowest bin ``j`` with
  ``|x| < 2 ** ((j + 1) * W - 1)``, half the next bin's quantum, so every
  bin above its own rounds it to zero.
- Each entry keeps its top bin (that of its largest term so far) and the
  :data:`FOLDS` bins below it. A term is split, top bin first, into its
  digits: ``d = (r + M) - M`` rounds the rest ``r`` to the bin's quantum
  (``M = 1.5 * 2 ** (j * W + 52)``, whose fixed last bit breaks ties the
  same way every time), and ``r - d`` goes on to the next bin. A digit
  depends on the term alone, never on what was summed before.
- Each bin adds multiples of its quantum, at most ``2 ** (W - 1)`` of them
  in size: its running sum is exact for fewer than ``2 ** (53 - W)`` =
  2**27 terms (far more calls than a calibration makes), so it does not
  depend on the order. Digits below the kept bins are dropped, which
  depends only on the final top bin.
- Two sums (two processes') are added by moving both to the larger top bin
  and adding their bins: exact again, in any order (an ``all_reduce``).
- The value is ``(bin0 + bin1) + bin2``, top first: within about ``2 **
  -52`` of the largest term per term of the exact sum, as a running
  ``float64`` sum is.

It costs three ``float64`` bins and a byte per entry, and about twenty
passes over the term per term (the Gram matrix it sums costs a matrix
product per term), so the collect engine keeps it for the ``float64``
inputs whose sums must be the same bits however the calls are split; the
others sum as they always did.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

import torch

from .._types import Tensor

__all__ = ["FOLDS", "WIDTH", "ExactSum", "Scratch", "fold"]

#: Bits per bin. The quantum of bin ``j`` is ``2 ** (j * WIDTH)``.
WIDTH = 26
#: How many bins each entry keeps, from its top bin down: ``FOLDS * WIDTH`` = 78 bits below its largest term's bin.
FOLDS = 3
#: The bins of tops: quanta from ``2 ** -936`` (the lowest kept bin's extractor, ``1.5 * 2 ** -936``, is still a
#: normal float) to ``2 ** 962`` (its extractor ``1.5 * 2 ** 1014`` still finite). Smaller terms go to the lowest bin
#: (their digits below its lowest kept bin, under ``2 ** -988``, are dropped); a term past ``2 ** 987`` overflows.
LOWEST, HIGHEST = -36, 37


def _limit(bins: Tensor) -> Tensor:
    """``2 ** ((j + 1) * WIDTH - 1)`` of every bin ``j`` in ``bins``, the bound its terms stay under (``float64``).

    Built from its bits; the bin's extractor ``M = 1.5 * 2 ** (j * WIDTH +
    52)`` is this times ``3 * 2 ** (52 - WIDTH)``, exactly.
    """
    exponent = bins.to(torch.int64) * WIDTH + (WIDTH - 1 + 1023)
    return (exponent << 52).view(torch.float64)


def _bins(x: Tensor) -> Tensor:
    """Each entry's bin: the lowest ``j`` with ``|x| < 2 ** ((j + 1) * WIDTH - 1)``, within ``[LOWEST, HIGHEST]``."""
    exponent = torch.frexp(x).exponent.to(torch.int32)  # |x| < 2 ** exponent (0 for 0)
    j = torch.div(exponent + WIDTH, WIDTH, rounding_mode="floor") - 1  # exponent <= (j + 1) * WIDTH - 1
    j = torch.where(x == 0, LOWEST, j)
    return j.clamp_(LOWEST, HIGHEST).to(torch.int8)


@final
class Scratch:
    """Two ``float64`` work tensors per shape, shared by the sums of one collection (they are used one at a time)."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[tuple[tuple[int, ...], torch.device], tuple[Tensor, Tensor]] = {}

    def of(self, shape: tuple[int, ...], device: torch.device) -> tuple[Tensor, Tensor]:
        key = (shape, device)
        if key not in self._held:
            self._held[key] = (torch.empty(shape, dtype=torch.float64, device=device),
                               torch.empty(shape, dtype=torch.float64, device=device))  # fmt: skip
        return self._held[key]


@final
class ExactSum:
    """The sum of ``float64`` terms of one shape, the same bits in any order and grouping (see the module).

    Per entry: ``top``, its top bin (``int8``); ``bins``, its
    :data:`FOLDS` bins from the top down, ``(FOLDS, *shape)``; ``limit``,
    the bound its top bin's terms stay under (:func:`_limit`). Terms are added in place by :meth:`add` (or
    into one slice of the first dim by :meth:`add_at`), on the work
    tensors of ``scratch`` (shared with other sums; a fresh one if
    ``None``); :meth:`value` gives the sum.
    """

    __slots__ = ("bins", "fresh", "limit", "scratch", "top")

    def __init__(self, shape: Sequence[int], device: torch.device, scratch: Scratch | None = None) -> None:
        self.top = torch.full(tuple(shape), LOWEST, dtype=torch.int8, device=device)
        self.bins = torch.zeros(FOLDS, *shape, dtype=torch.float64, device=device)
        self.limit = _limit(self.top)
        self.scratch = scratch if scratch is not None else Scratch()
        self.fresh = True  # nothing added yet: the first term sets the tops without moving any bin

    @classmethod
    def of(cls, held: Tensor | ExactSum | None, shape: Sequence[int], device: torch.device,
           scratch: Scratch | None = None) -> ExactSum:  # fmt: skip
        """``held`` if it is an exact sum; else a new one holding nothing (``None``) or a running sum of another
        dtype as one term (its bits then depend on how that running sum was added)."""
        if isinstance(held, ExactSum):
            return held
        out = cls(shape, device, scratch)
        if held is not None:
            out.add(held.to(device, torch.float64).reshape(tuple(shape)))
        return out

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.top.shape)

    def add(self, x: Tensor) -> None:
        """Add the term ``x`` (``float64``, this sum's shape)."""
        if self.fresh and x.dtype == torch.float64 and tuple(x.shape) == self.shape:
            self.top.copy_(_bins(x))
            self.limit.copy_(_limit(self.top))
        self.fresh = False
        _deposit(self.top, self.bins, self.limit, x, self.scratch)

    def add_at(self, index: int, x: Tensor) -> None:
        """Add the term ``x`` to the slice ``index`` of the first dim."""
        self.fresh = False
        _deposit(self.top[index], self.bins[:, index], self.limit[index], x, self.scratch)

    def move_to(self, top: Tensor) -> None:
        """Raise every entry's top bin to ``top`` (at least the current one): its lowest bins drop out.

        Two sums moved to the same tops add bin by bin, exactly (the ``all_reduce`` of :mod:`._collect`).
        """
        self.fresh = False
        _raise(self.top, self.bins, self.limit, top.reshape(self.top.shape).to(self.top.device, torch.int8))

    def value(self) -> Tensor:
        """The sum, ``float64``: the bins added from the top down."""
        return fold(self.bins)


def fold(bins: Tensor) -> Tensor:
    """The value of :data:`FOLDS` bins ``(FOLDS, *shape)``, added from the top down (``float64``)."""
    total = bins[0].clone()
    for k in range(1, FOLDS):
        total += bins[k]
    return total


def _raise(top: Tensor, bins: Tensor, limit: Tensor, new: Tensor) -> None:
    """Move the entries whose top bin rises to ``new``: each bin ``k`` takes what bin ``k - shift`` held.

    By index where few rise; over the whole tensor where many do (the first term's).
    """
    changed = new > top
    count = int(changed.sum())
    if not count:
        return
    if count * 8 > changed.numel():
        shift = (new.to(torch.int64) - top.to(torch.int64)).unsqueeze(0)
        source = torch.arange(FOLDS, device=bins.device).reshape(-1, *([1] * top.dim())) - shift
        bins.copy_(torch.where(source >= 0, bins.gather(0, source.clamp(min=0)), 0.0))
        top.copy_(new)
        limit.copy_(_limit(new))
        return
    where = changed.flatten().nonzero().squeeze(1)  # flat: every tensor here is contiguous past the bins' dim
    rise = new.flatten()[where]
    shift = (rise - top.flatten()[where]).to(torch.int64)
    flat = bins.view(FOLDS, -1)
    source = torch.arange(FOLDS, device=bins.device).unsqueeze(1) - shift
    moved = flat[:, where].gather(0, source.clamp(min=0))
    flat[:, where] = torch.where(source >= 0, moved, 0.0)
    top.view(-1)[where] = rise
    limit.view(-1)[where] = _limit(rise)


def _deposit(top: Tensor, bins: Tensor, limit: Tensor, x: Tensor, scratch: Scratch) -> None:
    """Add ``x``'s digits to ``bins`` in place, raising ``top`` first where ``x`` is larger than any term so far.

    The dense work is in place on two scratch tensors; the entries whose
    top rises (``|x| >= limit``: exactly those), and the infinite terms
    (which go whole to the top bin), are handled apart, by index. ``M`` of
    bin ``k`` below the top is ``limit * 3 * 2 ** (52 - (k + 1) * WIDTH)``:
    an exact product, so ``rest + M`` rounds once, fused or not. A NaN term
    makes every bin of its entry NaN, as it makes any sum.
    """
    if x.dtype != torch.float64 or tuple(x.shape) != tuple(top.shape):
        raise ValueError(f"ExactSum: a term must be float64 of shape {tuple(top.shape)}, got {x.dtype} of shape "
                         f"{tuple(x.shape)}")  # fmt: skip
    digit, rest = scratch.of(tuple(x.shape), x.device)
    look = torch.ge(torch.abs(x, out=digit), limit)  # above the top bin, or infinite
    rest.copy_(x)
    odd: tuple[Tensor, ...] = ()
    if bool(look.any()):
        where = look.nonzero(as_tuple=True)
        seen = x[where]
        new = top.clone()
        new[where] = torch.maximum(top[where], _bins(seen))
        _raise(top, bins, limit, new)  # (by index or over the whole tensor, as few or many rise)
        infinite = torch.isinf(seen)
        if bool(infinite.any()):
            odd = tuple(w[infinite] for w in where)
            rest[odd] = 0.0
    for k in range(FOLDS):
        scale = 3.0 * 2.0 ** (52 - (k + 1) * WIDTH)
        torch.add(rest, limit, alpha=scale, out=digit).sub_(limit, alpha=scale)
        bins[k].add_(digit)
        if k + 1 < FOLDS:
            rest.sub_(digit)
    if odd:
        bins[0][odd] += x[odd]
