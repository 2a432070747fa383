"""Global structured groups (funcprune._plans._global_structured): channels of several tensors ranked together."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
import torch
from _models import same_masks
from hypothesis import given

import funcprune as fp
from funcprune import GlobalStructuredPlan, global_structured
from funcprune._plans._global_structured import Normalize

Tensor = torch.Tensor


def rows(t: Tensor, dim: int) -> Tensor:
    """``t`` as one row per channel along ``dim``."""
    moved = t.movedim(dim % t.dim(), 0)
    return moved.reshape(moved.shape[0], -1)


def kept_channels(mask: Tensor, dim: int) -> Tensor:
    """Flags of the channels not entirely pruned (torch's fold rule)."""
    return rows(mask, dim).any(1)


def pruned_channel_count(masks: dict[str, Tensor], dim: int) -> int:
    return sum(int((~kept_channels(m, dim)).sum()) for m in masks.values())


def reference(
    tensors: list[Tensor],
    k: int,
    *,
    n: float = 2,
    dim: int = 0,
    normalize: Normalize = None,
    earlier: list[Tensor] | None = None,
) -> list[list[bool]]:
    """Kept channels by hand: norms concatenated, a stable argsort, the ``k`` first go."""
    norms, eligible = [], []
    for i, t in enumerate(tensors):
        mask = None if earlier is None else earlier[i]
        scored = t if mask is None else t * mask
        v = torch.linalg.vector_norm(rows(scored, dim), ord=n, dim=1)
        alive = torch.ones(v.shape, dtype=torch.bool) if mask is None else kept_channels(mask, dim)
        if normalize == "mean":
            v = v / v[alive].mean()
        elif normalize == "max":
            v = v / v[alive].max()
        norms.append(v)
        eligible.append(alive)
    flat, alive = torch.cat(norms), torch.cat(eligible)
    order = [int(i) for i in torch.argsort(flat, stable=True) if alive[i]]
    kept = alive.clone()
    kept[order[:k]] = False
    return [p.tolist() for p in torch.split(kept, [len(v) for v in norms])]


def channels_of(masks: dict[str, Tensor], dim: int = 0) -> list[list[bool]]:
    out = []
    for mask in masks.values():
        flags = rows(mask, dim)
        assert torch.equal(flags.any(1), flags.all(1)), "a channel is partly pruned"
        out.append(flags.all(1).tolist())
    return out


def group(seed: int = 0) -> dict[str, Tensor]:
    """A Conv 4-D weight, a Linear 2-D one and a 3-D one, with distinct channel norms."""
    g = torch.Generator().manual_seed(seed)
    return {
        "conv.weight": torch.randn(6, 3, 2, 2, generator=g),
        "fc.weight": torch.randn(5, 8, generator=g),
        "seq.weight": torch.randn(4, 2, 3, generator=g),
    }


# --- the ranking ----------------------------------------------------------------


@pytest.mark.parametrize("amount", [0, 1, 4, 9, 15, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("n", [1, 2, math.inf])
def test_equals_a_hand_reference_over_tensors_of_different_ranks(amount: float, n: float) -> None:
    params = group()
    masks = global_structured(list(params), fp.LnStructured(amount, n=n, dim=0))(params)
    k = amount if isinstance(amount, int) else round(amount * 15)
    assert channels_of(masks) == reference(list(params.values()), k, n=n)
    assert pruned_channel_count(masks, 0) == k
    assert all(m.dtype == torch.bool and m.shape == params[k].shape for k, m in masks.items())


def test_negative_dims_index_each_tensor_from_its_own_end() -> None:
    params = group(1)
    masks = global_structured(["*"], fp.LnStructured(5, n=2, dim=-1))(params)
    assert channels_of(masks, -1) == reference(list(params.values()), 5, dim=-1)
    assert [len(c) for c in channels_of(masks, -1)] == [2, 8, 3]


@pytest.mark.parametrize(
    "spec",
    [fp.LnStructured(2, n=2, dim=0), fp.LnStructured(0.4, n=1, dim=1), fp.LnStructured(0.5, n="fro", dim=-1),
     fp.LnStructured(1, n=math.inf, dim=2), fp.LnStructured(sparsity=0.6, n=2, dim=1)],
)  # fmt: skip
def test_one_tensor_equals_ln_structured(spec: fp.LnStructured) -> None:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(4, 5, 3, generator=g)
    earlier = torch.rand(4, 5, 3, generator=g) > 0.3
    earlier[:, 1] = False  # a whole channel along dim 1 pruned before
    for mask in (None, earlier):
        masks = None if mask is None else {"w": mask}
        ours = global_structured(["w"], spec)({"w": w}, masks)["w"]
        assert torch.equal(ours, fp.compute_mask(spec, w if mask is None else w * mask, mask))


def test_ties_go_to_the_lower_global_channel_index() -> None:
    params = {"a": torch.tensor([[2.0, 0.0], [1.0, 0.0]]), "b": torch.tensor([[1.0, 0.0], [2.0, 0.0]])}
    plan = global_structured(["a", "b"], fp.LnStructured(1, n=1, dim=0))
    assert channels_of(plan(params)) == [[True, False], [True, True]]
    assert channels_of(global_structured(["b", "a"], fp.LnStructured(1, n=1, dim=0))(params)) == [
        [True, True], [False, True]
    ]  # listed order decides, not the order of params  # fmt: skip
    equal = {"a": torch.ones(3, 2), "b": torch.ones(2, 2)}
    masks = global_structured(["*"], fp.LnStructured(4, n=2, dim=0))(equal)
    assert channels_of(masks) == [[False, False, False], [False, True]]


def test_nan_norms_are_pruned_last() -> None:
    params = {"a": torch.tensor([[math.nan, 1.0], [1.0, 1.0]]), "b": torch.tensor([[5.0, 5.0], [0.5, 0.0]])}
    masks = global_structured(["a", "b"], fp.LnStructured(3, n=2, dim=0))(params)
    assert channels_of(masks) == [[True, False], [False, False]]
    mean = global_structured(["a", "b"], fp.LnStructured(2, n=2, dim=0), normalize="mean")(params)
    # a's mean leaves the NaN out: sqrt(2) / sqrt(2) = 1; b: 0.5 / 3.75 < 7.07 / 3.75
    assert channels_of(mean) == [[True, False], [True, False]]


def test_scores_given_to_the_call_rank_the_channels() -> None:
    params = group(2)
    scores = {
        name: torch.arange(p.numel(), 0, -1, dtype=torch.float32).reshape(p.shape)
        for name, p in params.items()
    }
    plan = global_structured(list(params), fp.LnStructured(7, n=1, dim=0))
    masks = plan(params, scores=scores)
    assert channels_of(masks) == reference(list(scores.values()), 7, n=1)
    assert not same_masks(masks, plan(params))


def test_inputs_are_left_untouched_and_other_masks_pass_through() -> None:
    params = group(4)
    before = {n: p.clone() for n, p in params.items()}
    other = {"bias": torch.tensor([True, False])}
    params["bias"] = torch.ones(2)
    masks = global_structured(["*.weight"], fp.LnStructured(0.5, n=2, dim=0))(params, other)
    assert all(torch.equal(params[n], before[n]) for n in before)
    assert torch.equal(masks["bias"], other["bias"]) and masks["bias"] is not other["bias"]
    assert list(masks) == ["conv.weight", "fc.weight", "seq.weight", "bias"]


# --- channels are units (issue 37) -------------------------------------------------


def one_member_groups(params: dict[str, Tensor], dim: int) -> fp.Structure:
    """Each tensor's channels along ``dim`` as one unit group: what global_structured ranks."""
    return fp.Structure({
        name: fp.UnitGroup("channels", p.shape[dim], (fp.Member(name, dim % p.dim(), 1),)) for name, p in params.items()
    })  # fmt: skip


def test_channels_are_ranked_by_float64_norms_as_units_are() -> None:
    # Both channels' float32 norms are 1.0 (1 + 2**-40 rounds to 1): float32 keys tie and the lower
    # channel would go; the units' float64 keys see channel 1 as the smaller, and it goes.
    params = {"w": torch.tensor([[1.0, 2.0**-20], [1.0, 0.0], [3.0, 0.0]])}
    assert torch.norm(params["w"][0]) == torch.norm(params["w"][1])  # tied in float32
    spec = fp.LnStructured(1, n=2, dim=0)
    masks = global_structured(["w"], spec)(params)
    assert channels_of(masks) == [[True, False, True]]
    assert same_masks(masks, fp.structured(one_member_groups(params, 0), spec)(params))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("normalize", [None, "mean", "max"])
@pytest.mark.parametrize("n", [1, 2, 0.5, math.inf, "fro"])
def test_equals_structured_over_one_member_channel_groups(seed: int, normalize: Normalize, n: fp.NormOrder) -> None:
    g = torch.Generator().manual_seed(seed)
    params = {"a": torch.randn(6, 4, generator=g), "b": torch.randn(5, 3, 2, generator=g), "c": torch.randn(4, 7, generator=g)}
    earlier = {"b": torch.rand(5, 3, 2, generator=g) > 0.2, "c": torch.rand(4, 7, generator=g) > 0.5}
    spec = fp.LnStructured(sparsity=0.3, n=n, dim=0)
    masks = global_structured(list(params), spec, normalize=normalize)(params, earlier)
    assert all(kept_channels(m, 0).any() for m in masks.values())  # structured would keep one of each group
    units = fp.structured(one_member_groups(params, 0), spec, normalize=normalize)(params, earlier)
    assert same_masks(masks, units)


def test_a_nuclear_norm_ranks_each_channels_matrix() -> None:
    g = torch.Generator().manual_seed(13)
    params = {"a": torch.randn(5, 3, 4, generator=g), "b": torch.randn(3, 2, 6, generator=g) * 2}
    masks = global_structured(["a", "b"], fp.LnStructured(3, n="nuc", dim=0))(params)
    norms = torch.cat([torch.linalg.matrix_norm(p, ord="nuc") for p in params.values()])
    gone = set(torch.argsort(norms, stable=True)[:3].tolist())
    assert sum(channels_of(masks), []) == [i not in gone for i in range(8)]
    inf = dict(params, a=params["a"].clone())
    inf["a"][0, 0, 0] = math.inf  # its SVD gives NaN: ranked last, as a NaN norm
    masks = global_structured(["a", "b"], fp.LnStructured(7, n="nuc", dim=0))(inf)
    assert sum(channels_of(masks), []) == [True] + [False] * 7


def test_a_tensor_without_channels_keeps_its_earlier_mask() -> None:
    params = {"a": torch.randn(0, 3), "b": torch.randn(4, 3)}
    earlier = {"a": torch.ones(0, 3, dtype=torch.bool)}
    masks = global_structured(["a", "b"], fp.LnStructured(2, n=2, dim=0))(params, earlier)
    assert masks["a"].shape == (0, 3) and masks["a"].dtype == torch.bool and masks["a"] is not earlier["a"]
    assert pruned_channel_count({"b": masks["b"]}, 0) == 2
    with pytest.raises(RuntimeError, match="cannot compute the inf norm on the dimension 1"):
        global_structured(["b", "e"], fp.LnStructured(1, n=math.inf, dim=0))({"b": params["b"], "e": torch.ones(3, 0)})


# --- earlier masks, sparsity= ------------------------------------------------------


def test_earlier_masks_fraction_of_unpruned_channels_and_never_revive() -> None:
    params = group(5)
    g = torch.Generator().manual_seed(0)
    earlier = {n: torch.rand(p.shape, generator=g) > 0.2 for n, p in params.items()}
    earlier["conv.weight"][1] = False  # channels pruned before
    earlier["fc.weight"][3] = False
    masks = global_structured(list(params), fp.LnStructured(0.5, n=2, dim=0))(params, earlier)
    assert pruned_channel_count(masks, 0) == 2 + round(0.5 * 13)
    expected = reference(list(params.values()), round(0.5 * 13), earlier=list(earlier.values()))
    for (name, mask), keep in zip(masks.items(), expected, strict=True):
        channel = torch.tensor(keep).reshape(-1, *[1] * (mask.dim() - 1))
        assert torch.equal(mask, earlier[name] & channel)  # holes stay holes in kept channels


def test_sparsity_is_cumulative_over_the_groups_channels() -> None:
    params = group(6)
    names = list(params)
    quarter = global_structured(names, fp.LnStructured(sparsity=0.25, n=2, dim=0))
    half = global_structured(names, fp.LnStructured(sparsity=0.5, n=2, dim=0))
    first = quarter(params)
    assert pruned_channel_count(first, 0) == round(0.25 * 15)
    second = half(params, first)
    assert pruned_channel_count(second, 0) == round(0.5 * 15)
    assert all(not bool((second[n] & ~first[n]).any()) for n in names)
    assert same_masks(quarter(params, second), second)  # already there: nothing more, nothing revived
    assert channels_of(second) == reference(list(params.values()), round(0.5 * 15))


def test_an_int_amount_counts_the_groups_unpruned_channels() -> None:
    params = group(7)
    earlier = {"fc.weight": torch.ones(5, 8, dtype=torch.bool)}
    earlier["fc.weight"][:2] = False
    masks = global_structured(list(params), fp.LnStructured(13, n=2, dim=0))(params, earlier)
    assert pruned_channel_count(masks, 0) == 15
    with pytest.raises(ValueError, match=r"global_structured: cannot prune the 15 channels of .* "
                       r"amount=14 should be smaller than the number of parameters to prune=13"):  # fmt: skip
        global_structured(list(params), fp.LnStructured(14, n=2, dim=0))(params, earlier)


# --- normalize ----------------------------------------------------------------------


@pytest.mark.parametrize("normalize", ["mean", "max"])
def test_normalize_lets_layers_of_different_scale_compete(normalize: Normalize) -> None:
    g = torch.Generator().manual_seed(8)
    params = {"wide.weight": torch.randn(8, 512, generator=g), "narrow.weight": torch.randn(8, 4, generator=g)}
    spec = fp.LnStructured(8, n=2, dim=0)
    raw = global_structured(list(params), spec)(params)
    assert not bool(raw["narrow.weight"].any())  # raw norms: the small fan-in loses every channel
    masks = global_structured(list(params), spec, normalize=normalize)(params)
    assert all(bool(m.any()) and not bool(m.all()) for m in masks.values())
    assert channels_of(masks) == reference(list(params.values()), 8, normalize=normalize)


@pytest.mark.parametrize("normalize", ["mean", "max"])
def test_normalize_counts_only_the_unpruned_channels(normalize: Normalize) -> None:
    params = group(9)
    earlier = {n: torch.ones(p.shape, dtype=torch.bool) for n, p in params.items()}
    earlier["fc.weight"][0] = False
    earlier["conv.weight"][2:4] = False
    plan = global_structured(list(params), fp.LnStructured(4, n=2, dim=0), normalize=normalize)
    masks = plan(params, earlier)
    expected = reference(list(params.values()), 4, normalize=normalize, earlier=list(earlier.values()))
    assert channels_of(masks) == expected


def test_normalize_keeps_an_all_zero_tensor_at_zero() -> None:
    params = {"a": torch.zeros(3, 2), "b": torch.tensor([[1.0, 1.0], [3.0, 0.0]])}
    masks = global_structured(["a", "b"], fp.LnStructured(4, n=2, dim=0), normalize="mean")(params)
    assert channels_of(masks) == [[False, False, False], [False, True]]


# --- RandomStructured ---------------------------------------------------------------


def test_random_prunes_an_exact_count_reproducibly() -> None:
    params = group(10)
    plan = global_structured(list(params), fp.RandomStructured(6, dim=0))
    masks = [plan(params, generator=torch.Generator().manual_seed(s)) for s in (0, 0, 1, 2)]
    assert all(pruned_channel_count(m, 0) == 6 for m in masks)
    assert same_masks(masks[0], masks[1])
    assert not (same_masks(masks[0], masks[2]) and same_masks(masks[0], masks[3]))
    torch.manual_seed(5)
    first = plan(params)
    torch.manual_seed(5)
    assert same_masks(first, plan(params))
    channels_of(first)  # whole channels


def test_random_draws_uniformly_over_the_group_and_respects_earlier_masks() -> None:
    params = {"a": torch.randn(2, 3), "b": torch.randn(6, 2)}
    earlier = {"b": torch.ones(6, 2, dtype=torch.bool)}
    earlier["b"][5] = False
    plan = global_structured(["a", "b"], fp.RandomStructured(1, dim=0))
    g = torch.Generator().manual_seed(0)
    hits = torch.zeros(8)
    for _ in range(300):
        masks = plan(params, earlier, generator=g)
        assert pruned_channel_count(masks, 0) == 2
        hits += ~torch.cat([kept_channels(masks["a"], 0), kept_channels(masks["b"], 0)])
    assert hits[7] == 300  # pruned before, never revived
    assert bool(((hits[:7] / 300 - 1 / 7).abs() < 0.08).all())  # 1 / 7 each, binomial sd 0.02


# --- transforms ----------------------------------------------------------------------


def test_vmap_equals_a_loop_with_batched_earlier_masks() -> None:
    g = torch.Generator().manual_seed(11)
    params = {"w": torch.randn(3, 4, 5, generator=g), "c": torch.randn(3, 6, 2, 2, 2, generator=g)}
    earlier = {"w": torch.rand(3, 4, 5, generator=g) > 0.3}
    earlier["w"][1, 2] = False
    for spec, normalize in [
        (fp.LnStructured(0.4, n=2, dim=0), "mean"),
        (fp.LnStructured(3, n=1, dim=0), "max"),
        (fp.LnStructured(sparsity=0.5, n=2, dim=0), None),
    ]:
        plan = global_structured(["w", "c"], spec, normalize=normalize)  # type: ignore[arg-type]
        batched = torch.func.vmap(lambda p, m: plan(p, m))(params, earlier)
        for i in range(3):
            single = plan({k: v[i] for k, v in params.items()}, {"w": earlier["w"][i]})
            assert same_masks({k: v[i] for k, v in batched.items()}, single)


def test_vmap_random_follows_the_randomness_flag() -> None:
    params = {"w": torch.randn(4, 8, 3), "c": torch.randn(4, 6, 2, 2)}
    plan = global_structured(["*"], fp.RandomStructured(5, dim=0))
    different = torch.func.vmap(lambda p: plan(p), randomness="different")(params)
    same = torch.func.vmap(lambda p: plan(p), randomness="same")(params)
    for masks in (different, same):
        for i in range(4):
            assert pruned_channel_count({k: v[i] for k, v in masks.items()}, 0) == 5
    assert not all(torch.equal(m[0], m[i]) for m in different.values() for i in range(1, 4))
    assert all(torch.equal(m[0], m[i]) for m in same.values() for i in range(4))


def test_compiles_with_fullgraph() -> None:
    params = group(12)
    earlier = {"fc.weight": torch.rand(5, 8, generator=torch.Generator().manual_seed(0)) > 0.5}
    plan = fp.compose(
        global_structured(["*.weight"], fp.LnStructured(0.3, n=2, dim=0), normalize="mean"),
        fp.global_unstructured(["*.weight"], fp.L1Unstructured(0.2)),
    )
    compiled = torch.compile(lambda p, m: plan(p, m), fullgraph=True, backend="aot_eager")
    assert same_masks(compiled(params, earlier), plan(params, earlier))


# --- properties -------------------------------------------------------------------------


TARGETS = st.one_of(
    st.integers(0, 12).map(lambda a: ("amount", a)),
    st.floats(0.0, 1.0).map(lambda a: ("amount", a)),
    st.floats(0.0, 1.0).map(lambda s: ("sparsity", s)),
)


@given(
    shapes=st.lists(st.lists(st.integers(1, 4), min_size=2, max_size=4), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
    dim=st.sampled_from([0, 1, -1]),
    target=TARGETS,
    random=st.booleans(),
    normalize=st.sampled_from([None, "mean", "max"]),
)
def test_exact_count_whole_channels_never_revive(
    shapes: list[list[int]], seed: int, dim: int, target: tuple[str, float], random: bool,
    normalize: Normalize,
) -> None:  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    params = {f"p{i}": torch.randn(s, generator=g) for i, s in enumerate(shapes)}
    earlier = {n: torch.rand(p.shape, generator=g) > 0.3 for n, p in params.items()}
    total = sum(p.shape[dim] for p in params.values())
    before = pruned_channel_count(earlier, dim)
    kind, value = target
    if kind == "sparsity":
        expected = max(before, round(value * total)) - before
    else:
        expected = value if isinstance(value, int) else round(value * (total - before))
    spec: fp.LnStructured | fp.RandomStructured
    if random:
        spec, normalize = fp.RandomStructured(**{kind: value}, dim=dim), None
    else:
        spec = fp.LnStructured(**{kind: value}, n=2, dim=dim)
    plan = global_structured(list(params), spec, normalize=normalize)
    if isinstance(value, int) and value > total - before:
        with pytest.raises(ValueError, match="global_structured: cannot prune"):
            plan(params, earlier, generator=g)
        return
    masks = plan(params, earlier, generator=g)
    assert pruned_channel_count(masks, dim) - before == expected
    for name, mask in masks.items():
        assert not bool((mask & ~earlier[name]).any())  # never revives
        d = dim % mask.dim()
        channel = kept_channels(mask, dim).reshape([-1 if i == d else 1 for i in range(mask.dim())])
        assert torch.equal(mask, earlier[name] & channel)  # whole channels, holes kept


# --- construction and errors --------------------------------------------------------------


def test_plan_is_frozen_and_reads_like_the_call() -> None:
    plan = global_structured(["conv*.weight", "fc.weight"], fp.LnStructured(0.5, n=2, dim=0), normalize="mean")
    assert isinstance(plan, GlobalStructuredPlan) and plan.names == ("conv*.weight", "fc.weight")
    assert repr(plan) == (
        "global_structured(['conv*.weight', 'fc.weight'], LnStructured(amount=0.5, n=2, dim=0), "
        "normalize='mean')"
    )
    assert repr(global_structured(["w"], fp.RandomStructured(1))) == (
        "global_structured(['w'], RandomStructured(amount=1, dim=-1))"
    )
    with pytest.raises(AttributeError):
        plan.normalize = None  # type: ignore[misc]
    same = global_structured(("conv*.weight", "fc.weight"), fp.LnStructured(0.5, n=2, dim=0), normalize="mean")
    assert plan == same and hash(plan) == hash(same)


@pytest.mark.parametrize(
    "spec", [fp.L1Unstructured(0.2), fp.RandomUnstructured(2), fp.CustomFromMask(torch.ones(2)),
             fp.chain(fp.LnStructured(1, n=2)), "LnStructured", [fp.LnStructured(1, n=2)]]
)  # fmt: skip
def test_refuses_other_specs(spec: object) -> None:
    with pytest.raises(TypeError, match="global_structured: spec must be an LnStructured or RandomStructured"
                       " spec.*use global_unstructured for unstructured specs"):  # fmt: skip
        global_structured(["w"], spec)  # type: ignore[arg-type]


def test_refuses_bad_normalize() -> None:
    spec = fp.LnStructured(1, n=2)
    with pytest.raises(ValueError, match=r"normalize must be None, 'mean' or 'max', got 'sum'"):
        global_structured(["w"], spec, normalize="sum")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"normalize must be None, 'mean' or 'max', got 1 of type int"):
        global_structured(["w"], spec, normalize=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"normalize='mean' scales channel norms.*leave normalize=None"):
        global_structured(["w"], fp.RandomStructured(1), normalize="mean")


@pytest.mark.parametrize("names", ["w", [], [""], [3], None])
def test_refuses_bad_names(names: object) -> None:
    with pytest.raises(TypeError, match="global_structured: names must be a"):
        global_structured(names, fp.LnStructured(1, n=2))  # type: ignore[arg-type]


def test_errors_at_the_call_name_the_tensor() -> None:
    params = {"conv.weight": torch.randn(4, 3, 2, 2), "fc.weight": torch.randn(4, 6), "fc.bias": torch.randn(4)}
    with pytest.raises(IndexError, match=r"global_structured: cannot prune 'fc.weight' .*Invalid index 2"):
        global_structured(["*.weight"], fp.LnStructured(1, n=2, dim=2))(params)
    with pytest.raises(IndexError, match=r"'fc.weight' .*dim=-3 is out of range"):
        global_structured(["*.weight"], fp.LnStructured(1, n=2, dim=-3))(params)
    with pytest.raises(ValueError, match=r"'fc.bias' .*Structured pruning can only be applied"):
        global_structured(["fc.*"], fp.RandomStructured(1, dim=0))(params)
    with pytest.raises(fp.UnknownNameError, match="global_structured: name 'fc2.weight' matches no parameter"):
        global_structured(["fc2.weight"], fp.LnStructured(1, n=2))(params)
    with pytest.raises(ValueError, match=r"the 8 channels of \['conv.weight', 'fc.weight'\] jointly.*amount=9"):
        global_structured(["*.weight"], fp.LnStructured(9, n=2, dim=0))(params)
    with pytest.raises(ValueError, match=r"'fc.weight' .*n='nuc' needs scores with exactly 3 dims"):
        global_structured(["fc.weight"], fp.LnStructured(1, n="nuc", dim=0))(params)
    with pytest.raises(TypeError, match=r"'w' .*scores must be a floating-point tensor, got dtype torch.int64"):
        global_structured(["w"], fp.LnStructured(1, n=2, dim=0))({"w": torch.ones(2, 2, dtype=torch.int64)})
