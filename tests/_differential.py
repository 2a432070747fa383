"""Shared machinery of the differential fuzzers.

``tests/test_differential.py`` (the functional API against
``torch.nn.utils.prune``) and ``tests/compat/test_differential.py``
(``funcprune.compat`` against ``torch.nn.utils.prune``) both generate random,
seeded cases and compare what the two implementations give. This module holds
what they share:

* the case seeds (``FUNCPRUNE_FUZZ_CASES`` scales their number,
  ``FUNCPRUNE_FUZZ_START`` shifts them);
* random tensor values, distinct most of the time, with ties injected
  (repeated values, zeros, whole zero channels, duplicated channels,
  constant tensors) some of the time;
* random small models (``Linear`` / ``Conv1d`` / ``Conv2d`` stacks);
* the tie-aware mask comparison: :func:`selection_of` rebuilds, from the
  inputs of one torch pruning call, the scores torch ranked its units by, and
  :func:`assert_same_choice` checks that two masks could both be that call's
  result (same count pruned, identical outside the tied set at the threshold);
* a comparable description of a module's observable state
  (:func:`module_state`, :func:`assert_same_nested`), meta tensors included.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pytest
import torch
import torch.nn.utils.prune as tp
from torch import nn

from compat._helpers import distinct

Tensor = torch.Tensor

#: Environment variable: the number of cases each fuzzer runs.
CASES_ENV = "FUNCPRUNE_FUZZ_CASES"
#: Environment variable: the first case seed (to explore other seeds).
START_ENV = "FUNCPRUNE_FUZZ_START"

#: The kinds of torch pruning call whose result has a freedom on ties.
Kind = Literal[
    "identity", "custom", "l1", "random_unstructured", "random_structured", "ln"
]


def case_seeds(default_cases: int) -> list[Any]:
    """The pytest parameters of a fuzzer: one per case seed, shown as ``seed=N``.

    Args:
        default_cases: how many cases the default run has; the environment
            variable ``FUNCPRUNE_FUZZ_CASES`` overrides it (a heavier local run),
            ``FUNCPRUNE_FUZZ_START`` shifts the first seed.

    Returns:
        ``pytest.param`` objects for ``@pytest.mark.parametrize``.
    """
    cases = int(os.environ.get(CASES_ENV, str(default_cases)))
    start = int(os.environ.get(START_ENV, "0"))
    return [pytest.param(seed, id=f"seed={seed}") for seed in range(start, start + cases)]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one thread, then restore the thread count.

    The fuzzers make thousands of small tensor operations; on a loaded 2-core
    machine, two intra-op threads contend and make each of them tens of times
    slower.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --- values ----------------------------------------------------------------------------

#: How tensor values are generated, with their weights: distinct most of the time.
VALUE_STYLES: dict[str, int] = {
    "distinct": 70,
    "repeats": 7,
    "zeros": 7,
    "zero_channels": 7,
    "duplicate_channels": 5,
    "constant": 4,
}


def random_values(
    rng: random.Random, shape: Sequence[int], dtype: torch.dtype, style: str | None = None
) -> Tensor:
    """Random values of ``shape`` and ``dtype``, distinct most of the time.

    Args:
        rng: the case's random source (every choice is drawn from it).
        shape: the tensor's shape.
        dtype: the tensor's dtype. Values are made in float64 and then
            converted, so low-precision dtypes may tie on large tensors.
        style: one of :data:`VALUE_STYLES`; drawn by weight when ``None``.

    Returns:
        A new CPU tensor.
    """
    if style is None:
        style = rng.choices(list(VALUE_STYLES), weights=list(VALUE_STYLES.values()))[0]
    shape = tuple(shape)
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    values = distinct(shape, rng.randrange(2**31), torch.float64) * rng.choice([0.05, 1.0, 3.0])
    ndim = len(shape)
    if style == "repeats":  # a handful of magnitudes: ties everywhere
        values = (values * rng.choice([2, 4, 8])).round() / 4
    elif style == "zeros":
        values = values.masked_fill(torch.rand(shape, generator=g, dtype=torch.float64) < 0.3, 0.0)
    elif style == "zero_channels" and ndim >= 2:
        dim = rng.randrange(ndim)
        for index in range(shape[dim]):
            if rng.random() < 0.4:
                values.select(dim, index).zero_()
    elif style == "duplicate_channels" and ndim >= 2:
        dim = rng.randrange(ndim)
        if shape[dim] >= 2:
            source, target = rng.sample(range(shape[dim]), 2)
            sign = rng.choice([1.0, -1.0])
            values.select(dim, target).copy_(values.select(dim, source) * sign)
    elif style == "constant":
        values = torch.full(shape, rng.choice([0.0, 0.5, -1.0]), dtype=torch.float64)
    return values.to(dtype)


def fill_parameters_(module: nn.Module, rng: random.Random) -> None:
    """Overwrite every parameter of ``module`` with :func:`random_values`."""
    with torch.no_grad():
        for param in module.parameters():
            if param.device.type != "meta":
                param.copy_(random_values(rng, param.shape, param.dtype))


# --- models ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """How to build one random model, so that twins can be built again.

    Attributes:
        layers: ``("linear", in, out, bias)``, ``("conv1d", in, out, k, bias)``
            or ``("conv2d", in, out, k, bias)`` in order; a ``Flatten`` goes
            before the first linear after a conv, a ``ReLU`` between layers.
        dtypes: one dtype per layer.
        input_shape: the shape of a batch of inputs.
        device: ``"cpu"`` or ``"meta"``.
    """

    layers: tuple[tuple[Any, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    input_shape: tuple[int, ...]
    device: str = "cpu"

    @property
    def uniform_dtype(self) -> torch.dtype | None:
        """The one dtype of every layer, or ``None`` when they differ."""
        return self.dtypes[0] if len(set(self.dtypes)) == 1 else None

    def build(self) -> nn.Sequential:
        """A new model (parameters from torch's global RNG, as initialized)."""
        modules: list[nn.Module] = []
        after_conv = False
        for i, (layer, dtype) in enumerate(zip(self.layers, self.dtypes)):
            if i:
                modules.append(nn.ReLU())
            kind = layer[0]
            if kind == "linear":
                if after_conv:
                    modules.append(nn.Flatten())
                    after_conv = False
                modules.append(nn.Linear(layer[1], layer[2], bias=layer[3], dtype=dtype, device=self.device))
            elif kind == "conv1d":
                modules.append(nn.Conv1d(layer[1], layer[2], layer[3], bias=layer[4], dtype=dtype, device=self.device))
                after_conv = True
            else:
                modules.append(nn.Conv2d(layer[1], layer[2], layer[3], bias=layer[4], dtype=dtype, device=self.device))
                after_conv = True
        return nn.Sequential(*modules)


LOW_PRECISION = (torch.float16, torch.bfloat16)
ALL_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def random_model_spec(rng: random.Random, *, dtype_mode: str, large: bool = False) -> ModelSpec:
    """A random small model: an MLP, or a conv stack followed by linear layers.

    Args:
        rng: the case's random source.
        dtype_mode: ``"float32"``, ``"float64"``, ``"low"`` (one of float16 /
            bfloat16 for every layer) or ``"mixed"`` (each layer its own dtype
            among the four).
        large: include a 256x300 linear layer (76,800 entries: more than the
            65,536 where global selection switches to its sampled path).
    """
    batch = rng.randint(1, 3)
    layers: list[tuple[Any, ...]] = []
    shape = rng.choice(["mlp", "conv1d", "conv2d"]) if not large else "mlp"
    if shape == "mlp":
        features = 256 if large else rng.randint(2, 8)
        input_shape: tuple[int, ...] = (batch, features)
    else:
        channels, length = rng.randint(1, 4), rng.randint(4, 6)
        input_shape = (batch, channels, length) if shape == "conv1d" else (batch, channels, length, length)
        for _ in range(rng.randint(1, 2)):
            out, k = rng.randint(1, 5), rng.randint(1, min(3, length))
            layers.append((shape, channels, out, k, rng.random() < 0.7))
            channels, length = out, length - k + 1
        features = channels * length ** (1 if shape == "conv1d" else 2)
    for i in range(rng.randint(1, 3)):
        out = 300 if large and i == 0 else rng.randint(1, 8)
        layers.append(("linear", features, out, rng.random() < 0.7))
        features = out
    if dtype_mode == "mixed":
        dtypes = tuple(rng.choice(ALL_FLOATS) for _ in layers)
        if len(set(dtypes)) == 1 and len(layers) > 1:  # make it really mixed
            dtypes = (dtypes[0],) + tuple(rng.choice([d for d in ALL_FLOATS if d != dtypes[0]]) for _ in layers[1:])
    else:
        one = {"float32": torch.float32, "float64": torch.float64}.get(dtype_mode) or rng.choice(LOW_PRECISION)
        dtypes = tuple(one for _ in layers)
    return ModelSpec(tuple(layers), dtypes, input_shape)


def split_name(name: str) -> tuple[str, str]:
    """``"0.weight"`` -> ``("0", "weight")``: submodule path and tensor name."""
    prefix, _, leaf = name.rpartition(".")
    return prefix, leaf


# --- tie-aware comparison -------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """The choice one torch pruning call made, unit by unit.

    A unit is an entry (unstructured calls) or a channel along ``dim``
    (structured calls). Torch prunes the eligible units of smallest score.

    Attributes:
        dim: ``None`` for entries, else the channel dimension (non-negative).
        scores: one float64 key per unit (meaningful where eligible), see
            :func:`rank_keys`.
        eligible: one bool per unit: the units the call chose among.
        count: ``None``, or for torch's re-pruning of a 1-D tensor by a
            structured method (see :func:`selection_of`) the number of units
            chosen among all of them, pruned ones included (choosing one of
            those changes nothing).
    """

    dim: int | None
    scores: Tensor
    eligible: Tensor
    count: int | None = None


def rank_keys(scores: Tensor) -> Tensor:
    """float64 keys that order like torch's ``topk`` orders ``scores``.

    ``topk`` ranks NaN above everything, ``inf`` included, and NaNs tie with
    each other: NaN becomes ``+inf`` and ``+inf`` the largest finite float64
    (larger than any float32 or half score).
    """
    keys = scores.double()
    keys = keys.masked_fill(keys == math.inf, torch.finfo(torch.float64).max)
    return keys.masked_fill(keys.isnan(), math.inf)


def units_kept(mask: Tensor, dim: int | None) -> Tensor:
    """One bool per unit: an entry is kept, or a channel has a kept entry."""
    kept = mask != 0
    if dim is None:
        return kept.reshape(-1)
    others = [d for d in range(kept.dim()) if d != dim]
    return kept.to(torch.int64).sum(dim=others) != 0


def _channel_view(kept: Tensor, dim: int, shape: torch.Size) -> Tensor:
    view = [1] * len(shape)
    view[dim] = -1
    return kept.view(view).expand(shape)


def selection_of(
    kind: Kind,
    scores: Tensor,
    default: Tensor,
    *,
    dim: int | None = None,
    n: Any = None,
    rng_state: Tensor | None = None,
    amount: Any = None,
) -> Selection | None:
    """Rebuild what one torch pruning call ranked its units by.

    This follows ``torch.nn.utils.prune``: the call acts on the units still
    unpruned in ``default`` (entries where it is 1; channels not entirely 0),
    L1 ranks entries by ``|scores|``, Ln ranks channels by
    ``_compute_norm(scores[eligible channels], n, dim)``, and the random
    methods rank by the numbers they draw (``rand_like`` of the eligible
    scores, ``rand`` of the eligible channel count), redrawn here from
    ``rng_state``, the global RNG state the call started from.

    One quirk is modelled too: torch refuses a structured method on a 1-D
    tensor, but not when re-pruning it: its container then indexes the tensor
    with a 0-dim bool (``t[True]``, a ``(1, n)`` view), so with ``dim=-1``
    every entry is a channel, pruned ones included, and ``amount`` units are
    chosen among all ``n`` (``dim=0``: the whole tensor is the one channel).

    Args:
        kind: the method.
        scores: the importance scores the call used (the parameter as it
            was, or the ``importance_scores`` given).
        default: the mask before the call (ones for a first pruning).
        dim: the channel dimension of a structured call.
        n: the norm order of an Ln call.
        rng_state: the CPU RNG state before a random call.
        amount: the call's amount (needed for the 1-D quirk only).

    Returns:
        The :class:`Selection`, or ``None`` for calls without any freedom
        (identity, custom masks, one unit): their masks must be equal.
    """
    if kind in ("identity", "custom"):
        return None
    if kind in ("ln", "random_structured") and scores.dim() == 1:
        return _one_dim_selection(kind, scores, default, dim=dim, n=n, rng_state=rng_state, amount=amount)
    keep = default != 0
    if kind in ("l1", "random_unstructured"):
        eligible = keep.reshape(-1)
        unit_scores = torch.zeros(eligible.numel(), dtype=torch.float64)
        if kind == "l1":
            unit_scores[eligible] = rank_keys(scores.reshape(-1)[eligible].abs())
        else:
            assert rng_state is not None
            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(rng_state)
                prob = torch.rand_like(scores.reshape(-1)[eligible])
            unit_scores[eligible] = -prob.double()  # torch prunes the largest draws
        return Selection(None, unit_scores, eligible)
    assert dim is not None
    dim = dim % scores.dim()
    eligible = units_kept(keep, dim)
    unit_scores = torch.zeros(eligible.numel(), dtype=torch.float64)
    if kind == "ln":
        sub = scores.index_select(dim, eligible.nonzero().reshape(-1))
        unit_scores[eligible] = rank_keys(tp._compute_norm(sub, n, dim))
    else:
        assert rng_state is not None
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(rng_state)
            prob = torch.rand(int(eligible.sum()))
        unit_scores[eligible] = prob.double()  # torch prunes draws <= the k-th smallest
    return Selection(dim, unit_scores, eligible)


def _one_dim_selection(
    kind: Kind,
    scores: Tensor,
    default: Tensor,
    *,
    dim: int | None,
    n: Any,
    rng_state: Tensor | None,
    amount: Any,
) -> Selection | None:
    """torch's structured re-pruning of a 1-D tensor (see :func:`selection_of`)."""
    if dim != -1 or not bool((default != 0).any()):
        return None  # one unit (the whole tensor), or nothing selected at all
    view = scores.reshape(1, -1)
    if kind == "ln":
        unit_scores = rank_keys(tp._compute_norm(view, n, -1))
    else:
        assert rng_state is not None
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(rng_state)
            unit_scores = torch.rand(view.shape[-1]).double()
    count = tp._compute_nparams_toprune(amount, view.shape[-1])
    return Selection(0, unit_scores, torch.ones_like(unit_scores, dtype=torch.bool), count)


def _assert_overlapping_choice(mask: Tensor, before: Tensor, selection: Selection, what: str) -> None:
    """``mask`` is ``before`` minus ``count`` units of lowest score chosen
    among all units, pruned ones included (ties at the threshold in any way)."""
    assert selection.count is not None
    scores, k = selection.scores, selection.count
    assert not bool((mask & ~before).any()), f"{what}: revives entries pruned earlier"
    if k == 0:
        assert torch.equal(mask, before), f"{what}: prunes with a count of 0"
        return
    threshold = scores.sort().values[k - 1]
    below, tied, above = scores < threshold, scores == threshold, scores > threshold
    assert not bool((mask & below).any()), f"{what}: keeps a unit below the threshold {float(threshold)}"
    assert torch.equal(mask[above], before[above]), f"{what}: prunes a unit above the threshold {float(threshold)}"
    slots = k - int(below.sum())
    newly = int((tied & before & ~mask).sum())
    already = int((tied & ~before).sum())
    assert max(0, slots - already) <= newly <= slots, (
        f"{what}: prunes {newly} of the units tied at {float(threshold)} for {slots} places "
        f"({already} of them pruned already)"
    )


def assert_same_choice(
    expected: Tensor, actual: Tensor, default: Tensor, selection: Selection | None, what: str
) -> None:
    """Assert that ``actual`` is a result torch's call could have given.

    ``expected`` is torch's mask. Where the scores are distinct the masks must
    be equal; where torch's order among equal scores is unspecified, both
    must prune the same number of units, ``actual`` must be a valid mask of
    the call (inside ``default``; for a structured call, each channel either
    all of ``default`` or all pruned), and they may differ only at units
    whose score equals the threshold (the score of the last unit pruned,
    with every unit below it pruned and every unit above it kept).

    Args:
        expected: torch's mask (any dtype, nonzero = kept).
        actual: the other implementation's mask.
        default: the mask before the call.
        selection: from :func:`selection_of`; ``None`` means no freedom.
        what: names the call in failure messages.
    """
    exp, act, before = expected != 0, actual != 0, default != 0
    assert exp.shape == act.shape == before.shape, (what, exp.shape, act.shape, before.shape)
    if torch.equal(exp, act):
        return
    where = (exp != act).nonzero().tolist()[:8]
    assert selection is not None, f"{what}: masks differ at {where} and the call has no freedom"
    if selection.count is not None:
        _assert_overlapping_choice(exp, before, selection, f"{what} (torch's mask)")
        _assert_overlapping_choice(act, before, selection, what)
        return
    assert not bool((act & ~before).any()), f"{what}: revives entries pruned earlier"
    dim = selection.dim
    if dim is not None:
        for label, mask in (("torch's", exp), ("the other", act)):
            kept = units_kept(mask, dim)
            assert torch.equal(mask, before & _channel_view(kept, dim, mask.shape)), (
                f"{what}: {label} mask is not a channel mask along dim {dim}"
            )
    kept_exp, kept_act = units_kept(exp, dim), units_kept(act, dim)
    eligible, scores = selection.eligible, selection.scores
    assert torch.equal(kept_exp[~eligible], kept_act[~eligible]), f"{what}: differ outside the eligible units"
    pruned_exp = int((eligible & ~kept_exp).sum())
    pruned_act = int((eligible & ~kept_act).sum())
    assert pruned_exp == pruned_act, f"{what}: prunes {pruned_act} units where torch prunes {pruned_exp}"
    differ = eligible & (kept_exp != kept_act)
    tied = scores[differ]
    threshold = tied[0]
    units = differ.nonzero().reshape(-1).tolist()[:8]
    assert bool((tied == threshold).all()), (
        f"{what}: differs at units {units} whose scores are not all equal: {tied.tolist()[:8]}"
    )
    s, k = scores[eligible], kept_exp[eligible]
    assert not bool((~k & (s > threshold)).any()) and not bool((k & (s < threshold)).any()), (
        f"{what}: differs at units {units} of score {float(threshold)}, which is not torch's threshold"
    )


# --- observable state ------------------------------------------------------------------


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as compared: dtype, shape, device, flags and values."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    device: str
    requires_grad: bool
    values: Tensor | None  # None on the meta device

    @staticmethod
    def of(t: Tensor) -> TensorInfo:
        """Describe ``t`` (its values are copied, detached)."""
        values = None if t.device.type == "meta" else t.detach().clone()
        return TensorInfo(t.dtype, tuple(t.shape), t.device.type, t.requires_grad, values)


def describe(value: Any) -> Any:
    """``value`` with every tensor replaced by a :class:`TensorInfo`."""
    if isinstance(value, Tensor):
        return TensorInfo.of(value)
    if isinstance(value, dict):
        return {k: describe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    return value


def hook_state(hook: Any) -> Any:
    """The observable description of a pruning hook: class name, tensor name,
    public attributes (``amount``, ``n``, ``dim``, ``mask``) and, for a
    container, the description of each method in its history."""
    attrs = {attr: describe(getattr(hook, attr)) for attr in ("amount", "n", "dim", "mask") if hasattr(hook, attr)}
    history = [hook_state(m) for m in hook] if isinstance(hook, tp.PruningContainer) else []
    return [type(hook).__name__, getattr(hook, "_tensor_name", None), attrs, history]


def module_state(root: nn.Module, *, grads: bool = True) -> dict[str, Any]:
    """Everything a user can observe of ``root`` after pruning calls.

    Parameters (order, names, class, values, dtypes, ``requires_grad`` and
    gradients), buffers (order, names, dtypes, values), the pruned attributes
    (``module.<name>``, values and ``requires_grad``), the pruning hooks by
    tensor name (not their order among the forward pre-hooks, which compat
    keeps where torch moves a re-pruned tensor's hook to the end), the
    state-dict keys and ``is_pruned``. ``grads=False`` leaves gradients out
    (``copy.deepcopy`` of a ``Parameter`` does not copy its gradient).
    """
    state: dict[str, Any] = {}
    for prefix, sub in root.named_modules():
        params = [
            [name, type(p).__name__, describe(p), None if p.grad is None or not grads else describe(p.grad)]
            for name, p in sub.named_parameters(recurse=False)
        ]
        buffers = [[name, describe(b)] for name, b in sub.named_buffers(recurse=False)]
        hooks = {
            hook._tensor_name: hook_state(hook)
            for hook in sub._forward_pre_hooks.values()
            if isinstance(hook, tp.BasePruningMethod)
        }
        pruned = {
            name: describe(getattr(sub, name)) if hasattr(sub, name) else "<missing>"
            for name in sorted(hooks)
        }
        state[prefix or "<root>"] = {
            "parameters": params,
            "buffers": buffers,
            "hooks": dict(sorted(hooks.items())),
            "pruned attributes": pruned,
        }
    state["<state_dict keys>"] = list(root.state_dict())
    state["<is_pruned>"] = tp.is_pruned(root)
    return state


def assert_same_nested(a: Any, b: Any, path: str = "") -> None:
    """Assert two :func:`describe`-d structures are equal, naming the first
    difference by its path. Tensors must match in dtype, shape, device,
    ``requires_grad`` and values (``torch.equal``, NaN matching NaN: float16
    training may overflow to ``inf`` and then ``nan`` on both twins)."""
    if isinstance(a, TensorInfo):
        assert isinstance(b, TensorInfo), f"{path}: tensor vs {b!r}"
        head = (a.dtype, a.shape, a.device, a.requires_grad)
        assert head == (b.dtype, b.shape, b.device, b.requires_grad), f"{path}: {head} vs {(b.dtype, b.shape, b.device, b.requires_grad)}"
        if a.values is not None and b.values is not None and not torch.equal(a.values, b.values):
            differ = a.values != b.values
            if a.values.is_floating_point():  # NaN where both are NaN is the same value
                differ &= ~(a.values.isnan() & b.values.isnan())
            where = differ.nonzero().tolist()[:8]
            assert not where, f"{path}: values differ at {where}"
        return
    if isinstance(a, dict):
        assert isinstance(b, dict), f"{path}: dict vs {type(b).__name__}"
        assert list(a) == list(b), f"{path}: keys {list(a)} vs {list(b)}"
        for key in a:
            assert_same_nested(a[key], b[key], f"{path}/{key}")
        return
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_nested(x, y, f"{path}[{i}]")
        return
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return
    assert type(a) is type(b) and a == b, f"{path}: {a!r} vs {b!r}"


def outcome_type(fn: Callable[[], Any]) -> tuple[str, Any]:
    """``("ok", result)``, or the exception's type name and the exception."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001 - the point is to compare any failure
        return type(e).__name__, e


def assert_mutation_caught(run_case: Callable[[int], object], seeds: range, hits: list[object]) -> None:
    """Assert that a fuzzer notices a deliberate mistake.

    Args:
        run_case: runs one case by seed; raises ``AssertionError`` on a difference.
        seeds: the cases to run.
        hits: the mutated function appends to it each time the mistake takes
            effect (cleared before each case).

    Every case in which the mistake took effect must fail, and at least three
    of the cases must meet it.
    """
    affected = 0
    for seed in seeds:
        hits.clear()
        try:
            run_case(seed)
        except AssertionError:
            failed = True
        else:
            failed = False
        if hits:
            affected += 1
            assert failed, f"seed={seed}: the mistake took effect {len(hits)} times and went unnoticed"
    assert affected >= 3, f"only {affected} cases met the mistake"


def pruned_tensors(root: nn.Module) -> Iterator[tuple[str, nn.Module, str]]:
    """``(dotted name, submodule, tensor name)`` of every tensor with a pruning hook."""
    for prefix, sub in root.named_modules():
        for hook in sub._forward_pre_hooks.values():
            if isinstance(hook, tp.BasePruningMethod):
                name = hook._tensor_name
                yield (f"{prefix}.{name}" if prefix else name), sub, name
