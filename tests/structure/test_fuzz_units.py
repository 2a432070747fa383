"""Random units plans against a plain reference (issue 36, "Done when").

Random models (``tests/_random_nets.py``: MLPs and CNNs with residual adds,
concatenations, channel shuffles, chunks, depthwise convolutions and
BatchNorm), their :func:`fp.structure`, and on each a series of random
:func:`fp.structured` plans: random earlier masks (random entries, units
pruned in some members only, units pruned in all), given scores now and
then (NaN among them), ``LnStructured`` of every norm order with a count,
a fraction or ``sparsity=``, ``RandomStructured``, both scopes and every
``normalize``. The reference below is written with plain loops over units
in float64 (``math.fsum``): a unit is dead only when every member's
earlier mask prunes all of its slice (a member without one leaves it
alive); the count is taken over the units left; each group keeps the unit
it would lose last; the rest go by key, NaN last, ties to the earlier
unit; too large a count raises. Deterministic plans must give its masks
exactly; random ones its counts and rules.

The default run builds a few models (a few seconds); the ci profile
(``FUNCPRUNE_PROFILE=ci``) five times as many. ``FUNCPRUNE_FUZZ_CASES``
sets the number of models, ``FUNCPRUNE_FUZZ_START`` the first seed.
"""

from __future__ import annotations

import math
import os
import random
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch
from hypothesis import settings

import funcprune as fp
from _differential import one_thread
from _random_nets import random_net

Tensor = torch.Tensor

#: Models in the default run (5 times as many under the ci profile), and plans per model.
MODELS = max(1, round(4 * settings().max_examples / 60))
PLANS = 30


def model_seeds() -> list[int]:
    cases = int(os.environ.get("FUNCPRUNE_FUZZ_CASES", str(MODELS)))
    start = int(os.environ.get("FUNCPRUNE_FUZZ_START", "0"))
    return list(range(start, start + cases))


# --- the reference ----------------------------------------------------------------------------


def unit_slice(t: Tensor, member: fp.Member, unit: int) -> Tensor:
    return t.narrow(member.dim, member.start + unit * member.width, member.width)


def norm_of(entries: list[float], n: float) -> float:
    """The ``n``-norm of the entries, by hand: NaN if one is NaN, but for ``n = 0``, which counts it."""
    if n == 0:
        return float(sum(1 for v in entries if v != 0))
    if any(math.isnan(v) for v in entries):
        return math.nan
    magnitudes = [abs(v) for v in entries]
    if n == math.inf:
        return max(magnitudes)
    if n == -math.inf:
        return min(magnitudes)
    total = math.fsum(v**n for v in magnitudes)
    return total if n == 1 else total ** (1 / n)


@dataclass(frozen=True)
class Unit:
    group: str
    index: int
    position: int  # in the order of the groups, then units
    alive: bool
    key: float

    def order(self) -> tuple[bool, float, int]:
        """The order units go in: smallest key first, NaN last, ties to the earlier unit."""
        return (math.isnan(self.key), 0.0 if math.isnan(self.key) else self.key, self.position)


def pruned_count(spec: fp.LnStructured | fp.RandomStructured, alive: int, total: int) -> int:
    if spec.sparsity is not None:
        return max(0, alive - (total - round(spec.sparsity * total)))
    if isinstance(spec.amount, int):
        if spec.amount > alive:
            raise ValueError(f"amount={spec.amount} should be smaller than the number of units left {alive}")
        return spec.amount
    assert isinstance(spec.amount, float)
    return round(spec.amount * alive)


def reference_units(
    structure: fp.Structure, spec: fp.LnStructured | fp.RandomStructured, kinds: Sequence[str], normalize: str | None,
    params: Mapping[str, Tensor], earlier: Mapping[str, Tensor], scores: Mapping[str, Tensor],
) -> list[Unit]:  # fmt: skip
    """Every unit of the selected groups, with whether an earlier mask left it and its key."""
    units: list[Unit] = []
    n = math.nan if isinstance(spec, fp.RandomStructured) else 2.0 if spec.n == "fro" else float(spec.n)
    for name, group in structure.items():
        if group.kind not in kinds:
            continue
        found: list[tuple[bool, float]] = []
        for u in range(group.size):
            alive, entries = False, []
            for m in group.members:
                mask = earlier.get(m.name)
                alive = alive or mask is None or bool(unit_slice(mask, m, u).any())
                values = scores[m.name] if m.name in scores else params[m.name] * (1 if mask is None else mask)
                entries += unit_slice(values.detach().double(), m, u).flatten().tolist()
            found.append((alive, 0.0 if math.isnan(n) else norm_of(entries, n)))
        if normalize is not None:
            counted = [k for a, k in found if a and math.isfinite(k)]
            scale = (math.fsum(counted) / max(1, len(counted)) if normalize == "mean" else max(counted, default=0.0))
            if scale > 0:
                found = [(a, k / scale) for a, k in found]
        for u, (alive, key) in enumerate(found):
            units.append(Unit(name, u, len(units), alive, key))
    return units


def reference_pruned(spec: fp.LnStructured | fp.RandomStructured, pool: Sequence[Unit]) -> set[tuple[str, int]]:
    """The units of ``pool`` that go (or a ValueError): each group keeps the unit it would lose last."""
    alive = [u for u in pool if u.alive]
    count = pruned_count(spec, len(alive), len(pool))
    last = {}
    for u in sorted(alive, key=Unit.order):
        last[u.group] = u
    candidates = sorted((u for u in alive if last[u.group] is not u), key=Unit.order)
    if count > len(candidates):
        raise ValueError(f"{count} of the {len(alive)} units left would go, but at most {len(candidates)} can")
    return {(u.group, u.index) for u in candidates[:count]}


def reference_masks(
    structure: fp.Structure, kinds: Sequence[str], params: Mapping[str, Tensor], earlier: Mapping[str, Tensor],
    units: Sequence[Unit], pruned: set[tuple[str, int]],
) -> dict[str, Tensor]:  # fmt: skip
    """The earlier masks with the slices of the units that go, or that no earlier mask left, cleared."""
    out = {name: mask.clone() for name, mask in earlier.items()}
    for u in units:
        if u.alive and (u.group, u.index) not in pruned:
            continue
        for m in structure[u.group].members:
            mask = out.setdefault(m.name, torch.ones_like(params[m.name], dtype=torch.bool))
            unit_slice(mask, m, u.index).fill_(False)
    for name, group in structure.items():  # every member of a selected group has a mask
        if group.kind in kinds:
            for m in group.members:
                out.setdefault(m.name, torch.ones_like(params[m.name], dtype=torch.bool))
    return out


# --- random plans ----------------------------------------------------------------------------


def random_earlier(rng: random.Random, structure: fp.Structure, params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Earlier masks on some parameters: random entries, units pruned in some members, units pruned in all."""
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    masks: dict[str, Tensor] = {}
    for name, p in params.items():
        if rng.random() < 0.3:
            masks[name] = torch.rand(p.shape, generator=g) > rng.choice([0.0, 0.2, 0.5])
    for group in structure.values():
        for u in range(group.size):
            r = rng.random()
            if r < 0.1:  # pruned in every member: dead
                chosen = list(group.members)
            elif r < 0.3:  # pruned in some members only: alive
                chosen = [m for m in group.members if rng.random() < 0.5]
            else:
                continue
            for m in chosen:
                mask = masks.setdefault(m.name, torch.ones_like(params[m.name], dtype=torch.bool))
                unit_slice(mask, m, u).fill_(False)
    return masks


def random_scores(rng: random.Random, params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    scores = {}
    for name, p in params.items():
        if rng.random() < 0.3:
            s = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if rng.random() < 0.2 and s.numel():
                s.view(-1)[rng.randrange(s.numel())] = math.nan
            scores[name] = s
    return scores


def random_spec(rng: random.Random, units: int) -> fp.LnStructured | fp.RandomStructured:
    how = rng.choice(["count", "fraction", "fraction", "sparsity"])
    amount: dict[str, Any]
    if how == "count":
        amount = {"amount": rng.randint(0, units + 1)}
    elif how == "fraction":
        amount = {"amount": rng.choice([0.0, 0.25, 0.5, 0.75, 1.0, rng.random()])}
    else:
        amount = {"sparsity": rng.choice([0.0, 0.5, 0.9, rng.random()])}
    if rng.random() < 0.2:
        return fp.RandomStructured(**amount)
    orders: list[float | str] = [1, 2, 2, 3, math.inf, -math.inf, 0, "fro"]
    return fp.LnStructured(**amount, n=rng.choice(orders))


def run_model(seed: int) -> int:
    """Random plans on one random model; returns how many gave masks (the others raised as the reference does)."""
    rng = random.Random(f"funcprune-units-{seed}")
    plan, model, x, _ = random_net(rng)
    with warnings.catch_warnings():  # what cannot go is left out of it (and said)
        warnings.simplefilter("ignore", fp.UnitsLeftOutWarning)
        structure = fp.structure(model, x)
    if not structure:
        return 0
    params = {k: v.detach() for k, v in model.named_parameters()}
    total = sum(g.size for g in structure.values())
    gave = 0
    for i in range(PLANS):
        earlier = random_earlier(rng, structure, params)
        scores = random_scores(rng, params) if rng.random() < 0.3 else {}
        spec = random_spec(rng, total)
        scope = rng.choice(["global", "group"])
        normalize = None if isinstance(spec, fp.RandomStructured) else rng.choice([None, "mean", "max"])
        kinds = ["channels"]
        case = f"seed={seed} plan {i}: {plan!r}\n  {structure!r} {spec!r} scope={scope} normalize={normalize}"
        units = reference_units(structure, spec, kinds, normalize, params, earlier, scores)
        pools = [units] if scope == "global" else [[u for u in units if u.group == g] for g in structure]
        if isinstance(spec, fp.RandomStructured):  # a random order: one float64 draw per unit, pool by pool
            drawn = torch.Generator().manual_seed(i)
            pools = [[replace(u, key=float(k)) for u, k in zip(pool, torch.rand(len(pool), generator=drawn,
                                                                                   dtype=torch.float64))]
                     for pool in pools]  # fmt: skip
            units = [u for pool in pools for u in pool]
        plan_ = fp.structured(structure, spec, scope=scope, normalize=normalize)  # type: ignore[arg-type]
        generator = torch.Generator().manual_seed(i)
        try:
            pruned = set().union(*(reference_pruned(spec, pool) for pool in pools))
        except ValueError as e:
            with pytest.raises(ValueError, match="structured: cannot prune"):
                plan_(params, earlier, scores, generator=generator)
            assert "units left would go" in str(e) or "should be smaller" in str(e), e
            continue
        masks = plan_(params, earlier, scores, generator=generator)
        gave += 1
        expected = reference_masks(structure, kinds, params, earlier, units, pruned)
        assert masks.keys() == expected.keys(), f"{case}: names {sorted(masks)} vs {sorted(expected)}"
        for name in expected:
            if not torch.equal(masks[name], expected[name]):
                raise AssertionError(f"{case}: the mask of {name} differs from the reference's")
    return gave


@pytest.mark.parametrize("seed", model_seeds())
def test_random_units_plans_match_the_reference(seed: int) -> None:
    with one_thread():
        run_model(seed)


def test_the_fuzzer_gives_masks_mostly() -> None:
    with one_thread():
        assert sum(run_model(seed) for seed in range(2)) > PLANS  # of 2 * PLANS: the error is the exception


def caught_by_the_fuzzer(seeds: range) -> bool:
    try:
        for seed in seeds:
            run_model(seed)
    except (AssertionError, pytest.fail.Exception):
        return True
    return False


def test_the_fuzzer_fails_a_plan_that_breaks_either_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan that counts a unit pruned in the members with an earlier mask as dead (item 1), and one
    that lets a group lose every unit (item 3), both fail the comparison."""
    from funcprune._plans import _rank_units, _unit_keys

    maxima = _unit_keys._maxima

    def only_masked_members(group: fp.UnitGroup, pieces: Sequence[Any], how: Any, n: float) -> Any:
        got = maxima(group, pieces, how, n)
        masked = [p for p in pieces if p.mask is not None]
        if got.alive is not None:
            got.alive = maxima(group, masked, None, n).alive
        return got

    from funcprune._specs import _keep_units

    with one_thread():
        with monkeypatch.context() as m:
            m.setattr(_unit_keys, "_maxima", only_masked_members)
            assert caught_by_the_fuzzer(range(6))
        with monkeypatch.context() as m:
            m.setattr(_rank_units, "keep_units", lambda *a, **k: _keep_units.keep_units(*a))
            assert caught_by_the_fuzzer(range(6))
