"""One-shot methods as values: the built-ins, the strings as their shorthands, a user's own method.

A user's method is a frozen dataclass subclassing ``fp.Method``, written
here and nowhere else: each one below is all it takes to run a criterion
through ``fp.oneshot``. The built-ins are held to their definition (the
public pure functions, block by block) and to the strings' results.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import funcprune as fp

sys.path.insert(0, str(Path(__file__).parents[1]))
import _hf  # noqa: E402

Tensor = torch.Tensor
PER_ROW = fp.PerSlice(fp.L1Unstructured(0.5), dim=0)
Pruned = tuple[dict[str, Tensor], dict[str, Tensor]]


def batches_of(tiny: _hf.Tiny, count: int = 2) -> list[dict[str, Any]]:
    """``count`` calibration batches for ``tiny``'s (language) model: its inputs, shifted."""
    return [{"input_ids": (tiny.args[0] + k) % _hf.VOCAB, **tiny.kwargs} for k in range(count)]


def same(a: Pruned, b: Pruned) -> bool:
    """Two ``oneshot`` results are the same, bit for bit: params and masks, masks in the same order."""
    return (list(a[1]) == list(b[1]) and all(torch.equal(a[1][n], b[1][n]) for n in a[1])
            and a[0].keys() == b[0].keys() and all(torch.equal(a[0][n], b[0][n]) for n in a[0]))  # fmt: skip


# --- users' methods: each is one class, and nothing else is added to run it ---------------------


@dataclasses.dataclass(frozen=True)
class AbsTimesNorm(fp.Method):
    """Wanda written by a user: ``|W| * ||X||`` from the input norms the runner collects, ranked by a plan."""

    statistic = "input_norms"

    def prune(
        self,
        weights: Mapping[str, Tensor],
        statistics: Mapping[str, Tensor],
        specs: Mapping[str, fp.Spec],
        input_dims: Mapping[str, int],
    ) -> Pruned:
        scores = {n: w.abs() * statistics[n] for n, w in weights.items()}  # norms shaped to scale w as stored
        return {}, fp.Plan(specs, input_dims=input_dims)(weights, scores=scores)


@dataclasses.dataclass(frozen=True)
class Shuffled(fp.Method):
    """A user's method without statistics: random scores drawn from its own seed; records each call's weights."""

    seed: int = 0
    calls: list[list[str]] = dataclasses.field(default_factory=list, compare=False)
    statistic = None

    def prune(
        self,
        weights: Mapping[str, Tensor],
        statistics: Mapping[str, Tensor],
        specs: Mapping[str, fp.Spec],
        input_dims: Mapping[str, int],
    ) -> Pruned:
        self.calls.append(list(weights))
        g = torch.Generator().manual_seed(self.seed)
        scores = {n: torch.rand(w.shape, generator=g) for n, w in weights.items()}
        return {}, fp.Plan(specs, input_dims=input_dims)(weights, scores=scores)


@dataclasses.dataclass(frozen=True)
class Recorder(fp.Method):
    """A user's method that records what the runner gives it, then prunes as the built-in SparseGPT does."""

    seen: list[tuple[dict[str, Tensor], dict[str, Tensor], dict[str, fp.Spec]]] = dataclasses.field(
        default_factory=list, compare=False
    )
    statistic = "hessians"

    def prune(
        self,
        weights: Mapping[str, Tensor],
        statistics: Mapping[str, Tensor],
        specs: Mapping[str, fp.Spec],
        input_dims: Mapping[str, int],
    ) -> Pruned:
        self.seen.append((dict(weights), dict(statistics), dict(specs)))
        return fp.SparseGPT().prune(weights, statistics, specs, input_dims)


@dataclasses.dataclass(frozen=True)
class Returns(fp.Method):
    """Returns what it is told to, from the weights it is given: for the error tests."""

    result: Callable[[Mapping[str, Tensor]], object]
    statistic = None

    def prune(
        self,
        weights: Mapping[str, Tensor],
        statistics: Mapping[str, Tensor],
        specs: Mapping[str, fp.Spec],
        input_dims: Mapping[str, int],
    ) -> Pruned:
        return self.result(weights)  # type: ignore[return-value]  # deliberately anything


@dataclasses.dataclass(frozen=True)
class Gradients(fp.Method):
    """Asks for a statistic the runner cannot collect."""

    statistic = "gradients"  # type: ignore[assignment]  # deliberately wrong

    def prune(
        self,
        weights: Mapping[str, Tensor],
        statistics: Mapping[str, Tensor],
        specs: Mapping[str, fp.Spec],
        input_dims: Mapping[str, int],
    ) -> Pruned:
        raise AssertionError("never called")


@dataclasses.dataclass(frozen=True)
class NoNM(fp.Method):
    """Magnitude that refuses N:M specs, before any batch runs."""

    statistic = None

    def check_spec(self, spec: fp.Spec) -> None:
        if isinstance(spec, fp.NM):
            raise ValueError(f"NoNM: spec must not be N:M, got {spec!r}")

    def prune(
        self,
        weights: Mapping[str, Tensor],
        statistics: Mapping[str, Tensor],
        specs: Mapping[str, fp.Spec],
        input_dims: Mapping[str, int],
    ) -> Pruned:
        return fp.Magnitude().prune(weights, statistics, specs, input_dims)


# --- the built-ins ------------------------------------------------------------------------------


@pytest.mark.parametrize(("shorthand", "value"), [("magnitude", fp.Magnitude()), ("wanda", fp.Wanda()),
                                                   ("sparsegpt", fp.SparseGPT(blocksize=128, percdamp=0.01))])  # fmt: skip
def test_the_strings_are_shorthands_for_the_built_in_values(shorthand: str, value: fp.Method) -> None:
    tiny = _hf.tiny("gpt2")  # Conv1D weights, stored (in, out)
    batches = batches_of(tiny)
    by_string = fp.oneshot(tiny.model, batches, method=shorthand, spec=fp.NM(2, 4))
    by_value = fp.oneshot(tiny.model, batches, method=value, spec=fp.NM(2, 4))
    assert by_string[1] and same(by_string, by_value)


def test_sparsegpts_knobs_live_in_its_value_and_reach_every_block() -> None:
    tiny = _hf.tiny("llama")
    batches = batches_of(tiny)
    spec = fp.L1Unstructured(0.5)
    params, masks = fp.oneshot(tiny.model, batches, method=fp.SparseGPT(blocksize=8, percdamp=0.1), spec=spec)
    for n, mask in masks.items():  # half of each block of 8 input columns, not of the whole weight
        pruned = (~mask).reshape(mask.shape[0], -1, 8).sum(dim=(0, 2))
        assert torch.all(pruned == 4 * mask.shape[0]), n
    group = [n for n in masks if n.startswith("model.layers.0.")]  # block 0 is calibrated on the dense model
    dense = {n: p.detach() for n, p in tiny.model.named_parameters() if n in group}
    weights, want = fp.sparsegpt(dense, fp.hessians(tiny.model, batches, group), spec, blocksize=8, percdamp=0.1)
    for n in group:
        assert torch.equal(masks[n], want[n]), n
        torch.testing.assert_close(params[n], weights[n], rtol=1e-5, atol=1e-6)
    default = fp.oneshot(tiny.model, batches, method=fp.SparseGPT(), spec=spec)
    assert any(not torch.equal(default[1][n], masks[n]) for n in masks)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = x + self.fc2(torch.relu(self.fc1(x)))
        return out


class Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.blocks = nn.Linear(4, 8), nn.ModuleList(Block() for _ in range(3))

    def forward(self, x: Tensor) -> Tensor:
        h: Tensor = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return h


def _chain() -> tuple[nn.Module, list[Tensor]]:
    torch.manual_seed(0)
    net = Chain().double().eval()
    g = torch.Generator().manual_seed(1)
    return net, [torch.randn(24, 4, dtype=torch.float64, generator=g), torch.randn(2, 5, 4, dtype=torch.float64, generator=g)]


CHAIN, CHAIN_BATCHES = _chain()


#: Each example runs the runner and the definition over three blocks: a sixth of the profile's budget (10, in CI 50).
FEW = settings(max_examples=max(8, settings().max_examples // 6))


@FEW
@given(blocksize=st.integers(1, 12), percdamp=st.floats(1e-3, 2.0), fraction=st.sampled_from([0.25, 0.5, 0.75]),
       per_row=st.booleans())  # fmt: skip
def test_a_sparsegpt_value_prunes_each_block_as_sparsegpt_with_its_knobs_on_what_the_pruned_blocks_compute(
    blocksize: int, percdamp: float, fraction: float, per_row: bool
) -> None:
    spec: fp.Spec = fp.PerSlice(fp.L1Unstructured(fraction), dim=0) if per_row else fp.L1Unstructured(fraction)
    params, masks = fp.oneshot(CHAIN, CHAIN_BATCHES, method=fp.SparseGPT(blocksize, percdamp), spec=spec)
    model = copy.deepcopy(CHAIN)
    for i in range(3):
        group = [f"blocks.{i}.fc1.weight", f"blocks.{i}.fc2.weight"]
        here = {n: p.detach() for n, p in model.named_parameters() if n in group}
        hessians = fp.hessians(model, CHAIN_BATCHES, group)
        new, want = fp.sparsegpt(here, hessians, spec, blocksize=blocksize, percdamp=percdamp)
        for n in group:
            assert torch.equal(masks[n], want[n]), n
            torch.testing.assert_close(params[n], new[n], rtol=1e-9, atol=1e-12)
        with torch.no_grad():  # prune the block in the copy before calibrating the next
            for n in group:
                dict(model.named_parameters())[n].copy_(new[n] * want[n])


@given(blocksize=st.integers(-4, 1 << 20), percdamp=st.floats(allow_nan=True, allow_infinity=True))
def test_a_sparsegpt_value_takes_exactly_a_positive_blocksize_and_a_finite_percdamp_from_0(
    blocksize: int, percdamp: float
) -> None:
    if blocksize >= 1 and 0 <= percdamp < math.inf:
        method = fp.SparseGPT(blocksize=blocksize, percdamp=percdamp)
        assert (method.blocksize, method.percdamp, method.statistic) == (blocksize, percdamp, "hessians")
        assert method == fp.SparseGPT(blocksize, percdamp) and hash(method) == hash(fp.SparseGPT(blocksize, percdamp))
    else:
        with pytest.raises(ValueError, match=r"SparseGPT: (blocksize|percdamp) must be a (positive int|finite)"):
            fp.SparseGPT(blocksize=blocksize, percdamp=percdamp)


def test_method_values_are_frozen_and_refuse_bad_arguments_by_name() -> None:
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"blocksize": 0}, ValueError, r"SparseGPT: blocksize must be a positive int \(the columns of a block\), got 0"),
        ({"blocksize": True}, TypeError, r"SparseGPT: blocksize must be an int .*got True of type bool"),
        ({"blocksize": 8.0}, TypeError, r"SparseGPT: blocksize must be an int .*got 8.0 of type float"),
        ({"percdamp": -0.1}, ValueError, r"SparseGPT: percdamp must be a finite number >= 0 .*got -0.1"),
        ({"percdamp": math.inf}, ValueError, r"SparseGPT: percdamp must be a finite number >= 0 .*got inf"),
        ({"percdamp": "0.1"}, TypeError, r"SparseGPT: percdamp must be a real number .*got '0.1' of type str"),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            fp.SparseGPT(**kwargs)
    method = fp.SparseGPT(blocksize=64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        method.blocksize = 32  # type: ignore[misc]  # deliberately
    assert repr(method) == "SparseGPT(blocksize=64, percdamp=0.01)"
    assert (fp.Magnitude().statistic, fp.Wanda().statistic) == (None, "input_norms")
    assert len({fp.Magnitude(), fp.Magnitude(), fp.Wanda(), fp.Wanda()}) == 2  # values: equal when their fields are


# --- a user's own method ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_users_method_from_input_norms_is_wanda_written_by_hand(name: str) -> None:
    tiny = _hf.tiny(name)  # GPT-2's norms come as (in, 1) columns: they scale its (in, out) weights all the same
    batches = batches_of(tiny)
    params, masks = fp.oneshot(tiny.model, batches, method=AbsTimesNorm(), spec=PER_ROW)
    assert masks and same((params, masks), fp.oneshot(tiny.model, batches, method=fp.Wanda(), spec=PER_ROW))
    every = dict(tiny.model.named_parameters())
    assert all(params[n] is every[n] for n in every)  # a method that only masks changes no weight


def test_a_users_method_without_statistics_reads_no_batch_and_prunes_every_weight_in_one_call() -> None:
    tiny = _hf.tiny("llama")
    consumed: list[bool] = []

    def batches() -> Iterator[dict[str, Tensor]]:
        consumed.append(True)
        yield {"input_ids": tiny.args[0]}

    method = Shuffled(seed=3)
    params, masks = fp.oneshot(tiny.model, batches(), method=method, spec=fp.L1Unstructured(0.25))
    assert not consumed
    assert method.calls == [list(masks)] and len(masks) == 2 * 7  # once, with every weight of both blocks
    assert all(int((~m).sum()) == round(0.25 * m.numel()) for m in masks.values())
    again = fp.oneshot(tiny.model, batches(), method=Shuffled(seed=3), spec=fp.L1Unstructured(0.25))[1]
    other = fp.oneshot(tiny.model, batches(), method=Shuffled(seed=4), spec=fp.L1Unstructured(0.25))[1]
    assert all(torch.equal(masks[n], again[n]) for n in masks) and any(not torch.equal(masks[n], other[n]) for n in masks)
    owl = Shuffled(seed=3)  # OWL's sparsities read the batches; the method is still called once
    fp.oneshot(tiny.model, batches_of(tiny), method=owl, spec=fp.L1Unstructured(0.5), allocation="owl")
    assert owl.calls == [list(masks)]


def test_a_users_method_with_hessians_gets_each_blocks_weights_and_statistics_then_the_heads() -> None:
    tiny = _hf.tiny("llama", layers=3)
    batches = batches_of(tiny)
    names = [*fp.prunable(tiny.model), "lm_head.weight"]
    recorder = Recorder()
    got = fp.oneshot(tiny.model, batches, method=recorder, spec=PER_ROW, names=names)
    calls = [list(weights) for weights, _, _ in recorder.seen]
    assert calls == [[n for n in names if n.startswith(f"model.layers.{i}.")] for i in range(3)] + [["lm_head.weight"]]
    for weights, statistics, specs in recorder.seen:
        assert list(statistics) == list(weights) and specs == dict.fromkeys(weights, PER_ROW)
        assert not any(w.requires_grad for w in weights.values())  # detached
        assert all(statistics[n].shape == (w.shape[1], w.shape[1]) for n, w in weights.items())
    first, statistics, _ = recorder.seen[0]  # block 0's inputs come from the dense model
    want = fp.hessians(tiny.model, batches, list(first))
    for n in first:
        torch.testing.assert_close(statistics[n], want[n], rtol=1e-5, atol=1e-5)
    assert same(got, fp.oneshot(tiny.model, batches, method=fp.SparseGPT(), spec=PER_ROW, names=names))


def test_bad_methods_are_refused_before_any_batch_runs() -> None:
    tiny = _hf.tiny("llama")
    consumed: list[bool] = []

    def batches() -> Iterator[dict[str, Tensor]]:
        consumed.append(True)
        yield {"input_ids": tiny.args[0]}

    cases: list[tuple[object, dict[str, Any], type[Exception], str]] = [
        (3, {}, TypeError, r"oneshot: method must be a one-shot method \(fp.Magnitude\(\), .*got int"),
        ("Wanda", {}, ValueError, r"oneshot: method must be one of 'magnitude', 'wanda', 'sparsegpt' .*got 'Wanda'"),
        (fp.Wanda, {}, TypeError, r"method must be a one-shot method .*got ABCMeta"),  # the class, not a value
        (Gradients(), {}, ValueError,
         r"oneshot: Gradients.statistic must be None, 'input_norms' or 'hessians' .*got 'gradients'"),
        (fp.SparseGPT(blocksize=6), {}, ValueError, r"blocksize=6 must be a multiple of the spec's m=4"),
        (NoNM(), {}, ValueError, r"NoNM: spec must not be N:M"),
        (AbsTimesNorm(), {"names": ["model.embed_tokens.weight"]}, ValueError,
         r"belongs to a Embedding; method=AbsTimesNorm\(\) prunes the weights of Linear"),
    ]  # fmt: skip
    for method, kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            fp.oneshot(tiny.model, batches(), method=method, spec=fp.NM(2, 4), **kwargs)  # type: ignore[arg-type]
    assert not consumed
    names = ["model.embed_tokens.weight", "model.layers.0.input_layernorm.weight"]  # no statistic: any weight
    assert list(NoNM().prune({n: dict(tiny.model.named_parameters())[n] for n in names}, {},
                             dict.fromkeys(names, fp.L1Unstructured(0.5)), {})[1]) == names  # fmt: skip


def test_what_a_method_returns_is_checked_against_the_weights_it_was_given() -> None:
    tiny = _hf.tiny("llama")
    first = "model.layers.0.self_attn.q_proj.weight"

    def masks(weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
        return {n: torch.ones_like(w, dtype=torch.bool) for n, w in weights.items()}

    cases: list[tuple[Callable[[Mapping[str, Tensor]], object], type[Exception], str]] = [
        (lambda w: [{}, masks(w)], TypeError, r"oneshot: Returns.prune must return \(new_weights, masks\), .*got list"),
        (lambda w: ({}, {n: m for n, m in masks(w).items() if n != first}), ValueError,
         rf"Returns.prune returned nothing as the mask of '{first}'; expected a torch.bool tensor of its shape"),
        (lambda w: ({}, {**masks(w), first: torch.ones(32, 32)}), ValueError,
         rf"returned a torch.float32 tensor of shape \(32, 32\) on cpu as the mask of '{first}'"),
        (lambda w: ({}, {**masks(w), first: torch.ones(32, 16, dtype=torch.bool)}), ValueError,
         rf"returned a torch.bool tensor of shape \(32, 16\) on cpu as the mask of '{first}'"),
        (lambda w: ({}, {**masks(w), "lm_head.weight": torch.ones(1, dtype=torch.bool)}), ValueError,
         r"Returns.prune returned a mask for 'lm_head.weight', which is not one of the weights it was given"),
        (lambda w: ({first: w[first].double()}, masks(w)), ValueError,
         rf"returned a torch.float64 tensor of shape \(32, 32\) on cpu as the new weight '{first}'; expected"),
        (lambda w: ({"nope": w[first]}, masks(w)), ValueError, r"returned a new weight for 'nope', which is not"),
    ]  # fmt: skip
    for result, error, match in cases:
        with pytest.raises(error, match=match):
            fp.oneshot(tiny.model, [], method=Returns(result), spec=PER_ROW)
    params, kept = fp.oneshot(tiny.model, [], method=Returns(lambda w: ({first: w[first] * 2}, masks(w))), spec=PER_ROW)
    assert torch.equal(params[first], 2 * dict(tiny.model.named_parameters())[first].detach())
    assert all(bool(m.all()) for m in kept.values())
