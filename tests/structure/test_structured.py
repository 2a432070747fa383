"""``fp.structured``: plans over units, against a brute-force reference, under vmap, and their errors."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
import torch
from torch import nn
from hypothesis import given
from hypothesis import strategies as st

import funcprune as fp

Tensor = torch.Tensor


def fused() -> tuple[fp.Structure, dict[str, Tensor]]:
    """An MLP of 5 channels and a fused attention of 3 heads of 2 (q, k, v parts, as GPT-2's c_attn)."""
    g = torch.Generator().manual_seed(0)
    params = {
        "up": torch.randn(5, 4, generator=g), "up_b": torch.randn(5, generator=g),
        "down": torch.randn(4, 5, generator=g),
        "qkv": torch.randn(4, 18, generator=g), "out": torch.randn(6, 4, generator=g),
    }  # fmt: skip
    structure = fp.Structure({
        "mlp": fp.UnitGroup("channels", 5, (fp.Member("up", 0, 1), fp.Member("up_b", 0, 1), fp.Member("down", 1, 1))),
        "attn": fp.UnitGroup("heads", 3, tuple(fp.Member("qkv", 1, 2, start) for start in (0, 6, 12))
                             + (fp.Member("out", 0, 2),)),
    })  # fmt: skip
    return structure, params


def unit_entries(group: fp.UnitGroup, unit: int, tensors: Mapping[str, Tensor]) -> Tensor:
    """All entries of one unit, concatenated (the reference's way of scoring it)."""
    parts = [tensors[m.name].index_select(m.dim, torch.tensor(list(m.indices(unit)))).flatten() for m in group.members]
    return torch.cat(parts)


def reference(
    structure: fp.Structure, params: Mapping[str, Tensor], count: int, n: float, normalize: str | None
) -> dict[str, Tensor]:
    """The ``count`` units of smallest ``n``-norm (ties to the earlier unit) cleared, by loops; each
    group's largest unit stays (shrink keeps a channel of each layer), and too large a count raises."""
    keys: list[tuple[float, int, str, int]] = []
    position = 0
    for name, group in structure.items():
        norms = [float(torch.linalg.vector_norm(unit_entries(group, u, params).double(), ord=n)) for u in range(group.size)]
        scale = 1.0
        if normalize == "mean":
            scale = sum(norms) / len(norms)
        elif normalize == "max":
            scale = max(norms)
        for u, norm in enumerate(norms):
            keys.append((norm / scale if scale > 0 else norm, position, name, u))
            position += 1
    order = sorted(keys)
    last = {name: max(k for k in order if k[2] == name) for name in structure}
    candidates = [k for k in order if k != last[k[2]]]
    if count > len(candidates):
        raise ValueError(f"at most {len(candidates)} can go")
    pruned = candidates[:count]
    masks = {m.name: torch.ones_like(params[m.name], dtype=torch.bool) for g in structure.values() for m in g.members}
    for _, _, name, u in pruned:
        for m in structure[name].members:
            masks[m.name].index_fill_(m.dim, torch.tensor(list(m.indices(u))), False)
    return masks


@given(
    seed=st.integers(0, 2**31 - 1), count=st.integers(0, 8), n=st.sampled_from([1.0, 2.0, 3.0, math.inf]),
    normalize=st.sampled_from([None, "mean", "max"]),
)  # fmt: skip
def test_units_go_by_their_norm_over_every_member_as_the_loops_say(
    seed: int, count: int, n: float, normalize: str | None
) -> None:
    structure, _ = fused()
    g = torch.Generator().manual_seed(seed)
    params = {k: torch.randn(v.shape, generator=g).round(decimals=1) for k, v in fused()[1].items()}
    plan = fp.structured(structure, fp.LnStructured(count, n=n), normalize=normalize)  # type: ignore[arg-type]
    if count > 6:  # 8 units in 2 groups, each keeping one
        with pytest.raises(ValueError, match="at most 6 can go"):
            reference(structure, params, count, n, normalize)
        with pytest.raises(ValueError, match=f"{count} of the 8 units left would go, but each group keeps one"):
            plan(params)
        return
    masks = plan(params)
    expected = reference(structure, params, count, n, normalize)
    assert masks.keys() == expected.keys()
    for name in expected:
        assert torch.equal(masks[name], expected[name]), name


def test_the_count_is_of_units_and_every_pruned_unit_is_whole() -> None:
    structure, params = fused()
    masks = fp.structured(structure, fp.LnStructured(0.5, n=2))(params)  # round(0.5 * 8) = 4 units
    pruned_channels = int((~masks["up"].all(1)).sum())
    pruned_heads = int((~masks["out"].all(1)).sum()) // 2
    assert pruned_channels + pruned_heads == 4
    for m in structure["attn"].members:  # each head all-or-nothing in every member
        kept = fp_units(masks[m.name], m, 3)
        assert kept == fp_units(masks["out"], structure["attn"].members[-1], 3)


def fp_units(mask: Tensor, member: fp.Member, size: int) -> list[bool]:
    """Whether each unit's slice is kept (asserting it is all-or-nothing)."""
    out = []
    for u in range(size):
        part = mask.index_select(member.dim, torch.tensor(list(member.indices(u))))
        assert bool(part.all()) or not bool(part.any())
        out.append(bool(part.all()))
    return out


def test_group_scope_applies_the_amount_in_each_group() -> None:
    structure, params = fused()
    masks = fp.structured(structure, fp.LnStructured(0.4, n=2), scope="group")(params)
    assert int((~masks["up"].all(1)).sum()) == round(0.4 * 5)
    assert int((~masks["out"].all(1)).sum()) == 2 * round(0.4 * 3)
    for name, group in structure.items():  # the same as one plan per group
        alone = fp.structured(fp.Structure({name: group}), fp.LnStructured(0.4, n=2))(params)
        for key, mask in alone.items():
            assert torch.equal(mask, masks[key]), key


def test_kinds_select_the_groups() -> None:
    structure, params = fused()
    masks = fp.structured(structure, fp.LnStructured(2, n=1), kinds="heads")(params)
    assert set(masks) == {"qkv", "out"}
    assert int((~masks["out"].all(1)).sum()) == 4
    both = fp.structured(structure, fp.LnStructured(2, n=1), kinds=["heads", "channels"])(params)
    assert set(both) == {"up", "up_b", "down", "qkv", "out"}


def test_sparsity_counts_earlier_units_and_nothing_is_revived() -> None:
    structure, params = fused()
    earlier = {"up": torch.ones(5, 4, dtype=torch.bool), "up_b": torch.ones(5, dtype=torch.bool),
               "down": torch.ones(4, 5, dtype=torch.bool), "qkv": torch.rand(4, 18) > 0.2}  # fmt: skip
    earlier["up"][3], earlier["up_b"][3], earlier["down"][:, 3] = False, False, False  # channel 3: not eligible again
    masks = fp.structured(structure, fp.LnStructured(sparsity=0.5, n=2))(params, earlier)
    units = int((~masks["down"].all(0)).sum()) + int((~masks["out"].all(1)).sum()) // 2
    assert units == 4 and not bool(masks["down"][:, 3].any())
    for name, mask in earlier.items():
        assert not bool((masks[name] & ~mask).any()), name


def test_given_scores_rank_the_units() -> None:
    structure, params = fused()
    scores = {name: torch.ones_like(t) for name, t in params.items()}
    scores["down"] = torch.zeros_like(params["down"])
    scores["up"] = torch.zeros_like(params["up"])
    scores["up_b"] = torch.zeros_like(params["up_b"])
    scores["up"][4] = 1.0
    masks = fp.structured(structure, fp.LnStructured(4, n=1), kinds="channels")(params, scores=scores)
    assert masks["up"].all(1).tolist() == [False, False, False, False, True]


def test_random_units_are_reproducible_and_follow_vmap_randomness() -> None:
    structure, params = fused()
    plan = fp.structured(structure, fp.RandomStructured(3))
    first = plan(params, generator=torch.Generator().manual_seed(5))
    again = plan(params, generator=torch.Generator().manual_seed(5))
    assert all(torch.equal(first[k], again[k]) for k in first)
    batched = {k: v.expand(4, *v.shape) for k, v in params.items()}
    same = torch.func.vmap(plan, randomness="same")(batched)
    different = torch.func.vmap(plan, randomness="different")(batched)
    assert all(torch.equal(m[0], m[i]) for m in same.values() for i in range(4))
    assert not all(torch.equal(m[0], m[i]) for m in different.values() for i in range(1, 4))


def test_vmap_equals_a_loop() -> None:
    structure, params = fused()
    g = torch.Generator().manual_seed(3)
    batched = {k: torch.randn(3, *v.shape, generator=g) for k, v in params.items()}
    earlier = {"qkv": torch.rand(3, 4, 18, generator=g) > 0.1}
    plan = fp.structured(structure, fp.LnStructured(0.5, n=2), normalize="mean")
    out = torch.func.vmap(lambda p, m: plan(p, m))(batched, earlier)
    for i in range(3):
        single = plan({k: v[i] for k, v in batched.items()}, {"qkv": earlier["qkv"][i]})
        assert all(torch.equal(out[k][i], single[k]) for k in single)


def test_nan_units_go_last() -> None:
    structure, params = fused()
    params = dict(params, up=params["up"].clone())
    params["up"][0, 0] = float("nan")
    masks = fp.structured(structure, fp.LnStructured(4, n=2), kinds="channels")(params)
    assert masks["up"][0].all()


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda s: fp.structured({"mlp": None}, fp.LnStructured(1, n=2)), TypeError, "structure must be a funcprune.Structure"),  # type: ignore[arg-type]
        (lambda s: fp.structured(s, fp.L1Unstructured(0.5)), TypeError, "LnStructured or RandomStructured"),  # type: ignore[arg-type]
        (lambda s: fp.structured(s, fp.LnStructured(1, n="nuc")), ValueError, "nuclear norm"),
        (lambda s: fp.structured(s, fp.LnStructured(1, n=2), kinds="experts"), ValueError, r"no unit group of kinds \['experts'\]; it has \['channels', 'heads'\]"),
        (lambda s: fp.structured(s, fp.LnStructured(1, n=2), kinds="neurons"), ValueError, "kinds must be among"),  # type: ignore[arg-type]
        (lambda s: fp.structured(s, fp.LnStructured(1, n=2), kinds=3), TypeError, "kinds must be a kind"),  # type: ignore[arg-type]
        (lambda s: fp.structured(s, fp.LnStructured(1, n=2), scope="layer"), ValueError, "scope must be 'global' or 'group'"),  # type: ignore[arg-type]
        (lambda s: fp.structured(s, fp.LnStructured(1, n=2), normalize="sum"), ValueError, "normalize must be None"),  # type: ignore[arg-type]
        (lambda s: fp.structured(s, fp.RandomStructured(1), normalize="mean"), ValueError, "draws units at random"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_when_the_plan_is_built(call: object, error: type[Exception], match: str) -> None:
    structure, _ = fused()
    with pytest.raises(error, match=match):
        call(structure)  # type: ignore[operator]


def test_members_that_do_not_fit_the_params_are_refused_when_called() -> None:
    structure, params = fused()
    plan = fp.structured(structure, fp.LnStructured(1, n=2))
    with pytest.raises(KeyError, match="group 'attn' spans 'qkv', which params do not hold"):
        plan({k: v for k, v in params.items() if k != "qkv"})
    with pytest.raises(ValueError, match=r"group 'attn' spans 3 units of 2 along dim 1 of 'qkv' from 12, but its shape is \(4, 16\)"):
        plan(dict(params, qkv=torch.randn(4, 16)))
    with pytest.raises(ValueError, match="cannot prune the 8 units of 2 groups jointly with LnStructured"):
        plan = fp.structured(structure, fp.LnStructured(9, n=2))
        plan(params)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: fp.Member("", 0, 1), TypeError, "name must be a parameter name"),
        (lambda: fp.Member("w", -1, 1), ValueError, "dim must be at least 0"),
        (lambda: fp.Member("w", 0, 0), ValueError, "width must be at least 1"),
        (lambda: fp.Member("w", 0, 1.0), TypeError, "width must be an int"),  # type: ignore[arg-type]
        (lambda: fp.UnitGroup("neurons", 2, (fp.Member("w", 0, 1),)), ValueError, "kind must be one of"),  # type: ignore[arg-type]
        (lambda: fp.UnitGroup("channels", 0, (fp.Member("w", 0, 1),)), ValueError, "size must be at least 1"),
        (lambda: fp.UnitGroup("channels", 2, ()), TypeError, "members must be a non-empty tuple"),
        (lambda: fp.UnitGroup("channels", 2, ("w",)), TypeError, "members must be Member values"),  # type: ignore[arg-type]
        (lambda: fp.Structure({"g": "w"}), TypeError, "must map names"),  # type: ignore[dict-item]
    ],
)  # fmt: skip
def test_bad_values_are_refused(make: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        make()  # type: ignore[operator]


def test_a_structure_is_a_read_only_mapping() -> None:
    structure, _ = fused()
    assert list(structure) == ["mlp", "attn"] and len(structure) == 2
    assert structure.of_kinds("heads") == fp.Structure({"attn": structure["attn"]})
    with pytest.raises(TypeError):
        structure.groups["x"] = structure["mlp"]  # type: ignore[index]
    assert repr(structure) == "Structure(mlp: 5 channels, attn: 3 heads)"


def test_compiled_equals_eager() -> None:
    structure, params = fused()
    plan = fp.structured(structure, fp.LnStructured(0.5, n=2), normalize="mean")
    eager, compiled = plan(params), torch.compile(plan)(params)
    assert all(torch.equal(eager[k], compiled[k]) for k in eager)


def test_a_structure_pickles_and_copies() -> None:
    import copy
    import pickle

    structure, _ = fused()
    for again in (pickle.loads(pickle.dumps(structure)), copy.deepcopy(structure), copy.copy(structure)):
        assert again == structure and list(again) == list(structure)


# --- earlier masks over some members only (issue 36, item 1) ---------------------------------------


def mlp_and_rows_pruned() -> tuple[nn.Sequential, dict[str, Tensor], Tensor, dict[str, Tensor]]:
    """An MLP 8 -> 16 -> 4 (float64) and a Plan's masks that prune the rows of 4 hidden channels only."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).double()
    params: dict[str, Tensor] = dict(model.named_parameters())
    rows = fp.Plan({"0.weight": fp.LnStructured(4, n=2, dim=0)})(params)
    return model, params, torch.randn(3, 8, dtype=torch.float64), rows


def test_a_member_without_an_earlier_mask_leaves_its_units_alive() -> None:
    """The rows of 4 channels pruned, but not their biases or the next layer's columns: those
    channels are still alive, so amount 0 changes nothing and a fraction counts all 16."""
    model, params, x, rows = mlp_and_rows_pruned()
    structure = fp.structure(model, x)
    same = fp.structured(structure, fp.LnStructured(0, n=2))(params, rows)
    assert torch.equal(same["0.weight"], rows["0.weight"])
    assert same["0.bias"].all() and same["2.weight"].all()
    with torch.no_grad():
        assert torch.equal(fp.functional_call_masked(model, params, same, (x,)),
                           fp.functional_call_masked(model, params, rows, (x,)))  # fmt: skip
    half = fp.structured(structure, fp.LnStructured(0.5, n=2))(params, rows)
    gone = ~half["2.weight"].any(0)
    assert int(gone.sum()) == 8  # round(0.5 * 16), not 4 + round(0.5 * 12)
    assert torch.equal(~half["0.bias"], gone) and torch.equal(~half["0.weight"].any(1), gone | ~rows["0.weight"].any(1))
    scores = {"0.weight": params["0.weight"] * rows["0.weight"], "0.bias": params["0.bias"], "2.weight": params["2.weight"]}
    unit = torch.cat([scores["0.weight"], scores["0.bias"][:, None], scores["2.weight"].T], 1).double().norm(dim=1)
    assert torch.equal(gone, unit <= unit.sort().values[7])  # the 8 smallest norms of the units as pruned


def test_a_unit_is_dead_only_when_every_member_prunes_it() -> None:
    model, params, x, rows = mlp_and_rows_pruned()
    structure = fp.structure(model, x)
    dead = ~rows["0.weight"].any(1)
    earlier = dict(rows, **{"0.bias": ~dead, "2.weight": (~dead).expand(4, 16).clone()})
    half = fp.structured(structure, fp.LnStructured(0.5, n=2))(params, earlier)
    gone = ~half["2.weight"].any(0)
    assert int(gone.sum()) == 4 + round(0.5 * 12) and bool(gone[dead].all())


# --- each group keeps a unit, as shrink keeps a channel (issue 36, item 3) -----------------------------


def test_each_group_keeps_its_best_unit_and_the_count_stays_exact() -> None:
    structure, params = fused()
    params = dict(params, up=params["up"] * 1e-3, up_b=params["up_b"] * 1e-3, down=params["down"] * 1e-3)
    masks = fp.structured(structure, fp.LnStructured(5, n=2))(params)  # the 5 channels are the 5 smallest units
    kept = fp_units(masks["up"], structure["mlp"].members[0], 5)
    norms = [float(unit_entries(structure["mlp"], u, params).double().norm()) for u in range(5)]
    assert kept == [u == max(range(5), key=norms.__getitem__) for u in range(5)]
    assert fp_units(masks["out"], structure["attn"].members[-1], 3).count(False) == 1  # the next unit goes instead
    group = fp.structured(structure, fp.LnStructured(0.8, n=2), scope="group")(params)  # 4 of 5, 2 of 3
    assert fp_units(group["up"], structure["mlp"].members[0], 5).count(True) == 1
    with pytest.raises(ValueError, match=r"cannot prune the 5 channels of 'mlp' with .*: 5 of the 5 units left would go"):
        fp.structured(structure, fp.LnStructured(1.0, n=2), scope="group")(params)
    with pytest.raises(ValueError, match="each group keeps one of its units .*: at most 6 can go"):
        fp.structured(structure, fp.LnStructured(sparsity=0.9, n=2))(params)
    drawn = fp.structured(structure, fp.RandomStructured(6))(params, generator=torch.Generator().manual_seed(0))
    assert fp_units(drawn["up"], structure["mlp"].members[0], 5).count(True) == 1
    assert fp_units(drawn["out"], structure["attn"].members[-1], 3).count(True) == 1


def test_a_group_left_whole_by_earlier_masks_is_not_protected_again() -> None:
    structure, params = fused()
    earlier = {name: torch.zeros_like(params[name], dtype=torch.bool) for name in ("up", "up_b", "down")}
    masks = fp.structured(structure, fp.LnStructured(2, n=2))(params, earlier)  # the MLP is gone: 2 of 3 heads go
    assert fp_units(masks["out"], structure["attn"].members[-1], 3).count(True) == 1
    assert not masks["up"].any()


def shrink_case(conv: bool) -> tuple[nn.Sequential, Tensor]:
    """A plain CNN or MLP whose first hidden layer is much smaller than the rest: a global units plan
    at 0.5 would prune all of its channels."""
    torch.manual_seed(0)
    if conv:
        model = nn.Sequential(
            nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 6, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 2),
        )  # fmt: skip
        x = torch.randn(2, 3, 5, 5, dtype=torch.float64)
    else:
        model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2))
        x = torch.randn(3, 4, dtype=torch.float64)
    model = model.double().eval()
    with torch.no_grad():  # the first layer's channels, and the next layer's columns that read them, small
        for p in model[0].parameters():
            p.mul_(1e-3)
        second = model[2]
        assert isinstance(second, nn.Linear | nn.Conv2d)
        second.weight.mul_(1e-3)
    return model, x


@pytest.mark.parametrize("conv", [False, True], ids=["mlp", "cnn"])
def test_a_global_units_plan_removes_exactly_what_shrink_removes(conv: bool) -> None:
    """propagate adds nothing to the masks of a units plan, and the shrunk model computes the
    model masked by them (issue 36, item 3: a whole group pruned, shrink kept a channel of it and
    removed the next layer's outputs, bias included, beyond the masks)."""
    import warnings

    model, x = shrink_case(conv)
    params = dict(model.named_parameters())
    structure = fp.structure(model, x)
    masks = fp.structured(structure, fp.LnStructured(0.5, n=2))(params)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        closure = fp.propagate(model, masks, x)
        small = fp.shrink(model, masks, x)
    with torch.no_grad():
        want = fp.functional_call_masked(model, params, masks, (x,))
        torch.testing.assert_close(small(x), want, rtol=1e-10, atol=1e-12)
    assert closure.keys() == masks.keys() and all(torch.equal(closure[k], masks[k]) for k in masks)
    assert not caught, [str(w.message) for w in caught]
    assert fp_units(masks["0.weight"], structure["0"].members[0], 6).count(True) == 1  # the rest of the 6 go
    removed = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in small.parameters())
    assert removed == sum(int((~m).sum()) for m in masks.values())
