"""Which weights to prune (funcprune._targets._prunable): names, ties, custom types, errors, plans."""

from __future__ import annotations

import copy
import types

import pytest
import torch
import torch.nn.utils.parametrize as parametrize
import torch.nn.utils.prune as tprune
from torch import nn

import funcprune as fp
import funcprune.compat as prune
from _models import lenet, same_masks, targets, torch_masks

Tensor = torch.Tensor


class Everything(nn.Module):
    """One of every layer kind prunable knows, and norm layers it must skip."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.bag = nn.EmbeddingBag(10, 8)
        self.conv1 = nn.Conv1d(2, 3, 3)
        self.conv2 = nn.Conv2d(2, 3, 3)
        self.conv3 = nn.Conv3d(2, 3, 2)
        self.deconv1 = nn.ConvTranspose1d(3, 2, 3)
        self.deconv2 = nn.ConvTranspose2d(3, 2, 3)
        self.deconv3 = nn.ConvTranspose3d(3, 2, 2, bias=False)
        self.bn = nn.BatchNorm2d(3)
        self.ln = nn.LayerNorm(8)
        self.gn = nn.GroupNorm(1, 3)
        self.inorm = nn.InstanceNorm1d(3, affine=True)
        self.rms = nn.RMSNorm(8)
        self.fc = nn.Linear(8, 8)
        self.bilinear = nn.Bilinear(8, 6, 4)
        self.attn = nn.MultiheadAttention(8, 2)
        self.cross = nn.MultiheadAttention(8, 2, kdim=4, vdim=6, add_bias_kv=True)
        self.encoder = nn.TransformerEncoderLayer(8, 2, 16)
        self.lstm = nn.LSTM(8, 6, num_layers=2, bidirectional=True, proj_size=3)
        self.gru = nn.GRU(8, 6)
        self.rnn = nn.RNN(8, 6)
        self.cell = nn.GRUCell(8, 6)
        self.head = nn.Linear(8, 3, bias=False)


LSTM = [
    f"lstm.weight_{kind}_l{layer}{direction}"
    for layer in (0, 1)
    for direction in ("", "_reverse")
    for kind in ("ih", "hh", "hr")
]
EXPECTED = [
    "conv1.weight", "conv2.weight", "conv3.weight",
    "deconv1.weight", "deconv2.weight", "deconv3.weight",
    "fc.weight", "bilinear.weight",
    "attn.in_proj_weight", "attn.out_proj.weight",
    "cross.q_proj_weight", "cross.k_proj_weight", "cross.v_proj_weight", "cross.out_proj.weight",
    "encoder.self_attn.in_proj_weight", "encoder.self_attn.out_proj.weight",
    "encoder.linear1.weight", "encoder.linear2.weight",
    *LSTM,
    "gru.weight_ih_l0", "gru.weight_hh_l0",
    "rnn.weight_ih_l0", "rnn.weight_hh_l0",
    "cell.weight_ih", "cell.weight_hh",
    "head.weight",
]  # fmt: skip
NORMS = (nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm, nn.InstanceNorm1d, nn.RMSNorm)


def everything(seed: int = 0) -> Everything:
    torch.manual_seed(seed)
    return Everything()


# --- what is selected --------------------------------------------------------


def test_every_layer_kind_gives_exactly_its_weights() -> None:
    assert fp.prunable(everything()) == EXPECTED


def test_embeddings_are_selected_on_request_only() -> None:
    model = everything()
    assert fp.prunable(model, embeddings=True) == ["embed.weight", "bag.weight", *EXPECTED]
    assert fp.prunable(model, embeddings=False) == EXPECTED


def test_lstm_names_are_those_torch_gives() -> None:
    """The expected LSTM names are real ones (the list above is not a typo's echo)."""
    lstm = nn.LSTM(8, 6, num_layers=2, bidirectional=True, proj_size=3)
    assert [n for n, _ in lstm.named_parameters() if n.startswith("weight_")] == [
        n.removeprefix("lstm.") for n in LSTM
    ]


@pytest.mark.parametrize("embeddings", [False, True])
def test_never_a_bias_a_norm_parameter_or_a_duplicate(embeddings: bool) -> None:
    model = everything()
    names = fp.prunable(model, embeddings=embeddings)
    norm_prefixes = tuple(p + "." for p, m in model.named_modules() if isinstance(m, NORMS))
    assert len(norm_prefixes) == len(NORMS) + 2  # the encoder's norm1 and norm2
    assert not [n for n in names if "bias" in n.rsplit(".", 1)[-1]]
    assert not [n for n in names if n.startswith(norm_prefixes)]
    assert len(set(names)) == len(names)
    order = list(dict(model.named_parameters()))
    assert names == sorted(names, key=order.index)


def test_a_single_layer_and_a_layer_without_weights() -> None:
    assert fp.prunable(nn.Conv2d(1, 2, 3)) == ["weight"]
    assert fp.prunable(nn.MultiheadAttention(4, 1)) == ["in_proj_weight", "out_proj.weight"]
    assert fp.prunable(nn.LayerNorm(4)) == []
    assert fp.prunable(nn.ReLU()) == []


def test_subclasses_of_the_known_layers_are_selected() -> None:
    class Scaled(nn.Linear):
        pass

    model = nn.Sequential(Scaled(3, 4), nn.Sequential(nn.ReLU(), nn.LazyConv1d(2, 3)))
    # the lazy conv is not materialized yet: its weight is skipped
    assert fp.prunable(model) == ["0.weight"]
    with torch.no_grad():
        model[1](torch.randn(1, 4, 5))
    assert fp.prunable(model) == ["0.weight", "1.1.weight"]


def test_lazy_linear_once_materialized() -> None:
    lazy = nn.LazyLinear(3)
    assert fp.prunable(lazy) == []
    lazy(torch.randn(2, 5))
    assert fp.prunable(lazy) == ["weight"]


def test_frozen_parameters_are_selected() -> None:
    model = lenet()
    model.requires_grad_(False)
    assert fp.prunable(model) == [f"{n}.weight" for n in ("conv1", "conv2", "fc1", "fc2", "fc3")]


def test_meta_models_give_the_same_names() -> None:
    """A base model on the meta device (for stack_module_state) has the same names."""
    assert fp.prunable(everything().to("meta")) == EXPECTED


# --- ties and sharing --------------------------------------------------------


class TiedLM(nn.Module):
    """An Embedding tied to the output Linear, with a norm in between."""

    def __init__(self, *, head_first: bool = False) -> None:
        super().__init__()
        if head_first:
            self.head = nn.Linear(8, 10, bias=False)
        self.embed = nn.Embedding(10, 8)
        self.norm = nn.LayerNorm(8)
        self.hidden = nn.Linear(8, 8)
        if not head_first:
            self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight


@pytest.mark.parametrize("embeddings", [False, True])
def test_a_tied_weight_appears_once_under_its_first_name(embeddings: bool) -> None:
    model = TiedLM()
    assert model.head.weight is model.embed.weight
    # With outputs=True and embeddings=False the tensor is still a Linear's weight: it is
    # listed, under the name named_parameters gives it (the Embedding's, registered first).
    # (By default it is left out, as a weight tied to an input embedding: test_outputs.py.)
    assert fp.prunable(model, embeddings=embeddings, outputs=True) == ["embed.weight", "hidden.weight"]
    assert fp.prunable(TiedLM(head_first=True), embeddings=embeddings, outputs=True) == [
        "head.weight",
        "hidden.weight",
    ]


def test_a_shared_layer_appears_once() -> None:
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.ReLU(), shared, nn.Linear(4, 2))
    assert fp.prunable(model) == ["0.weight", "3.weight"]


# --- only leaf parameters registered on their module ------------------------


def test_parametrized_weights_are_not_selected() -> None:
    class Double(nn.Module):
        def forward(self, w: Tensor) -> Tensor:
            return 2 * w

    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    parametrize.register_parametrization(model[0], "weight", Double())
    names = list(dict(model.named_parameters()))
    assert "0.parametrizations.weight.original" in names
    assert fp.prunable(model) == ["1.weight"]


def test_tensors_swapped_in_by_functional_call_are_not_parameters() -> None:
    seen: list[list[str]] = []

    class Recorder(nn.Linear):
        def forward(self, x: Tensor) -> Tensor:
            seen.append(fp.prunable(self))
            out: Tensor = super().forward(x)
            return out

    layer = Recorder(3, 2)
    clones = {n: p.detach().clone() for n, p in layer.named_parameters()}
    torch.func.functional_call(layer, clones, (torch.randn(1, 3),))
    layer(torch.randn(1, 3))
    assert seen == [[], ["weight"]]


@pytest.mark.parametrize("lib", [tprune, prune], ids=["torch", "compat"])
def test_a_module_in_hook_mode_is_refused(lib: types.ModuleType) -> None:
    model = lenet()
    lib.l1_unstructured(model.fc1, "weight", 0.5)
    with pytest.raises(ValueError, match=r"prunable: .*'fc1.weight_orig'.*hook mode.*unprune_"):
        fp.prunable(model)
    prune.unprune_(model)
    assert fp.prunable(model) == [f"{n}.weight" for n in ("conv1", "conv2", "fc1", "fc2", "fc3")]


# --- custom types ------------------------------------------------------------


class Mine(nn.Module):
    """A user's layer: a weight, a bias and a scale, plus a child Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 3))
        self.bias = nn.Parameter(torch.zeros(4))
        self.scale = nn.Parameter(torch.ones(4))
        self.inner = nn.Linear(3, 3)


class MineToo(Mine):
    pass


def test_custom_types_select_their_weight_only() -> None:
    model = nn.Sequential(Mine(), MineToo(), nn.LayerNorm(3))
    assert fp.prunable(model) == ["0.inner.weight", "1.inner.weight"]
    assert fp.prunable(model, types=(Mine,)) == [
        "0.weight", "0.inner.weight", "1.weight", "1.inner.weight"
    ]  # fmt: skip
    assert fp.prunable(model, types=[MineToo]) == ["0.inner.weight", "1.weight", "1.inner.weight"]
    assert fp.prunable(model, types=(MineToo, nn.LayerNorm)) == [
        "0.inner.weight", "1.weight", "1.inner.weight", "2.weight"
    ]  # fmt: skip


# --- errors ------------------------------------------------------------------


def test_module_must_be_a_module() -> None:
    params = dict(lenet().named_parameters())
    with pytest.raises(TypeError, match=r"prunable: module must be a torch.nn.Module, got dict; "
                       r"pass the model itself"):  # fmt: skip
        fp.prunable(params)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^prunable: module must be a torch.nn.Module, got int$"):
        fp.prunable(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("types", "message"),
    [
        ((nn.Linear, int), r"types\[1\] must be a torch.nn.Module subclass, got the class int"),
        ((nn.Linear(2, 2),), r"types\[0\] must be a torch.nn.Module subclass, got Linear\("),
        (("Linear",), r"types\[0\] must be a torch.nn.Module subclass, got 'Linear' of type"),
        ("Linear", r"types must be a tuple of torch.nn.Module subclasses, got 'Linear' of type"),
        (nn.Linear, r"types must be a tuple .*got the class Linear itself; write types=\(Linear,"),
        (3, r"types must be a tuple of torch.nn.Module subclasses, got 3 of type int"),
    ],
    ids=["int class", "instance", "name", "string", "one class", "int"],
)
def test_types_must_be_module_subclasses(types: object, message: str) -> None:
    with pytest.raises(TypeError, match="prunable: " + message):
        fp.prunable(lenet(), types=types)  # type: ignore[arg-type]


def test_embeddings_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="prunable: embeddings must be a bool, got 1 of type int"):
        fp.prunable(lenet(), embeddings=1)  # type: ignore[arg-type]


# --- the names as plan keys --------------------------------------------------


def test_global_plan_over_prunable_matches_torch() -> None:
    model = everything()
    names = fp.prunable(model, embeddings=True)
    params = dict(model.named_parameters())
    masks = fp.global_unstructured(names, fp.L1Unstructured(0.5))(params)
    assert list(masks) == names
    pruned = sum(int((~m).sum()) for m in masks.values())
    assert pruned == round(0.5 * sum(params[n].numel() for n in names))

    twin = copy.deepcopy(model)
    tprune.global_unstructured(targets(twin, names), tprune.L1Unstructured, amount=0.5)
    assert same_masks(masks, torch_masks(twin))


def test_plan_over_prunable_prunes_each_named_weight() -> None:
    model = TiedLM()
    names = fp.prunable(model, embeddings=True)
    params = dict(model.named_parameters())
    masks = fp.Plan({name: fp.L1Unstructured(0.5) for name in names})(params)
    assert list(masks) == names
    for name, mask in masks.items():
        assert int((~mask).sum()) == round(0.5 * params[name].numel())
