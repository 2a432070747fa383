"""Differential fuzzing of ``funcprune.compat`` against ``torch.nn.utils.prune``.

Each case builds twin random models (one pruned with ``torch.nn.utils.prune``,
one with ``funcprune.compat``; ``Linear`` / ``Conv1d`` / ``Conv2d`` layers,
float32 / float64 / float16 / bfloat16 or mixed dtypes; a few on the meta
device) and runs a random sequence of steps on both, the global RNG seeded
alike before each call:

* every pruning function (``identity``, ``random_unstructured``,
  ``l1_unstructured``, ``random_structured``, ``ln_structured``,
  ``custom_from_mask``, ``global_unstructured``), with and without
  ``importance_scores``, valid calls mostly and invalid ones sometimes
  (amounts too large or of the wrong type, bad dims, 1-D tensors for
  structured methods, scores or masks of the wrong shape, unknown names);
* ``remove`` and ``is_pruned`` (each library's, on both twins);
* ``copy.deepcopy`` (compat only: torch's fails on a pruned module; the copy
  is compared with its original and may replace it);
* a pickle round trip of the whole module (``torch.save`` / ``torch.load``,
  ``weights_only=False``), a state-dict round trip (saved and loaded with
  ``weights_only=True``, then loaded into fresh twins pruned alike, crossed
  between the libraries half of the time), and a ``weights_only=True`` round
  trip of the pruned tensors;
* SGD steps with momentum and weight decay (forward and backward on random
  input) and plain forward passes.

After every step the twins are compared: parameters (order, class, values,
dtypes, gradients), buffers, the pruned attributes, hooks and container
histories, state-dict keys, ``is_pruned``, forward outputs, optimizer
momenta. A failing call must fail alike (same exception type); compat must
then have left its module exactly as it was. Torch may leave its module
half-changed (a dropped hook, a parameter moved to the end); its twin is then
restored from a pickle taken before the call, and the case goes on. Masks that differ only among scores tied at the threshold are
checked (same count, identical elsewhere) and the torch twin then takes
compat's choice. Random calls must consume exactly the random numbers torch
consumes.

A failing case prints its seed (``seed=N`` in the test id) and its steps;
rerun it alone with ``FUNCPRUNE_FUZZ_START=N FUNCPRUNE_FUZZ_CASES=1 python -m
pytest tests/compat/test_differential.py -k matches``. ``FUNCPRUNE_FUZZ_CASES``
scales the number of cases up for a heavier run (``FUNCPRUNE_FUZZ_START``
shifts the seeds). The last tests check that the fuzzer does fail on a
deliberately wrong compat (a flipped mask entry, an extra random draw,
another exception type).
"""

from __future__ import annotations

import copy
import functools
import io
import math
import random
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as tp
from torch import nn

import funcprune.compat as cp
from _differential import (
    Kind,
    ModelSpec,
    assert_mutation_caught,
    assert_same_choice,
    assert_same_nested,
    case_seeds,
    describe,
    fill_parameters_,
    module_state,
    one_thread,
    outcome_type,
    pruned_tensors,
    random_model_spec,
    random_values,
    selection_of,
    split_name,
)

Tensor = torch.Tensor

#: Cases in the default run (about 25 seconds on a 2-core machine, one torch thread).
DEFAULT_CASES = 100
NORMS: tuple[Any, ...] = (1, 2, math.inf, -math.inf, "fro", 1, 2, "nuc", 0.5, 3, 0)


@dataclass
class Twins:
    """The state of one case.

    Attributes:
        rng: every random choice of the case comes from it.
        spec: how the models are built.
        torch_root: the model pruned with ``torch.nn.utils.prune``.
        compat_root: its twin, pruned with ``funcprune.compat``.
        targets: the dotted names of the model's parameters as built.
        torch_opt: SGD over the torch twin's parameters, once a step made one.
        compat_opt: the same over the compat twin's.
        log: what the case did, printed when it fails.
    """

    rng: random.Random
    spec: ModelSpec
    torch_root: nn.Module
    compat_root: nn.Module
    targets: list[str]
    torch_opt: torch.optim.SGD | None = None
    compat_opt: torch.optim.SGD | None = None
    log: list[str] = field(default_factory=list)

    @property
    def meta(self) -> bool:
        """Whether the twins live on the meta device (no values to compare)."""
        return self.spec.device == "meta"

    def sub(self, lib: types.ModuleType, prefix: str) -> nn.Module:
        """The submodule ``prefix`` of the twin that ``lib`` prunes."""
        root = self.torch_root if lib is tp else self.compat_root
        return root.get_submodule(prefix)

    def reset_optimizers(self) -> None:
        """Forget both optimizers (after the twins were replaced)."""
        self.torch_opt = self.compat_opt = None


def new_model(spec: ModelSpec, seed: int, values_rng: random.Random | None) -> nn.Module:
    """A model built from ``spec`` under ``seed``, its values drawn from
    ``values_rng`` (left as initialized when ``None``)."""
    torch.manual_seed(seed)
    model = spec.build()
    if values_rng is not None:
        fill_parameters_(model, values_rng)
    return model


def build_twins(seed: int) -> Twins:
    """The twins of case ``seed``: float32 / float64 / float16 or bfloat16 /
    mixed dtypes; 4% with a 76,800-entry layer, 6% on the meta device."""
    rng = random.Random(f"funcprune-compat-{seed}")
    mode = rng.choices(["float32", "float64", "low", "mixed"], weights=[50, 25, 10, 15])[0]
    large = rng.random() < 0.04  # a 76,800-entry layer: global selection's sampled path
    spec = random_model_spec(rng, dtype_mode="mixed" if large and rng.random() < 0.6 else mode, large=large)
    if rng.random() < 0.06:
        spec = ModelSpec(spec.layers, spec.dtypes, spec.input_shape, device="meta")
    values_seed = rng.randrange(2**31)
    model_seed = rng.randrange(2**31)
    first = new_model(spec, model_seed, random.Random(values_seed))
    second = new_model(spec, model_seed, random.Random(values_seed))
    twins = Twins(rng, spec, first, second, [n for n, _ in first.named_parameters()])
    twins.log.append(f"model {spec}")
    return twins


# --- comparisons -------------------------------------------------------------------------


def fingerprint(root: nn.Module) -> list[Any]:
    """Identities and values of everything a pruning call may change."""
    out: list[Any] = []
    for prefix, sub in root.named_modules():
        out.append(prefix)
        out.append([[k, id(p), describe(p)] for k, p in sub._parameters.items() if p is not None])
        out.append([[k, id(b), describe(b)] for k, b in sub._buffers.items() if b is not None])
        out.append([[k, id(h)] for k, h in sub._forward_pre_hooks.items()])
        out.append([[id(m) for m in h] for h in sub._forward_pre_hooks.values() if isinstance(h, tp.PruningContainer)])
        out.append(sorted([k, id(v)] for k, v in vars(sub).items() if isinstance(v, Tensor)))
    return out


def unchanged(before: list[Any], after: list[Any]) -> bool:
    """Whether two :func:`fingerprint` results are the same."""
    try:
        assert_same_nested(before, after)
    except AssertionError:
        return False
    return True


def compare_twins(tw: Twins, where: str) -> None:
    """Everything observable must be equal on the two twins."""
    assert_same_nested(module_state(tw.torch_root), module_state(tw.compat_root), where)
    assert cp.is_pruned(tw.compat_root) == tp.is_pruned(tw.torch_root), where
    assert cp.is_pruned(tw.torch_root) == tp.is_pruned(tw.compat_root) == tp.is_pruned(tw.torch_root), where
    if tw.torch_opt is not None and tw.compat_opt is not None:
        momenta = [
            [describe(opt.state[p].get("momentum_buffer")) for p in opt.param_groups[0]["params"]]
            for opt in (tw.torch_opt, tw.compat_opt)
        ]
        assert_same_nested(momenta[0], momenta[1], f"{where}: momentum")


# --- pruning calls --------------------------------------------------------------------------


@dataclass
class PruneCall:
    """One pruning call, made alike on both twins.

    Attributes:
        what: a readable description, for the log.
        run: makes the call with one library on that library's twin.
        kind: the method, for the tie check (``None``: no tie check).
        targets: the dotted names the call prunes.
        scores: the importance scores the call passes, by dotted name.
        dim: the channel dimension of a structured call.
        n: the norm order of an Ln call.
        joint: a ``global_unstructured`` call.
        amount: the call's amount.
    """

    what: str
    run: Callable[[types.ModuleType], Any]
    kind: Kind | None
    targets: list[str]
    scores: dict[str, Tensor] = field(default_factory=dict)
    dim: int | None = None
    n: Any = None
    joint: bool = False
    amount: Any = None


def random_amount(rng: random.Random, units: int) -> Any:
    """Valid amounts mostly; sometimes one too large, negative, > 1, a
    string or a bool (torch takes ``True`` for the count 1)."""
    r = rng.random()
    if r < 0.02:
        return units + 1
    if r < 0.03:
        return rng.choice([-1, 1.5, "0.5", True, False])
    if r < 0.35:
        return rng.randint(0, max(0, units // 3))
    if r < 0.45:
        return rng.choice([0.0, 1.0, 0.5])
    return round(rng.uniform(0.0, 0.7), rng.choice([1, 2, 3]))


def same_values(tw: Twins, t: Tensor) -> Callable[[], Tensor]:
    """A factory of copies of ``t`` on the twins' device (one per library)."""
    device = tw.spec.device

    def make() -> Tensor:
        return t.to(device) if device == "meta" else t.clone()

    return make


def pick_target(tw: Twins) -> str:
    """A parameter of the model mostly; now and then an unknown name, or
    (when pruned) the ``<name>_orig`` parameter itself."""
    r = tw.rng.random()
    name = tw.rng.choice(tw.targets)
    if r < 0.03:
        return split_name(name)[0] + ".nonexistent"
    if r < 0.05:
        prefix, leaf = split_name(name)
        if hasattr(tw.torch_root.get_submodule(prefix), leaf + "_orig"):
            return name + "_orig"
    return name


def current_shape(tw: Twins, name: str) -> torch.Size | None:
    """The shape of ``module.<name>`` on the torch twin (``None``: no tensor)."""
    prefix, leaf = split_name(name)
    value = getattr(tw.torch_root.get_submodule(prefix), leaf, None)
    return value.shape if isinstance(value, Tensor) else None


def random_prune_call(tw: Twins) -> PruneCall:
    """A random call of one of the module-level pruning functions."""
    rng = tw.rng
    name = pick_target(tw)
    prefix, leaf = split_name(name)
    shape = current_shape(tw, name) or torch.Size([3])
    dtype = next(iter(tw.torch_root.parameters())).dtype
    value = getattr(tw.torch_root.get_submodule(prefix), leaf, None)
    if isinstance(value, Tensor):
        dtype = value.dtype
    fn = rng.choice(["identity", "random_unstructured", "l1_unstructured", "l1_unstructured",
                     "random_structured", "ln_structured", "ln_structured", "custom_from_mask"])
    kwargs: dict[str, Any] = {}
    make: dict[str, Callable[[], Tensor]] = {}
    kind: Kind | None = None
    dim: int | None = None
    n: Any = None
    ndim = len(shape)
    if fn in ("random_structured", "ln_structured"):
        dim = rng.choice([0, -1, 1, -2, rng.randint(-ndim - 1, ndim)])
        size = shape[dim] if -ndim <= dim < ndim else 1
        kwargs["amount"] = random_amount(rng, size)
        kwargs["dim"] = dim
        kind = "random_structured"
        if fn == "ln_structured":
            n = kwargs["n"] = rng.choice(NORMS)
            kind = "ln"
    elif fn in ("random_unstructured", "l1_unstructured"):
        kwargs["amount"] = random_amount(rng, shape.numel())
        kind = "random_unstructured" if fn == "random_unstructured" else "l1"
    elif fn == "custom_from_mask":
        mask_shape = shape if rng.random() < 0.97 else torch.Size([*shape, 2])
        g = torch.Generator().manual_seed(rng.randrange(2**31))
        mask = (torch.rand(mask_shape, generator=g) < 0.7).to(rng.choice([torch.float32, torch.bool, dtype]))
        make["mask"] = same_values(tw, mask)
        kind = "custom"
    else:
        kind = "identity"
    scores: dict[str, Tensor] = {}
    if fn in ("l1_unstructured", "ln_structured") and rng.random() < 0.3:
        score_shape = shape if rng.random() < 0.95 else torch.Size([*shape, 1])
        given = random_values(rng, score_shape, dtype)
        make["importance_scores"] = same_values(tw, given)
        scores[name] = given

    def run(lib: types.ModuleType) -> Any:
        args = {**kwargs, **{k: f() for k, f in make.items()}}
        return getattr(lib, fn)(tw.sub(lib, prefix), leaf, **args)

    shown = {**kwargs, **{k: f"<{tuple(f().shape)}>" for k, f in make.items()}}
    return PruneCall(f"{fn}({name}, {shown})", run, kind, [name], scores, dim, n, amount=kwargs.get("amount"))


def random_global_call(tw: Twins) -> PruneCall:
    """A random ``global_unstructured`` call over 1-4 of the parameters."""
    rng = tw.rng
    names = rng.sample(tw.targets, rng.randint(1, min(4, len(tw.targets))))
    total = sum((current_shape(tw, n) or torch.Size([0])).numel() for n in names)
    method = rng.choices(["L1Unstructured", "RandomUnstructured", "Identity", "LnStructured"], weights=[60, 30, 5, 5])[0]
    kwargs: dict[str, Any] = {}
    if method != "Identity":
        kwargs["amount"] = random_amount(rng, total)
    if method == "LnStructured":
        kwargs.update(n=2, dim=0)
    scores: dict[str, Tensor] = {}
    if rng.random() < 0.3:
        for name in names:
            shape = current_shape(tw, name)
            if shape is not None and rng.random() < 0.6:
                prefix, leaf = split_name(name)
                dtype = getattr(tw.torch_root.get_submodule(prefix), leaf).dtype
                scores[name] = random_values(rng, shape, dtype)

    def run(lib: types.ModuleType) -> Any:
        pairs = [(tw.sub(lib, split_name(n)[0]), split_name(n)[1]) for n in names]
        given = {pair: same_values(tw, scores[n])() for n, pair in zip(names, pairs) if n in scores}
        return lib.global_unstructured(
            pairs, pruning_method=getattr(lib, method), importance_scores=given or None, **kwargs
        )

    kinds: dict[str, Kind] = {"L1Unstructured": "l1", "RandomUnstructured": "random_unstructured", "Identity": "identity"}
    kind = kinds.get(method)
    return PruneCall(f"global_unstructured({names}, {method}, {kwargs}, scores={sorted(scores)})", run, kind, names, scores, joint=True)


def call_inputs(tw: Twins, call: PruneCall) -> tuple[Tensor, Tensor] | None:
    """The scores and default mask torch's call starts from, as torch computes
    them (flattened and concatenated in the promoted dtype for a global call);
    ``None`` if they cannot be had (unknown names, meta tensors)."""
    if tw.meta or call.kind is None:
        return None
    pieces, defaults = [], []
    for name in call.targets:
        prefix, leaf = split_name(name)
        sub = tw.torch_root.get_submodule(prefix)
        current = getattr(sub, leaf, None)
        if not isinstance(current, Tensor):
            return None
        given = call.scores.get(name)
        pieces.append((current if given is None or given.shape != current.shape else given).detach().clone())
        defaults.append(getattr(sub, leaf + "_mask", torch.ones_like(current)).detach().clone())
    if not call.joint:
        return pieces[0], defaults[0]
    return torch.nn.utils.parameters_to_vector(pieces), torch.nn.utils.parameters_to_vector(defaults)


def pruning_method_of(sub: nn.Module, leaf: str) -> Any:
    """The newest method acting on ``leaf``: the hook, or its container's last."""
    for hook in sub._forward_pre_hooks.values():
        if isinstance(hook, tp.BasePruningMethod) and hook._tensor_name == leaf:
            return hook[-1] if isinstance(hook, tp.PruningContainer) else hook
    raise AssertionError(f"no pruning hook for {leaf}")


def reconcile_ties(tw: Twins, call: PruneCall, inputs: tuple[Tensor, Tensor] | None, rng_state: Tensor) -> None:
    """Where the masks differ, check it is a tie at the threshold, then give
    the torch twin compat's choice (mask buffer, custom mask, attribute)."""
    if tw.meta:
        return
    pairs = []
    for name in call.targets:
        prefix, leaf = split_name(name)
        pairs.append((tw.torch_root.get_submodule(prefix), tw.compat_root.get_submodule(prefix), leaf))
    theirs = [getattr(t, leaf + "_mask") for t, _, leaf in pairs]
    mine = [getattr(c, leaf + "_mask") for _, c, leaf in pairs]
    if all(torch.equal(a, b) for a, b in zip(theirs, mine)):
        return
    assert inputs is not None and call.kind is not None, f"{call.what}: masks differ"
    scores, default = inputs
    selection = selection_of(
        call.kind, scores, default, dim=call.dim, n=call.n, rng_state=rng_state, amount=call.amount
    )
    if call.joint:
        flat_theirs = torch.cat([m.reshape(-1) for m in theirs])
        flat_mine = torch.cat([m.reshape(-1) for m in mine])
        assert_same_choice(flat_theirs, flat_mine, default, selection, call.what)
    else:
        assert_same_choice(theirs[0], mine[0], default, selection, call.what)
    tw.log.append("  tie: the torch twin takes compat's choice")
    for (t, c, leaf), buffer, choice in zip(pairs, theirs, mine):
        with torch.no_grad():
            buffer.copy_(choice)
        if call.joint:
            t_method, c_method = pruning_method_of(t, leaf), pruning_method_of(c, leaf)
            t_method.mask = c_method.mask.clone()
        setattr(t, leaf, pruning_method_of(t, leaf).apply_mask(t))


def make_call(tw: Twins, call: PruneCall) -> bool:
    """Make ``call`` on both twins and compare; ``False`` ends the case.

    Torch's twin is pickled before the call: where torch fails and leaves its
    module half-changed, it is restored from that pickle (compat must have
    left its own module exactly as it was).
    """
    tw.log.append(call.what)
    inputs = call_inputs(tw, call)
    before_t, before_c = fingerprint(tw.torch_root), fingerprint(tw.compat_root)
    torch_before = io.BytesIO()  # torch may leave its module half-changed on failure
    torch.save(tw.torch_root, torch_before)
    seed = tw.rng.randrange(2**31)
    torch.manual_seed(seed)
    rng_state = torch.get_rng_state()
    t_status, t_result = outcome_type(lambda: call.run(tp))
    t_rng = torch.get_rng_state()
    torch.manual_seed(seed)
    c_status, c_result = outcome_type(lambda: call.run(cp))
    c_rng = torch.get_rng_state()
    if tw.meta and t_status == "NotImplementedError":
        # torch's own limit: re-pruning (and global pruning) index with a mask,
        # which meta tensors cannot do (data-dependent nonzero); compat can, and
        # then succeeds or fails as torch fails on real tensors.
        tw.log.append(f"  torch cannot do this on meta tensors; compat: {c_status}. The case stops")
        if c_status != "ok":
            assert unchanged(before_c, fingerprint(tw.compat_root)), f"{call.what}: compat failed and left its module changed"
        return False
    assert t_status == c_status, f"{call.what}: torch {t_status} ({t_result}) but compat {c_status} ({c_result})"
    if t_status != "ok":
        tw.log.append(f"  both fail: {t_status}")
        assert unchanged(before_c, fingerprint(tw.compat_root)), f"{call.what}: compat failed and left its module changed"
        if not unchanged(before_t, fingerprint(tw.torch_root)):
            # put torch's twin back as it was (from a pickle: gradients are not
            # pickled, so both twins drop theirs) and go on
            tw.log.append("  torch left its module half-changed: restored from before the call")
            torch_before.seek(0)
            tw.torch_root = torch.load(torch_before, weights_only=False)
            tw.compat_root.zero_grad(set_to_none=True)
            tw.reset_optimizers()
        compare_twins(tw, call.what)
        return True
    if not tw.meta:
        assert torch.equal(t_rng, c_rng), f"{call.what}: compat drew other random numbers than torch"
    if call.kind is not None:
        reconcile_ties(tw, call, inputs, rng_state)
    compare_twins(tw, call.what)
    return True


# --- other steps -------------------------------------------------------------------------------


def step_remove(tw: Twins) -> bool:
    """``remove`` a pruned tensor mostly, else any parameter (may fail alike)."""
    pruned = [name for name, _, _ in pruned_tensors(tw.torch_root)]
    name = tw.rng.choice(pruned) if pruned and tw.rng.random() < 0.85 else tw.rng.choice(tw.targets)
    prefix, leaf = split_name(name)
    return make_call(tw, PruneCall(f"remove({name})", lambda lib: lib.remove(tw.sub(lib, prefix), leaf), None, [name]))


def step_is_pruned(tw: Twins) -> bool:
    """Both libraries' ``is_pruned`` agree on every submodule of both twins."""
    for prefix, _ in tw.torch_root.named_modules():
        t_sub, c_sub = tw.sub(tp, prefix), tw.sub(cp, prefix)
        results = {tp.is_pruned(t_sub), cp.is_pruned(t_sub), tp.is_pruned(c_sub), cp.is_pruned(c_sub)}
        assert len(results) == 1, f"is_pruned disagrees on {prefix!r}"
    return True


def random_input(tw: Twins) -> Tensor:
    """A batch of distinct input values in the models' dtype."""
    dtype = tw.spec.uniform_dtype or torch.float32
    return random_values(tw.rng, tw.spec.input_shape, dtype, "distinct")


def forward_both(tw: Twins, x: Tensor, what: str) -> tuple[Tensor, Tensor] | None:
    """Run both twins on ``x``; ``None`` if both fail alike (mixed dtypes)."""
    t_status, t_out = outcome_type(lambda: tw.torch_root(x))
    c_status, c_out = outcome_type(lambda: tw.compat_root(x))
    assert t_status == c_status, f"{what}: torch {t_status} ({t_out}) but compat {c_status} ({c_out})"
    if t_status != "ok":
        return None
    assert_same_nested(describe(t_out), describe(c_out), f"{what}: output")
    return t_out, c_out


def step_forward(tw: Twins) -> bool:
    """A forward pass on both twins (it refreshes the pruned attributes)."""
    tw.log.append("forward")
    forward_both(tw, random_input(tw), "forward")
    compare_twins(tw, "forward")
    return True


def step_optimizer(tw: Twins) -> bool:
    """An SGD step (momentum, weight decay) on both twins after a forward and
    backward pass; outputs, gradients, values and momenta compared. The
    pruned attributes stay as the forward left them (stale), as in torch."""
    tw.log.append("SGD step")
    if tw.torch_opt is None or tw.compat_opt is None:
        tw.torch_opt, tw.compat_opt = (
            torch.optim.SGD(list(root.parameters()), lr=0.1, momentum=0.9, weight_decay=1e-2)
            for root in (tw.torch_root, tw.compat_root)
        )
    tw.torch_opt.zero_grad()
    tw.compat_opt.zero_grad()
    outputs = forward_both(tw, random_input(tw), "SGD step")
    if outputs is None:
        return True
    for out in outputs:
        torch.autograd.backward(out.float().square().mean())
    compare_twins(tw, "SGD step: gradients")
    tw.torch_opt.step()
    tw.compat_opt.step()
    compare_twins(tw, "SGD step: after the step")
    return True


def _without_pruned(state: dict[str, Any]) -> dict[str, Any]:
    """``module_state`` without the pruned attributes (they refresh on forward)."""
    return {k: {kk: vv for kk, vv in v.items() if kk != "pruned attributes"} if isinstance(v, dict) else v
            for k, v in state.items()}  # fmt: skip


def step_deepcopy(tw: Twins) -> bool:
    """Deep-copy the compat twin (torch cannot copy a pruned module)."""
    tw.log.append("deepcopy (compat)")
    clone = copy.deepcopy(tw.compat_root)
    # The copy's pruned attributes are recomputed from its own orig and mask
    # (compat's deepcopy fix), while the original's stay as its last forward
    # left them (stale after an optimizer step, as in torch): compared below,
    # after a forward refreshes both.
    assert_same_nested(_without_pruned(module_state(tw.compat_root, grads=False)),
                       _without_pruned(module_state(clone, grads=False)), "deepcopy: the copy")  # fmt: skip
    originals = {id(t) for t in [*tw.compat_root.parameters(), *tw.compat_root.buffers()]}
    assert not any(id(t) in originals for t in [*clone.parameters(), *clone.buffers()]), "deepcopy shares tensors"
    if not tw.meta and tw.spec.uniform_dtype is not None:
        x = random_input(tw)
        outputs = forward_both(tw, x, "deepcopy")
        assert outputs is not None
        assert_same_nested(describe(outputs[1]), describe(clone(x)), "deepcopy: the copy's output")
        assert_same_nested(
            module_state(tw.compat_root, grads=False), module_state(clone, grads=False), "deepcopy: the copy after a forward"
        )
    if tw.rng.random() < 0.5:
        tw.log.append("  the copy replaces the compat twin (gradients dropped on both)")
        tw.compat_root = clone
        tw.torch_root.zero_grad(set_to_none=True)
        tw.reset_optimizers()
    compare_twins(tw, "deepcopy")
    return True


def save_and_load(obj: Any, *, weights_only: bool) -> Any:
    """``obj`` through ``torch.save`` and ``torch.load`` in memory."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=weights_only)


def step_pickle(tw: Twins) -> bool:
    """A pickle round trip of both whole twins, which then replace them."""
    tw.log.append("pickle round trip")
    t_status, t_loaded = outcome_type(lambda: save_and_load(tw.torch_root, weights_only=False))
    c_status, c_loaded = outcome_type(lambda: save_and_load(tw.compat_root, weights_only=False))
    assert t_status == c_status, f"pickle: torch {t_status} ({t_loaded}) but compat {c_status} ({c_loaded})"
    if t_status != "ok":
        return True
    # pickling a Parameter leaves its gradient behind, in both libraries
    assert_same_nested(module_state(tw.compat_root, grads=False), module_state(c_loaded), "pickle: compat's copy")
    assert_same_nested(module_state(tw.torch_root, grads=False), module_state(t_loaded), "pickle: torch's copy")
    tw.torch_root, tw.compat_root = t_loaded, c_loaded
    tw.reset_optimizers()
    compare_twins(tw, "pickle")
    return True


def step_save_pruned_tensors(tw: Twins) -> bool:
    """Save the pruned attributes (``module.weight``) with ``torch.save`` and
    load them back with ``weights_only=True``, as one saves any tensor."""
    tw.log.append("save the pruned tensors (weights_only=True)")
    saved = [
        {name: getattr(sub, leaf) for name, sub, leaf in sorted(pruned_tensors(root), key=lambda e: e[0])}
        for root in (tw.torch_root, tw.compat_root)
    ]
    t_status, t_loaded = outcome_type(lambda: save_and_load(saved[0], weights_only=True))
    c_status, c_loaded = outcome_type(lambda: save_and_load(saved[1], weights_only=True))
    assert t_status == c_status, f"pruned tensors: torch {t_status} ({t_loaded}) but compat {c_status} ({c_loaded})"
    if t_status == "ok":
        assert_same_nested(describe(t_loaded), describe(c_loaded), "pruned tensors, loaded")
    return True


def values_by_name(root: nn.Module) -> dict[str, Any]:
    """Parameters and buffers by dotted name, in name order."""
    entries = {f"parameter {n}": describe(p) for n, p in root.named_parameters()}
    entries.update({f"buffer {n}": describe(b) for n, b in root.named_buffers()})
    return dict(sorted(entries.items()))


def step_state_dict(tw: Twins) -> bool:
    """Round-trip the state dicts (``weights_only=True``) into fresh twins
    reparametrized alike (``identity`` on each pruned tensor), crossed between
    the libraries half of the time; the fresh twins then replace the twins."""
    pruned = [name for name, _, _ in pruned_tensors(tw.torch_root)]
    if any(name.endswith("_orig") for name in pruned):
        return True  # a pruned "<name>_orig" cannot be rebuilt by identity alone
    crossed = tw.rng.random() < 0.5
    tw.log.append(f"state dict round trip into fresh twins (crossed={crossed})")
    states = [root.state_dict() for root in (tw.torch_root, tw.compat_root)]
    assert_same_nested(describe(dict(states[0])), describe(dict(states[1])), "state_dict")
    loaded = [save_and_load(dict(state), weights_only=True) for state in states]
    assert_same_nested(describe(loaded[0]), describe(loaded[1]), "state_dict, loaded")
    seed = tw.rng.randrange(2**31)
    fresh = []
    for lib in (tp, cp):
        model = new_model(tw.spec, seed, None)
        for name in pruned:
            prefix, leaf = split_name(name)
            lib.identity(model.get_submodule(prefix), leaf)
        fresh.append(model)
    sources = loaded[::-1] if crossed else loaded
    results = [outcome_type(functools.partial(model.load_state_dict, state)) for model, state in zip(fresh, sources)]
    assert [r[0] for r in results] == [results[0][0]] * 2, f"load_state_dict: {results}"
    assert str(results[0][1]) == str(results[1][1]), f"load_state_dict: {results}"
    for model, root in zip(fresh, (tw.torch_root, tw.compat_root)):
        assert_same_nested(values_by_name(root), values_by_name(model), "state dict: the fresh twin's values")
    tw.torch_root, tw.compat_root = fresh
    tw.reset_optimizers()
    compare_twins(tw, "state dict")
    return True


def step_prune(tw: Twins) -> bool:
    """A random module-level pruning call on both twins."""
    return make_call(tw, random_prune_call(tw))


def step_global(tw: Twins) -> bool:
    """A random ``global_unstructured`` call on both twins."""
    return make_call(tw, random_global_call(tw))


#: The steps and their weights; on the meta device only those without values.
STEPS: dict[str, tuple[Callable[[Twins], bool], int, bool]] = {
    "prune": (step_prune, 34, True),
    "global": (step_global, 12, True),
    "remove": (step_remove, 8, True),
    "is_pruned": (step_is_pruned, 3, True),
    "forward": (step_forward, 9, False),
    "optimizer": (step_optimizer, 12, False),
    "deepcopy": (step_deepcopy, 7, True),
    "pickle": (step_pickle, 5, False),
    "state_dict": (step_state_dict, 6, False),
    "save_pruned_tensors": (step_save_pruned_tensors, 2, False),
}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


def run_case(seed: int, *, show_log: bool = True) -> Twins:
    """Run one fuzz case; an ``AssertionError`` reports a difference, and the
    case's steps are printed (``show_log``)."""
    tw = build_twins(seed)
    steps = {k: v for k, v in STEPS.items() if v[2] or not tw.meta}
    names, weights = list(steps), [v[1] for v in steps.values()]
    try:
        compare_twins(tw, "as built")
        for _ in range(tw.rng.randint(8, 20)):
            step = steps[tw.rng.choices(names, weights=weights)[0]][0]
            if not step(tw):
                break
    except Exception:
        if show_log:
            print(f"seed={seed}:", *tw.log, sep="\n")
        raise
    return tw


@pytest.mark.parametrize("seed", case_seeds(DEFAULT_CASES))
def test_compat_matches_torch(seed: int) -> None:
    """A random sequence of calls gives the same observable state on both twins."""
    run_case(seed)


# --- the fuzzer can fail -------------------------------------------------------------------


def run_quietly(seed: int) -> None:
    run_case(seed, show_log=False)


def on_meta(module: nn.Module) -> bool:
    return any(t.device.type == "meta" for t in module.parameters())


def test_the_fuzzer_catches_one_flipped_mask_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case where compat's ``l1_unstructured`` flips one mask entry fails."""
    real = cp.l1_unstructured
    hits: list[object] = []

    def flipped(module: nn.Module, name: str, *args: Any, **kwargs: Any) -> nn.Module:
        out = real(module, name, *args, **kwargs)
        if not on_meta(module):
            with torch.no_grad():
                mask = getattr(module, name + "_mask").view(-1)
                mask[0] = 1 - mask[0]
            hits.append(name)
        return out

    monkeypatch.setattr(cp, "l1_unstructured", flipped)
    assert_mutation_caught(run_quietly, range(12), hits)


def test_the_fuzzer_catches_one_extra_random_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case where compat's ``random_unstructured`` draws one number too many fails."""
    real = cp.random_unstructured
    hits: list[object] = []

    def one_more(module: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        out: nn.Module = real(module, *args, **kwargs)
        if not on_meta(module):
            torch.rand(1)
            hits.append(module)
        return out

    monkeypatch.setattr(cp, "random_unstructured", one_more)
    assert_mutation_caught(run_quietly, range(12), hits)


def test_the_fuzzer_catches_another_exception_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case where compat's ``remove`` raises ``KeyError`` for torch's ``ValueError`` fails."""
    real = cp.remove
    hits: list[object] = []

    def other_error(module: nn.Module, name: str) -> nn.Module:
        try:
            out: nn.Module = real(module, name)
        except ValueError as e:
            hits.append(name)
            raise KeyError(name) from e
        return out

    monkeypatch.setattr(cp, "remove", other_error)
    assert_mutation_caught(run_quietly, range(12), hits)
