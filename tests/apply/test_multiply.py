"""The bool-mask product: the float-mask product's bits, 1 byte an entry saved for backward."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import funcprune as fp
from funcprune import _native
from funcprune._apply import _multiply
from funcprune._apply._multiply import masked_multiply

Tensor = torch.Tensor
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
         torch.float64: torch.int64}  # fmt: skip
SPECIAL = [float("inf"), float("-inf"), float("nan"), -0.0, 0.0, -1.5, 1e-30]


def same_bits(a: Tensor, b: Tensor) -> bool:
    """Equal bit for bit (``-0.0`` is not ``0.0``), NaN where the other has NaN.

    NaN's sign and payload are not compared: torch's own vectorized and
    scalar kernels give different ones (bfloat16 conversions, ``-inf * 0``).
    """
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    nan = a.isnan()
    if not torch.equal(nan, b.isnan()):
        return False
    return torch.equal(a.detach()[~nan].view(_BITS[a.dtype]), b.detach()[~nan].view(_BITS[b.dtype]))


@contextmanager
def chunk_bytes(n: int) -> Iterator[None]:
    """Small chunks, so that small tensors take several of them."""
    old, _multiply._CHUNK_BYTES = _multiply._CHUNK_BYTES, n
    try:
        yield
    finally:
        _multiply._CHUNK_BYTES = old


def tensor_of(shape: tuple[int, ...], dtype: torch.dtype, seed: int, special: bool) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g, dtype=torch.float64)
    if special and t.numel():
        flat = t.view(-1)
        picks = torch.randint(0, flat.numel(), (min(flat.numel(), 6),), generator=g)
        for i, value in zip(picks.tolist(), SPECIAL):
            flat[i] = value
    return t.to(dtype)


shapes = st.lists(st.integers(0, 9), min_size=0, max_size=3).map(tuple)


@given(shape=shapes, dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16),
       special=st.booleans(), chunk=st.sampled_from([1 << 20, 8, 3]), native=st.booleans())  # fmt: skip
def test_values_and_gradients_are_the_float_mask_products_bits(
    shape: tuple[int, ...], dtype: torch.dtype, seed: int, special: bool, chunk: int, native: bool
) -> None:
    """Through the native kernel (float32/64, where it loads) or torch's chunks (any chunk size)."""
    weight = tensor_of(shape, dtype, seed, special).requires_grad_()
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(seed + 1)) < 0.5
    grad_out = tensor_of(shape, dtype, seed + 2, special)
    reference = weight * mask.to(dtype)
    (expected,) = torch.autograd.grad(reference, weight, grad_out)
    with chunk_bytes(chunk), contextlib.nullcontext() if native else _native.disabled():
        out = masked_multiply(weight, mask)
        (got,) = torch.autograd.grad(out, weight, grad_out)
    assert same_bits(out, reference)
    assert same_bits(got, expected)


@pytest.mark.parametrize("layout", ["transposed", "expanded mask", "sliced"])
def test_non_contiguous_tensors_give_the_same_bits(layout: str) -> None:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(6, 5, generator=g)
    mask = torch.rand(6, 5, generator=g) < 0.5
    if layout == "transposed":
        weight, mask = weight.t(), mask.t()
    elif layout == "expanded mask":
        mask = mask[:1].expand(6, 5)
    else:
        weight, mask = weight[::2], mask[::2]
    weight.requires_grad_()
    out = masked_multiply(weight, mask)
    assert same_bits(out, weight * mask.float())
    (grad,) = torch.autograd.grad(out, weight, torch.full_like(out, -2.0))
    assert same_bits(grad, -2.0 * mask.float())


def test_other_weight_and_mask_dtypes_multiply_as_before() -> None:
    ints = {"w": torch.tensor([3, -4, 5])}
    assert fp.apply_masks(ints, {"w": torch.tensor([True, False, True])})["w"].tolist() == [3, 0, 5]
    weight = torch.tensor([1.0, -2.0, float("inf")], requires_grad=True)
    mult = fp.to_multipliers({"w": weight}, {"w": torch.tensor([True, False, False])})["w"]
    for mask in (torch.tensor([1.0, 0.0, 0.0]), mult):
        assert same_bits(masked_multiply(weight, mask), weight * mask)


# --- what autograd keeps ---------------------------------------------------------------


def saved_during(fn: Callable[[], Tensor]) -> tuple[Tensor, list[Tensor]]:
    saved: list[Tensor] = []

    def pack(t: Tensor) -> Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, saved


def test_autograd_keeps_the_bool_mask_itself() -> None:
    g = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(64, 48, generator=g), "b": torch.randn(48, generator=g)}
    params = {n: p.requires_grad_() for n, p in params.items()}
    masks = {"w": torch.rand(64, 48, generator=g) < 0.2, "b": torch.rand(48, generator=g) < 0.5}

    def loss() -> Tensor:
        return torch.stack([t.sum() for t in fp.apply_masks(params, masks).values()]).sum()

    out, saved = saved_during(loss)
    for name, mask in masks.items():
        kept = [t for t in saved if t.shape == mask.shape]
        assert all(t.dtype == torch.bool for t in kept)
        assert sum(t.numel() * t.element_size() for t in kept) == mask.numel()
        assert kept[0].data_ptr() == mask.data_ptr()  # the mask itself, no copy
    torch.autograd.backward(out)
    assert same_bits(params["w"].grad, masks["w"].float())  # type: ignore[arg-type]


def test_a_masked_linear_keeps_one_byte_per_weight_for_its_mask() -> None:
    torch.manual_seed(0)
    net = nn.Linear(32, 16)
    params = {n: p.detach().clone().requires_grad_() for n, p in net.named_parameters()}
    masks = fp.Plan({"weight": fp.L1Unstructured(0.8)})(params)
    x, y = torch.randn(8, 32), torch.randn(8, 16)
    loss, saved = saved_during(lambda: F.mse_loss(fp.functional_call_masked(net, params, masks, (x,)), y))
    of_weight = [t for t in saved if t.shape == masks["weight"].shape]
    assert [t.dtype for t in of_weight] == [torch.bool]
    torch.autograd.backward(loss)
    assert bool((params["weight"].grad[~masks["weight"]] == 0).all())  # type: ignore[index]


def test_writing_into_the_mask_before_backward_raises() -> None:
    weight = torch.randn(5, requires_grad=True)
    mask = torch.tensor([True, False, True, True, False])
    out = masked_multiply(weight, mask)
    mask[0] = False
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.backward(out.sum())


def test_a_bool_mask_made_in_inference_mode_trains() -> None:
    weight = torch.randn(4, 3, requires_grad=True)
    with torch.inference_mode():
        mask = torch.rand(4, 3) < 0.5
    out, saved = saved_during(lambda: masked_multiply(weight, mask))
    assert [t.dtype for t in saved] == [torch.bool]
    torch.autograd.backward(out.sum())
    assert same_bits(weight.grad, mask.float())  # type: ignore[arg-type]
    with torch.inference_mode():
        assert same_bits(masked_multiply(weight, mask), weight * mask.float())


# --- transforms and higher derivatives --------------------------------------------------


# torch.func's forward mode registers torch's own decompositions with torch.jit.script
# on first use, which warns about itself (torch's warning, not funcprune's)
JIT_WARNING = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


def _case(seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(7, 5, generator=g, dtype=torch.float64), torch.rand(7, 5, generator=g) < 0.5


@JIT_WARNING
def test_grad_vjp_jvp_and_jacfwd_match_the_float_mask() -> None:
    w, m = _case()
    fm = m.double()

    def loss(w: Tensor) -> Tensor:
        return (masked_multiply(w, m) ** 3).sum()

    assert same_bits(torch.func.grad(loss)(w), torch.func.grad(lambda w: ((w * fm) ** 3).sum())(w))
    t = torch.randn(7, 5, dtype=torch.float64)
    tangent = torch.func.jvp(lambda w: masked_multiply(w, m), (w,), (t,))[1]
    assert same_bits(tangent, t * fm)
    vjp = torch.func.vjp(lambda w: masked_multiply(w, m), w)[1]
    assert same_bits(vjp(t)[0], t * fm)
    assert same_bits(torch.func.jacfwd(loss)(w), torch.func.grad(loss)(w))
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(w, t)  # type: ignore[no-untyped-call]
        out = torch.autograd.forward_ad.unpack_dual(masked_multiply(dual, m))  # type: ignore[no-untyped-call]
        assert same_bits(out.tangent, t * fm)


@JIT_WARNING
def test_double_backward_is_exact() -> None:
    w, m = _case(1)
    fm = m.double()
    leaf = w.clone().requires_grad_()
    (g,) = torch.autograd.grad((masked_multiply(leaf, m) ** 3).sum(), leaf, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), leaf)
    assert same_bits(h, 6 * (w * fm) * fm * fm)  # d/dw of 3 (w m)^2 m
    hessian = torch.func.hessian(lambda w: (masked_multiply(w, m[0]) ** 3).sum())(w[0])
    expected = torch.func.hessian(lambda w: ((w * fm[0]) ** 3).sum())(w[0])
    assert same_bits(hessian, expected)


def test_vmap_with_batched_and_shared_masks_and_per_sample_grads() -> None:
    w, m = _case(2)
    ws, ms = torch.stack([w, -w, 2 * w]), torch.stack([m, ~m, m])
    batched = torch.func.vmap(masked_multiply)(ws, ms)
    assert same_bits(batched, ws * ms.double())
    shared = torch.func.vmap(masked_multiply, in_dims=(0, None))(ws, m)
    assert same_bits(shared, ws * m.double())
    masks_only = torch.func.vmap(masked_multiply, in_dims=(None, 0))(w, ms)
    assert same_bits(masks_only, w * ms.double())

    def loss(w: Tensor, m: Tensor) -> Tensor:
        return (masked_multiply(w, m) ** 2).sum()

    per_sample = torch.func.vmap(torch.func.grad(loss))(ws, ms)
    assert same_bits(per_sample, torch.stack([torch.func.grad(loss)(a, b) for a, b in zip(ws, ms)]))


def test_forward_and_backward_compile_with_fullgraph() -> None:
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(9, 4, generator=g)
    weight[0, :3] = torch.tensor([float("inf"), -1.0, float("nan")])
    mask = torch.rand(9, 4, generator=g) < 0.5
    mask[0, :3] = False
    compiled = torch.compile(masked_multiply, fullgraph=True)
    leaf = weight.clone().requires_grad_()
    out, saved = saved_during(lambda: compiled(leaf, mask))
    assert same_bits(out, weight * mask.float())
    assert all(t.dtype == torch.bool for t in saved if t.shape == mask.shape)
    (grad,) = torch.autograd.grad(out, leaf, torch.full_like(out, 3.0))
    assert same_bits(grad, 3.0 * mask.float())
