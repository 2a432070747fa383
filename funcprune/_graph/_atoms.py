"""The atoms of one analysis: channels, numbered, merged into groups, with what keeps them.

An *atom* is one channel the analysis follows: an output row of a Linear, an
output channel of a Conv, an embedding column. Atoms are allocated in
blocks (:meth:`Atoms.new`) and tensors of atom ids (``-1``: no atom) stand
beside the model's tensors. Ops that make two atoms go together *couple*
them (a union-find): a group goes whole or not at all. An atom may also be
*blocked* (it stays, with a reason: a model output, a reduction that its
removal would change...) or *refused* (an op the analysis cannot reason
about reads it: removing it is refused, naming the op). Each parameter
(or buffer) index that belongs to atoms is recorded (:meth:`Atoms.relate`):
it goes when every atom it belongs to goes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import torch

from .._types import Tensor

__all__ = ["Atoms", "Related", "Slice", "broadcast", "pairs"]


class Slice(NamedTuple):
    """Index ``index`` of a tensor's dim ``dim``: a row, a column, an entry of a norm's weight...

    A named tuple: a 1B model's analysis makes about 400,000 of them, and a
    tuple is made in half the time of a frozen dataclass and hashed in a
    quarter (sets of them decide what shrink removes).
    """

    tensor: str
    dim: int
    index: int  # type: ignore[assignment]  # (shadows tuple.index, which no caller uses)


#: For each tensor (by name) and dim, the atoms each index belongs to.
Related = Mapping[str, Mapping[int, Mapping[int, frozenset[int]]]]


class Atoms:
    """Atoms in a union-find, with what makes them (producers), keeps them and relates tensors to them."""

    def __init__(self) -> None:
        self._parent: list[int] = []
        self._why: dict[int, str] = {}  # atom -> why its group is all-or-nothing along an axis
        self.blocked: dict[int, str] = {}  # atom -> why it stays
        self.refused: dict[int, str] = {}  # atom -> the op that reads it, described
        self.producers: dict[int, Slice] = {}  # atom -> the row (channel) that makes it
        self.read: set[int] = set()  # atoms a layer reads as its input channels (weight columns)
        #: tensor -> dim -> index -> its atom, or its atoms where it has several (no set made per index: a 1B
        #: model has a million indices, most of one atom each)
        self._related: dict[str, dict[int, dict[int, int | set[int]]]] = {}

    def __len__(self) -> int:
        return len(self._parent)

    def new(self, n: int, producers: Iterable[Slice] = ()) -> Tensor:
        """``n`` new atoms (their ids), made by ``producers`` (one slice per atom, in order)."""
        start = len(self._parent)
        self._parent.extend(range(start, start + n))
        self.producers.update(zip(range(start, start + n), producers, strict=False))
        return torch.arange(start, start + n)

    def find(self, atom: int) -> int:
        parent = self._parent
        while parent[atom] != atom:
            parent[atom] = parent[parent[atom]]
            atom = parent[atom]
        return atom

    def union_pairs(self, joined: Iterable[tuple[int, int]]) -> None:
        """Join the groups of ``a`` and ``b`` for each pair: the root of a group is its smallest atom, whatever the
        order of the unions (the finds inlined: a 1B model's analysis makes about a million unions)."""
        parent = self._parent
        for a, b in joined:
            while parent[a] != a:
                parent[a] = a = parent[parent[a]]
            while parent[b] != b:
                parent[b] = b = parent[parent[b]]
            if a < b:
                parent[b] = a
            elif b < a:
                parent[a] = b

    def couple(self, a: Tensor, b: Tensor) -> None:
        """Couple ``a[i]`` with ``b[i]`` wherever both are atoms (same shapes, or broadcastable)."""
        self.union_pairs(pairs(a, b))

    def couple_along(self, ids: Tensor, dims: Iterable[int], why: str) -> None:
        """Couple the atoms of ``ids`` that differ only along ``dims``: all or none of them go."""
        dims = sorted(d % ids.dim() for d in dims) if ids.dim() else []
        if not dims or not bool((ids >= 0).any()):
            return
        moved = ids.movedim(dims, list(range(ids.dim() - len(dims), ids.dim())))
        rows = moved.reshape(-1, int(torch.tensor(moved.shape[moved.dim() - len(dims):]).prod().item()))
        rows = torch.unique(rows, dim=0)
        if rows.shape[1] > 1:  # each row's distinct atoms, ascending, -1 first (duplicates -1 too)
            rows, _ = rows.sort(dim=1)
            rows = torch.where(torch.cat([torch.ones_like(rows[:, :1], dtype=torch.bool), rows[:, 1:] != rows[:, :-1]], 1), rows, -1)
        for row in rows.tolist():
            atoms = [a for a in row if a >= 0]
            if len(atoms) > 1:
                self.union_pairs(zip(itertools.repeat(atoms[0]), atoms[1:]))
                self._why.setdefault(atoms[0], why)

    def mark_read(self, ids: Tensor) -> None:
        """Record that a layer reads the atoms of ``ids`` as its input channels."""
        self.read.update(_atoms_in(ids))

    def block(self, ids: Tensor, why: str) -> None:
        for atom in _atoms_in(ids):
            self.blocked.setdefault(atom, why)

    def refuse(self, ids: Tensor, what: str) -> None:
        for atom in _atoms_in(ids):
            self.refused.setdefault(atom, what)

    def relate(self, tensor: str, dim: int, index: Tensor, ids: Tensor, *, couple: bool = False) -> None:
        """Record that index ``index[i]`` of ``tensor``'s dim ``dim`` belongs to atom ``ids[i]``.

        With ``couple``, the atoms one index belongs to are coupled: a layer's
        row or column is one slice, whichever node uses it (a layer called
        twice). Without, the index goes when all of them go (a norm's weight
        shared by the heads of an attention).
        """
        distinct = index.dim() == ids.dim() == 1 and index.shape == ids.shape and _ascending(index)
        if distinct and bool((ids >= 0).all()):
            found = list(zip(index.tolist(), ids.tolist(), strict=True))  # (a layer's rows: new atoms, one per index)
        else:
            distinct, found = False, pairs(index, ids)
        if not found:
            return
        by_index = self._related.setdefault(tensor, {}).setdefault(dim, {})
        if distinct and not by_index:  # none of the indices related before (a layer's first call)
            by_index.update(found)
            return
        joined: list[tuple[int, int]] = []
        for i, atom in found:
            had = by_index.get(i)
            if had is None:
                by_index[i] = atom
            elif isinstance(had, int):
                if had != atom:
                    joined.append((had, atom))
                    by_index[i] = {had, atom}  # the set an index's atoms would have filled, in the same order
            else:
                joined.append((next(iter(had)), atom))
                had.add(atom)
        if couple:
            self.union_pairs(joined)

    def roots(self) -> list[int]:
        """The root of every atom's group (its smallest atom)."""
        return [self.find(a) for a in range(len(self._parent))]

    def why_coupled(self, roots: list[int]) -> dict[int, str]:
        """For each group coupled along an axis, why (the first such op)."""
        out: dict[int, str] = {}
        for atom, why in self._why.items():
            out.setdefault(roots[atom], why)
        return out

    def related(self) -> Mapping[str, Mapping[int, Mapping[int, int | set[int]]]]:
        """For each tensor and dim, the atom each index belongs to, or its atoms where it has several (as kept:
        read, not changed)."""
        return self._related


def pairs(a: Tensor, b: Tensor) -> list[tuple[int, int]]:
    """The distinct pairs ``(a[i], b[i])`` where both are atoms (``>= 0``; broadcastable shapes), sorted.

    Dims along which the pairs repeat (the tokens of an activation) are cut
    to one slice before ``unique`` sorts what is left.
    """
    a, b = broadcast(a, b)
    valid = (a >= 0) & (b >= 0)
    if not bool(valid.any()):
        return []
    span = int(b.max()) + 1
    keys = torch.unique(unrepeated(torch.where(valid, a * span + b, -1)))
    keys = keys[keys >= 0]
    return list(zip((keys // span).tolist(), (keys % span).tolist(), strict=True))


def _ascending(index: Tensor) -> bool:
    """Whether the 1-D ``index`` holds distinct indices, ascending (``>= 0``): its pairs with atoms are its zip."""
    return index.numel() > 0 and int(index[0]) >= 0 and bool((index[1:] > index[:-1]).all())


def _atoms_in(ids: Tensor) -> list[int]:
    """The distinct atoms of ``ids``, sorted (its dims along which it repeats cut to one slice first)."""
    flat = unrepeated(ids).reshape(-1)
    found: list[int] = torch.unique(flat[flat >= 0]).tolist()
    return found


def unrepeated(t: Tensor) -> Tensor:
    """``t`` with every dim along which it repeats (the tokens of an activation's atom ids) cut to one slice: the
    same distinct values, from a fraction of the entries."""
    for dim in range(t.dim()):
        if t.shape[dim] > 1 and bool((t == t.narrow(dim, 0, 1)).all()):
            t = t.narrow(dim, 0, 1)
    return t


def broadcast(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``a`` and ``b`` expanded to their common shape."""
    rank = max(a.dim(), b.dim())
    sa = (1,) * (rank - a.dim()) + tuple(a.shape)
    sb = (1,) * (rank - b.dim()) + tuple(b.shape)
    shape = [x if y == 1 else y for x, y in zip(sa, sb)]
    return a.reshape(sa).expand(shape), b.reshape(sb).expand(shape)
