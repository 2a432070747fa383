"""Sparse weights (funcprune._sparse): outputs equal the masked dense model, break-even, errors."""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import funcprune as fp
from funcprune import BSR_BREAK_EVEN, CSR_BREAK_EVEN, SlowSparseWarning, to_sparse
from funcprune._payoff._sparse import SparseLayout, _convert

Tensor = torch.Tensor
NO_AUTOGRAD: list[Callable[[], AbstractContextManager[object]]] = [torch.no_grad, torch.inference_mode]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
needs_2_4 = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0),
    reason="needs a CUDA device with 2:4 sparse kernels (compute capability 8.0 or later)",
)


def mlp(seed: int = 0, bias: bool = True) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64, bias=bias), nn.ReLU(), nn.Linear(64, 16, bias=bias))


def params_of(module: nn.Module) -> dict[str, Tensor]:
    return dict(module.named_parameters())


def masks_for(params: dict[str, Tensor], layout: SparseLayout, sparsity: float = 0.99) -> dict[str, Tensor]:
    """Masks above break-even: unstructured for CSR, whole 16x16 blocks for BSR."""
    spec = fp.L1Unstructured(sparsity=sparsity) if layout == "csr" else fp.Block(sparsity=sparsity, shape=(16, 16))
    return fp.Plan({"*.weight": spec})(params)


def blocksize(layout: SparseLayout) -> tuple[int, int] | None:
    return (16, 16) if layout == "bsr" else None


def dense_equal(sparse: Tensor, dense: Tensor) -> bool:
    return torch.equal(sparse.to_dense(), dense)


# --- outputs -----------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["csr", "bsr"])
@pytest.mark.parametrize("shape", [(32,), (1, 32), (5, 32), (2, 3, 32)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mode", NO_AUTOGRAD, ids=lambda m: m.__name__)
def test_functional_call_on_sparse_weights_equals_the_masked_dense_model(
    layout: SparseLayout, shape: tuple[int, ...], bias: bool,
    mode: Callable[[], AbstractContextManager[object]],
) -> None:  # fmt: skip
    model = mlp(bias=bias)
    params = params_of(model)
    masks = masks_for(params, layout, 0.8)
    sparse = to_sparse(params, masks, layout=layout, blocksize=blocksize(layout), below_break_even="allow")
    x = torch.randn(shape)
    with mode():
        out = torch.func.functional_call(model, sparse, (x,))
        expected = torch.func.functional_call(model, fp.apply_masks(params, masks), (x,))
    assert out.shape == expected.shape and out.layout == torch.strided
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["csr", "bsr"])
def test_sparse_weights_hold_the_masked_values_and_the_rest_passes_through(layout: SparseLayout) -> None:
    params = params_of(mlp())
    masks = masks_for(params, layout)
    sparse = to_sparse(params, masks, layout=layout, blocksize=blocksize(layout))
    assert list(sparse) == list(params)
    masked = fp.apply_masks(params, masks)
    for name, t in sparse.items():
        if name in masks:
            assert t.layout == (torch.sparse_csr if layout == "csr" else torch.sparse_bsr)
            assert t.dtype == params[name].dtype and not t.requires_grad
            assert dense_equal(t, masked[name])
        else:
            assert t is params[name]  # the very same tensor
    unmasked = to_sparse(params, {}, layout=layout, blocksize=blocksize(layout))
    assert unmasked is not params and all(unmasked[n] is p for n, p in params.items())


def test_the_structure_comes_from_the_mask_not_from_the_values() -> None:
    weight = torch.tensor([[0.0, 1.0, 2.0, 0.0], [3.0, 0.0, 0.0, 4.0]])
    mask = torch.tensor([[True, False, True, False], [False, True, False, True]])
    csr = to_sparse({"w": weight}, {"w": mask}, layout="csr", below_break_even="allow")["w"]
    assert csr.col_indices().tolist() == [0, 2, 1, 3]  # kept zeros are stored
    assert csr.values().tolist() == [0.0, 2.0, 0.0, 4.0]
    bsr = to_sparse({"w": weight}, {"w": mask}, layout="bsr", blocksize=(2, 2), below_break_even="allow")["w"]
    assert bsr.layout == torch.sparse_bsr and bsr.values().shape == (2, 2, 2)  # both blocks keep an entry
    assert dense_equal(bsr, weight * mask)
    ones = to_sparse({"w": weight}, {"w": mask}, layout="bsr", blocksize=(1, 1), below_break_even="allow")["w"]
    assert ones.layout == torch.sparse_bsr and ones.values().shape == (4, 1, 1)
    with torch.inference_mode():  # BSR runs, including the 1x1 blocks
        x = torch.randn(3, 4)
        for sparse in (bsr, ones):
            torch.testing.assert_close(torch.nn.functional.linear(x, sparse), x @ (weight * mask).T)


def test_inputs_are_untouched() -> None:
    params = {name: p.detach().clone() for name, p in params_of(mlp()).items()}
    masks = masks_for(params, "csr")
    before = {name: t.clone() for name, t in [*params.items(), *((f"mask {n}", m) for n, m in masks.items())]}
    to_sparse(params, masks, layout="csr")
    after = {**params, **{f"mask {n}": m for n, m in masks.items()}}
    assert all(torch.equal(before[n], after[n]) for n in before)


@given(st.integers(1, 8), st.integers(1, 8), st.integers(0, 2**31 - 1), st.sampled_from([torch.float32, torch.float64]))
def test_csr_holds_apply_masks_values_for_random_masks(rows: int, cols: int, seed: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(seed)
    params = {"w": torch.randn(rows, cols, generator=gen, dtype=dtype)}
    masks = {"w": torch.rand(rows, cols, generator=gen) < 0.3}
    sparse = to_sparse(params, masks, layout="csr", below_break_even="allow")["w"]
    assert sparse._nnz() == int(masks["w"].sum())
    assert dense_equal(sparse, fp.apply_masks(params, masks)["w"])


def test_gradients_reach_the_input_through_csr_not_the_weights() -> None:
    model = mlp()
    params = params_of(model)
    masks = masks_for(params, "csr")
    sparse = to_sparse(params, masks, layout="csr")
    x = torch.randn(4, 32, requires_grad=True)
    x_dense = x.detach().clone().requires_grad_()
    torch.func.functional_call(model, sparse, (x,)).sum().backward()
    fp.functional_call_masked(model, params, masks, (x_dense,)).sum().backward()
    torch.testing.assert_close(x.grad, x_dense.grad)
    assert all(not sparse[name].requires_grad and sparse[name].is_inference() for name in masks)


# --- break-even ----------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["csr", "bsr"])
def test_below_break_even_warns_raises_or_passes_as_asked(layout: SparseLayout) -> None:
    params = params_of(mlp())
    measured = CSR_BREAK_EVEN if layout == "csr" else BSR_BREAK_EVEN
    low = masks_for(params, layout, measured.sparsity - 0.15)
    block = blocksize(layout)
    with pytest.warns(SlowSparseWarning, match=rf"to_sparse: '0.weight' \(\d+% .*below the break-even.*{layout!r}"):
        to_sparse(params, low, layout=layout, blocksize=block)
    with pytest.raises(ValueError, match=r"to_sparse: '0.weight' .*below the break-even"):
        to_sparse(params, low, layout=layout, blocksize=block, below_break_even="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        to_sparse(params, low, layout=layout, blocksize=block, below_break_even="allow")
        to_sparse(params, masks_for(params, layout, 0.99), layout=layout, blocksize=block)


def test_bsr_counts_whole_blocks_for_the_break_even() -> None:
    params = params_of(mlp())
    scattered = masks_for(params, "csr", 0.99)  # 99% of entries, few whole 16x16 blocks
    with pytest.warns(SlowSparseWarning, match=r"blocks pruned"):
        to_sparse(params, scattered, layout="bsr", blocksize=(16, 16))


def test_bsr_blocks_smaller_than_measured_always_warn() -> None:
    params = params_of(mlp())
    masks = fp.Plan({"*.weight": fp.Block(sparsity=0.99, shape=(4, 4))})(params)
    with pytest.warns(SlowSparseWarning, match=r"'0.weight', '2.weight': blocks of 4x4 entries, smaller than the 16x16"):
        to_sparse(params, masks, layout="bsr", blocksize=(4, 4))
    with pytest.raises(ValueError, match=r"blocks of 4x4 entries"):
        to_sparse(params, masks, layout="bsr", blocksize=(4, 4), below_break_even="raise")


@pytest.mark.ci  # the default suite's 5 minutes: CI runs it
def test_a_bsr_weight_alone_raises_no_beta_warning() -> None:
    """torch warns once a process that BSR is beta: not through to_sparse (the first BSR made here)."""
    script = (
        "import warnings, torch, funcprune as fp\n"
        "warnings.simplefilter('error')\n"
        "w = {'w': torch.randn(32, 32)}\n"
        "m = {'w': fp.compute_mask(fp.Block(sparsity=0.99, shape=(16, 16)), w['w'])}\n"
        "fp.to_sparse(w, m, layout='bsr', blocksize=(16, 16))\n"
    )
    done = subprocess.run([sys.executable, "-W", "ignore:Failed to initialize NumPy", "-c", script],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_the_break_even_constants_are_sparsities() -> None:
    for measured in (CSR_BREAK_EVEN, BSR_BREAK_EVEN):
        assert 0.0 < measured.batch_1 <= measured.batch_64 == measured.sparsity < 1.0
    assert issubclass(SlowSparseWarning, UserWarning)


# --- errors --------------------------------------------------------------------------


def test_errors_name_the_argument_and_what_was_expected() -> None:
    params = {"fc.weight": torch.randn(8, 8), "conv.weight": torch.randn(4, 2, 3, 3)}
    mask = {"fc.weight": torch.rand(8, 8) < 0.01}
    with pytest.raises(ValueError, match=r"to_sparse: layout must be one of 'csr', 'bsr', 'semi_structured', got 'coo'"):
        to_sparse(params, mask, layout="coo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"to_sparse: below_break_even must be one of 'warn', 'raise', 'allow'"):
        to_sparse(params, mask, layout="csr", below_break_even="ignore")  # type: ignore[arg-type]
    with pytest.raises(fp.UnknownNameError, match=r"to_sparse: mask for 'fc.wieght'.*did you mean 'fc.weight'"):
        to_sparse(params, {"fc.wieght": mask["fc.weight"]}, layout="csr")
    conv = {"conv.weight": torch.ones(4, 2, 3, 3, dtype=torch.bool)}
    with pytest.raises(ValueError, match=r"to_sparse: the parameter 'conv.weight' has shape \(4, 2, 3, 3\); only Linear-like 2-D"):
        to_sparse(params, conv, layout="csr")
    with pytest.raises(ValueError, match=r"to_sparse: layout='bsr' needs blocksize"):
        to_sparse(params, mask, layout="bsr")
    with pytest.raises(ValueError, match=r"to_sparse: blocksize=\(3, 3\) does not tile the parameter 'fc.weight'"):
        to_sparse(params, mask, layout="bsr", blocksize=(3, 3))
    with pytest.raises(ValueError, match=r"to_sparse: blocksize must be a tuple of two positive ints, got \(0, 4\)"):
        to_sparse(params, mask, layout="bsr", blocksize=(0, 4))
    with pytest.raises(ValueError, match=r"to_sparse: blocksize is for layout='bsr' only"):
        to_sparse(params, mask, layout="csr", blocksize=(4, 4))
    with pytest.raises(ValueError, match=r"to_sparse: blocksize=\(1, 4\) is not square, .*CPU BSR matmul"):
        to_sparse(params, mask, layout="bsr", blocksize=(1, 4))


def test_masks_and_dtypes_are_checked() -> None:
    params = {"w": torch.randn(8, 8)}
    with pytest.raises(TypeError, match=r"to_sparse: the mask for 'w' has dtype torch.int64"):
        to_sparse(params, {"w": torch.ones(8, 8, dtype=torch.long)}, layout="csr")
    with pytest.raises(ValueError, match=r"to_sparse: the mask for 'w' has shape \(4, 8\)"):
        to_sparse(params, {"w": torch.ones(4, 8, dtype=torch.bool)}, layout="csr")
    with pytest.raises(TypeError, match=r"to_sparse: the parameter 'w' has dtype torch.float16.*CPU sparse matmul"):
        to_sparse({"w": torch.randn(8, 8).half()}, {"w": torch.ones(8, 8, dtype=torch.bool)}, layout="csr")
    with pytest.raises(TypeError, match=r"to_sparse: params must be a mapping"):
        to_sparse(nn.Linear(2, 2), {}, layout="csr")  # type: ignore[arg-type]


def test_float_masks_mean_what_bool_masks_mean() -> None:
    params = {"w": torch.randn(8, 8)}
    mask = torch.rand(8, 8) < 0.05
    a = to_sparse(params, {"w": mask}, layout="csr", below_break_even="allow")["w"]
    b = to_sparse(params, {"w": mask.double()}, layout="csr", below_break_even="allow")["w"]
    assert torch.equal(a.to_dense(), b.to_dense())


def two_four(rows: int, cols: int) -> Tensor:
    return fp.NM(2, 4).compute_mask(torch.randn(rows, cols))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
def test_semi_structured_needs_cuda() -> None:
    params = {"w": torch.randn(64, 64).half()}
    with pytest.raises(ValueError, match=r"to_sparse: layout='semi_structured' needs CUDA weights.*'w' is on cpu"):
        to_sparse(params, {"w": two_four(64, 64)}, layout="semi_structured")


# --- reading, saving and running them in and out of inference_mode -------------------

#: Autograd on, no_grad, inference_mode: where the sparse weights are read, saved and run.
EVERY_MODE: list[Callable[[], AbstractContextManager[object]]] = [torch.enable_grad, *NO_AUTOGRAD]


def linear_and_masks(layout: SparseLayout) -> tuple[nn.Linear, dict[str, Tensor], dict[str, Tensor]]:
    """A hand-built Linear, its parameters and a 90% mask of its weight for ``layout``."""
    torch.manual_seed(0)
    lin = nn.Linear(64, 32)
    params = params_of(lin)
    spec = fp.L1Unstructured(sparsity=0.9) if layout == "csr" else fp.Block(sparsity=0.9, shape=(16, 16))
    return lin, params, {"weight": fp.compute_mask(spec, params["weight"].detach())}


def parts(sparse: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return sparse.crow_indices(), sparse.col_indices(), sparse.values()


@pytest.mark.parametrize("layout", ["csr", "bsr"])
def test_sparse_weights_read_back_in_and_out_of_inference_mode(layout: SparseLayout) -> None:
    _, params, masks = linear_and_masks(layout)
    weight = to_sparse(params, masks, layout=layout, blocksize=blocksize(layout), below_break_even="allow")["weight"]
    masked = fp.apply_masks(params, masks)["weight"].detach()
    for mode in EVERY_MODE:
        with mode():
            dense, text = weight.to_dense(), repr(weight)
        assert dense.layout == torch.strided and not dense.requires_grad and torch.equal(dense, masked), mode
        assert text.startswith("tensor(crow_indices=tensor([") and text.endswith(f"layout={weight.layout})"), mode
        assert "size=(32, 64)" in text and "grad" not in text
    # an inference tensor (F.linear runs it under inference_mode) around ordinary parts (to_dense reads them anywhere)
    assert weight.is_inference() and not any(part.is_inference() for part in parts(weight))


@pytest.mark.parametrize("layout", ["csr", "bsr"])
def test_functional_call_runs_the_sparse_weight_as_its_dense_form_in_every_mode(layout: SparseLayout) -> None:
    lin, params, masks = linear_and_masks(layout)
    sparse = to_sparse(params, masks, layout=layout, blocksize=blocksize(layout), below_break_even="allow")
    x = torch.randn(5, 64)
    for mode in EVERY_MODE:
        with mode():
            out = torch.func.functional_call(lin, sparse, (x,))
            as_dense = torch.nn.functional.linear(x, sparse["weight"].to_dense(), params["bias"])
            masked = torch.func.functional_call(lin, fp.apply_masks(params, masks), (x,))
        torch.testing.assert_close(out, as_dense, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out, masked, rtol=1e-5, atol=1e-5)
        assert out.requires_grad == (mode is torch.enable_grad)  # through the bias only


@pytest.mark.parametrize("layout", ["csr", "bsr"])
def test_sparse_weights_survive_torch_save_and_load(layout: SparseLayout, tmp_path: Path) -> None:
    lin, params, masks = linear_and_masks(layout)
    sparse = to_sparse(params, masks, layout=layout, blocksize=blocksize(layout), below_break_even="allow")
    x = torch.randn(5, 64)
    expected = torch.func.functional_call(lin, fp.apply_masks(params, masks), (x,)).detach()
    path = tmp_path / "sparse.pt"
    for mode in EVERY_MODE:
        with mode():
            torch.save(sparse, path)
            loaded = torch.load(path, weights_only=True)
            assert list(loaded) == list(sparse) and loaded["weight"].layout == sparse["weight"].layout
            assert all(torch.equal(a, b) for a, b in zip(parts(loaded["weight"]), parts(sparse["weight"])))
            assert torch.equal(loaded["weight"].to_dense(), sparse["weight"].to_dense())
        with torch.no_grad():  # an ordinary sparse tensor when loaded outside inference_mode (pytorch#98004)
            torch.testing.assert_close(torch.func.functional_call(lin, loaded, (x,)), expected, rtol=1e-5, atol=1e-5)


def test_weights_made_under_inference_mode_work_outside_it() -> None:
    with torch.inference_mode():  # inference params and masks, to_sparse called in inference_mode
        lin, params, masks = linear_and_masks("csr")
        params = {name: p.clone() for name, p in params.items()}
        sparse = to_sparse(params, masks, layout="csr", below_break_even="allow")
        masked = fp.apply_masks(params, masks)
    assert all(p.is_inference() for p in params.values())
    assert torch.equal(sparse["weight"].to_dense(), masked["weight"])
    x = torch.randn(5, 64)
    for mode in EVERY_MODE:
        with mode():
            out = torch.func.functional_call(lin, sparse, (x,))
        torch.testing.assert_close(out, x @ masked["weight"].T + params["bias"], rtol=1e-5, atol=1e-5)


def test_a_sparse_transformers_model_runs_reads_back_and_saves_in_and_out_of_inference_mode(tmp_path: Path) -> None:
    from _hf import tiny  # skips without transformers

    t = tiny("llama")
    params = params_of(t.model)
    linears = [f"{name}.weight" for name, m in t.model.named_modules() if isinstance(m, nn.Linear)]
    masks = {name: fp.compute_mask(fp.L1Unstructured(sparsity=0.9), params[name].detach()) for name in linears}
    sparse = to_sparse(params, masks, layout="csr", below_break_even="allow")
    masked = fp.apply_masks(params, masks)

    def logits(p: dict[str, Tensor]) -> Tensor:
        out: Tensor = torch.func.functional_call(t.model, p, t.args, t.kwargs).logits
        return out

    with torch.no_grad():
        expected = logits(masked)
    for mode in EVERY_MODE:
        with mode():
            torch.testing.assert_close(logits(sparse), expected, rtol=1e-4, atol=1e-4)
            assert all(torch.equal(sparse[n].to_dense(), masked[n].detach()) for n in masks), mode
            assert all(repr(sparse[n]).startswith("tensor(crow_indices=") for n in masks)
    torch.save(sparse, tmp_path / "sparse.pt")
    loaded = torch.load(tmp_path / "sparse.pt", weights_only=True)
    assert all(torch.equal(loaded[n].to_dense(), sparse[n].to_dense()) for n in masks)
    with torch.no_grad():
        torch.testing.assert_close(logits(loaded), expected, rtol=1e-4, atol=1e-4)


# --- the layers that hold the weights (module=) -----------------------------------------------------


class TiedLM(nn.Module):
    """An embedding, a Linear, and an LM head that is the embedding's weight (``tie=True``) or its own."""

    def __init__(self, tie: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.fc, self.head = nn.Embedding(32, 16), nn.Linear(16, 16), nn.Linear(16, 32, bias=False)
        if tie:
            self.head.weight = self.embed.weight

    def forward(self, ids: Tensor) -> Tensor:
        out: Tensor = self.head(torch.relu(self.fc(self.embed(ids))))
        return out


IDS = torch.tensor([[1, 5, 7, 30], [0, 2, 2, 9]])


def runs_as_masked(model: nn.Module, params: dict[str, Tensor], masks: dict[str, Tensor], args: tuple[object, ...],
                   kwargs: dict[str, object] | None = None) -> None:  # fmt: skip
    """``to_sparse(..., module=model)`` accepts ``masks``, and the model computes on it what it computes masked."""
    sparse = to_sparse(params, masks, layout="csr", below_break_even="allow", module=model)
    assert all(sparse[n].layout == torch.sparse_csr for n in masks)
    with torch.no_grad():
        out = torch.func.functional_call(model, sparse, args, kwargs)
        expected = fp.functional_call_masked(model, params, masks, args, kwargs)
    if not isinstance(out, Tensor):
        out, expected = out.logits, expected.logits
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_an_embedding_weight_is_refused_naming_it_and_its_layer_and_the_linears_run() -> None:
    model = TiedLM(tie=False)
    params = params_of(model)
    masks = fp.Plan({"*.weight": fp.L1Unstructured(0.9)})(params)
    with pytest.raises(ValueError, match=r"^to_sparse: the parameter 'embed.weight' is the weight of 'embed', of "
                       r"type Embedding, which reads it with F.embedding.*; leave it out of masks$"):  # fmt: skip
        to_sparse(params, masks, layout="csr", below_break_even="allow", module=model)
    masks.pop("embed.weight")
    runs_as_masked(model, params, masks, (IDS,))


def test_a_weight_tied_between_an_embedding_and_an_lm_head_is_refused_and_untying_it_works() -> None:
    model = TiedLM(tie=True)
    params = params_of(model)
    assert "head.weight" not in params  # named_parameters() gives the tie its first name
    masks = fp.Plan({"*.weight": fp.L1Unstructured(0.9)})(params)
    with pytest.raises(ValueError) as info:
        to_sparse(params, masks, layout="csr", below_break_even="allow", module=model)
    message = str(info.value)
    assert message.startswith("to_sparse: the parameter 'embed.weight' is tied: one Parameter, held as "
                              "'head.weight' (of type Linear) and as 'embed.weight' (of type Embedding), "
                              "which reads it with F.embedding")  # fmt: skip
    assert "leave 'embed.weight' out of masks, or untie it first, giving 'head.weight' a Parameter" in message
    runs_as_masked(model, params, {"fc.weight": masks["fc.weight"]}, (IDS,))  # left out: the rest runs
    model.head.weight = nn.Parameter(model.head.weight.detach().clone())  # untied, as the message says
    params = params_of(model)
    runs_as_masked(model, params, {"head.weight": masks["embed.weight"], "fc.weight": masks["fc.weight"]}, (IDS,))


def test_a_layer_that_does_not_read_its_weight_through_f_linear_is_refused() -> None:
    model = nn.Sequential(nn.MultiheadAttention(8, 2))
    params = params_of(model)
    masks = {"0.in_proj_weight": torch.rand(24, 8) < 0.05}
    with pytest.raises(ValueError, match=r"^to_sparse: the parameter '0.in_proj_weight' is the in_proj_weight of "
                       r"'0', of type MultiheadAttention, which does not read it through F.linear; only the "
                       r"weights of nn.Linear layers"):  # fmt: skip
        to_sparse(params, masks, layout="csr", module=model)
    to_sparse(params, masks, layout="csr", below_break_even="allow")  # without module: tensors only, unchecked


def test_module_is_checked_and_its_own_weight_has_no_path() -> None:
    lin = nn.Linear(8, 4)
    params = params_of(lin)
    masks = {"weight": torch.rand(4, 8) < 0.05}
    runs_as_masked(lin, params, masks, (torch.randn(3, 8),))
    with pytest.raises(TypeError, match=r"^to_sparse: module must be a torch.nn.Module or None, got dict$"):
        to_sparse(params, masks, layout="csr", module=params)  # type: ignore[arg-type]
    with pytest.raises(fp.UnknownNameError, match=r"^to_sparse: 'weight' is not a parameter name"):
        to_sparse(params, masks, layout="csr", module=nn.Sequential(lin))
    emb = nn.Embedding(8, 4)
    with pytest.raises(ValueError, match=r"^to_sparse: the parameter 'weight' is the weight of the module itself, "
                       r"of type Embedding"):  # fmt: skip
        to_sparse(params_of(emb), {"weight": torch.rand(8, 4) < 0.05}, layout="csr", module=emb)


def test_gpt2_s_conv1d_weights_run_as_csr_and_its_tied_embedding_is_refused() -> None:
    from _hf import tiny  # skips without transformers

    t = tiny("gpt2")
    params = params_of(t.model)
    weights = [n for n, p in params.items() if p.dim() == 2]
    masks = {n: fp.compute_mask(fp.L1Unstructured(sparsity=0.9), params[n].detach()) for n in weights}
    with pytest.raises(ValueError, match=r"^to_sparse: the parameter 'transformer.wte.weight' is tied: one "
                       r"Parameter, held as 'lm_head.weight' \(of type Linear\) and as 'transformer.wte.weight' "
                       r"\(of type Embedding\)"):  # fmt: skip
        to_sparse(params, masks, layout="csr", module=t.model)
    with pytest.raises(ValueError, match=r"^to_sparse: the parameter 'transformer.wpe.weight' is the weight of "
                       r"'transformer.wpe', of type Embedding"):  # fmt: skip
        to_sparse(params, {n: m for n, m in masks.items() if n != "transformer.wte.weight"}, layout="csr",
                  module=t.model)  # fmt: skip
    conv1d = {n: m for n, m in masks.items() if ".h." in n}
    runs_as_masked(t.model, params, conv1d, t.args, t.kwargs)
    block = {"transformer.h.0.mlp.c_fc.weight": torch.ones(32, 128, dtype=torch.bool)}
    with pytest.raises(ValueError, match=r"^to_sparse: the parameter 'transformer.h.0.mlp.c_fc.weight' is the weight "
                       r"of 'transformer.h.0.mlp.c_fc', of type Conv1D, which multiplies by it with torch.addmm, "
                       r"which takes a sparse weight with layout='csr' only, not 'bsr'"):  # fmt: skip
        to_sparse(params, block, layout="bsr", blocksize=(16, 16), below_break_even="allow", module=t.model)


def test_semi_structured_weights_are_inference_wrappers_of_ordinary_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 2:4 code path on the CPU: torch's CUTLASS 2:4 tensor, made from a CPU weight as CUDA would make it."""
    from torch.sparse import SparseSemiStructuredTensorCUTLASS as Cutlass
    from torch.sparse._semi_structured_conversions import (
        sparse_semi_structured_from_dense_cutlass,
    )

    def on_the_cpu(dense: Tensor) -> Tensor:
        packed, meta = sparse_semi_structured_from_dense_cutlass(dense)  # type: ignore[no-untyped-call]
        return Cutlass(dense.shape, packed=packed, meta=meta, packed_t=None, meta_t=None,
                       compressed_swizzled_bitmask=None)  # fmt: skip

    monkeypatch.setattr(torch.sparse, "to_sparse_semi_structured", on_the_cpu)
    torch.manual_seed(0)
    weight, mask = torch.randn(64, 64, dtype=torch.float16), two_four(64, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's 2:4 layout is a prototype
        semi = _convert("to_sparse", "w", weight, mask, "semi_structured", (1, 1))
    assert isinstance(semi, Cutlass) and semi.is_inference() and not semi.requires_grad
    assert semi.packed is not None and semi.meta is not None
    assert not semi.packed.is_inference() and not semi.meta.is_inference()
    for mode in EVERY_MODE:
        with mode():
            assert torch.equal(semi.to_dense(), torch.where(mask, weight, 0.0)), mode  # type: ignore[no-untyped-call]
            assert repr(semi) == "SparseSemiStructuredTensorCUTLASS(shape=torch.Size([64, 64]))"


# --- CUDA ------------------------------------------------------------------------------


@needs_2_4
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_semi_structured_equals_the_masked_dense_model_on_cuda(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 64)).to("cuda", dtype)
    params = params_of(model)
    masks = {name: two_four(*p.shape).cuda() for name, p in params.items() if p.dim() == 2}
    assert all(bool((m.reshape(-1, 4).sum(-1) <= 2).all()) for m in masks.values())  # 2:4 indeed
    sparse = to_sparse(params, masks, layout="semi_structured")
    x = torch.randn(2, 16, 128, device="cuda", dtype=dtype)
    for mode in NO_AUTOGRAD:
        with mode():
            out = torch.func.functional_call(model, sparse, (x,))
            expected = torch.func.functional_call(model, fp.apply_masks(params, masks), (x,))
        torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)


@needs_cuda
def test_semi_structured_refuses_what_it_cannot_hold_on_cuda() -> None:
    params = {"w": torch.randn(64, 64, device="cuda", dtype=torch.float16)}
    dense = torch.ones(64, 64, dtype=torch.bool, device="cuda")
    with pytest.raises(ValueError, match=r"to_sparse: layout='semi_structured' needs a 2:4 mask.*'w'"):
        to_sparse(params, {"w": dense}, layout="semi_structured")
    with pytest.raises(TypeError, match=r"needs torch.float16 or torch.bfloat16.*'w' has dtype torch.float32"):
        to_sparse({"w": params["w"].float()}, {"w": two_four(64, 64).cuda()}, layout="semi_structured")


@needs_cuda
@pytest.mark.parametrize("layout", ["csr", "bsr"])
def test_csr_and_bsr_run_on_cuda(layout: SparseLayout) -> None:
    model = mlp().cuda()
    params = params_of(model)
    masks = masks_for(params, layout)
    sparse = to_sparse(params, masks, layout=layout, blocksize=blocksize(layout), below_break_even="allow")
    x = torch.randn(2, 3, 32, device="cuda")
    with torch.inference_mode():
        out = torch.func.functional_call(model, sparse, (x,))
        expected = torch.func.functional_call(model, fp.apply_masks(params, masks), (x,))
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


@needs_2_4
def test_semi_structured_reads_back_saves_and_runs_in_and_out_of_inference_mode_on_cuda(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 64)).to("cuda", torch.float16)
    params = params_of(model)
    masks = {name: two_four(*p.shape).cuda() for name, p in params.items() if p.dim() == 2}
    sparse = to_sparse(params, masks, layout="semi_structured")
    masked = fp.apply_masks(params, masks)
    x = torch.randn(2, 16, 128, device="cuda", dtype=torch.float16)
    for mode in EVERY_MODE:
        with mode():
            for name in masks:
                torch.testing.assert_close(sparse[name].to_dense(), masked[name].detach())
                assert repr(sparse[name]).startswith("SparseSemiStructuredTensor")
            if mode is not torch.enable_grad:  # 2:4 under autograd: not what to_sparse is for
                out = torch.func.functional_call(model, sparse, (x,))
                torch.testing.assert_close(out, torch.func.functional_call(model, masked, (x,)), rtol=2e-2, atol=2e-2)
    torch.save(sparse, tmp_path / "semi.pt")
    with torch.serialization.safe_globals([type(sparse[name]) for name in masks]):  # a tensor subclass
        loaded = torch.load(tmp_path / "semi.pt", weights_only=True)
    for name in masks:
        assert type(loaded[name]) is type(sparse[name])
        torch.testing.assert_close(loaded[name].to_dense(), masked[name].detach())
