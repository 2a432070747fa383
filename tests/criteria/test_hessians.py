"""The Hessians of layer reconstruction (funcprune._criteria._hessians), and padding left out of calibration.

``fp.hessians`` is checked against its definition, ``Σ XᵀX`` over the inputs
that reached each weight's module, captured here by a forward pre-hook of the
test's own; then its dtypes, the ``attention_mask`` of dict batches (shared
with ``fp.input_norms``, checked for both), the module left as it was, and
its errors.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import funcprune as fp

Tensor = torch.Tensor

SEED = st.integers(0, 2**31 - 1)


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def call(model: nn.Module, batch: object) -> object:
    """``model`` called on ``batch`` as the docstring says: a tensor, ``*tuple``/``*list`` or ``**dict``."""
    if isinstance(batch, Tensor):
        return model(batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    assert isinstance(batch, dict)
    return model(**batch)


def inputs_of(model: nn.Module, names: list[str], batches: list[Any]) -> dict[str, list[Tensor]]:
    """The inputs that reach each named weight's module when ``model`` runs on ``batches``, by our own hook."""
    seen: dict[str, list[Tensor]] = {name: [] for name in names}

    def catcher(name: str) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], None]:
        def hook(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            seen[name].append((args[0] if args else kwargs["input"]).detach().clone())

        return hook

    handles = [
        model.get_submodule(name.rpartition(".")[0]).register_forward_pre_hook(catcher(name), with_kwargs=True)
        for name in names
    ]
    try:
        with torch.no_grad():
            for batch in batches:
                call(model, batch)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def gram(inputs: list[Tensor]) -> Tensor:
    """``Σ x.reshape(-1, in).T @ x.reshape(-1, in)`` over ``inputs``, in float64."""
    features = inputs[0].shape[-1]
    total = torch.zeros(features, features, dtype=torch.float64)
    for x in inputs:
        rows = x.reshape(-1, features).double()
        total += rows.T @ rows
    return total


def assert_psd(h: Tensor) -> None:
    """Symmetric (to rounding) and positive semi-definite (eigenvalues >= -tol)."""
    torch.testing.assert_close(h, h.T, rtol=1e-6, atol=1e-6 * float(h.abs().max()))
    eigenvalues = torch.linalg.eigvalsh(h.double())
    assert float(eigenvalues.min()) >= -1e-6 * max(float(eigenvalues.abs().max()), 1.0)


def hooks_of(module: nn.Module) -> list[tuple[str, list[object]]]:
    dicts = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
             "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_backward_hooks")  # fmt: skip
    modules = module.named_modules()
    return [(f"{name}.{d}", list(getattr(m, d).items())) for name, m in modules for d in dicts]


def no_hooks_left(module: nn.Module) -> bool:
    return all(not m._forward_pre_hooks and not m._forward_pre_hooks_with_kwargs for m in module.modules())


def recorded(batches: list[Any], ran: list[int]) -> Iterator[Any]:
    """``batches`` one by one, appending to ``ran`` once the first is asked for."""
    ran.append(1)
    yield from batches


# --- the definition ------------------------------------------------------------------


class Net(nn.Module):
    """Nested Sequentials, a layer called twice per forward, a head; a keyword argument."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Sequential(nn.Linear(6, 6), nn.Tanh()))
        self.shared = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(6, 3)

    def forward(self, x: Tensor, scale: float = 1.0) -> Tensor:
        out: Tensor = self.head(self.drop(self.shared(torch.relu(self.shared(self.body(x * scale))))))
        return out


NAMES = ["body.0.weight", "body.2.0.weight", "shared.weight", "head.weight"]


def net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net().eval()


XS = [randn(3, 4, seed=1), randn(2, 5, 4, seed=2), randn(4, seed=3)]  # (batch, in), (batch, tokens, in), (in,)


def as_batches(kind: str) -> list[Any]:
    if kind == "tensor":
        return list(XS)
    if kind == "tuple":
        return [(x, 2.0) for x in XS]
    if kind == "list":
        return [[x, 2.0] for x in XS]
    return [{"x": x, "scale": 2.0} for x in XS]


@pytest.mark.parametrize("kind", ["tensor", "tuple", "list", "dict", "generator of dicts"])
def test_hessians_are_the_sum_of_x_transpose_x_over_every_input_reaching_each_layer(kind: str) -> None:
    model = net()
    batches = as_batches(kind.removeprefix("generator of "))
    seen = inputs_of(model, NAMES, batches)
    assert [len(seen[n]) for n in NAMES] == [3, 3, 6, 3]  # the shared layer: twice per batch
    got = fp.hessians(model, (b for b in batches) if kind.startswith("generator") else batches, NAMES)
    assert list(got) == NAMES
    for name in NAMES:
        features = model.get_parameter(name).shape[1]
        assert got[name].shape == (features, features) and got[name].dtype == torch.float32
        torch.testing.assert_close(got[name].double(), gram(seen[name]), rtol=1e-5, atol=1e-5)
        assert_psd(got[name])
    first_calls = gram(seen["shared.weight"][::2])  # both calls of the shared layer count, not the first only
    assert not torch.allclose(got["shared.weight"].double(), first_calls, rtol=1e-3)
    norms = fp.input_norms(model, batches, NAMES)  # the same tokens: input_norms are sqrt(diag(H))
    for name in NAMES:
        torch.testing.assert_close(norms[name], got[name].diagonal().sqrt(), rtol=1e-5, atol=1e-6)


def test_the_docstring_example_and_keyword_input() -> None:
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    got = fp.hessians(model, [torch.tensor([[3.0, 0.0]]), torch.tensor([[4.0, 1.0]])], ["0.weight"])
    assert torch.equal(got["0.weight"], torch.tensor([[25.0, 4.0], [4.0, 1.0]]))
    layer = nn.Linear(3, 2)
    y = randn(4, 3)
    torch.testing.assert_close(fp.hessians(layer, [{"input": y}], ["weight"])["weight"], y.T @ y)


def test_names_in_their_order_duplicates_once_and_none_runs_nothing() -> None:
    model = net()
    names = ["head.weight", "body.0.weight", "head.weight"]
    assert list(fp.hessians(model, [XS[0]], names)) == ["head.weight", "body.0.weight"]
    ran: list[int] = []
    assert fp.hessians(model, recorded([XS[0]], ran), []) == {}
    assert not ran


def test_the_result_is_data_not_recorded_by_autograd() -> None:
    layer = nn.Linear(3, 2)
    x = randn(4, 3).requires_grad_()
    h = fp.hessians(layer, [x * 2], ["weight"])["weight"]
    assert not h.requires_grad and h.grad_fn is None
    assert all(p.grad is None for p in layer.parameters())


def test_a_tied_weight_is_collected_from_the_module_named_first() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3))
    model[2].weight = model[0].weight
    x = randn(4, 3)
    torch.testing.assert_close(fp.hessians(model, [x], ["0.weight"])["0.weight"], x.T @ x)
    with pytest.raises(fp.UnknownNameError, match=r"^hessians: '2.weight' is not a parameter name: it is the same"):
        fp.hessians(model, [x], ["2.weight"])



# --- inputs changed in place between two layers -------------------------------------------


def norms_of(inputs: list[Tensor]) -> Tensor:
    """The L2 norm of each feature (the last dim) over ``inputs``, in float64."""
    return gram(inputs).diagonal().sqrt()


def _added(fc: nn.Linear, fed: Tensor, target: Tensor) -> None:
    target += fc(fed)


def _relu(fc: nn.Linear, fed: Tensor, target: Tensor) -> None:
    fc(fed)
    target.relu_()


def _add(fc: nn.Linear, fed: Tensor, target: Tensor) -> None:
    fc(fed)
    target.add_(0.5)


def _through_a_view(fc: nn.Linear, fed: Tensor, target: Tensor) -> None:
    fc(fed)
    target[..., ::2].mul_(-2.0)


def _through_detach(fc: nn.Linear, fed: Tensor, target: Tensor) -> None:
    fc(fed)
    target.detach().sub_(1.0)


#: How a forward feeds ``fc`` a tensor and then changes it (``target``: it, or its base) in place.
IN_PLACE: dict[str, Callable[[nn.Linear, Tensor, Tensor], None]] = {
    "x += fc1(x)": _added,
    "relu_": _relu,
    "add_": _add,
    "through a view": _through_a_view,
    "through detach": _through_detach,
}


class InPlace(nn.Module):
    """``fc1``, an in-place change of its input (``change``), then ``fc2``, ``fc3`` and ``fc4`` on that tensor.

    ``fc3`` sees it unchanged after ``fc2`` (their statistic may be shared);
    ``fc4`` sees it after it was changed once more, in place, after ``fc2``
    and ``fc3`` recorded it. ``view=True`` feeds every layer a view of a
    tensor and changes that tensor (the view's base), not the view.
    """

    def __init__(self, change: str, view: bool = False) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3, self.fc4 = (nn.Linear(4, 4) for _ in range(4))
        self.change, self.view = IN_PLACE[change], view

    def forward(self, x: Tensor) -> Tensor:
        base = x.clone()
        h = base.view_as(base) if self.view else base
        self.change(self.fc1, h, base)
        out: Tensor = self.fc2(h) + self.fc3(h)
        base.mul_(3.0)
        last: Tensor = self.fc4(h)
        return out + last


IN_PLACE_NAMES = [f"fc{i}.weight" for i in range(1, 5)]


@pytest.mark.parametrize("view", [False, True], ids=["tensor", "view of it"])
@pytest.mark.parametrize("change", list(IN_PLACE))
def test_a_tensor_changed_in_place_between_two_layers_gives_each_what_it_received(change: str, view: bool) -> None:
    """Each layer's statistic is of the input it received, as a hook that clones it records (no stale reuse)."""
    torch.manual_seed(0)
    model = InPlace(change, view).eval()
    batches = [randn(3, 4, seed=11), randn(2, 5, 4, seed=12)]
    seen = inputs_of(model, IN_PLACE_NAMES, batches)
    assert not torch.equal(gram(seen["fc1.weight"]), gram(seen["fc2.weight"]))  # the change changed something
    norms, grams = fp.input_norms(model, batches, IN_PLACE_NAMES), fp.hessians(model, batches, IN_PLACE_NAMES)
    for name in IN_PLACE_NAMES:
        torch.testing.assert_close(norms[name].double(), norms_of(seen[name]), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grams[name].double(), gram(seen[name]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [fp.input_norms, fp.hessians])
def test_under_inference_mode_an_input_changed_in_place_is_summed_again(fn: Callable[..., dict[str, Tensor]]) -> None:
    """Inference tensors have no version counter: nothing is reused, whatever the forward changed."""
    torch.manual_seed(0)
    model = InPlace("add_").eval()
    batches = [randn(3, 4, seed=11)]
    seen = inputs_of(model, IN_PLACE_NAMES, batches)
    with torch.inference_mode():
        got = fn(model, batches, IN_PLACE_NAMES)
    for name in IN_PLACE_NAMES:
        want = norms_of(seen[name]) if fn is fp.input_norms else gram(seen[name])
        torch.testing.assert_close(got[name].double(), want, rtol=1e-5, atol=1e-5)


def test_an_unchanged_input_is_summed_once_a_changed_one_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sharing of q, k and v stays: rows are made once per distinct state of the input, not per layer."""
    from funcprune._criteria import _hooks

    made: list[int] = []
    rows = _hooks._rows

    def counted(*args: Any) -> Tensor:
        made.append(1)
        out: Tensor = rows(*args)
        return out

    monkeypatch.setattr(_hooks, "_rows", counted)
    torch.manual_seed(0)
    fp.input_norms(InPlace("add_").eval(), [randn(3, 4, seed=11)], IN_PLACE_NAMES)
    assert len(made) == 3  # fc1; fc2 and fc3 after the change (shared); fc4 after the second change


class Parting(nn.Module):
    """``fc1``, ``fc2`` and ``fc3`` on one input, which is changed in place before the layer ``parts_at``
    (``"fc2"``, ``"fc3"``, or ``""``: none) in the calls whose batch's first row starts with a positive value."""

    def __init__(self, parts_at: str) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = (nn.Linear(4, 4) for _ in range(3))
        self.parts_at = parts_at

    def forward(self, x: Tensor) -> Tensor:
        h = x.clone()
        parts = bool(x.reshape(-1, 4)[0, 0] > 0)
        out: Tensor = self.fc1(h)
        for name in ("fc2", "fc3"):
            if parts and self.parts_at == name:
                h.mul_(2.0)
            out = out + getattr(self, name)(h)
        return out


@pytest.mark.parametrize("parts_at", ["fc2", "fc3"])
@pytest.mark.parametrize("pattern", ["+--+-", "-+-++", "--+--", "+++--"], ids=lambda p: p.replace("+", "P"))
def test_sums_shared_while_the_input_is_shared_give_each_weight_its_own_ordered_sum_bit_for_bit(
    parts_at: str, pattern: str
) -> None:
    """The runner's sharing (``shared=True``: q, k and v keep one running sum while every call feeds them one
    input): each weight's sum has the bits of the left fold of its own ``xᵀx`` terms, in float32, however the
    calls part its input from the others' (``+``: this call changes the input before ``parts_at``) and join it
    again; weights that took the same terms in every call get one tensor, and by default each its own."""
    from funcprune._criteria import GRAMS, calls, collect

    torch.manual_seed(0)
    model = Parting(parts_at).eval()
    batches = [randn(2, 3, 4, seed=i).abs() * (1 if sign == "+" else -1) for i, sign in enumerate(pattern)]
    names = ["fc1.weight", "fc2.weight", "fc3.weight"]
    seen = inputs_of(model, names, batches)
    got = collect("hessians", model, calls("hessians", batches), names, GRAMS, shared=True)
    for name in names:
        terms = [x.reshape(-1, 4).T @ x.reshape(-1, 4) for x in seen[name]]
        folded = terms[0]
        for term in terms[1:]:
            folded = folded + term
        assert torch.equal(got[name], folded), name
    alike = {name: [torch.equal(a, b) for a, b in zip(seen[name], seen["fc1.weight"], strict=True)] for name in names}
    for name in names[1:]:
        assert (got[name] is got["fc1.weight"]) == all(alike[name]), (name, alike[name])
    alone = fp.hessians(model, batches, names)
    assert len({t.untyped_storage().data_ptr() for t in alone.values()}) == 3
    assert all(torch.equal(alone[n], got[n]) for n in names)


def test_a_first_term_that_is_a_view_of_the_input_is_never_added_to_in_place() -> None:
    """A statistic may return a view of its rows, and the rows of a batch that reaches a layer unchanged are a
    view of the caller's tensor: the sum holds that first term as it is, and adds to a tensor of its own."""
    from funcprune._criteria import Statistic, calls, collect

    first_row = Statistic(lambda rows: rows[0], lambda f: (f,), linear_only=True, narrow_in_float64=False, fresh=False)
    model = nn.Linear(4, 2)
    batches = [randn(1, 4, seed=i) for i in range(3)]
    before = [b.clone() for b in batches]
    got = collect("first rows", model, calls("first rows", batches), ["weight"], first_row)
    assert all(torch.equal(a, b) for a, b in zip(batches, before, strict=True))
    torch.testing.assert_close(got["weight"], sum(b[0] for b in before))

# --- transformers: GPT-2's Conv1D, Llama's Linears ---------------------------------------------


@pytest.fixture(scope="module")
def hf() -> Any:
    return pytest.importorskip("_hf", reason="needs transformers (the hf extra)")


@pytest.fixture(scope="module")
def gpt2(hf: Any) -> Any:
    return hf.tiny("gpt2")


@pytest.fixture(scope="module")
def llama(hf: Any) -> Any:
    return hf.tiny("llama")


def weights_of(model: nn.Module, kind: str) -> list[str]:
    return [f"{path}.weight" for path, m in model.named_modules() if type(m).__name__ == kind]


def test_hessians_of_gpt2_s_conv1d_are_in_by_in(gpt2: Any) -> None:
    model = gpt2.model
    names = weights_of(model, "Conv1D")
    assert len(names) == 8
    ids = gpt2.args[0]
    batches = [{"input_ids": ids, "use_cache": False}, {"input_ids": ids.flip(0)[:, :5], "use_cache": False}]
    seen = inputs_of(model, names, batches)
    got = fp.hessians(model, batches, names)
    shapes = set()
    for name in names:
        weight = model.get_parameter(name)  # stored (in, out)
        inputs = weight.shape[0]
        assert got[name].shape == (inputs, inputs), name
        shapes.add(tuple(weight.shape))
        torch.testing.assert_close(got[name].double(), gram(seen[name]), rtol=1e-5, atol=1e-4)
        assert_psd(got[name])
    assert any(a != b for a, b in shapes)  # (in, out) with in != out: the wrong dim would not fit


def test_hessians_of_llama_s_linears_are_those_of_their_inputs(llama: Any) -> None:
    model = llama.model
    names = weights_of(model, "Linear")
    assert len(names) == 15  # 7 a layer, and the head
    ids = llama.args[0]
    batches = [{"input_ids": ids, "use_cache": False}, {"input_ids": ids[:1, 2:], "use_cache": False}]
    seen = inputs_of(model, names, batches)
    got = fp.hessians(model, batches, names)
    assert list(got) == names
    for name in names:
        inputs = model.get_parameter(name).shape[1]
        assert got[name].shape == (inputs, inputs) and got[name].dtype == torch.float32
        torch.testing.assert_close(got[name].double(), gram(seen[name]), rtol=1e-5, atol=1e-4)
        assert_psd(got[name])


# --- dtypes ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float32_and_float64_inputs_give_their_own_dtype(dtype: torch.dtype) -> None:
    layer = nn.Linear(4, 3).to(dtype)
    xs = [randn(5, 4, seed=1, dtype=dtype), randn(2, 3, 4, seed=2, dtype=dtype)]
    h = fp.hessians(layer, xs, ["weight"])["weight"]
    assert h.dtype == dtype
    tight = dtype == torch.float64
    torch.testing.assert_close(h.double(), gram(xs), rtol=1e-12 if tight else 1e-5, atol=1e-12 if tight else 1e-5)


def exact(dtype: torch.dtype, *shape: int, seed: int) -> Tensor:
    """Multiples of 1/16 in [-4, 4]: exact in float16 and bfloat16, their Gram sums exact in float64."""
    return (torch.randint(-64, 65, shape, generator=torch.Generator().manual_seed(seed)) / 16).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_are_summed_and_returned_in_float64(dtype: torch.dtype) -> None:
    layer = nn.Linear(4, 3).to(dtype)
    xs = [exact(dtype, 7, 4, seed=1), exact(dtype, 2, 5, 4, seed=2), exact(dtype, 4, seed=3)]
    h = fp.hessians(layer, xs, ["weight"])["weight"]
    assert h.dtype == torch.float64
    assert torch.equal(h, gram(xs))  # the float64 sum of the upcast inputs, exactly
    noisy = [randn(300, 4, seed=4, dtype=dtype) * 100, randn(3, 50, 4, seed=5, dtype=dtype)]
    h = fp.hessians(layer, noisy, ["weight"])["weight"]
    assert h.dtype == torch.float64
    torch.testing.assert_close(h, gram(noisy), rtol=1e-13, atol=0)  # no rounding to float32 on the way
    norms = fp.input_norms(layer, xs, ["weight"])["weight"]  # input_norms keeps its contract: float32
    assert norms.dtype == torch.float32
    torch.testing.assert_close(norms, gram(xs).diagonal().sqrt().float())


def test_half_sums_do_not_overflow() -> None:
    """4096 tokens of 300: each sum (3.7e8) is far past float16's 65504."""
    layer = nn.Linear(2, 1).half()
    x = torch.full((4096, 2), 300.0, dtype=torch.float16)
    assert bool((x.T @ x).isinf().all())
    h = fp.hessians(layer, [x[:1000], x[1000:]], ["weight"])["weight"]
    assert h.dtype == torch.float64 and h.tolist() == [[368640000.0] * 2] * 2


# --- padding left out -------------------------------------------------------------------


class Padded(nn.Module):
    """A layer on (batch, tokens, in), one on the flattened (batch * tokens, hidden) rows, one on pooled ones."""

    def __init__(self, pool: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(3, 4).double()
        self.flat = nn.Linear(4, 2).double()
        self.pooled = nn.Linear(4, 2).double()
        self.pool = pool
        self.calls = 0

    def forward(self, x: Tensor, attention_mask: Any = None) -> Tensor:
        self.calls += 1
        h = torch.tanh(self.fc(x))
        out: Tensor = self.flat(h.reshape(-1, h.shape[-1]))
        if self.pool:
            out = self.pooled(h.mean(dim=1))
        return out


PADDED_NAMES = ["fc.weight", "flat.weight"]
MASKS = [
    torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]),
    torch.tensor([[0, 0, 0, 0, 0], [1, 1, 0, 0, 0]]),  # a sequence of padding only
]


@pytest.mark.parametrize("mask_dtype", [torch.int64, torch.bool, torch.float32])
def test_padding_is_left_out_of_3d_and_flattened_inputs(mask_dtype: torch.dtype) -> None:
    model = Padded()
    xs = [randn(2, 5, 3, seed=1, dtype=torch.float64), randn(2, 5, 3, seed=2, dtype=torch.float64)]
    batches = [{"x": x, "attention_mask": m.to(mask_dtype)} for x, m in zip(xs, MASKS, strict=True)]
    real = [x[m.bool()] for x, m in zip(xs, MASKS, strict=True)]  # the rows of the real tokens
    with torch.no_grad():
        hidden = [torch.tanh(model.fc(r)) for r in real]
    expected = {"fc.weight": gram(real), "flat.weight": gram(hidden)}
    got, norms = fp.hessians(model, batches, PADDED_NAMES), fp.input_norms(model, batches, PADDED_NAMES)
    for name in PADDED_NAMES:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(norms[name], expected[name].diagonal().sqrt(), rtol=1e-12, atol=1e-12)
    alone = [{"x": r[None]} for r in real]  # the real tokens alone, without a mask
    for name, h in fp.hessians(model, alone, PADDED_NAMES).items():
        torch.testing.assert_close(got[name], h, rtol=1e-12, atol=1e-12)
    everything = fp.hessians(model, [{"x": x} for x in xs], PADDED_NAMES)  # no mask: every token
    torch.testing.assert_close(everything["fc.weight"], gram(xs), rtol=1e-12, atol=1e-12)
    positional = fp.hessians(model, [(x, m) for x, m in zip(xs, MASKS, strict=True)], PADDED_NAMES)
    torch.testing.assert_close(positional["fc.weight"], gram(xs), rtol=1e-12, atol=1e-12)  # a dict's only


@pytest.mark.parametrize("fn", [fp.hessians, fp.input_norms])
def test_inputs_whose_tokens_the_mask_does_not_match_are_refused_naming_the_module(
    fn: Callable[..., dict[str, Tensor]],
) -> None:
    x = randn(2, 5, 3, dtype=torch.float64)
    name = fn.__name__
    model = Padded(pool=True)
    with pytest.raises(ValueError, match=re.escape(
        f"{name}: the module 'fc' received an input of shape (2, 5, 3), whose tokens do not match the "
        "batch's attention_mask of shape (2, 6)"
    )):  # fmt: skip
        fn(model, [{"x": x, "attention_mask": torch.ones(2, 6)}], PADDED_NAMES)
    assert no_hooks_left(model)


@pytest.mark.parametrize("fn", [fp.hessians, fp.input_norms])
def test_a_pooled_input_one_row_per_sequence_counts_every_row(fn: Callable[..., dict[str, Tensor]]) -> None:
    x = randn(2, 5, 3, dtype=torch.float64)
    model = Padded(pool=True)
    masked = fn(model, [{"x": x, "attention_mask": MASKS[0]}], ["pooled.weight"])
    plain = fn(model, [{"x": x}], ["pooled.weight"])
    torch.testing.assert_close(masked["pooled.weight"], plain["pooled.weight"], rtol=0, atol=0)


@pytest.mark.parametrize(
    "mask", [torch.ones(5), torch.ones(2, 1, 5, 5), [[1, 1, 1, 0, 0]] * 2], ids=["1-D", "4-D", "list"]
)
@pytest.mark.parametrize("fn", [fp.hessians, fp.input_norms])
def test_a_mask_that_is_not_a_2d_tensor_marks_no_tokens_every_token_counts(
    fn: Callable[..., dict[str, Tensor]], mask: object
) -> None:
    x = randn(2, 5, 3, dtype=torch.float64)
    got = fn(Padded(), [{"x": x, "attention_mask": mask}], PADDED_NAMES)
    plain = fn(Padded(), [{"x": x}], PADDED_NAMES)
    for name in PADDED_NAMES:
        torch.testing.assert_close(got[name], plain[name], rtol=0, atol=0)


@pytest.mark.parametrize("fn", [fp.hessians, fp.input_norms])
def test_an_additive_mask_is_refused_before_its_batch_runs(fn: Callable[..., dict[str, Tensor]]) -> None:
    model = Padded()
    x = randn(2, 5, 3, dtype=torch.float64)
    additive = torch.zeros(2, 5).masked_fill(MASKS[0] == 0, float("-inf"))
    with pytest.raises(ValueError, match=re.escape(
        f"{fn.__name__}: batch 1's attention_mask must hold 1 at real tokens and 0 at padding (or be bool)"
    )):  # fmt: skip
        fn(model, [{"x": x}, {"x": x, "attention_mask": additive}], PADDED_NAMES)
    assert model.calls == 1 and no_hooks_left(model)


def test_an_encoder_decoder_batch_counts_every_token() -> None:
    """The mask of a batch with decoder inputs is the encoder's alone: no module is masked by it."""
    model = Padded()
    x = randn(2, 5, 3, dtype=torch.float64)

    class Seq2Seq(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x: Tensor, attention_mask: Tensor, decoder_input_ids: Tensor) -> Tensor:
            out: Tensor = self.inner(x)
            return out

    names = [f"inner.{n}" for n in PADDED_NAMES]
    got = fp.hessians(Seq2Seq(), [{"x": x, "attention_mask": MASKS[0], "decoder_input_ids": x}], names)
    plain = fp.hessians(Seq2Seq(), [{"x": x, "attention_mask": torch.ones(2, 5), "decoder_input_ids": x}], names)
    for name in names:
        torch.testing.assert_close(got[name], plain[name], rtol=0, atol=0)


def test_a_tokens_first_input_is_refused_rather_than_masked_in_the_wrong_order() -> None:
    class TokensFirst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 1)

        def forward(self, x: Tensor, attention_mask: Tensor) -> Tensor:
            out: Tensor = self.fc(x.transpose(0, 1))  # (tokens, batch, in), as a sequence-first layer takes it
            return out

    x = torch.arange(12.0).reshape(2, 3, 2)
    with pytest.raises(ValueError, match="the module 'fc' received an input of shape \\(3, 2, 2\\)"):
        fp.hessians(TokensFirst(), [{"x": x, "attention_mask": torch.tensor([[1, 1, 0], [1, 0, 0]])}], ["fc.weight"])


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_right_padded_batch_gives_what_its_sequences_alone_give(family: str, request: pytest.FixtureRequest) -> None:
    tiny = request.getfixturevalue(family)
    model, ids = tiny.model, tiny.args[0]
    names = weights_of(model, "Linear" if family == "llama" else "Conv1D")
    lengths = [ids.shape[1], 5]
    mask = torch.zeros_like(ids)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
    padded = ids.masked_fill(mask == 0, 0)
    batch = [{"input_ids": padded, "attention_mask": mask, "use_cache": False}]
    alone = [{"input_ids": ids[i : i + 1, :length], "use_cache": False} for i, length in enumerate(lengths)]
    for fn in (fp.hessians, fp.input_norms):
        got, expected = fn(model, batch, names), fn(model, alone, names)
        for name in names:
            torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-5 * float(expected[name].abs().max()))
    counted = fp.hessians(model, [{"input_ids": padded, "use_cache": False}], names)  # padding counted: not the same
    expected = fp.hessians(model, alone, names)
    assert all(not torch.allclose(counted[n], expected[n], rtol=1e-3) for n in names)


# --- the module is left as it was ----------------------------------------------------------


def failing_batches() -> Iterator[Tensor]:
    yield XS[0]
    yield XS[1]
    raise RuntimeError("the data loader failed")


@pytest.mark.parametrize("training", [True, False])
def test_the_module_is_left_as_it_was_also_when_a_batch_raises(training: bool) -> None:
    model = net().train(training)
    state, hooks = copy.deepcopy(model.state_dict()), hooks_of(model)
    modes = [m.training for m in model.modules()]
    fp.hessians(model, [XS[0]], NAMES)
    with pytest.raises(RuntimeError, match="the data loader failed"):  # midway: two batches ran
        fp.hessians(model, failing_batches(), NAMES)
    with pytest.raises(ValueError, match="received an input of shape"):  # raised in a hook
        fp.hessians(model, [XS[0], randn(2, 5)], NAMES)
    with pytest.raises(TypeError, match="unexpected keyword"):  # the module's own error
        fp.hessians(model, [{"x": XS[0], "scal": 2.0}], NAMES)
    with pytest.raises(ValueError, match="attention_mask"):
        fp.hessians(model, [{"x": XS[0], "attention_mask": torch.full((2, 3), 2.0)}], NAMES)
    assert no_hooks_left(model) and hooks_of(model) == hooks
    assert [m.training for m in model.modules()] == modes
    after = model.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(after[k], state[k]) for k in state)
    assert all(p.grad is None and p.requires_grad for p in model.parameters())


def test_the_user_s_own_hooks_stay_and_still_run() -> None:
    model = net()
    seen: list[int] = []
    model.shared.register_forward_pre_hook(lambda m, a: seen.append(1))
    hooks = hooks_of(model)
    fp.hessians(model, [XS[0]], NAMES)
    with pytest.raises(RuntimeError, match="the data loader failed"):
        fp.hessians(model, failing_batches(), NAMES)
    assert hooks_of(model) == hooks and len(model.shared._forward_pre_hooks) == 1
    assert len(seen) == 2 + 4  # twice a batch: 1 batch, then 2 before the failure


# --- errors ---------------------------------------------------------------------------


class Zoo(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.conv = nn.Conv2d(2, 2, 1)
        self.conv1d = nn.Conv1d(2, 2, 1)
        self.norm = nn.LayerNorm(2)
        self.embed = nn.Embedding(4, 2)
        self.unused = nn.Linear(2, 2)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.norm(self.fc(x))
        return out


@pytest.mark.parametrize(
    ("name", "error", "message"),
    [
        ("fc.wieght", fp.UnknownNameError, r"'fc.wieght' is not a parameter name; did you mean 'fc.weight'"),
        ("nothing", fp.UnknownNameError, r"'nothing' is not a parameter name"),
        ("conv.weight", ValueError, r"'conv.weight' belongs to the module 'conv', of type Conv2d; "),
        ("conv1d.weight", ValueError, r"'conv1d.weight' belongs to the module 'conv1d', of type Conv1d; "),
        ("fc.bias", ValueError, r"'fc.bias' belongs to the module 'fc', of type Linear; "),
        ("norm.weight", ValueError, r"'norm.weight' belongs to the module 'norm', of type LayerNorm; "),
        ("embed.weight", ValueError, r"'embed.weight' belongs to the module 'embed', of type Embedding; "),
    ],
)  # fmt: skip
def test_names_that_are_no_linear_weight_are_refused_before_any_batch_runs(
    name: str, error: type[Exception], message: str
) -> None:
    ran: list[int] = []
    linear_only = r"hessians supports the weight of nn.Linear and of transformers' Conv1D$"
    with pytest.raises(error, match=r"^hessians: " + message + ("" if error is fp.UnknownNameError else linear_only)):
        fp.hessians(Zoo(), recorded([randn(2, 2)], ran), ["fc.weight", name])
    assert not ran


def test_arguments_of_the_wrong_type_are_refused_before_any_batch_runs() -> None:
    model = Zoo()
    ran: list[int] = []
    cases: list[tuple[type[Exception], str, Callable[[Iterator[Any]], object]]] = [
        (TypeError, r"^hessians: module must be a torch.nn.Module, got dict",
         lambda b: fp.hessians(dict(model.named_parameters()), b, ["fc.weight"])),  # type: ignore[arg-type]
        (TypeError, r"^hessians: names must be a list of parameter names, got the str 'fc.weight'; "
         r"write \['fc.weight'\]", lambda b: fp.hessians(model, b, "fc.weight")),
        (TypeError, r"^hessians: names\[1\] must be a str, got int",
         lambda b: fp.hessians(model, b, ["fc.weight", 1])),  # type: ignore[list-item]
        (TypeError, r"^hessians: across must be a torch.distributed process group",
         lambda b: fp.hessians(model, b, ["fc.weight"], across="world")),  # type: ignore[arg-type]
    ]  # fmt: skip
    for error, message, run in cases:
        with pytest.raises(error, match=message):
            run(recorded([randn(2, 2)], ran))
    assert not ran
    for single in (randn(2, 2), {"x": randn(2, 2)}, "batch", 3):
        with pytest.raises(TypeError, match=r"^hessians: batches must be an iterable .* wrap a single batch as \[batch\]"):
            fp.hessians(model, single, ["fc.weight"])  # type: ignore[arg-type]
    assert no_hooks_left(model)


def test_errors_found_while_running() -> None:
    model = Zoo()
    with pytest.raises(ValueError, match=r"^hessians: no batches: batches was empty"):
        fp.hessians(model, [], ["fc.weight"])
    with pytest.raises(ValueError, match=r"^hessians: no batches"):
        fp.hessians(model, recorded([], []), ["fc.weight"])  # an empty generator
    with pytest.raises(ValueError, match=r"^hessians: the module 'unused', holding 'unused.weight', was never "
                       r"called by any batch"):  # fmt: skip
        fp.hessians(model, [randn(3, 2)], ["fc.weight", "unused.weight"])
    with pytest.raises(TypeError, match=r"^hessians: the input of the module 'fc' must be a floating-point "
                       r"tensor, got dtype torch.int64"):  # fmt: skip
        fp.hessians(model, [torch.ones(3, 2, dtype=torch.long)], ["fc.weight"])
    with pytest.raises(ValueError, match=r"^hessians: the module 'fc' received an input of shape \(3, 5\); "
                       r"expected its 2 input features in dim -1"):  # fmt: skip
        fp.hessians(model, [randn(3, 5)], ["fc.weight"])
    with pytest.raises(TypeError, match=r"^hessians: batch 1 must be a tensor, a tuple or list of arguments or "
                       r"a dict of keyword arguments, got float"):  # fmt: skip
        fp.hessians(model, [randn(3, 2), 3.0], ["fc.weight"])
    assert no_hooks_left(model)


# --- a property --------------------------------------------------------------------------


@given(
    st.integers(1, 5), st.integers(1, 3), st.lists(st.integers(1, 4), min_size=1, max_size=5),
    st.sampled_from([(), (1,), (3,)]), st.sampled_from([torch.float32, torch.float64]), SEED,
)  # fmt: skip
def test_hessians_do_not_depend_on_how_tokens_are_split_into_batches(
    inputs: int, outputs: int, sizes: list[int], tokens: tuple[int, ...], dtype: torch.dtype, seed: int
) -> None:
    layer = nn.Linear(inputs, outputs).to(dtype)
    x = randn(sum(sizes), *tokens, inputs, seed=seed, dtype=dtype)
    pieces = list(torch.split(x, sizes))
    whole = fp.hessians(layer, [x], ["weight"])["weight"]
    split = fp.hessians(layer, pieces, ["weight"])["weight"]
    per_batch = [fp.hessians(layer, [p], ["weight"])["weight"] for p in pieces]
    assert whole.dtype == split.dtype == dtype and whole.shape == (inputs, inputs)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(split, whole, rtol=tol, atol=tol)
    torch.testing.assert_close(split, sum(per_batch, torch.zeros_like(whole)), rtol=tol, atol=tol)
    torch.testing.assert_close(whole.double(), gram([x]), rtol=tol, atol=tol)


def test_bfloat16_norms_past_float32_s_squares_do_not_overflow() -> None:
    """The root is taken in float64, before the float32 result: 1e20 squared overflows float32, its norm does not."""
    model = nn.Linear(2, 1).to(torch.bfloat16)
    x = torch.full((4, 2), 1e20, dtype=torch.bfloat16)
    norms = fp.input_norms(model, [x], ["weight"])["weight"]
    assert norms.dtype == torch.float32
    torch.testing.assert_close(norms, torch.full((2,), 2 * float(x[0, 0])), rtol=1e-6, atol=0)


def test_weights_fed_the_same_input_get_equal_results_that_share_no_memory(llama: Any) -> None:
    """Query, key and value projections see one input: it is summed once, and each gets its own tensor."""
    tiny = llama
    names = [f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"]
    ids = tiny.args[0]
    batches = [ids, ids[:, 1:], ids.flip(-1)]  # three: the first term held, then a sum of its own added to in place
    for fn in (fp.hessians, fp.input_norms):
        got = fn(tiny.model, batches, names)
        assert torch.equal(got[names[0]], got[names[1]]) and torch.equal(got[names[0]], got[names[2]])
        if fn is fp.hessians:  # (norms are the square roots of sums: not sums of the batches' norms)
            terms = [fn(tiny.model, [b], names) for b in batches]  # the running sum's terms, in the same order
            for name in names:
                assert torch.equal(got[name], terms[0][name] + terms[1][name] + terms[2][name])
        got[names[0]].add_(1.0)
        assert not torch.equal(got[names[0]], got[names[1]])


class Twice(nn.Module):
    """``fc`` called twice on one unchanged input, then ``other`` on it once."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.other = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc(x) + self.fc(x) + self.other(x)
        return out


@pytest.mark.parametrize("shared", [False, True])
def test_a_module_called_twice_on_one_input_counts_it_twice(shared: bool) -> None:
    """The statistic made once for the input counts once per call of the module, also where sums are shared."""
    from funcprune._criteria import GRAMS, calls, collect

    model = Twice().eval()
    batches = [randn(3, 4, seed=i) for i in range(3)]
    got = collect("hessians", model, calls("hessians", batches), ["fc.weight", "other.weight"], GRAMS, shared=shared)
    once = gram(batches)
    torch.testing.assert_close(got["fc.weight"].double(), 2 * once, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["other.weight"].double(), once, rtol=1e-5, atol=1e-5)
