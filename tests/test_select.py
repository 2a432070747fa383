"""The selection paths (threshold, fast eager, joint) give exactly the sort path's flags."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.func import vmap

import funcprune as fp
from funcprune import _fastselect, _kernels
from funcprune._fastselect import lowest_fast
from funcprune._select import lowest, lowest_by_sort
from funcprune._validate import count_to_prune


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
def test_lowest_fast_equals_lowest(case: tuple[torch.Tensor, int, torch.Tensor | None], sample: int) -> None:
    keys, k, eligible = case
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_fastselect, "_SAMPLE", sample)
        picked = lowest_fast(keys, k, eligible)
        kept = lowest_fast(keys, k, eligible, complement=True)
    expected = lowest_by_sort(keys, k, eligible)
    assert torch.equal(picked, expected)
    assert torch.equal(kept, ~expected)
    assert torch.equal(lowest(keys, k, eligible), expected)  # the threshold path, where it applies
    batched = vmap(lambda t: lowest(t, k))(keys[None])[0]
    assert eligible is not None or torch.equal(batched, expected)


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
    assert shape[0] * shape[1] >= _fastselect.FAST_MIN_KEYS
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


def test_the_kernels_take_the_fast_path_when_large(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    original = _fastselect.lowest_fast

    def spy(keys: torch.Tensor, k: int, eligible: torch.Tensor | None = None, *, complement: bool = False) -> torch.Tensor:
        calls.append(keys.numel())
        return original(keys, k, eligible, complement=complement)

    monkeypatch.setattr(_kernels, "lowest_fast", spy)
    fp.compute_mask(fp.L1Unstructured(0.5), torch.randn(10))
    assert calls == []
    fp.compute_mask(fp.L1Unstructured(0.5), torch.randn(_fastselect.FAST_MIN_KEYS))
    assert calls == [_fastselect.FAST_MIN_KEYS]


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
    group: tuple[list[torch.Tensor], list[torch.Tensor | None], float | int], sample: int
) -> None:
    scores, defaults, amount = group
    flat = torch.cat(scores)
    flat_default = None
    if any(d is not None for d in defaults):
        flat_default = torch.cat([torch.ones_like(s, dtype=torch.bool) if d is None else d for s, d in zip(scores, defaults)])
    expected = torch.split(fp.compute_mask(fp.L1Unstructured(amount), flat, flat_default), [s.numel() for s in scores])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_fastselect, "FAST_MIN_KEYS", 1)
        mp.setattr(_fastselect, "_SAMPLE", sample)
        got = _fastselect.joint_l1_kept(scores, defaults, amount)
    if got is None:  # only where this path must step aside
        available = flat.numel() if flat_default is None else int(flat_default.sum())
        nothing_to_prune = count_to_prune(amount, available) == 0
        assert nothing_to_prune or not bool(torch.isfinite(flat).all()) or sample == 16
        return
    assert [m.shape for m in got] == [s.shape for s in scores]
    for g_, e in zip(got, expected):
        assert torch.equal(g_, e)


def test_global_fast_path_equals_torch_on_a_large_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model above the fast-path size (float64: no ties), two global rounds."""
    import torch.nn.utils.prune as tprune
    from torch import nn

    calls: list[int] = []
    original = _fastselect.joint_l1_kept

    def spy(*args: object) -> list[torch.Tensor] | None:
        result = original(*args)  # type: ignore[arg-type]
        calls.append(result is not None)
        return result

    monkeypatch.setattr(fp._global, "joint_l1_kept", spy)
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
