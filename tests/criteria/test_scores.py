"""Importance scores (funcprune._scores, _activations): definitions, SNIP and Wanda end to end, collection, errors."""

from __future__ import annotations

import copy
import itertools
import math
import re
from collections.abc import Callable, Iterator
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import funcprune as fp

Tensor = torch.Tensor

SHAPE = st.lists(st.integers(1, 5), min_size=0, max_size=3).map(tuple)
SEED = st.integers(0, 2**31 - 1)
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
ScoreFn = Callable[..., dict[str, Tensor]]


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def clones(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {name: t.clone() for name, t in tensors.items()}


def same(a: dict[str, Tensor], b: dict[str, Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def weights_and_grads(
    shapes: list[tuple[int, ...]], seed: int
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    params = {f"t{i}": randn(*shape, seed=seed + i) for i, shape in enumerate(shapes)}
    grads = {n: randn(*t.shape, seed=seed + 100 + i) for i, (n, t) in enumerate(params.items())}
    return params, grads


# --- saliency and taylor ---------------------------------------------------------


@given(st.lists(SHAPE, min_size=1, max_size=4), SEED)
def test_saliency_and_taylor_are_their_definitions_and_leave_inputs_alone(
    shapes: list[tuple[int, ...]], seed: int
) -> None:
    params, grads = weights_and_grads(shapes, seed)
    before, grads_before = clones(params), clones(grads)
    for fn, exponent in [(fp.saliency, 1), (fp.taylor, 2)]:
        scores = fn(params, grads)
        assert list(scores) == list(params)
        for name in params:
            definition = (params[name].double() * grads[name].double()).abs() ** exponent
            assert torch.equal(scores[name], definition), name
            assert scores[name] is not params[name] and scores[name] is not grads[name]
    assert same(params, before) and same(grads, grads_before)


@pytest.mark.parametrize("fn", [fp.saliency, fp.taylor])
@pytest.mark.parametrize("dtype", FLOATS)
def test_scores_come_in_float64_where_the_products_are_exact(fn: ScoreFn, dtype: torch.dtype) -> None:
    w, g = randn(3, 4, dtype=dtype), randn(3, 4, seed=1, dtype=dtype)
    score = fn({"w": w}, {"w": g})["w"]
    assert score.dtype == torch.float64
    product = w.double() * g.double()  # exact for every dtype but float64's own
    assert torch.equal(score, product.abs() if fn is fp.saliency else product.square())
    mixed = fn({"w": w.double()}, {"w": g})["w"]
    assert mixed.dtype == torch.float64


def test_taylor_of_half_inputs_neither_underflows_nor_overflows() -> None:
    w = torch.tensor([1e-3, 2e-3, 300.0], dtype=torch.float16)
    g = torch.tensor([1e-2, 1e-2, 300.0], dtype=torch.float16)
    score = fp.taylor({"w": w}, {"w": g})["w"]
    assert bool((w * g).square()[0] == 0) and bool((w * g).square()[2].isinf())  # in float16
    assert score[0] > 0 and score[1] > score[0] and bool(score.isfinite().all())


def finite(dtype: torch.dtype) -> st.SearchStrategy[float]:
    """Finite values of ``dtype``, as Python floats (exact), every exponent as likely as any.

    ``float16``, ``bfloat16`` and ``float32`` ones come from random bit patterns: subnormals and
    values near the top of the range as often as ordinary ones. ``float64`` ones have 26-bit
    significands and magnitudes in ``[2**-255, 2**255)`` (or are zero): their products with one
    another or with narrower floats are exact in ``float64`` and their squares normal there, the
    range where ``fp.taylor`` promises float64 inputs their exact order.
    """
    if dtype == torch.float64:
        return st.builds(
            lambda m, e, sign: sign * math.ldexp(m, e),
            st.integers(0, 2**26 - 1), st.integers(-255, 229), st.sampled_from([1.0, -1.0]),
        )  # fmt: skip
    bits = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}[dtype]
    width = torch.iinfo(bits).bits

    def value(pattern: int) -> float:
        return float(torch.tensor([pattern], dtype=bits).view(dtype).item())

    return st.integers(-(2 ** (width - 1)), 2 ** (width - 1) - 1).map(value).filter(math.isfinite)


@st.composite
def products(draw: st.DrawFn) -> tuple[Tensor, Tensor]:
    """A weight and a gradient of 1 to 10 entries, each of any dtype of FLOATS (mixed too)."""
    w_dtype, g_dtype = draw(st.sampled_from(FLOATS)), draw(st.sampled_from(FLOATS))
    n = draw(st.integers(1, 10))
    w = draw(st.lists(finite(w_dtype), min_size=n, max_size=n))
    g = draw(st.lists(finite(g_dtype), min_size=n, max_size=n))
    return torch.tensor(w, dtype=torch.float64).to(w_dtype), torch.tensor(g, dtype=torch.float64).to(g_dtype)


def order(values: Tensor | list[Fraction]) -> list[int]:
    """For every ordered pair of entries, -1, 0 or 1 as the first is below, equal to or above the second."""
    exact = [Fraction(v) for v in values.tolist()] if isinstance(values, Tensor) else values
    return [(a > b) - (a < b) for a, b in itertools.product(exact, repeat=2)]


def exact_squares(w: Tensor, g: Tensor) -> list[Fraction]:
    """``(w * g) ** 2`` in exact arithmetic, from the inputs' values."""
    return [(Fraction(a) * Fraction(b)) ** 2 for a, b in zip(w.double().tolist(), g.double().tolist(), strict=True)]


@given(products())
def test_taylor_and_saliency_rank_as_the_exact_products(case: tuple[Tensor, Tensor]) -> None:
    w, g = case
    exact = order(exact_squares(w, g))  # |w * g| orders as its square
    for fn in (fp.taylor, fp.saliency):
        scores = fn({"w": w}, {"w": g})["w"]
        assert order(scores) == exact, (fn.__name__, w.dtype, g.dtype, scores)


@pytest.mark.parametrize(
    ("dtype", "w", "g"),
    [
        (torch.bfloat16, [2.0**100, 2.0**101, 2.0**120], [2.0**27, 2.0**27, 2.0**27]),  # inf in float32
        (torch.bfloat16, [2.0**-120, 2.0**-119, 2.0**-133], [2.0**-10, 2.0**-10, 2.0**-10]),  # products 0
        (torch.float32, [2.0**-76, 2.0**-75, 3 * 2.0**-76], [1.0, 1.0, 1.0]),  # squares below 1e-45: 0, 2**-149
        (torch.float32, [1 + 2.0**-23, 1.0], [1 + 2.0**-23, 1 + 2.0**-22]),  # products 1 + 2**-22 in float32
    ],
)  # fmt: skip
def test_taylor_ranks_the_products_that_float32_ties(dtype: torch.dtype, w: list[float], g: list[float]) -> None:
    wt, gt = torch.tensor(w, dtype=dtype), torch.tensor(g, dtype=dtype)
    assert wt.double().tolist() == w and gt.double().tolist() == g  # the values meant, exactly
    float32 = (wt.float() * gt.float()).square()  # in float32: ties where the exact squares differ
    assert len(set(float32.tolist())) < len(w)
    scores = fp.taylor({"w": wt}, {"w": gt})["w"]
    assert order(scores) == order(exact_squares(wt, gt))
    assert len(set(scores.tolist())) == len(w) and bool(scores.isfinite().all())


@given(products(), products(), st.sampled_from([0.25, 0.5, 0.75, 1]))
def test_plans_on_taylor_and_on_saliency_scores_prune_the_same_weights(
    a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor], amount: float
) -> None:
    params, grads = {"a": a[0], "b": b[0]}, {"a": a[1], "b": b[1]}
    on_taylor, on_saliency = fp.taylor(params, grads), fp.saliency(params, grads)
    spec = fp.L1Unstructured(amount)
    plans: list[fp.Plan | fp.GlobalPlan] = [fp.Plan({"*": spec}), fp.global_unstructured(["a", "b"], spec)]
    for plan in plans:
        assert same(plan(params, scores=on_taylor), plan(params, scores=on_saliency)), plan
    w = torch.cat([a[0].double(), b[0].double()])  # exact: every value
    g = torch.cat([a[1].double(), b[1].double()])
    joint = torch.cat([on_taylor["a"], on_taylor["b"]])  # what the global plan ranks
    assert order(joint) == order(exact_squares(w, g))


def test_scores_are_data_not_recorded_by_autograd() -> None:
    w = randn(4, 3).requires_grad_()
    g = randn(4, 3, seed=1).requires_grad_()
    for fn in (fp.saliency, fp.taylor):
        score = fn({"w": w * 2}, {"w": g})["w"]
        assert not score.requires_grad and score.grad_fn is None
    norms = fp.wanda({"w": w}, {"w": randn(3).abs().requires_grad_()})["w"]
    assert not norms.requires_grad


def test_extra_gradients_are_ignored() -> None:
    params, grads = weights_and_grads([(2, 3)], 0)
    scores = fp.saliency(params, {**grads, "bias": None, "other": torch.zeros(7)})
    assert list(scores) == ["t0"]


@pytest.mark.parametrize("fn", [fp.saliency, fp.taylor])
def test_saliency_and_taylor_under_vmap_equal_the_loop(fn: ScoreFn) -> None:
    stacked = {"a": randn(3, 4, 5), "b": randn(3, 6, seed=1)}
    grads = {"a": randn(3, 4, 5, seed=2), "b": randn(3, 6, seed=3)}
    batched = torch.func.vmap(fn)(stacked, grads)
    for i in range(3):
        one = fn({k: v[i] for k, v in stacked.items()}, {k: v[i] for k, v in grads.items()})
        for name in stacked:
            assert torch.equal(batched[name][i], one[name])


@pytest.mark.parametrize("fn", [fp.saliency, fp.taylor])
def test_gradient_errors_name_the_parameter(fn: ScoreFn) -> None:
    run, name = fn, fn.__name__
    w = {"fc.weight": torch.ones(2, 3)}
    with pytest.raises(ValueError, match=rf"^{name}: no gradient for parameter 'fc.weight': grads "
                       r"has no key 'fc.weight'; did you mean 'fc1.weight'\?"):  # fmt: skip
        run(w, {"fc1.weight": torch.ones(2, 3)})
    with pytest.raises(ValueError, match=rf"^{name}: no gradient for parameter 'fc.weight': "
                       r"grads\['fc.weight'\] is None"):  # fmt: skip
        run(w, {"fc.weight": None})
    with pytest.raises(ValueError, match=re.escape(
        f"{name}: the gradient for 'fc.weight' has shape (3, 2) but the parameter has shape (2, 3)"
    )):  # fmt: skip
        run(w, {"fc.weight": torch.ones(3, 2)})
    with pytest.raises(TypeError, match=rf"^{name}: the parameter 'fc.weight' has dtype torch.int64"):
        run({"fc.weight": torch.ones(2, 3, dtype=torch.long)}, {"fc.weight": torch.ones(2, 3)})
    with pytest.raises(TypeError, match=rf"^{name}: the gradient for 'fc.weight' has dtype torch.bool"):
        run(w, {"fc.weight": torch.ones(2, 3, dtype=torch.bool)})
    with pytest.raises(TypeError, match=rf"^{name}: grads must be a mapping"):
        run(w, [torch.ones(2, 3)])
    with pytest.raises(TypeError, match=rf"^{name}: grads\['fc.weight'\] must be a tensor, got float"):
        run(w, {"fc.weight": 1.0})
    with pytest.raises(TypeError, match=rf"^{name}: params must be a mapping"):
        run(nn.Linear(3, 2), {})


# --- SNIP end to end -------------------------------------------------------------


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def keep_largest(scores: Tensor, amount: float) -> Tensor:
    """The reference mask by sort: the round(amount * n) smallest scores pruned (lower index first)."""
    flat = scores.flatten()
    pruned = torch.sort(flat, stable=True).indices[: round(amount * flat.numel())]
    mask = torch.ones(flat.numel(), dtype=torch.bool)
    mask[pruned] = False
    return mask.view(scores.shape)


def test_snip_keeps_the_largest_connection_sensitivities() -> None:
    model = mlp()
    params = {name: p.detach() for name, p in model.named_parameters()}
    x, y = randn(16, 6, seed=1), torch.arange(16) % 3

    def loss(p: dict[str, Tensor]) -> Tensor:
        out: Tensor = F.cross_entropy(torch.func.functional_call(model, p, (x,)), y)
        return out

    grads = torch.func.grad(loss)(params)
    scores = fp.saliency(params, grads)
    masks = fp.Plan({"*.weight": fp.L1Unstructured(0.5)})(params, scores=scores)
    assert list(masks) == ["0.weight", "2.weight"]
    for name, mask in masks.items():
        expected = keep_largest((params[name].double() * grads[name].double()).abs(), 0.5)
        assert torch.equal(mask, expected), name
        assert not torch.equal(mask, keep_largest(params[name].abs(), 0.5))  # not magnitude


# --- wanda -----------------------------------------------------------------------


@given(st.integers(1, 5), st.integers(1, 5), st.lists(st.integers(1, 3), max_size=2), SEED)
def test_wanda_is_the_weight_magnitude_times_the_input_norm(
    out: int, inputs: int, kernel: list[int], seed: int
) -> None:
    params = {"w": randn(out, inputs, *kernel, seed=seed), "b": randn(out, seed=seed + 1)}
    norms = {"w": randn(inputs, seed=seed + 2).abs()}
    before, norms_before = clones(params), clones(norms)
    score = fp.wanda(params, norms)
    assert list(score) == ["w"]
    index = (slice(None), slice(None), *(None,) * len(kernel))
    assert torch.equal(score["w"], params["w"].abs() * norms["w"][None, :][index])
    assert same(params, before) and same(norms, norms_before)


@pytest.mark.parametrize(
    ("weight", "norm", "expected"),
    [(torch.bfloat16, torch.float32, torch.float32), (torch.float16, torch.float16, torch.float32),
     (torch.float32, torch.float64, torch.float64), (torch.float64, torch.float32, torch.float64)],
)  # fmt: skip
def test_wanda_dtype_is_the_promoted_one_at_least_float32(
    weight: torch.dtype, norm: torch.dtype, expected: torch.dtype
) -> None:
    w, n = randn(3, 4, dtype=weight), randn(4, seed=1).abs().to(norm)
    score = fp.wanda({"w": w}, {"w": n})["w"]
    assert score.dtype == expected
    assert torch.equal(score, w.abs().to(expected) * n.to(expected)[None, :])


def test_wanda_under_vmap_with_batched_or_shared_norms() -> None:
    models = [nn.Conv2d(3, 4, 2) for _ in range(3)]
    stacked, _ = torch.func.stack_module_state(models)
    weights = {"weight": stacked["weight"].detach()}
    norms = randn(3, 3, seed=1).abs()
    batched = torch.func.vmap(fp.wanda)(weights, {"weight": norms})["weight"]
    shared = torch.func.vmap(fp.wanda, in_dims=(0, None))(weights, {"weight": norms[0]})["weight"]
    for i, model in enumerate(models):
        w = model.weight.detach()
        assert torch.equal(batched[i], fp.wanda({"weight": w}, {"weight": norms[i]})["weight"])
        assert torch.equal(shared[i], w.abs() * norms[0][None, :, None, None])


def test_wanda_errors() -> None:
    params = {"fc.weight": torch.ones(2, 3), "fc.bias": torch.ones(2)}
    with pytest.raises(fp.UnknownNameError, match=r"^wanda: input_norms names 'fc1.weight', not a "
                       r"parameter name; did you mean 'fc.weight'\?"):  # fmt: skip
        fp.wanda(params, {"fc1.weight": torch.ones(3)})
    with pytest.raises(ValueError, match=re.escape(
        "wanda: input_norms['fc.weight'] has shape (4,) but the parameter has 3 input features "
        "(shape (2, 3), dim 1)"
    )):  # fmt: skip
        fp.wanda(params, {"fc.weight": torch.ones(4)})
    with pytest.raises(ValueError, match=r"input_norms\['fc.weight'\] has shape \(3, 1\), which does not fit"):
        fp.wanda(params, {"fc.weight": torch.ones(3, 1)})
    with pytest.raises(ValueError, match=r"^wanda: the parameter 'fc.bias' has shape \(2,\); wanda "
                       r"scores weights of shape \(out, in, \*kernel\)"):  # fmt: skip
        fp.wanda(params, {"fc.bias": torch.ones(2)})
    with pytest.raises(TypeError, match=r"^wanda: input_norms\['fc.weight'\] has dtype torch.int64"):
        fp.wanda(params, {"fc.weight": torch.ones(3, dtype=torch.long)})
    with pytest.raises(TypeError, match=r"^wanda: input_norms\['fc.weight'\] must be a tensor"):
        fp.wanda(params, {"fc.weight": [1.0, 2.0, 3.0]})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match=r"^wanda: input_norms must be a mapping .* fp.input_norms"):
        fp.wanda(params, [torch.ones(3)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^wanda: input_norms\['fc.weight'\] is on meta but the "
                       r"parameter is on cpu"):  # fmt: skip
        fp.wanda(params, {"fc.weight": torch.ones(3, device="meta")})


# --- input_norms: the reference ----------------------------------------------------


class Net(nn.Module):
    """A conv, a shared layer called twice, a head; inputs captured by hand for the reference."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.fc = nn.Linear(12, 12)
        self.head = nn.Linear(12, 2)

    def features(self, x: Tensor) -> list[tuple[str, Tensor]]:
        """Each (weight name, input reaching its layer), in call order."""
        a = F.adaptive_avg_pool2d(torch.relu(self.conv(x)), 2).flatten(1)
        b = torch.relu(self.fc(a))
        c = self.fc(b)
        return [("conv.weight", x), ("fc.weight", a), ("fc.weight", b), ("head.weight", c)]

    def forward(self, x: Tensor, scale: float = 1.0) -> Tensor:
        out: Tensor = self.head(self.fc(torch.relu(self.fc(
            F.adaptive_avg_pool2d(torch.relu(self.conv(x * scale)), 2).flatten(1)))))
        return out  # fmt: skip


def net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net()


NAMES = ["conv.weight", "fc.weight", "head.weight"]


def reference_norms(model: Net, batches: list[Tensor]) -> dict[str, Tensor]:
    """||X_j||_2 over every calibration token, X stacked by hand, in float64."""
    tokens: dict[str, list[Tensor]] = {name: [] for name in NAMES}
    with torch.no_grad():
        for x in batches:
            for name, inp in model.features(x):
                features = inp.movedim(1, -1) if name == "conv.weight" else inp
                tokens[name].append(features.reshape(-1, features.shape[-1]).double())
    return {name: torch.linalg.vector_norm(torch.cat(t), dim=0) for name, t in tokens.items()}


def images(n: int, seed: int) -> Tensor:
    return randn(n, 2, 5, 5, seed=seed)


def test_input_norms_equal_the_stacked_inputs_norms_and_wanda_the_paper() -> None:
    model = net()
    batches = [images(4, 1), images(3, 2)]
    norms = fp.input_norms(model, batches, NAMES)
    expected = reference_norms(model, batches)
    assert list(norms) == NAMES
    for name in NAMES:
        assert norms[name].dtype == torch.float32 and norms[name].shape == expected[name].shape
        torch.testing.assert_close(norms[name].double(), expected[name], rtol=1e-6, atol=0)
    params = {name: p.detach() for name, p in model.named_parameters()}
    scores = fp.wanda(params, norms)
    for name in NAMES:  # the paper's |W_ij| * ||X_j||_2
        w = params[name].double().abs()
        paper = w * expected[name].view(-1, *(1,) * (w.dim() - 2))
        torch.testing.assert_close(scores[name].double(), paper, rtol=1e-6, atol=0)


@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), SEED)
def test_input_norms_do_not_depend_on_how_tokens_are_split_into_batches(
    sizes: list[int], seed: int
) -> None:
    layer = nn.Linear(3, 2).double()
    x = randn(sum(sizes), 3, seed=seed, dtype=torch.float64)
    split = fp.input_norms(layer, list(torch.split(x, sizes)), ["weight"])["weight"]
    assert split.dtype == torch.float64
    torch.testing.assert_close(split, torch.linalg.vector_norm(x, dim=0), rtol=1e-12, atol=0)


def test_unbatched_and_extra_token_dims() -> None:
    conv, linear = nn.Conv1d(2, 3, 2), nn.Linear(3, 1)
    x = randn(2, 6)  # one unbatched sequence (C, L)
    torch.testing.assert_close(fp.input_norms(conv, [x], ["weight"])["weight"], x.norm(dim=1))
    y = randn(2, 4, 3, seed=1)  # (batch, sequence, features)
    expected = y.reshape(-1, 3).norm(dim=0)
    torch.testing.assert_close(fp.input_norms(linear, [y, y[0, 0]], ["weight"])["weight"],
                               (expected.square() + y[0, 0].square()).sqrt())  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_accumulate_in_float64(dtype: torch.dtype) -> None:
    """4096 tokens of 300: the sum of squares (3.7e8) is far past float16's 65504."""
    layer = nn.Linear(2, 1).to(dtype)
    x = torch.full((4096, 2), 300.0, dtype=dtype)
    assert bool(x.square().sum(0).isinf().all()) or dtype == torch.bfloat16
    norms = fp.input_norms(layer, [x[:1000], x[1000:]], ["weight"])["weight"]
    assert norms.dtype == torch.float32
    assert norms.tolist() == [19200.0, 19200.0]  # 300 * sqrt(4096)
    noisy = randn(2048, 2, seed=3, dtype=dtype) * 1000
    got = fp.input_norms(layer, [noisy], ["weight"])["weight"]
    torch.testing.assert_close(got, torch.linalg.vector_norm(noisy.double(), dim=0).float())


def test_tuple_and_dict_batches_and_keyword_input() -> None:
    model = net()
    x = images(3, 1)
    expected = fp.input_norms(model, [x * 2.0], NAMES)
    for batches in ([(x, 2.0)], [[x, 2.0]], [{"x": x, "scale": 2.0}]):
        assert same(fp.input_norms(model, batches, NAMES), expected)
    layer = nn.Linear(3, 2)
    y = randn(4, 3)
    assert torch.equal(fp.input_norms(layer, [{"input": y}], ["weight"])["weight"], y.norm(dim=0))


def test_a_generator_of_batches_is_consumed_once_and_duplicates_are_one() -> None:
    layer = nn.Linear(3, 2)
    xs = [randn(2, 3, seed=i) for i in range(3)]
    norms = fp.input_norms(layer, (x for x in xs), ["weight", "weight"])
    assert list(norms) == ["weight"]
    torch.testing.assert_close(norms["weight"], torch.cat(xs).norm(dim=0))


def test_a_tied_weight_is_collected_from_the_module_named_first() -> None:
    """Two Linears holding one Parameter: its name is the first's, and only its inputs count."""
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    model[1].weight = model[0].weight
    assert [n for n, _ in model.named_parameters() if n.endswith("weight")] == ["0.weight"]
    x = randn(4, 3)
    norms = fp.input_norms(model, [x], ["0.weight"])
    assert list(norms) == ["0.weight"]
    torch.testing.assert_close(norms["0.weight"], x.norm(dim=0))
    with pytest.raises(fp.UnknownNameError, match="'1.weight' is not a parameter name: it is the same"):
        fp.input_norms(model, [x], ["1.weight"])


def test_no_names_run_nothing() -> None:
    assert fp.input_norms(nn.Linear(2, 2), failing_batches(), []) == {}


# --- input_norms: the module is left as it was ----------------------------------------


def hooks_of(module: nn.Module) -> list[tuple[str, list[object]]]:
    dicts = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
             "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_backward_hooks")  # fmt: skip
    modules = module.named_modules()
    return [(f"{name}.{d}", list(getattr(m, d).items())) for name, m in modules for d in dicts]


def failing_batches() -> Iterator[Tensor]:
    yield images(2, 1)
    raise RuntimeError("the data loader failed")


@pytest.mark.parametrize("training", [True, False])
def test_the_module_is_left_as_it_was_also_when_a_batch_raises(training: bool) -> None:
    model = net().train(training)
    model.fc.register_forward_pre_hook(lambda m, a: None)  # the user's own hook stays
    state, hooks = copy.deepcopy(model.state_dict()), hooks_of(model)
    modes = [m.training for m in model.modules()]
    fp.input_norms(model, [images(2, 1)], NAMES)
    with pytest.raises(RuntimeError, match="the data loader failed"):
        fp.input_norms(model, failing_batches(), NAMES)
    with pytest.raises(ValueError, match="received an input of shape"):  # raised in a hook
        fp.input_norms(model, [images(2, 1), randn(2, 5, 5, 5)], NAMES)
    with pytest.raises(TypeError, match="unexpected keyword"):  # the module's own error
        fp.input_norms(model, [{"x": images(2, 1), "scal": 2.0}], NAMES)
    assert hooks_of(model) == hooks and len(model.fc._forward_pre_hooks) == 1
    assert [m.training for m in model.modules()] == modes
    assert same(model.state_dict(), state)
    assert all(p.grad is None for p in model.parameters())


# --- input_norms: errors ------------------------------------------------------------


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.grouped = nn.Conv1d(4, 4, 1, groups=2)
        self.deconv = nn.ConvTranspose1d(4, 4, 1)
        self.fc = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)
        self.attn = nn.MultiheadAttention(4, 1)
        self.shared = self.fc  # one module under two names

    def forward(self, ids: Tensor) -> Tensor:
        out: Tensor = self.shared(self.fc(self.embed(ids)))
        return out


@pytest.mark.parametrize(
    ("name", "error", "message"),
    [
        ("fc.wieght", fp.UnknownNameError,
         r"'fc.wieght' is not a parameter name; did you mean 'fc.weight'"),
        ("shared.weight", fp.UnknownNameError,
         r"'shared.weight' is not a parameter name: it is the same Parameter as 'fc.weight'"),
        ("embed.weight", ValueError,
         r"'embed.weight' belongs to the module 'embed', of type Embedding; input_norms "
         r"supports the weight of nn.Linear and of nn.Conv1d/2d/3d with groups=1"),
        ("fc.bias", ValueError,
         r"'fc.bias' belongs to the module 'fc', of type Linear; input_norms supports"),
        ("grouped.weight", ValueError,
         r"'grouped.weight' belongs to the module 'grouped', of type Conv1d with groups=2"),
        ("deconv.weight", ValueError,
         r"'deconv.weight' belongs to the module 'deconv', of type ConvTranspose1d"),
        ("attn.in_proj_weight", ValueError,
         r"'attn.in_proj_weight' belongs to the module 'attn', of type MultiheadAttention"),
    ],
)  # fmt: skip
def test_unsupported_names_are_refused_before_any_batch_runs(
    name: str, error: type[Exception], message: str
) -> None:
    ran: list[int] = []

    def batches() -> Iterator[Tensor]:
        ran.append(1)
        yield torch.tensor([1, 2])

    with pytest.raises(error, match=r"^input_norms: " + message):
        fp.input_norms(Mixed(), batches(), ["fc.weight", name])
    assert not ran


def test_no_batches_and_never_reached_layers() -> None:
    model = Mixed()
    with pytest.raises(ValueError, match=r"^input_norms: no batches"):
        fp.input_norms(model, [], ["fc.weight"])
    ids = torch.tensor([1, 2])
    with pytest.raises(ValueError, match=r"^input_norms: the module 'unused', holding 'unused.weight', "
                       r"was never called by any batch"):  # fmt: skip
        fp.input_norms(model, [ids], ["fc.weight", "unused.weight"])
    with pytest.raises(ValueError, match=r"'attn.out_proj', holding 'attn.out_proj.weight', was never"):
        fp.input_norms(model, [ids], ["attn.out_proj.weight"])
    assert hooks_of(model) == hooks_of(Mixed())


def test_argument_and_batch_type_errors() -> None:
    layer = nn.Linear(3, 2)
    x = randn(2, 3)
    with pytest.raises(TypeError, match=r"^input_norms: module must be a torch.nn.Module, got dict"):
        fp.input_norms(dict(layer.named_parameters()), [x], ["weight"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^input_norms: names must be a list .* write \['weight'\]"):
        fp.input_norms(layer, [x], "weight")
    with pytest.raises(TypeError, match=r"^input_norms: names\[0\] must be a str, got int"):
        fp.input_norms(layer, [x], [0])  # type: ignore[list-item]
    for single in (x, {"input": x}):
        with pytest.raises(TypeError, match=r"^input_norms: batches must be an iterable .* \[batch\]"):
            fp.input_norms(layer, single, ["weight"])
    with pytest.raises(TypeError, match=r"^input_norms: batch 1 must be a tensor, a tuple or list"):
        fp.input_norms(layer, [x, 3.0], ["weight"])
    with pytest.raises(TypeError, match=r"^input_norms: the input of the module itself must be a "
                       r"floating-point tensor, got dtype torch.int64"):  # fmt: skip
        fp.input_norms(layer, [torch.ones(2, 3, dtype=torch.long)], ["weight"])
    with pytest.raises(ValueError, match=r"^input_norms: the module itself received an input of "
                       r"shape \(2, 4\); expected its 3 input features in dim -1"):  # fmt: skip
        fp.input_norms(layer, [randn(2, 4)], ["weight"])
    assert hooks_of(layer) == hooks_of(nn.Linear(3, 2))
