"""Unit keys: each unit's ``n``-norm over all of its members' entries, the same wherever the entries lie.

A unit's entries may lie in several parameters (a KV group's query, key,
value and output slices) and, for sharded parameters, on several processes
(FSDP2 cuts a head's rows of ``o_proj`` between processes; tensor
parallelism keeps them whole). Each holder of some entries adds up its part
of the unit's sum of ``|x| ** n``, and the parts are added across members
and processes. Floating-point sums depend on their order, so the parts are
made **order-free**: every term is first rounded to a multiple of one
quantum per unit (``(v + M) - M`` with ``M = 1.5 * 2**E`` in float64, the
pre-rounding of reproducible summation), chosen from the unit's largest
term and its entry count so that every partial sum of such terms is exact.
The unit's sum is then the same bit for bit in one process, split over
members, or over any number of processes in any order, and so is every
mask ranked from it. The rounding costs at most one quantum per term:
about ``count * max_term * 2**-50`` on the sum, far below float32's
precision.

What crosses processes is one maximum (each unit's largest term, its NaN
and inf flags and whether an earlier mask left it) and one sum (the
rounded sums, or counts for ``n = 0``), of a few numbers per unit, never the
weights. ``n = inf`` and ``-inf`` need the maximum only, ``n = 0`` a count.
Terms are ``|x| ** n`` in float64 (``x * x`` and ``|x|`` exactly for
``n = 2`` and ``1``; other orders use torch's elementwise ``pow``).

A unit with a NaN entry has a NaN key (ranked last by the selection), one
with an infinite term an infinite sum (``n < 0``: a zero entry, so a zero
norm), as ``torch.linalg.vector_norm`` gives.

``n = "nuc"``, the nuclear norm, is no sum of parts: it keys units that are
one index of one member (``global_structured``'s channels of a 3-dim
tensor), each a matrix that one process holds whole, normed there in the
scores' dtype as ``torch.norm`` norms it (exact: every other process adds
nothing), then taken by the maximum. An SVD that fails on one process
(non-finite entries) fails every process: a flag rides along the maximum,
and the others raise :class:`FailedElsewhere`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Union, final

import torch

from .. import _native
from .._types import Tensor
from .._units import Member, UnitGroup
from .._validate import is_concrete

__all__ = ["FailedElsewhere", "Order", "Piece", "Reduce", "unit_keys"]

#: Reduces a vector of per-unit numbers over the processes that hold parts of the units (identity in one).
Reduce = Callable[[Tensor, Literal["sum", "max"]], Tensor]
#: The norm units are keyed by: an order of vector norm, the nuclear norm, or ``None`` (drawn at random: zeros).
Order = Union[float, Literal["nuc"], None]


class FailedElsewhere(RuntimeError):
    """Another process of the mesh failed to compute its units' norms (its own error says why)."""


@final
@dataclass(frozen=True, slots=True, eq=False)
class Piece:
    """One member's values as this process holds them.

    Attributes:
        member: the member.
        values: the block of the values ranked (the scores, else the
            parameter as currently pruned), the whole tensor in one process.
        mask: the block of the member's earlier mask, or ``None``.
        offset: where the block starts along ``member.dim`` in the whole tensor.
        entries: the whole tensor's entries per index along ``member.dim``.
        counted: whether this block's sums count (``False`` on a copy of a
            block that another process counts).
    """

    member: Member
    values: Tensor
    mask: Tensor | None
    offset: int
    entries: int
    counted: bool = True


def _order(n: float | Literal["nuc"]) -> Literal["sum", "count", "max", "min", "nuc"]:
    if n == "nuc":
        return "nuc"
    if n == 0:
        return "count"
    if n == math.inf:
        return "max"
    if n == -math.inf:
        return "min"
    return "sum"


def _terms(x: Tensor, n: float) -> Tensor:
    """``|x| ** n`` in float64 (exact for n = 1 and 2)."""
    x = x.to(torch.float64)
    if n == 2:
        return x * x
    if n == 1:
        return x.abs()
    return x.abs().pow(n)


def _span(piece: Piece, size: int) -> tuple[Tensor, Tensor | None, int] | None:
    """The part of the block within the units' run, its mask, and where it starts in the run (or ``None``)."""
    m = piece.member
    length = piece.values.shape[m.dim]
    lo = max(piece.offset, m.start)
    hi = min(piece.offset + length, m.end(size))
    if lo >= hi or piece.values.numel() == 0:
        return None
    part = piece.values.narrow(m.dim, lo - piece.offset, hi - lo)
    kept = None if piece.mask is None else piece.mask.narrow(m.dim, lo - piece.offset, hi - lo)
    return part, kept, lo - m.start + (0 if m.unit is None else m.unit * m.width)  # a member of one unit: its run


def _per_index(t: Tensor, dim: int, how: Literal["sum", "max", "min"]) -> Tensor:
    """``t`` reduced over every dim but ``dim``: one number per index along ``dim``."""
    others = tuple(d for d in range(t.dim()) if d != dim)
    if not others:
        return t
    if how == "sum":
        return t.sum(others)
    return t.amax(others) if how == "max" else t.amin(others)


def _to_units(
    per_index: Tensor, first: int, size: int, width: int, how: Literal["sum", "max"], neutral: float = 0.0
) -> Tensor:
    """Per-index numbers (from index ``first`` of the units' run on) combined per unit: a vector of ``size``.

    Units this block does not reach get ``neutral``.
    """
    length = per_index.shape[-1]
    lead = first % width
    units = -(-(lead + length) // width)
    tail = units * width - lead - length
    before = first // width
    after = size - before - units

    def fill(count: int) -> Tensor:
        return torch.full((count,), neutral, dtype=per_index.dtype, device=per_index.device)

    padded = per_index if not (lead or tail) else torch.cat([fill(lead), per_index, fill(tail)], -1)
    grid = padded.reshape(*padded.shape[:-1], units, width)
    combined = grid.sum(-1) if how == "sum" else grid.amax(-1)
    return combined if not (before or after) else torch.cat([fill(before), combined, fill(after)], -1)


def _flag(t: Tensor, dim: int, first: int, size: int, width: int) -> Tensor:
    """1.0 for the units where ``t`` (bool) has a true entry, else 0.0."""
    others = tuple(d for d in range(t.dim()) if d != dim)
    per_index = t.any(dim=others) if others else t
    return _to_units(per_index.to(torch.float64), first, size, width, "max")


def _device(pieces: Sequence[Piece]) -> torch.device:
    return pieces[0].values.device


@dataclass(slots=True)
class _Maxima:
    """What one group reduces by maximum: units an earlier mask left, NaN and inf flags, largest terms
    (nuclear norms for ``"nuc"``), and whether a process failed to compute them."""

    alive: Tensor | None
    nan: Tensor | None = None
    inf: Tensor | None = None
    top: Tensor | None = None
    failed: Tensor | None = None
    #: This process's own failure (never sent).
    error: RuntimeError | None = None

    def parts(self) -> list[Tensor]:
        return [t for t in self.fields() if t is not None]

    def replaced(self, values: list[Tensor]) -> _Maxima:
        it = iter(values)
        alive, nan, inf, top, failed = (None if t is None else next(it) for t in self.fields())
        return _Maxima(alive, nan, inf, top, failed, self.error)

    def fields(self) -> tuple[Tensor | None, ...]:
        """Every number reduced by maximum, in order (``None`` where a group has none of them)."""
        return (self.alive, self.nan, self.inf, self.top, self.failed)


def _abs_max(part: Tensor, dim: int) -> Tensor:
    """The largest ``|x|`` per index along ``dim`` (NaN where there is one): two reads, no copy of ``|x|``."""
    return torch.maximum(_per_index(part, dim, "max"), -_per_index(part, dim, "min"))


def _fast(n: float) -> bool:
    """Whether ``n``'s terms are exact in float64 and monotone in ``|x|``: their extremes come from ``x``'s."""
    return n in (1.0, 2.0)


def _maxima(group: UnitGroup, pieces: Sequence[Piece], how: str | None, n: float) -> _Maxima:
    size = group.size
    zeros = torch.zeros(size, dtype=torch.float64, device=_device(pieces))
    masked = any(p.mask is not None for p in pieces)
    got = _Maxima(zeros if masked else None)
    if how == "nuc":
        got.nan, got.top, got.failed = zeros, zeros, zeros
    if how in ("sum", "max", "min"):
        got.nan = zeros
        got.inf = zeros if how == "sum" else None
        got.top = zeros if how == "sum" else torch.full_like(zeros, -math.inf)
    for piece in pieces:
        span = _span(piece, size)
        if span is None:
            continue
        part, kept, first = span
        d, w = piece.member.dim, piece.member.width
        if got.alive is not None:  # a member without an earlier mask leaves every unit it spans alive
            if kept is not None:
                flags = _flag(kept, d, first, size, w)
            else:
                every = torch.ones(part.shape[d], dtype=torch.float64, device=part.device)
                flags = _to_units(every, first, size, w, "max")
            got.alive = torch.maximum(got.alive, flags)
        if got.nan is None or got.top is None:
            continue
        if how == "nuc":
            _nuclear(got, part, d, first, size)
            continue
        if how == "sum" and not _fast(n):  # any other order: every term computed (rare orders, slower)
            v = _terms(part, n)
            nan, inf = _per_index(v.isnan(), d, "max"), _per_index(v.isinf(), d, "max")
            largest = _per_index(torch.where(v.isfinite(), v, torch.zeros_like(v)), d, "max")
        else:  # per index from x's extremes, then one term per index
            if how == "min":
                extreme = _per_index(part.abs(), d, "min").to(torch.float64)
            else:  # one native read where it applies (for sums only: the sign of a zero maximum is moot there)
                native = _native.unit_abs_max(part, d) if how == "sum" and is_concrete(part) else None
                extreme = _abs_max(part, d).to(torch.float64) if native is None else native
            term = extreme if how != "sum" else _terms(extreme, n)
            nan, inf = term.isnan(), term.isinf()
            largest = term if how != "min" else -term
        got.nan = torch.maximum(got.nan, _to_units(nan.to(torch.float64), first, size, w, "max"))
        if got.inf is not None:
            got.inf = torch.maximum(got.inf, _to_units(inf.to(torch.float64), first, size, w, "max"))
            largest, neutral = torch.where(largest.isfinite(), largest, torch.zeros_like(largest)), 0.0
        else:
            largest, neutral = torch.where(nan, torch.full_like(largest, -math.inf), largest), -math.inf
        got.top = torch.maximum(got.top, _to_units(largest, first, size, w, "max", neutral))
    return got


def _nuclear(got: _Maxima, part: Tensor, d: int, first: int, size: int) -> None:
    """Each index's nuclear norm over the other dims (a matrix per unit), into ``got`` (its NaN flags apart)."""
    assert got.nan is not None and got.top is not None and got.failed is not None
    try:
        norms = torch.norm(part, p="nuc", dim=[i for i in range(part.dim()) if i != d]).to(torch.float64)
    except RuntimeError as e:  # an SVD of non-finite values: every process raises, after the maximum
        got.error = e
        got.failed = torch.ones_like(got.failed)
        return
    nan = norms.isnan()
    got.nan = torch.maximum(got.nan, _to_units(nan.to(torch.float64), first, size, 1, "max"))
    got.top = torch.maximum(got.top, _to_units(torch.where(nan, torch.zeros_like(norms), norms), first, size, 1, "max"))


def _quanta(group: UnitGroup, pieces: Sequence[Piece], top: Tensor) -> Tensor:
    """Each unit's ``M = 1.5 * 2**E``: its terms rounded to multiples of ``ulp(M)`` add up exactly.

    With every term at most ``2**e`` (``e = ceil(log2(largest))``) and at most
    ``2**k`` terms (the unit's entries, counted from the whole shapes: alike on every process), every partial sum is below ``2**(e + k)``; ``E = e + k + 2``
    keeps it under ``2**(E + 1)``, where multiples of ``ulp(M) = 2**(E - 52)``
    are exact, and ``|term| < M / 2`` as the rounding by ``(v + M) - M`` needs.
    """
    counts = [0] * group.size  # each unit's entries (a member of one unit counts for it alone)
    for p in pieces:
        for u in range(group.size) if p.member.unit is None else (p.member.unit,):
            counts[u] += p.member.width * p.entries
    k = torch.tensor([math.ceil(math.log2(c + 1)) for c in counts], dtype=top.dtype, device=top.device)
    e = torch.ceil(torch.log2(top.clamp(min=2.0**-1000)))
    return torch.ldexp(torch.full_like(top, 1.5), e + (k + 2))


#: Entries per chunk of the rounded sums: float64 temporaries that stay in cache.
CHUNK = 1 << 17


def _rounded_part(part: Tensor, d: int, big: Tensor, n: float) -> Tensor:
    """Per index along ``d``: the sum of ``part``'s terms, each rounded to its index's quantum (``big``: ``M``).

    In one native pass where eager (``funcprune._native.unit_rounded``),
    else chunk by chunk along dim 0 (every sum is exact, so the order is
    free; in one step when compiled); terms that are not finite give NaN
    or infinities, which the flags override.
    """
    eager = is_concrete(part) and is_concrete(big)  # not compiled, nor under a transform (a batched quantum)
    if eager and _fast(n):
        native = _native.unit_rounded(part, d, big, square=n == 2)  # one read; the same sums (they are exact)
        if native is not None:
            return native
    length = part.shape[d]
    shape = [length if i == d else 1 for i in range(part.dim())]
    m = big.reshape(shape)
    rows = part.shape[0]
    step = max(1, CHUNK // max(1, part.numel() // max(1, rows)))
    if torch.compiler.is_compiling():
        step = max(1, rows)  # one step: the compiler fuses the terms into the sum, and a loop would unroll
    out: list[Tensor] = []
    total: Tensor | None = None
    for s in range(0, rows, step):
        count = min(step, rows - s)
        v = _terms(part.narrow(0, s, count), n)  # a new tensor: rounded in place, where eager
        here = m.narrow(0, s, count) if d == 0 else m
        rounded = v.add_(here).sub_(here) if eager else (v + here) - here
        per_index = _per_index(rounded, d, "sum")
        if d == 0:
            out.append(per_index)
        else:
            total = per_index if total is None else total + per_index
    if d == 0:
        return torch.cat(out, -1) if len(out) > 1 else out[0]
    assert total is not None
    return total


def _summed(group: UnitGroup, pieces: Sequence[Piece], per_index: Callable[[Tensor, int, int, int], Tensor]) -> Tensor:
    """This process's part of a per-unit sum: ``per_index(part, dim, first, width)`` of each counted block, per unit."""
    size = group.size
    total = torch.zeros(size, dtype=torch.float64, device=_device(pieces))
    for piece in pieces:
        span = _span(piece, size)
        if span is None or not piece.counted:
            continue
        part, _, first = span
        d, w = piece.member.dim, piece.member.width
        total = total + _to_units(per_index(part, d, first, w).to(torch.float64), first, size, w, "sum")
    return total


def _rounded_sums(group: UnitGroup, pieces: Sequence[Piece], n: float, top: Tensor) -> Tensor:
    """This process's part of each unit's sum of ``|x| ** n``, every term rounded to the unit's quantum."""
    big = _quanta(group, pieces, top)

    def rounded(part: Tensor, d: int, first: int, w: int) -> Tensor:
        return _rounded_part(part, d, big.repeat_interleave(w, dim=-1).narrow(-1, first, part.shape[d]), n)

    return _summed(group, pieces, rounded)


def _counts(group: UnitGroup, pieces: Sequence[Piece]) -> Tensor:
    """This process's part of each unit's count of nonzero entries (NaN counts, as torch counts it)."""

    def nonzero(part: Tensor, d: int, first: int, w: int) -> Tensor:
        others = tuple(i for i in range(part.dim()) if i != d)
        return torch.count_nonzero(part, dim=others) if others else (part != 0).to(torch.int64)

    return _summed(group, pieces, nonzero)


def unit_keys(
    groups: Sequence[tuple[UnitGroup, Sequence[Piece]]], n: Order, reduce: Reduce
) -> list[tuple[Tensor, Tensor | None]]:
    """Each group's unit keys and the units an earlier mask left (``None``: no member has a mask).

    Keys are float64 ``n``-norms of all of a unit's entries (zeros where ``n``
    is ``None``: units drawn at random; nuclear norms for ``"nuc"``, of
    units one index of one member). ``reduce`` is called at most twice:
    once with ``"max"``, once with ``"sum"``, each over one vector of a few
    numbers per unit of every group.

    Raises:
        RuntimeError: this process's own error computing a nuclear norm
            (an SVD of non-finite values), or :class:`FailedElsewhere` where
            another process's failed: on every process alike.
    """
    how = None if n is None else _order(n)
    power = 0.0 if n is None or n == "nuc" else n
    maxima = [_maxima(group, pieces, how, power) for group, pieces in groups]
    flat = [t for got in maxima for t in got.parts()]
    if flat:
        reduced = iter(torch.split(reduce(torch.cat(flat, -1), "max"), [t.shape[-1] for t in flat], -1))
        maxima = [got.replaced([next(reduced) for _ in got.parts()]) for got in maxima]
    for got in maxima:
        if got.error is not None:
            raise got.error
    if any(got.failed is not None and bool((got.failed > 0).any()) for got in maxima):
        raise FailedElsewhere("another process of the mesh failed to compute its units' norms")
    sums: list[Tensor] = []
    for (group, pieces), got in zip(groups, maxima, strict=True):
        if how == "sum" and got.top is not None:
            sums.append(_rounded_sums(group, pieces, power, got.top))
        elif how == "count":
            sums.append(_counts(group, pieces))
    summed = iter(torch.split(reduce(torch.cat(sums, -1), "sum"), [t.shape[-1] for t in sums], -1)) if sums else iter(())
    out: list[tuple[Tensor, Tensor | None]] = []
    for (group, pieces), got in zip(groups, maxima, strict=True):
        eligible = None if got.alive is None else got.alive > 0
        if how is None:
            keys = torch.zeros(group.size, dtype=torch.float64, device=_device(pieces))
        elif how == "count":
            keys = next(summed)
        else:
            assert got.nan is not None and got.top is not None
            if how == "sum":
                assert got.inf is not None
                total = next(summed)
                total = torch.where(got.inf > 0, torch.full_like(total, math.inf), total)
                keys = total if power == 1 else total.pow(1 / power)
            elif how == "nuc":
                keys = got.top
            else:
                keys = got.top if how == "max" else -got.top
            keys = torch.where(got.nan > 0, torch.full_like(keys, math.nan), keys)
        out.append((keys, eligible))
    return out
