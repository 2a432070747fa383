"""Where each weight's input features run (funcprune._targets._input_dims): every layer kind, read by running it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as tprune
from torch import nn

import funcprune as fp
from _models import Conv1D, MiniGPT, lenet

Tensor = torch.Tensor


class Layers(nn.Module):
    """One of every layer kind with an input dim, and some without."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 6)
        self.fc = nn.Linear(6, 5)
        self.c_fc = Conv1D(5, 6)
        self.square = Conv1D(6, 6)
        self.conv1 = nn.Conv1d(6, 4, 3)
        self.conv2 = nn.Conv2d(6, 4, 3, groups=2)
        self.deconv1 = nn.ConvTranspose1d(6, 4, 3)
        self.deconv2 = nn.ConvTranspose2d(6, 4, 3, groups=2)
        self.attn = nn.MultiheadAttention(6, 2)
        self.gru = nn.GRU(6, 4, bidirectional=True)
        self.cell = nn.LSTMCell(6, 4)
        self.bilinear = nn.Bilinear(6, 6, 2)
        self.norm = nn.LayerNorm(6)


EXPECTED = {
    "fc.weight": 1, "c_fc.weight": 0, "square.weight": 0, "conv1.weight": 1, "conv2.weight": 1,
    "deconv1.weight": 0, "deconv2.weight": 0, "attn.in_proj_weight": 1, "attn.out_proj.weight": 1,
    "gru.weight_ih_l0": 1, "gru.weight_hh_l0": 1, "gru.weight_ih_l0_reverse": 1, "gru.weight_hh_l0_reverse": 1,
    "cell.weight_ih": 1, "cell.weight_hh": 1,
}  # fmt: skip


def test_every_layer_kind_gives_its_input_dim_and_the_others_none() -> None:
    assert fp.input_dims(Layers()) == EXPECTED  # the same order as named_parameters() too
    assert list(fp.input_dims(Layers())) == [n for n, _ in Layers().named_parameters() if n in EXPECTED]


#: Each layer's weight, and the layer called on an input whose features are in dim ``features``.
RUNS: dict[str, tuple[Callable[[Layers, Tensor], Tensor], int, tuple[int, ...]]] = {
    "fc.weight": (lambda m, x: m.fc(x), -1, (3, 6)),
    "c_fc.weight": (lambda m, x: m.c_fc(x), -1, (3, 6)),
    "square.weight": (lambda m, x: m.square(x), -1, (3, 6)),
    "conv1.weight": (lambda m, x: m.conv1(x), 1, (2, 6, 5)),
    "conv2.weight": (lambda m, x: m.conv2(x), 1, (2, 6, 5, 5)),
    "deconv1.weight": (lambda m, x: m.deconv1(x), 1, (2, 6, 5)),
    "deconv2.weight": (lambda m, x: m.deconv2(x), 1, (2, 6, 5, 5)),
    "attn.in_proj_weight": (lambda m, x: m.attn(x, x, x)[0], -1, (3, 2, 6)),
    "gru.weight_ih_l0": (lambda m, x: m.gru(x)[0], -1, (3, 2, 6)),
    "cell.weight_ih": (lambda m, x: m.cell(x)[0], -1, (2, 6)),
}


@pytest.mark.parametrize("name", list(RUNS))
@pytest.mark.parametrize("feature", [0, 4])
def test_the_dim_is_where_the_input_features_run(name: str, feature: int) -> None:
    """With only input feature ``feature`` nonzero, the output's gradient reaches that index of the dim only.

    (Of a grouped conv, whose dim 1 counts the input channels of one group,
    the index within its group.)
    """
    model = Layers()
    call, features, shape = RUNS[name]
    x = torch.zeros(shape)
    x.select(features, feature).normal_()
    weight = dict(model.named_parameters())[name]
    (grad,) = torch.autograd.grad(call(model, x).square().sum(), weight)
    dim = fp.input_dims(model)[name]
    reached = grad.ne(0).transpose(0, dim).flatten(1).any(1)
    assert reached.tolist() == [i == feature % weight.shape[dim] for i in range(weight.shape[dim])]


def test_a_tied_weight_goes_by_its_first_name_and_a_shared_layer_once() -> None:
    model = MiniGPT()
    assert fp.input_dims(model) == {"wte.weight": 1, "c_fc.weight": 0, "c_proj.weight": 0}  # wte: lm_head's
    shared = nn.Linear(4, 4)
    assert fp.input_dims(nn.Sequential(shared, nn.ReLU(), shared)) == {"0.weight": 1}


def test_lazy_layers_once_materialized() -> None:
    model = nn.Sequential(nn.LazyLinear(3), nn.LazyConvTranspose1d(2, 3))
    assert fp.input_dims(model) == {}
    model(torch.randn(1, 4, 5))
    assert fp.input_dims(model) == {"0.weight": 1, "1.weight": 0}


def test_a_weight_two_layers_read_along_different_dims_is_refused() -> None:
    model = nn.Sequential(nn.Linear(4, 4), Conv1D(4, 4))
    model[1].weight = model[0].weight
    with pytest.raises(ValueError, match=r"^input_dims: one parameter is '0.weight', whose input features "
                       r"run along dim 1, and '1.weight' \(Conv1D\), along dim 0: its layout is ambiguous"):  # fmt: skip
        fp.input_dims(model)


def test_errors() -> None:
    with pytest.raises(TypeError, match=r"^input_dims: module must be a torch.nn.Module, got dict; pass "):
        fp.input_dims(dict(nn.Linear(2, 2).named_parameters()))  # type: ignore[arg-type]
    model = lenet()
    tprune.l1_unstructured(model.fc1, "weight", 0.5)
    with pytest.raises(ValueError, match=r"^input_dims: .*'fc1.weight_orig'.*hook mode"):
        fp.input_dims(model)


def _tiny(name: str) -> Any:
    hf = pytest.importorskip("_hf", reason="needs transformers (the hf extra)")
    return hf.tiny(name).model


def test_gpt2_s_conv1d_weights_run_their_inputs_along_dim_0() -> None:
    model = _tiny("gpt2")
    dims = fp.input_dims(model)
    conv1d = [n for n, m in model.named_modules() if type(m).__name__ == "Conv1D"]
    assert len(conv1d) == 8
    assert dims == {"transformer.wte.weight": 1, **{f"{n}.weight": 0 for n in conv1d}}  # wte: lm_head's
    assert set(fp.prunable(model)) <= set(dims)


@pytest.mark.parametrize("family", ["llama", "bert", "vit"])
def test_linear_models_run_their_inputs_along_dim_1(family: str) -> None:
    model = _tiny(family)
    dims = fp.input_dims(model)
    assert set(dims.values()) == {1} and set(fp.prunable(model, outputs=True)) <= set(dims)
