"""Baking masks into a new module (funcprune._bake): values, buffers, tied weights, errors."""

from __future__ import annotations

import math
from typing_extensions import assert_type

import pytest
import torch
import torch.nn.utils.prune as tprune
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import funcprune as fp
import funcprune.compat as prune

Tensor = torch.Tensor


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


class Cnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))
        return out


def cnn() -> Cnn:
    torch.manual_seed(0)
    model = Cnn()
    model.train()
    model(torch.randn(8, 2, 6, 6))  # running statistics away from their initial values
    return model.eval()


class Tied(nn.Module):
    """A tiny language model whose output layer shares the embedding's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(7, 4)
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: Tensor) -> Tensor:
        out: Tensor = self.head(self.embed(tokens))
        return out


def l1_masks(module: nn.Module, amount: float = 0.5) -> dict[str, Tensor]:
    params = {n: p.detach() for n, p in module.named_parameters()}
    return fp.Plan({"*.weight": fp.L1Unstructured(amount)})(params)


def snapshot(module: nn.Module) -> dict[str, Tensor]:
    """Every tensor of ``module``, cloned, and its raw bits (``-0.0`` and NaNs told apart)."""
    return {name: t.detach().clone() for name, t in module.state_dict(keep_vars=True).items()}


def bitwise_equal(a: Tensor, b: Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(bits), b.view(bits))


# --- values ------------------------------------------------------------------------


def test_bake_holds_apply_masks_values_in_a_new_module_of_the_same_class() -> None:
    model = mlp()
    masks = l1_masks(model)
    params = dict(model.named_parameters())
    baked = fp.bake(model, masks)
    assert_type(baked, nn.Sequential)
    assert type(baked) is nn.Sequential and baked is not model
    expected = fp.apply_masks(params, masks)
    for name, p in baked.named_parameters():
        assert isinstance(p, nn.Parameter) and p.requires_grad
        assert torch.equal(p, expected[name]), name
        assert (p == 0).sum() == (0 if name not in masks else (~masks[name]).sum()), name
    x = torch.randn(5, 6)
    assert torch.equal(baked(x), fp.functional_call_masked(model, params, masks, (x,)))


def test_pruned_entries_are_plus_zero_and_kept_ones_bit_for_bit() -> None:
    lin = nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[-1.5, math.inf, math.nan, -0.0]]))
    mask = torch.tensor([[False, False, False, True]])
    weight = fp.bake(lin, {"weight": mask}).weight.detach()
    assert bitwise_equal(weight, torch.tensor([[0.0, 0.0, 0.0, -0.0]]))  # +0.0 where pruned
    kept = fp.bake(lin, {"weight": ~mask}).weight.detach()
    assert bitwise_equal(kept[:, :3], lin.weight.detach()[:, :3])  # nan and inf kept as they are


def test_float_masks_mean_what_bool_masks_mean() -> None:
    model = mlp()
    masks = l1_masks(model, 0.3)
    floats = {name: m.float() for name, m in masks.items()}
    for (name, a), (_, b) in zip(fp.bake(model, masks).named_parameters(),
                                 fp.bake(model, floats).named_parameters()):  # fmt: skip
        assert bitwise_equal(a.detach(), b.detach()), name


@given(
    st.integers(1, 6), st.integers(1, 6), st.integers(0, 2**31 - 1),
    st.sampled_from([torch.float32, torch.float64]), st.booleans(),
)  # fmt: skip
def test_bake_equals_apply_masks_for_random_masks(
    rows: int, cols: int, seed: int, dtype: torch.dtype, requires_grad: bool
) -> None:
    gen = torch.Generator().manual_seed(seed)
    lin = nn.Linear(cols, rows).to(dtype)
    lin.bias.requires_grad_(requires_grad)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(rows, cols, generator=gen))
    masks = {"weight": torch.rand(rows, cols, generator=gen) < 0.5, "bias": torch.rand(rows, generator=gen) < 0.5}
    before = snapshot(lin)
    baked = fp.bake(lin, masks)
    expected = fp.apply_masks(dict(lin.named_parameters()), masks)
    for name, p in baked.named_parameters():
        assert p.dtype == dtype and p.requires_grad == getattr(lin, name).requires_grad
        assert torch.equal(p.detach(), expected[name].detach())
        kept = masks[name]
        assert bitwise_equal(p.detach()[kept], getattr(lin, name).detach()[kept])
    assert all(bitwise_equal(before[n], t) for n, t in lin.state_dict().items())


# --- buffers, the original, tied weights ------------------------------------------


def test_a_cnn_keeps_its_buffers_and_computes_the_masked_outputs() -> None:
    model = cnn()
    masks = l1_masks(model)
    baked = fp.bake(model, masks)
    buffers = dict(model.named_buffers())
    assert not torch.equal(buffers["bn.running_mean"], torch.zeros(4))  # the test means something
    for name, b in baked.named_buffers():
        assert bitwise_equal(b, buffers[name]) and b.data_ptr() != buffers[name].data_ptr()
    assert not baked.training
    x = torch.randn(3, 2, 6, 6)
    expected = fp.functional_call_masked(model, dict(model.named_parameters()), masks, (x,))
    torch.testing.assert_close(baked(x), expected, rtol=0, atol=1e-6)
    fresh = Cnn()
    fresh.load_state_dict(baked.state_dict())  # strict: buffers included
    torch.testing.assert_close(fresh.eval()(x), expected, rtol=0, atol=1e-6)


def test_the_original_is_untouched_and_shares_nothing() -> None:
    model = cnn()
    model.conv.weight.data[0, 0, 0, 0] = -0.0
    before = snapshot(model)
    baked = fp.bake(model, l1_masks(model, 0.9))
    after = model.state_dict(keep_vars=True)
    assert before.keys() == after.keys()
    assert all(bitwise_equal(before[n], after[n]) for n in before)
    ours = {t.data_ptr() for t in model.state_dict().values() if t.numel()}
    assert not ours & {t.data_ptr() for t in baked.state_dict().values() if t.numel()}
    with torch.no_grad():
        baked.fc.weight.fill_(1.0)
    assert bitwise_equal(model.fc.weight.detach(), before["fc.weight"])


def test_tied_weights_stay_tied_and_masked_once() -> None:
    torch.manual_seed(0)
    model = Tied()
    mask = torch.rand(7, 4) < 0.5
    for masks in ({"embed.weight": mask}, {"head.weight": mask}, {"embed.weight": mask, "head.weight": mask}):
        baked = fp.bake(model, masks)
        assert baked.head.weight is baked.embed.weight
        assert baked.embed.weight is not model.embed.weight
        assert torch.equal(baked.embed.weight, model.embed.weight * mask)
        assert [n for n, _ in baked.named_parameters()] == ["embed.weight"]


def test_tied_weights_with_different_masks_are_refused() -> None:
    model = Tied()
    mask = torch.ones(7, 4, dtype=torch.bool)
    other = mask.clone()
    other[0, 0] = False
    with pytest.raises(ValueError, match=r"bake: 'embed.weight' and 'head.weight' are one tied Parameter.*differ"):
        fp.bake(model, {"embed.weight": mask, "head.weight": other})


# --- hook mode and errors ----------------------------------------------------------


@pytest.mark.parametrize("library", ["torch", "funcprune.compat"])
def test_a_module_in_hook_mode_is_refused_with_the_way_out(library: str) -> None:
    model = mlp()
    (tprune if library == "torch" else prune).l1_unstructured(model[0], "weight", amount=0.5)
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"bake: module is pruned in hook mode.*'0.weight'.*unprune_"):
        fp.bake(model, {})
    assert all(bitwise_equal(before[n], t) for n, t in model.state_dict(keep_vars=True).items())
    masks = prune.unprune_(model)  # the way out the message gives
    weight = dict(fp.bake(model, masks).named_parameters())["0.weight"]
    assert torch.equal(weight, model.get_parameter("0.weight") * masks["0.weight"])


def test_errors_name_the_argument_and_the_key() -> None:
    model = mlp()
    good = torch.ones(8, 6, dtype=torch.bool)
    with pytest.raises(fp.UnknownNameError, match=r"bake: mask for '0.wieght'.*did you mean '0.weight'"):
        fp.bake(model, {"0.wieght": good})
    with pytest.raises(ValueError, match=r"bake: the mask for '0.weight' has shape \(6, 8\)"):
        fp.bake(model, {"0.weight": good.T})
    with pytest.raises(TypeError, match=r"bake: the mask for '0.weight' has dtype torch.int64.*torch.bool"):
        fp.bake(model, {"0.weight": good.long()})
    with pytest.raises(ValueError, match=r"bake: the mask for '0.weight' must hold only 0 and 1"):
        fp.bake(model, {"0.weight": good.float() * 0.5})
    with pytest.raises(TypeError, match=r"bake: masks must be a mapping"):
        fp.bake(model, [good])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"bake: module must be a torch.nn.Module, got dict"):
        fp.bake({"0.weight": good}, {})  # type: ignore[type-var]


def test_no_masks_gives_an_equal_copy() -> None:
    model = cnn()
    baked = fp.bake(model, {})
    assert all(bitwise_equal(t, model.state_dict()[n]) for n, t in baked.state_dict().items())
    assert baked.training is False and baked.bn is not model.bn
