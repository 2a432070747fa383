"""The selection paths (threshold, fast eager, joint) give exactly the sort path's flags."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.func import vmap

import funcprune as fp
from funcprune._specs import _kernels
from funcprune import _native
from funcprune._select import _bracket, _choose, _groups, _short_rows
from funcprune._select._choose import keep
from funcprune._validate import count_to_prune


def kept_by_sort(keys: torch.Tensor, k: int, eligible: torch.Tensor | None) -> torch.Tensor:
    """The reference: the stable-sort path, whatever the size."""
    return _choose._keep_rows(keys[None], k, None if eligible is None else eligible[None])[0]


@pytest.fixture(scope="module", params=["native", "torch"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """The bracket's scans in native kernels (where they load), then in torch."""
    if request.param == "native":
        yield "native"
    else:
        with _native.disabled():
            yield "torch"


@st.composite
def keys_and_k(draw: st.DrawFn) -> tuple[torch.Tensor, int, torch.Tensor | None]:
    n = draw(st.integers(1, 4000))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    kind = draw(st.sampled_from(["normal", "ties", "sorted", "periodic", "specials"]))
    if kind == "normal":
        keys = torch.randn(n, generator=g)
    elif kind == "ties":
        keys = torch.randint(0, draw(st.integers(1, 6)), (n,), generator=g).float()
    elif kind == "sorted":  # a strided sample of sorted data brackets badly
        keys = torch.sort(torch.randn(n, generator=g)).values.flip(0) if draw(st.booleans()) else torch.arange(n).float()
    elif kind == "periodic":
        keys = (torch.arange(n) % draw(st.integers(1, 300))).float()
    else:
        keys = torch.randn(n, generator=g)
        specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0])
        where = torch.rand(n, generator=g) < 0.2
        keys[where] = specials[torch.randint(0, 5, (int(where.sum()),), generator=g)]
    eligible = torch.rand(n, generator=g) < draw(st.floats(0.0, 1.0)) if draw(st.booleans()) else None
    available = n if eligible is None else int(eligible.sum())
    return keys, draw(st.integers(0, available)), eligible


@pytest.mark.parametrize("sample", [16, 1 << 17])
@given(case=keys_and_k())
def test_the_bracket_and_threshold_paths_equal_the_sort_path(
    case: tuple[torch.Tensor, int, torch.Tensor | None], sample: int, path: str
) -> None:
    keys, k, eligible = case
    expected = kept_by_sort(keys, k, eligible)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_choose, "FAST_MIN_KEYS", 1)
        mp.setattr(_bracket, "_SAMPLE", sample)
        mp.setattr(_bracket, "_WINDOW_MIN", 1)  # order statistics through their window, at any size
        bracketed = _bracket.keep_by_bracket([_groups.KeyPart(keys, eligible=eligible)], k)
        assert torch.equal(keep(keys, k, eligible), expected)  # the bracket, or the sort where it steps aside
    assert bracketed is None or torch.equal(bracketed[0], expected)
    assert torch.equal(keep(keys, k, eligible), expected)  # the threshold path, where it applies
    batched = vmap(lambda t: keep(t, k))(keys[None])[0]
    assert eligible is not None or torch.equal(batched, expected)


@given(case=keys_and_k(), data=st.data())
def test_order_statistics_equal_kthvalue(
    case: tuple[torch.Tensor, int, torch.Tensor | None], data: st.DataObject, path: str
) -> None:
    keys = case[0]
    ranks = data.draw(st.lists(st.integers(1, keys.numel()), min_size=1, max_size=3))
    expected = [float(torch.kthvalue(keys, r).values) for r in ranks]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_bracket, "_WINDOW_MIN", 1)
        found = _bracket._order_statistics(keys, *ranks)
    torch.testing.assert_close(torch.tensor(found), torch.tensor(expected), rtol=0, atol=0, equal_nan=True)


SPECS = [
    fp.L1Unstructured(0.3),
    fp.L1Unstructured(0.9),
    fp.L1Unstructured(17),
    fp.RandomUnstructured(0.5),
    fp.LnStructured(0.5, n=1, dim=0),
]


@pytest.mark.parametrize("spec", SPECS, ids=repr)
@pytest.mark.parametrize("ties", [False, True])
def test_eager_fast_path_equals_the_transform_path(spec: fp.Spec, ties: bool) -> None:
    """A tensor above the fast-path size: eager (selection) vs vmap (sort)."""
    g = torch.Generator().manual_seed(11)
    shape = (300, 256)
    assert shape[0] * shape[1] >= _choose.FAST_MIN_KEYS
    scores = torch.randint(-3, 4, shape, generator=g).float() if ties else torch.randn(shape, generator=g)
    default = torch.rand(shape, generator=g) < 0.8
    for d in (None, default):
        torch.manual_seed(3)
        eager = fp.compute_mask(spec, scores, d)
        torch.manual_seed(3)
        if d is None:
            batched = vmap(lambda s: fp.compute_mask(spec, s), randomness="same")(scores[None])
        else:
            batched = vmap(lambda s, m: fp.compute_mask(spec, s, m), randomness="same")(scores[None], d[None])
        if isinstance(spec, fp.RandomUnstructured) and d is not None:
            # eager draws only for the unpruned entries, as torch does; under
            # vmap it draws for all: the same count, other entries
            assert int(eager.sum()) == int(batched[0].sum())
        else:
            assert torch.equal(eager, batched[0])


def spy_on_the_bracket(mp: pytest.MonkeyPatch) -> list[bool]:
    """Record, per bracket attempt, whether it answered (``False``: it stepped aside)."""
    answered: list[bool] = []
    original = _bracket.keep_by_bracket

    def spy(parts: list[_groups.KeyPart], k: int) -> list[torch.Tensor] | None:
        result = original(parts, k)
        answered.append(result is not None)
        return result

    mp.setattr(_choose, "_keep_by_bracket", spy)
    return answered


def test_the_kernels_take_the_fast_path_when_large(monkeypatch: pytest.MonkeyPatch) -> None:
    answered = spy_on_the_bracket(monkeypatch)
    fp.compute_mask(fp.L1Unstructured(0.5), torch.randn(10))
    assert answered == []
    fp.compute_mask(fp.L1Unstructured(0.5), torch.randn(_choose.FAST_MIN_KEYS))
    assert answered == [True]


#: Mixed in one group, they are ranked in the promoted dtype, as torch.cat does.
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@st.composite
def groups(draw: st.DrawFn) -> tuple[list[torch.Tensor], list[torch.Tensor | None], float | int]:
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    sizes = draw(st.lists(st.integers(1, 700), min_size=1, max_size=5))
    ties = draw(st.booleans())
    dtypes = draw(st.lists(st.sampled_from(DTYPES), min_size=len(sizes), max_size=len(sizes)))
    scores = [
        (torch.randint(-3, 4, (n,), generator=g).float() if ties else torch.randn(n, generator=g)).to(dtype)
        for n, dtype in zip(sizes, dtypes)
    ]
    if draw(st.booleans()):
        scores[0][: max(1, sizes[0] // 4)] = float("nan")
    defaults = [torch.rand(n, generator=g) < 0.7 if draw(st.booleans()) else None for n in sizes]
    available = sum(n if d is None else int(d.sum()) for n, d in zip(sizes, defaults))
    amount = draw(st.one_of(st.floats(0.0, 1.0), st.integers(0, available)))
    return scores, defaults, amount


@pytest.mark.parametrize("sample", [16, 1 << 17])
@given(group=groups())
def test_joint_l1_equals_the_concatenated_mask(
    group: tuple[list[torch.Tensor], list[torch.Tensor | None], float | int], sample: int, path: str
) -> None:
    scores, defaults, amount = group
    flat = torch.cat(scores)
    flat_default = None
    if any(d is not None for d in defaults):
        flat_default = torch.cat([torch.ones_like(s, dtype=torch.bool) if d is None else d for s, d in zip(scores, defaults)])
    expected = torch.split(fp.compute_mask(fp.L1Unstructured(amount), flat, flat_default), [s.numel() for s in scores])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_choose, "FAST_MIN_KEYS", 1)
        mp.setattr(_bracket, "_SAMPLE", sample)
        answered = spy_on_the_bracket(mp)
        got = _kernels.l1_unstructured_jointly(amount, scores, defaults)
    assert [m.shape for m in got] == [s.shape for s in scores]
    for g_, e in zip(got, expected):
        assert torch.equal(g_, e)
    available = flat.numel() if flat_default is None else int(flat_default.sum())
    if count_to_prune(amount, available) and bool(torch.isfinite(flat).all()) and sample != 16:
        assert answered == [True]  # steps aside only where it must


def test_global_fast_path_equals_torch_on_a_large_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model above the fast-path size (float64: no ties), two global rounds."""
    import torch.nn.utils.prune as tprune
    from torch import nn

    calls = spy_on_the_bracket(monkeypatch)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(300, 200), nn.ReLU(), nn.Linear(200, 150)).double()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    plan = fp.global_unstructured(["*.weight"], fp.L1Unstructured(0.4))
    masks = plan(params)
    masks = plan(params, masks)
    pairs = [(model[0], "weight"), (model[2], "weight")]
    tprune.global_unstructured(pairs, tprune.L1Unstructured, amount=0.4)
    tprune.global_unstructured(pairs, tprune.L1Unstructured, amount=0.4)
    assert calls == [True, True]
    for name, (module, _) in zip(["0.weight", "2.weight"], pairs):
        assert torch.equal(masks[name], getattr(module, "weight_mask").bool())


@pytest.mark.parametrize("size", [100, 300])  # below and above the fast-path size
@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("high", [torch.float32, torch.float64])
def test_a_mixed_dtype_global_group_prunes_torchs_count_and_mask(
    size: int, low: torch.dtype, high: torch.dtype
) -> None:
    """An fp32 embedding beside a half-precision body: ranked in the promoted dtype."""
    import torch.nn.utils.prune as tprune
    from torch import nn

    torch.manual_seed(0)
    a, b = nn.Linear(size, size, bias=False).to(high), nn.Linear(size, size, bias=False).to(low)
    params = {"a": a.weight.detach().clone(), "b": b.weight.detach().clone()}
    plan = fp.global_unstructured(["a", "b"], fp.L1Unstructured(0.5))
    masks = plan(params)
    masks = plan(params, masks)  # a second round, on the first's masks
    pairs = [(a, "weight"), (b, "weight")]
    tprune.global_unstructured(pairs, tprune.L1Unstructured, amount=0.5)
    tprune.global_unstructured(pairs, tprune.L1Unstructured, amount=0.5)
    expected = round(0.5 * 2 * size * size) + round(0.5 * (2 * size * size - round(0.5 * 2 * size * size)))
    assert sum(int((~m).sum()) for m in masks.values()) == expected
    flat_scores = torch.cat([params["a"].reshape(-1), params["b"].reshape(-1)]).abs()
    theirs: list[torch.Tensor] = [getattr(m, "weight_mask").reshape(-1) for m in (a, b)]
    flat_torch = torch.cat(theirs).bool()
    flat_ours = torch.cat([masks["a"].reshape(-1), masks["b"].reshape(-1)])
    differ = flat_torch != flat_ours
    if bool(differ.any()):  # only among scores tied at the threshold
        tied = flat_scores[differ]
        assert bool(tied.min() == tied.max())


@st.composite
def grouped(draw: st.DrawFn) -> tuple[torch.Tensor, _groups.Group, torch.Tensor | None, int | torch.Tensor]:
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=2, max_size=3)))
    ties = draw(st.booleans())
    keys = torch.randint(0, 3, shape, generator=g).float() if ties else torch.randn(shape, generator=g)
    dim = draw(st.integers(-len(shape), len(shape) - 1))
    if draw(st.booleans()):
        group: _groups.Group = _groups.Slices(dim)
        n_groups, size = shape[dim], keys.numel() // shape[dim]
    else:
        size = draw(st.sampled_from([d for d in range(1, shape[dim] + 1) if shape[dim] % d == 0]))
        group = _groups.Runs(size, dim)
        n_groups = keys.numel() // size
    eligible = torch.rand(shape, generator=g) < 0.7 if draw(st.booleans()) else None
    k: int | torch.Tensor = draw(st.integers(0, size))
    if draw(st.booleans()):
        k = torch.randint(0, size + 1, (n_groups,), generator=g)
    return keys, group, eligible, k


def rows_of(t: torch.Tensor, group: _groups.Group) -> torch.Tensor:
    """The reference grouping, written out: one row per group, in order."""
    if isinstance(group, _groups.Slices):
        return torch.stack([t.select(group.dim, i).reshape(-1) for i in range(t.shape[group.dim])])
    assert isinstance(group, _groups.Runs)
    return t.movedim(group.dim, -1).reshape(-1, group.size)


@given(case=grouped())
def test_each_group_prunes_its_own_k_lowest(
    case: tuple[torch.Tensor, _groups.Group, torch.Tensor | None, int | torch.Tensor],
) -> None:
    keys, group, eligible, k = case
    kept = keep(keys, k, eligible, group=group)
    assert kept.shape == keys.shape and kept.dtype == torch.bool
    key_rows = rows_of(keys, group)
    kept_rows = rows_of(kept, group)
    eligible_rows = None if eligible is None else rows_of(eligible, group)
    for i in range(key_rows.shape[0]):
        k_i = k if isinstance(k, int) else int(k[i])
        e_i = None if eligible_rows is None else eligible_rows[i]
        assert torch.equal(kept_rows[i], kept_by_sort(key_rows[i], k_i, e_i))
    batched = vmap(lambda t: keep(t, k, eligible, group=group))(keys[None])[0]
    assert torch.equal(batched, kept)


def test_blocks_that_do_not_tile_the_dim_are_refused() -> None:
    with pytest.raises(ValueError, match=r"blocks of 4 entries along dim -1 do not tile a length of 6"):
        keep(torch.randn(2, 6), 1, group=_groups.Runs(4))


@st.composite
def short_rows(draw: st.DrawFn) -> tuple[torch.Tensor, int | torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**20)))
    n_rows, length = draw(st.integers(0, 40)), draw(st.integers(1, _short_rows.SHORT_ROW_MAX))
    dtype = draw(st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]))
    keys = torch.randn(n_rows, length, generator=g).to(dtype)
    if draw(st.booleans()):  # ties, signed zeros, infinities and NaNs of both signs
        specials = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0])
        where = torch.rand(n_rows, length, generator=g) < 0.5
        keys[where] = specials[torch.randint(0, 8, (int(where.sum()),), generator=g)].to(dtype)
    eligible = torch.rand(n_rows, length, generator=g) < 0.7 if draw(st.booleans()) else None
    k: int | torch.Tensor = draw(st.integers(0, length))
    if draw(st.booleans()):
        k = torch.randint(0, length + 1, (n_rows,), generator=g)
    return keys, k, eligible


@given(case=short_rows())
def test_the_short_rows_path_equals_the_sort_path(
    case: tuple[torch.Tensor, int | torch.Tensor, torch.Tensor | None],
) -> None:
    keys, k, eligible = case
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_short_rows, "_CHUNK_ROWS", 7)  # rows cross chunk boundaries
        kept = _short_rows.keep_in_short_rows(keys, k, eligible)
    assert torch.equal(kept, _choose._keep_rows(keys, k, eligible))
    assert torch.equal(keep(keys, k, eligible, group=_groups.Runs(keys.shape[1])), kept)
