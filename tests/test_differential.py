"""Differential fuzzing of the functional API against ``torch.nn.utils.prune``.

Each case builds a random small model (``Linear`` / ``Conv1d`` / ``Conv2d``
layers, random shapes, some with biases; float32, float64, float16/bfloat16
or mixed dtypes; in a few cases a 76,800-entry layer) and prunes it for
several rounds with random plans: :class:`funcprune.Plan` rules (every spec,
lists of specs, glob patterns), :func:`funcprune.global_unstructured` groups
and :func:`funcprune.compose` of several. Each round passes the previous
round's masks (iterative pruning), sometimes importance ``scores``.

The reference is the torch module flow: the same steps, one
``torch.nn.utils.prune`` call each, on a twin module, the global RNG seeded
alike at the start of the round. Each call is checked on its own (funcprune
computing that single step on the torch twin's current masks must give a
mask torch's call could have given, and consume exactly the random numbers
torch drew); where the two differ on tied scores only, the twin takes
funcprune's choice, so that after the round the plan's masks must equal the
twin's bit for bit. Failures must have the same exception type.

A failing case prints its seed (``seed=N`` in the test id) and what it did;
rerun it alone with ``FUNCPRUNE_FUZZ_START=N FUNCPRUNE_FUZZ_CASES=1 python -m
pytest tests/test_differential.py -k plans_match``. ``FUNCPRUNE_FUZZ_CASES``
scales the number of cases up for a heavier run (``FUNCPRUNE_FUZZ_START``
shifts the seeds). The last tests check that the fuzzer does fail on a
deliberately wrong plan and that the tie-aware comparison allows ties only.
"""

from __future__ import annotations

import copy
import fnmatch
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as tp
from torch import nn

import funcprune as fp
from _differential import (
    Kind,
    ModelSpec,
    Selection,
    assert_mutation_caught,
    assert_same_choice,
    case_seeds,
    fill_parameters_,
    one_thread,
    outcome_type,
    random_model_spec,
    random_values,
    selection_of,
    split_name,
)
from _reference import _apply_kwargs, torch_method

Tensor = torch.Tensor

#: Cases in the default run (about 16 seconds on a 2-core machine, one torch thread).
DEFAULT_CASES = 500
NORMS: tuple[Any, ...] = (1, 2, math.inf, -math.inf, "fro")
RARE_NORMS: tuple[Any, ...] = ("nuc", 0.5, 3)


# --- plans ------------------------------------------------------------------------------


@dataclass
class Case:
    """One fuzz case: the model, its functional parameters and the torch twin.

    Attributes:
        rng: every random choice of the case comes from it.
        spec: how the model was built.
        model: the plain model (functional side, never pruned).
        twin: the same model, pruned in place with ``torch.nn.utils.prune``.
        params: ``dict(model.named_parameters())``.
        log: what the case did, printed when it fails.
    """

    rng: random.Random
    spec: ModelSpec
    model: nn.Module
    twin: nn.Module
    params: dict[str, Tensor]
    log: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return list(self.params)


def matches(pattern: str, names: list[str]) -> list[str]:
    """The names a plan key selects, in parameter order (as ``fp.Plan`` does)."""
    if any(c in pattern for c in "*?["):
        return [n for n in names if fnmatch.fnmatchcase(n, pattern)]
    return [n for n in names if n == pattern]


def random_amount(rng: random.Random, units: int, left: int) -> int | float:
    """A float fraction most of the time, else a count up to a sixth of the
    ``left`` units still unpruned; now and then more than the ``units`` of the
    tensor (an invalid amount both sides must refuse alike)."""
    r = rng.random()
    if r < 0.006:
        return units + 1
    if r < 0.35:
        return rng.randint(0, max(0, left // 6))
    if r < 0.45:
        return rng.choice([0.0, 1.0, 0.5])
    return round(rng.uniform(0.0, 0.7), rng.choice([1, 2, 3]))


@dataclass(frozen=True)
class Targets:
    """What one rule (or global group) of a plan prunes, to fit its amounts.

    Attributes:
        shapes: the shapes of the tensors selected.
        masks: their masks at the start of the round (``None``: unpruned).
    """

    shapes: list[torch.Size]
    masks: list[Tensor | None]

    @staticmethod
    def of(names: list[str], params: Mapping[str, Tensor], masks: Mapping[str, Tensor]) -> Targets:
        return Targets([params[n].shape for n in names], [masks.get(n) for n in names])

    def units(self, dim: int | None) -> tuple[int, int]:
        """The smallest count of units (entries, or channels along ``dim``)
        of the tensors, in all and still unpruned."""
        total, left = [], []
        for shape, mask in zip(self.shapes, self.masks):
            if dim is None:
                total.append(shape.numel())
                left.append(shape.numel() if mask is None else int(mask.count_nonzero()))
            elif -len(shape) <= dim < len(shape):
                total.append(shape[dim])
                if mask is None:
                    left.append(shape[dim])
                else:
                    others = [d for d in range(len(shape)) if d != dim % len(shape)]
                    left.append(int((mask.to(torch.int64).sum(dim=others) != 0).sum()) if others else shape[dim])
        return min(total, default=1), min(left, default=1)


def random_leaf_spec(rng: random.Random, targets: Targets) -> fp.Spec:
    """A random leaf spec meant for one rule's tensors.

    Structured specs are drawn when every tensor has two dims or more (and,
    rarely, when not: an invalid call both sides must refuse alike); custom
    masks when the rule matches one tensor.
    """
    shapes = targets.shapes
    kinds = ["identity", "random_unstructured", "l1", "l1"]
    if all(len(s) >= 2 for s in shapes) or rng.random() < 0.05:
        kinds += ["random_structured", "ln", "ln", "ln"]
    if len(shapes) == 1:
        kinds.append("custom")
    kind = rng.choice(kinds)
    if kind == "identity":
        return fp.Identity()
    if kind == "random_unstructured":
        return fp.RandomUnstructured(random_amount(rng, *targets.units(None)))
    if kind == "l1":
        return fp.L1Unstructured(random_amount(rng, *targets.units(None)))
    if kind == "custom":
        mask = torch.rand(shapes[0], generator=torch.Generator().manual_seed(rng.randrange(2**31))) < 0.7
        return fp.CustomFromMask(mask if rng.random() < 0.5 else mask.float())
    ndim = min(len(s) for s in shapes)
    dim = rng.choice([0, 1, -1, -2, 0, 1, -1, -2, rng.randint(-ndim - 1, ndim)]) if ndim >= 2 else rng.choice([0, -1])
    amount = random_amount(rng, *targets.units(dim))
    if kind == "random_structured":
        return fp.RandomStructured(amount, dim=dim)
    n = rng.choice(NORMS) if rng.random() < 0.93 else rng.choice(RARE_NORMS)
    if n == "fro" and max(len(s) for s in shapes) > 3 and rng.random() < 0.8:
        n = 2  # 'fro' needs at most 3 dims; keep that refusal rare
    return fp.LnStructured(amount, n=n, dim=dim)


def random_rule_plan(rng: random.Random, params: Mapping[str, Tensor], masks: Mapping[str, Tensor]) -> fp.Plan:
    """A :class:`fp.Plan` of 1-3 rules: exact names or patterns, each mapped
    to a spec or a list of specs (a chain)."""
    names = list(params)
    weights = [n for n in names if params[n].dim() >= 2]
    layers = sorted({split_name(n)[0] for n in names})
    keys = names + weights + ["*.weight", "*.weight", "*"]
    if any(n.endswith("bias") for n in names):
        keys.append("*.bias")
    keys += [f"{layer}.*" for layer in layers]
    rules: dict[str, fp.Spec | list[fp.Spec]] = {}
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(keys)
        targets = Targets.of(matches(key, names), params, masks)
        if rng.random() < 0.7:
            rules[key] = random_leaf_spec(rng, targets)
        else:
            rules[key] = [random_leaf_spec(rng, targets) for _ in range(rng.randint(0, 3))]
    return fp.Plan(rules)


def random_global_plan(
    rng: random.Random, params: Mapping[str, Tensor], masks: Mapping[str, Tensor]
) -> fp.GlobalPlan:
    """A :func:`fp.global_unstructured` group: names and patterns, an L1 or
    random spec (now and then a list of unstructured specs)."""
    names = list(params)
    options = names + ["*.weight", "*.weight", "*"]
    listed = [rng.choice(options) for _ in range(rng.randint(1, 4))]
    selected = list(dict.fromkeys(n for key in listed for n in matches(key, names)))
    total = sum(params[n].numel() for n in selected)
    left = sum(params[n].numel() if n not in masks else int(masks[n].count_nonzero()) for n in selected)

    def one() -> fp.Spec:
        if rng.random() < 0.65:
            return fp.L1Unstructured(random_amount(rng, total, left))
        return fp.RandomUnstructured(random_amount(rng, total, left))

    if rng.random() < 0.1:
        return fp.global_unstructured(listed, [one(), rng.choice([one(), fp.Identity()])])
    return fp.global_unstructured(listed, one())


def random_plan(
    rng: random.Random, params: Mapping[str, Tensor], masks: Mapping[str, Tensor], *, large: bool
) -> fp.AbstractPlan:
    """A rule plan, a global plan or a composition of 2-3 of them; integer
    amounts are sized on ``masks``, the masks at the start of the round."""
    def single() -> fp.AbstractPlan:
        if rng.random() < (0.7 if large else 0.4):
            return random_global_plan(rng, params, masks)
        return random_rule_plan(rng, params, masks)

    if rng.random() < 0.25:
        return fp.compose(*(single() for _ in range(rng.randint(2, 3))))
    return single()


# --- the torch module flow ----------------------------------------------------------------


@dataclass(frozen=True)
class TorchCall:
    """One ``torch.nn.utils.prune`` call of the flow a plan stands for.

    Attributes:
        names: the one parameter pruned, or the group of a global call.
        spec: the leaf spec the call applies.
        joint: a ``global_unstructured`` call.
    """

    names: tuple[str, ...]
    spec: fp.Spec
    joint: bool


def torch_calls(plan: fp.AbstractPlan, names: list[str]) -> list[TorchCall]:
    """The torch calls a plan stands for, in order.

    Rules in insertion order, each rule's names in parameter order, a list
    rule's steps one after another on each name; a global group is one
    ``global_unstructured`` call per step, over its names in listed order;
    composed plans one after another.
    """
    if isinstance(plan, fp.ComposedPlan):
        return [call for p in plan.plans for call in torch_calls(p, names)]
    if isinstance(plan, fp.GlobalPlan):
        group = tuple(dict.fromkeys(n for key in plan.names for n in matches(key, names)))
        steps = plan.spec.specs if isinstance(plan.spec, fp.Chain) else (plan.spec,)
        return [TorchCall(group, step, True) for step in steps]
    assert isinstance(plan, fp.Plan)
    calls: list[TorchCall] = []
    for key, spec in plan.items():
        steps = (spec.specs or (fp.Identity(),)) if isinstance(spec, fp.Chain) else (spec,)
        for name in matches(key, names):
            calls.extend(TorchCall((name,), step, False) for step in steps)
    return calls


def kind_of(spec: fp.Spec) -> Kind:
    """The :data:`Kind` of a leaf spec."""
    kinds: dict[type[fp.Spec], Kind] = {
        fp.Identity: "identity",
        fp.CustomFromMask: "custom",
        fp.L1Unstructured: "l1",
        fp.RandomUnstructured: "random_unstructured",
        fp.RandomStructured: "random_structured",
        fp.LnStructured: "ln",
    }
    return kinds[type(spec)]


def uses_scores(spec: fp.Spec) -> bool:
    """Whether torch's method takes ``importance_scores`` (L1 and Ln do)."""
    return isinstance(spec, (fp.L1Unstructured, fp.LnStructured))


def run_torch_call(twin: nn.Module, call: TorchCall, scores: Mapping[str, Tensor]) -> None:
    """Make ``call`` with ``torch.nn.utils.prune`` on ``twin``."""
    method = type(torch_method(call.spec))
    kwargs = _apply_kwargs(call.spec)
    if call.joint:
        pairs = [(twin.get_submodule(split_name(n)[0]), split_name(n)[1]) for n in call.names]
        given = {pair: scores[n] for n, pair in zip(call.names, pairs) if n in scores}
        tp.global_unstructured(pairs, pruning_method=method, importance_scores=given or None, **kwargs)
        return
    prefix, leaf = split_name(call.names[0])
    if uses_scores(call.spec) and call.names[0] in scores:
        kwargs["importance_scores"] = scores[call.names[0]]
    method.apply(twin.get_submodule(prefix), leaf, **kwargs)


def twin_masks(twin: nn.Module) -> dict[str, Tensor]:
    """The ``<name>_mask`` buffers of the twin, keyed like ``named_parameters()``."""
    return {n[: -len("_mask")]: b for n, b in twin.named_buffers() if n.endswith("_mask")}


def call_inputs(
    twin: nn.Module, call: TorchCall, scores: Mapping[str, Tensor]
) -> tuple[Tensor, Tensor]:
    """The scores and default mask torch's call starts from (flattened and
    concatenated for a global call, in the promoted dtype, as torch does)."""
    pieces, defaults = [], []
    for name in call.names:
        prefix, leaf = split_name(name)
        sub = twin.get_submodule(prefix)
        current = getattr(sub, leaf).detach()
        given = scores.get(name) if (call.joint or uses_scores(call.spec)) else None
        pieces.append(current if given is None else given)
        defaults.append(getattr(sub, leaf + "_mask", torch.ones_like(current)))
    if not call.joint:
        return pieces[0], defaults[0].clone()
    return torch.nn.utils.parameters_to_vector(pieces), torch.nn.utils.parameters_to_vector(defaults)


def call_selection(call: TorchCall, scores: Tensor, default: Tensor, rng_state: Tensor) -> Selection | None:
    """The :class:`Selection` of ``call`` on these inputs."""
    spec = call.spec
    return selection_of(
        kind_of(spec),
        scores,
        default,
        dim=getattr(spec, "dim", None),
        n=getattr(spec, "n", None),
        rng_state=rng_state,
    )


def single_step(case: Case, call: TorchCall, scores: Mapping[str, Tensor], masks: Mapping[str, Tensor]) -> fp.Masks:
    """funcprune's masks for ``call`` alone, on the twin's current masks."""
    plan: fp.AbstractPlan
    if call.joint:
        plan = fp.global_unstructured(list(call.names), call.spec)
    else:
        plan = fp.Plan({call.names[0]: call.spec})
    return plan(case.params, masks, scores)


def adopt_(twin: nn.Module, name: str, mask: Tensor) -> None:
    """Give the twin funcprune's choice among tied scores for ``name``."""
    prefix, leaf = split_name(name)
    sub = twin.get_submodule(prefix)
    buffer = getattr(sub, leaf + "_mask")
    with torch.no_grad():
        buffer.copy_(mask.to(buffer.dtype))
    orig = getattr(sub, leaf + "_orig")
    setattr(sub, leaf, buffer.to(dtype=orig.dtype) * orig)


def matrix_norm_refusal(spec: fp.Spec, torch_status: str, fp_result: object) -> bool:
    """The one documented difference in error types: a matrix norm (``'fro'``,
    ``'nuc'``) over the wrong number of dims is a ``ValueError`` in funcprune
    (tests/test_errors.py) where torch fails inside ``linalg.matrix_norm``
    with a ``RuntimeError``."""
    return (
        isinstance(spec, fp.LnStructured)
        and spec.n in ("fro", "nuc")
        and torch_status == "RuntimeError"
        and type(fp_result) is ValueError
        and "needs scores with" in str(fp_result)
    )


def one_dim_structured_refusal(
    call: TorchCall, torch_status: str, fp_result: object, before: Mapping[str, Tensor]
) -> bool:
    """A documented refusal: funcprune's structured specs refuse 1-D tensors
    (``ValueError``, tests/test_errors.py) always, torch only on a first
    pruning; re-pruning a 1-D tensor, torch's container indexes it with a
    0-dim bool (``t[True]``, a ``(1, n)`` view) and prunes the whole tensor
    as one channel (or fails in ``vector_norm`` with a ``RuntimeError`` for
    ``n=-inf``). Torch's flow is then ahead, so the case stops there."""
    return (
        not call.joint
        and isinstance(call.spec, (fp.LnStructured, fp.RandomStructured))
        and call.names[0] in before
        and before[call.names[0]].dim() == 1
        and torch_status in ("ok", "RuntimeError")
        and type(fp_result) is ValueError
        and "multidimensional" in str(fp_result)
    )


def flat(masks: Mapping[str, Tensor], names: tuple[str, ...]) -> Tensor:
    """The masks of ``names``, as one flat bool vector (a global group's)."""
    return torch.cat([(masks[n] != 0).reshape(-1) for n in names])


def check_call(
    case: Case, call: TorchCall, scores: Mapping[str, Tensor]
) -> tuple[str, Exception | None]:
    """Make one torch call on the twin and check funcprune's single step.

    Returns:
        ``("ok", None)``, or the failure's type name and exception (both
        sides failed alike).
    """
    before = {n: m.clone() for n, m in twin_masks(case.twin).items()}
    t_scores, t_default = call_inputs(case.twin, call, scores)
    state = torch.get_rng_state()
    status, result = outcome_type(lambda: run_torch_call(case.twin, call, scores))
    after = torch.get_rng_state()
    torch.set_rng_state(state)
    given = before if case.rng.random() < 0.5 else {n: m.bool() for n, m in before.items()}
    fp_status, fp_result = outcome_type(lambda: single_step(case, call, scores, given))
    what = f"{call.spec!r} on {list(call.names)}"
    if matrix_norm_refusal(call.spec, status, fp_result) or one_dim_structured_refusal(
        call, status, fp_result, before
    ):
        case.log.append(f"  allowed difference: torch {status}, funcprune {fp_result!r}")
        status, result = fp_status, fp_result
    assert fp_status == status, f"{what}: torch {status} ({result}) but funcprune {fp_status} ({fp_result})"
    if status != "ok":
        return status, result
    assert torch.equal(torch.get_rng_state(), after), f"{what}: funcprune drew other random numbers than torch"
    mine: fp.Masks = fp_result
    theirs = twin_masks(case.twin)
    assert set(mine) == set(theirs), (what, sorted(mine), sorted(theirs))
    for name in theirs:
        if name not in call.names:
            assert torch.equal(mine[name], theirs[name] != 0), f"{what}: changed {name}"
    selection = call_selection(call, t_scores, t_default, state)
    if call.joint:
        assert_same_choice(flat(theirs, call.names), flat(mine, call.names), t_default, selection, what)
    else:
        name = call.names[0]
        assert_same_choice(theirs[name], mine[name], t_default, selection, what)
    for name in call.names:
        if not torch.equal(mine[name], theirs[name] != 0):
            case.log.append(f"  tie: took funcprune's choice for {name}")
            adopt_(case.twin, name, mine[name])
    return "ok", None


# --- the fuzz case --------------------------------------------------------------------------


def build_case(seed: int) -> Case:
    """The model and twin of case ``seed``: 10% have a 76,800-entry layer
    (mixed dtypes more often than not), 30% mix dtypes."""
    rng = random.Random(f"funcprune-functional-{seed}")
    large = rng.random() < 0.1
    mode = rng.choices(["float32", "float64", "low", "mixed"], weights=[40, 20, 10, 30])[0]
    if large and rng.random() < 0.6:
        mode = "mixed"
    spec = random_model_spec(rng, dtype_mode=mode, large=large)
    torch.manual_seed(rng.randrange(2**31))
    model = spec.build()
    fill_parameters_(model, rng)
    twin = copy.deepcopy(model)
    case = Case(rng, spec, model, twin, dict(model.named_parameters()))
    case.log.append(f"model {spec}")
    return case


def random_scores(case: Case) -> dict[str, Tensor]:
    """Importance scores for a random subset of the parameters, 30% of the time."""
    if case.rng.random() < 0.7:
        return {}
    chosen = [n for n in case.names if case.rng.random() < 0.5]
    return {n: random_values(case.rng, case.params[n].shape, case.params[n].dtype) for n in chosen}


def run_round(case: Case, masks: fp.Masks, large: bool) -> fp.Masks | None:
    """One round: the plan on funcprune's side, its calls on the twin; the
    masks after it (``None`` once both sides failed alike)."""
    rng = case.rng
    plan = random_plan(rng, case.params, masks, large=large)
    scores = random_scores(case)
    seed = rng.randrange(2**31)
    # now and then the plan draws from its own generator, seeded as torch's
    # global RNG is: the same stream, and the global RNG left alone
    generator = torch.Generator().manual_seed(seed) if rng.random() < 0.2 else None
    case.log.append(f"round: {plan!r} scores={sorted(scores)} seed={seed} generator={generator is not None}")
    given: dict[str, Tensor] = dict(masks)
    if masks and rng.random() < 0.3:  # torch-style float masks are accepted too
        given = {n: m.to(case.params[n].dtype) for n, m in masks.items()}
    inputs = [t.detach().clone() for t in [*case.params.values(), *given.values(), *scores.values()]]

    torch.manual_seed(seed)
    fp_status, fp_result = outcome_type(lambda: plan(case.params, given, scores, generator))
    fp_rng = torch.get_rng_state()
    if generator is not None:
        torch.manual_seed(seed)
        assert torch.equal(fp_rng, torch.get_rng_state()), "a plan given a generator drew from the global RNG"
        fp_rng = generator.get_state()
    for t, saved in zip([*case.params.values(), *given.values(), *scores.values()], inputs):
        assert torch.equal(t, saved), "the plan wrote into its inputs"

    torch.manual_seed(seed)
    for call in torch_calls(plan, case.names):
        case.log.append(f"  call {call.spec!r} on {list(call.names)}")
        status, error = check_call(case, call, scores)
        if status != "ok":
            assert fp_status == status, f"torch's flow fails with {status} ({error}) but the plan gives {fp_status} ({fp_result})"
            case.log.append(f"  both fail: {status}: {str(error)[:150]}")
            return None
    assert fp_status == "ok", f"the plan fails with {fp_status} ({fp_result}) but torch's flow does not"
    assert torch.equal(fp_rng, torch.get_rng_state()), "the plan drew other random numbers than torch's flow"

    out: fp.Masks = fp_result
    theirs = twin_masks(case.twin)
    assert list(out) == [n for n in case.names if n in out], "masks not in parameter order"
    assert set(out) == set(theirs), (sorted(out), sorted(theirs))
    for name, mask in out.items():
        assert mask.dtype == torch.bool and mask.shape == case.params[name].shape, name
        if not torch.equal(mask, theirs[name] != 0):
            where = (mask != (theirs[name] != 0)).nonzero().tolist()[:8]
            raise AssertionError(f"{name}: the plan's mask differs from torch's flow at {where}")
    applied = fp.apply_masks(case.params, out)
    for name in out:
        prefix, leaf = split_name(name)
        assert torch.equal(applied[name], getattr(case.twin.get_submodule(prefix), leaf)), name
    if case.spec.uniform_dtype is not None:
        x = random_values(rng, case.spec.input_shape, case.spec.uniform_dtype, "distinct")
        expected = case.twin(x)
        actual = fp.functional_call_masked(case.model, case.params, out, (x,))
        assert torch.equal(actual, expected), "functional_call_masked differs from torch's pruned forward"
    return out


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


def run_case(seed: int, *, show_log: bool = True) -> Case:
    """Run one fuzz case; an ``AssertionError`` reports a difference, and the
    case's rounds and calls are printed (``show_log``)."""
    case = build_case(seed)
    large = any(p.numel() >= 65_536 for p in case.params.values())
    masks: fp.Masks = {}
    try:
        for _ in range(case.rng.randint(2, 5)):
            result = run_round(case, masks, large)
            if result is None:
                break
            masks = result
    except Exception:
        if show_log:
            print(f"seed={seed}:", *case.log, sep="\n")
        raise
    return case


@pytest.mark.parametrize("seed", case_seeds(DEFAULT_CASES))
def test_plans_match_torch(seed: int) -> None:
    """Random plans over several rounds give torch's masks, round after round."""
    run_case(seed)


# --- the fuzzer can fail -------------------------------------------------------------------


def run_quietly(seed: int) -> None:
    run_case(seed, show_log=False)


def test_the_fuzzer_catches_one_flipped_mask_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case whose plans return a mask with one entry flipped fails."""
    real = fp.AbstractPlan.__call__
    hits: list[object] = []

    def flipped(self: fp.AbstractPlan, *args: Any, **kwargs: Any) -> fp.Masks:
        out = real(self, *args, **kwargs)
        for name, mask in out.items():
            mask = out[name] = mask.clone()
            mask.view(-1)[0] = ~mask.view(-1)[0]
            hits.append(name)
            break
        return out

    monkeypatch.setattr(fp.AbstractPlan, "__call__", flipped)
    assert_mutation_caught(run_quietly, range(10), hits)


def test_the_fuzzer_catches_one_extra_random_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case whose plans draw one random number too many fails."""
    real = fp.AbstractPlan.__call__
    hits: list[object] = []

    def one_more(self: fp.AbstractPlan, *args: Any, **kwargs: Any) -> fp.Masks:
        out = real(self, *args, **kwargs)
        torch.rand(1)
        hits.append(self)
        return out

    monkeypatch.setattr(fp.AbstractPlan, "__call__", one_more)
    assert_mutation_caught(run_quietly, range(10), hits)


def test_same_choice_allows_ties_only() -> None:
    """The tie-aware comparison: ties at the threshold may go either way,
    nothing else may differ."""
    scores = torch.tensor([0.1, 0.5, -0.5, 0.5, 0.9])
    ones = torch.ones(5)
    selection = selection_of("l1", scores, ones)
    theirs = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0])  # 0.1 and the first 0.5
    assert_same_choice(theirs, torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0]), ones, selection, "tie")
    for wrong in ([1.0, 0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 1.0, 0.0]):
        with pytest.raises(AssertionError):
            assert_same_choice(theirs, torch.tensor(wrong), ones, selection, "not a tie")
    with pytest.raises(AssertionError, match="no freedom"):
        assert_same_choice(theirs, torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0]), ones, None, "custom")
    earlier = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0])  # revived entry 4
    with pytest.raises(AssertionError, match="revives"):
        assert_same_choice(
            torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0]), torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0]),
            earlier, selection_of("l1", scores, earlier), "revives",
        )


def test_same_choice_on_channels() -> None:
    """Structured masks: tied channels may swap; a mask that is no channel
    mask, or prunes a channel of distinct norm, is caught."""
    t = torch.tensor([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0], [9.0, 9.0]])  # rows 0 and 2 tie
    ones = torch.ones(4, 2)
    selection = selection_of("ln", t, ones, dim=0, n=2)
    theirs = torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    assert_same_choice(theirs, torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]), ones, selection, "tie")
    for wrong in ([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0]], [[0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]):
        with pytest.raises(AssertionError):
            assert_same_choice(theirs, torch.tensor(wrong), ones, selection, "not a tie")
