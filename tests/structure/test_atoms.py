"""The analysis' atoms: a layer's new rows related by their zip, as the general path relates any pairs."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from funcprune._graph._atoms import Atoms


def _state(atoms: Atoms) -> tuple[list[int], dict[str, dict[int, dict[int, frozenset[int]]]]]:
    related = {
        t: {d: {i: frozenset((a,) if isinstance(a, int) else a) for i, a in by.items()} for d, by in dims.items()}
        for t, dims in atoms.related().items()
    }  # an index of one atom holds it, not a set of it
    return atoms.roots(), related


@settings(max_examples=60, deadline=None)
@given(
    calls=st.lists(
        st.tuples(st.sampled_from(["w", "b"]), st.lists(st.integers(0, 7), min_size=1, max_size=6, unique=True),
                  st.booleans()),
        min_size=1, max_size=6,
    ),
    seed=st.integers(0, 2**16),
)  # fmt: skip
def test_a_layer_s_rows_are_related_as_any_pairs_are(calls: list[tuple[str, list[int], bool]], seed: int) -> None:
    """``relate`` with a 1-D ascending index and new atoms (a layer's rows; a layer called twice, its rows coupled
    with the atoms they had) takes the zip of the two; the general path (``pairs``: the same entries laid out in
    2-D) gives the same groups and the same atoms for every index, coupled or not, and an index laid out in
    another order or repeated takes the general path."""
    g = torch.Generator().manual_seed(seed)
    fast, general = Atoms(), Atoms()
    for tensor, indices, couple in calls:
        order = sorted(indices) if torch.rand((), generator=g) < 0.7 else indices  # (not ascending: the general path)
        index = torch.tensor(order)
        for atoms in (fast, general):
            ids = atoms.new(len(order))
            if atoms is fast:
                atoms.relate(tensor, 0, index, ids, couple=couple)
            else:
                atoms.relate(tensor, 0, index.unsqueeze(0), ids.unsqueeze(0), couple=couple)
    assert _state(fast) == _state(general)


def test_an_index_repeated_is_related_once_per_atom() -> None:
    """An index given twice in one call (not ascending) relates each of its atoms, coupled where asked."""
    atoms = Atoms()
    ids = atoms.new(3)
    atoms.relate("w", 0, torch.tensor([2, 2, 5]), ids, couple=True)
    roots, related = _state(atoms)
    assert related == {"w": {0: {2: frozenset({0, 1}), 5: frozenset({2})}}}
    assert roots == [0, 0, 2]
