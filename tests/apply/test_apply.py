"""Applying masks: apply_masks, the masked functional_call, training, transforms."""

from __future__ import annotations

import copy
from typing_extensions import assert_type

import pytest
import torch
import torch.nn.functional as F
import torch.nn.utils.prune as tprune
from torch import nn

import funcprune as fp
from _models import LeNet

WEIGHTS = ["conv1.weight", "conv2.weight", "fc1.weight", "fc2.weight", "fc3.weight"]


def lenet(seed: int = 0) -> LeNet:
    torch.manual_seed(seed)
    return LeNet()


def params_of(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def images(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 1, 28, 28, generator=torch.Generator().manual_seed(seed))


def global20(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return fp.global_unstructured(["*.weight"], fp.L1Unstructured(0.2))(params)


# --- apply_masks -----------------------------------------------------------------


def test_apply_masks_multiplies_like_torchs_hook_and_returns_a_new_dict() -> None:
    model = lenet()
    params = params_of(model)
    masks = global20(params)
    masked = fp.apply_masks(params, masks)
    reference = copy.deepcopy(model)
    tprune.global_unstructured([(getattr(reference, n.split(".")[0]), "weight") for n in WEIGHTS],
                               tprune.L1Unstructured, amount=0.2)  # fmt: skip
    assert masked is not params and list(masked) == list(params)
    for name in WEIGHTS:
        weight = getattr(reference.get_submodule(name.split(".")[0]), "weight")
        assert torch.equal(masked[name], weight)
        assert torch.equal(masked[name].signbit(), weight.signbit())  # -0.0 as in torch
    assert masked["fc1.bias"] is params["fc1.bias"]  # no mask: unchanged
    assert not bool((params["fc1.weight"] == 0).any())  # inputs untouched


def test_apply_masks_accepts_torch_float_masks_and_refuses_others() -> None:
    params = {"w": torch.tensor([1.0, 2.0])}
    assert fp.apply_masks(params, {"w": torch.tensor([0.0, 1.0])})["w"].tolist() == [0.0, 2.0]
    with pytest.raises(ValueError, match="mask for 'w' must hold only 0 and 1"):
        fp.apply_masks(params, {"w": torch.tensor([0.0, 2.0])})


def test_apply_masks_errors_name_the_parameter() -> None:
    params = params_of(lenet())
    with pytest.raises(
        fp.UnknownNameError, match="'fc1.wieght' is not a parameter name.*'fc1.weight'"
    ):
        fp.apply_masks(params, {"fc1.wieght": torch.ones(120, 400, dtype=torch.bool)})
    with pytest.raises(
        ValueError, match=r"mask for 'fc2.weight' has shape \(120, 84\) but .* \(84, 120\)"
    ):
        fp.apply_masks(params, {"fc2.weight": torch.ones(120, 84, dtype=torch.bool)})
    with pytest.raises(
        ValueError, match="mask for 'fc3.bias' is on meta but the parameter is on cpu"
    ):
        fp.apply_masks(params, {"fc3.bias": torch.ones(10, dtype=torch.bool, device="meta")})
    with pytest.raises(ValueError, match=r"strict=True and no mask was given for \['conv1.bias'"):
        fp.apply_masks(params, global20(params), strict=True)
    with pytest.raises(TypeError, match="masks must be a mapping"):
        fp.apply_masks(params, [torch.ones(1)])  # type: ignore[arg-type]


# --- functional_call_masked and gradients --------------------------------------


def test_functional_call_masked_equals_the_torch_pruned_module() -> None:
    model = lenet(1)
    params = params_of(model)
    masks = global20(params)
    reference = copy.deepcopy(model)
    tprune.global_unstructured([(getattr(reference, n.split(".")[0]), "weight") for n in WEIGHTS],
                               tprune.L1Unstructured, amount=0.2)  # fmt: skip
    x = images(8)
    assert torch.equal(fp.functional_call_masked(model, params, masks, x), reference(x))
    assert torch.equal(fp.functional_call_masked(model, params, masks, (x,)), reference(x))
    assert not torch.equal(fp.functional_call_masked(model, params, {}, x), reference(x))
    assert all(not hasattr(m, "weight_mask") for m in model.modules())  # module untouched


def test_functional_call_masked_uses_the_modules_buffers_or_the_given_ones() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).eval()
    with torch.no_grad():
        net[1].running_mean.fill_(0.5)  # type: ignore[operator]
    params = params_of(net)
    masks = {"0.weight": torch.rand(4, 3, generator=torch.Generator().manual_seed(0)) > 0.5}
    x = torch.randn(5, 3)
    out = fp.functional_call_masked(net, params, masks, x)
    with torch.no_grad():
        expected = net[1](F.linear(x, params["0.weight"] * masks["0.weight"], params["0.bias"]))
    assert torch.equal(out, expected)
    zeros = {name: torch.zeros_like(b) for name, b in net.named_buffers()}
    assert not torch.equal(fp.functional_call_masked(net, params, masks, x, buffers=zeros), out)


def test_pruned_entries_get_zero_gradient_under_grad() -> None:
    model = lenet(2)
    params = params_of(model)
    masks = global20(params)

    def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        out: torch.Tensor = fp.functional_call_masked(model, p, masks, images(4))
        return out.square().sum()

    grads = torch.func.grad(loss)(params)
    for name, mask in masks.items():
        assert bool((grads[name][~mask] == 0).all())
        assert bool((grads[name][mask] != 0).any())


def test_mask_gradients_is_pure_and_works_under_vmap() -> None:
    grads = {"w": torch.ones(3, 2), "b": torch.ones(2)}
    masks = {"w": torch.tensor([[True, False], [False, True], [True, True]])}
    out = fp.mask_gradients(grads, masks)
    assert out["w"].tolist() == [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    assert out["b"] is grads["b"] and bool(grads["w"].all())
    batched = torch.func.vmap(fp.mask_gradients)(
        {"w": torch.ones(5, 3, 2)}, {"w": masks["w"].expand(5, 3, 2)}
    )
    assert torch.equal(batched["w"], out["w"].expand(5, 3, 2))


# --- keeping pruned weights at zero while training ---------------------------------


def test_torch_optim_with_mask_gradients_and_apply_masks_keeps_pruned_weights_at_zero() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    params = dict(net.named_parameters())
    masks = fp.Plan({"*.weight": fp.L1Unstructured(0.5)})(params)
    fp.apply_masks_(params, masks)
    before = {n: p.detach().clone() for n, p in params.items()}
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    x, y = torch.randn(32, 6), torch.randn(32, 2)
    for _ in range(5):
        optimizer.zero_grad()
        torch.autograd.backward(
            F.mse_loss(net(x), y)
        )  # an ordinary forward: pruned entries get gradients
        assert any(
            bool((p.grad[~masks[n]] != 0).any())
            for n, p in params.items()
            if n in masks and p.grad is not None
        )
        fp.mask_gradients_(params, masks)
        optimizer.step()
        fp.apply_masks_(params, masks)
    for name, mask in masks.items():
        assert bool((params[name][~mask] == 0).all())
        assert not torch.equal(params[name][mask], before[name][mask])


def test_mask_gradients_alone_keeps_adam_at_zero_and_apply_masks_alone_repairs_decay() -> None:
    torch.manual_seed(0)
    net = nn.Linear(6, 4)
    params = dict(net.named_parameters())
    masks = {"weight": torch.rand(4, 6, generator=torch.Generator().manual_seed(1)) > 0.5}
    fp.apply_masks_(params, masks)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        torch.autograd.backward(net(torch.randn(8, 6)).square().sum())
        fp.mask_gradients_(params, masks)
        optimizer.step()
    assert bool((net.weight[~masks["weight"]] == 0).all())
    with torch.no_grad():
        net.weight.add_(1.0)  # anything that moves pruned entries...
    fp.apply_masks_(params, masks)  # ...is undone
    assert bool((net.weight[~masks["weight"]] == 0).all())


def test_a_pure_functional_sgd_loop_keeps_masked_weights_out_of_the_model() -> None:
    model = lenet(3)
    params = params_of(model)
    masks = global20(params)
    x, y = images(16), torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(0))

    def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(fp.functional_call_masked(model, p, masks, x), y)

    start = loss(params)
    for _ in range(5):
        grads = fp.mask_gradients(torch.func.grad(loss)(params), masks)
        params = fp.apply_masks({n: p - 0.05 * grads[n] for n, p in params.items()}, masks)
    assert float(loss(params)) < float(start)
    for name, mask in masks.items():
        assert bool((params[name][~mask] == 0).all())


# --- transforms --------------------------------------------------------------------


def test_vmap_ensemble_forward_equals_each_model() -> None:
    torch.manual_seed(0)
    models = [LeNet() for _ in range(3)]
    params, buffers = torch.func.stack_module_state(models)
    plan = fp.Plan(
        {"conv*.weight": fp.L1Unstructured(0.3), "fc*.weight": fp.LnStructured(0.25, n=2, dim=0)}
    )
    masks = torch.func.vmap(lambda p: plan(p))(params)
    x = images(5)
    out = torch.func.vmap(lambda p, b, m: fp.functional_call_masked(models[0], p, m, x, buffers=b))(
        params, buffers, masks
    )
    for i, single in enumerate(models):
        own = plan(params_of(single))
        assert all(torch.equal(masks[n][i], own[n]) for n in own)
        assert torch.allclose(
            out[i], fp.functional_call_masked(single, params_of(single), own, x), atol=1e-6
        )
    applied = torch.func.vmap(fp.apply_masks)(params, masks)
    assert torch.equal(applied["fc2.weight"][1], params["fc2.weight"][1] * masks["fc2.weight"][1])


@pytest.mark.ci  # the default suite's 5 minutes: CI runs it
def test_a_masked_forward_compiles_with_fullgraph() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    params = params_of(net)
    masks = fp.Plan({"*.weight": fp.L1Unstructured(0.5)})(params)
    x = torch.randn(3, 8)

    def forward(
        p: dict[str, torch.Tensor], m: dict[str, torch.Tensor], x: torch.Tensor
    ) -> torch.Tensor:
        out: torch.Tensor = fp.functional_call_masked(net, p, m, x)
        return out

    compiled = torch.compile(forward, fullgraph=True)
    assert torch.allclose(compiled(params, masks, x), forward(params, masks, x), atol=1e-6)


def test_float_masks_are_checked_on_every_call_whatever_wrote_them() -> None:
    """No memo: a write that does not bump the version (``.data``) is still caught."""
    params = {"w": torch.tensor([1.0, -2.0, 3.0])}
    mask = torch.tensor([1.0, 0.0, 1.0])
    assert fp.apply_masks(params, {"w": mask})["w"].tolist() == [1.0, -0.0, 3.0]
    mask.data[1] = 0.5
    with pytest.raises(ValueError, match=r"must hold only 0 and 1"):
        fp.apply_masks(params, {"w": mask})
    as_bool = fp.apply_masks(params, {"w": torch.tensor([True, False, True])})["w"]
    assert torch.equal(as_bool, fp.apply_masks(params, {"w": torch.tensor([1.0, 0.0, 1.0])})["w"])


def test_to_multipliers_checks_once_and_holds_its_own_copies() -> None:
    params = {"w": torch.tensor([1.0, -2.0, 3.0]), "v": torch.tensor([4.0, 5.0], dtype=torch.float64)}
    mask = torch.tensor([1.0, 0.0, 1.0])
    mult = fp.to_multipliers(params, {"w": mask, "v": torch.tensor([False, True])})
    assert {n: t.dtype for n, t in mult.items()} == {"w": torch.float32, "v": torch.float64}
    mask.data[1] = 0.5  # the caller's tensor: not the multipliers' copy
    masked = fp.apply_masks(params, mult)
    assert masked["w"].tolist() == [1.0, -0.0, 3.0] and masked["v"].tolist() == [0.0, 5.0]
    assert fp.mask_gradients(params, mult)["w"].tolist() == [1.0, -0.0, 3.0]
    with pytest.raises(ValueError, match=r"to_multipliers: the mask for 'w' must hold only 0 and 1"):
        fp.to_multipliers(params, {"w": torch.tensor([1.0, 0.5, 1.0])})
    with pytest.raises(TypeError, match="build it with funcprune.to_multipliers"):
        fp.Multipliers({"w": mask})
    with pytest.raises(fp.UnknownNameError, match="apply_masks: mask for 'w'"):
        fp.apply_masks({"x": params["w"]}, mult)
    with pytest.raises(ValueError, match="has shape"):
        fp.apply_masks({"w": torch.ones(2), "v": params["v"]}, mult)
    with pytest.raises(TypeError):
        mult["w"] = mask  # type: ignore[index]  # an immutable mapping


def test_to_multipliers_train_like_bool_masks() -> None:
    model = lenet()
    params = params_of(model)
    masks = global20(params)
    mult = fp.to_multipliers(params, masks)
    x = images(4)
    assert torch.equal(fp.functional_call_masked(model, params, mult, (x,)),
                       fp.functional_call_masked(model, params, masks, (x,)))  # fmt: skip


def test_float_masks_made_under_inference_mode_work_everywhere() -> None:
    """Inference tensors have no version counter; nothing may ask for one."""
    model = lenet()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.inference_mode():
        masks = {n: m.float() for n, m in global20(params).items()}
    x = images(2)
    expected = fp.functional_call_masked(model, params, {n: m.clone() for n, m in masks.items()}, (x,))
    assert torch.equal(fp.functional_call_masked(model, params, masks, (x,)), expected)
    assert set(fp.apply_masks(params, masks)) == set(params)
    assert set(fp.mask_gradients(params, masks)) == set(params)
    assert set(fp.Plan({"fc1.weight": fp.L1Unstructured(0.1)})(params, masks)) == set(masks)
    mult = fp.to_multipliers(params, masks)
    live = {n: p.clone() for n, p in params.items()}
    fp.apply_masks_(live, masks)
    for name, p in live.items():
        p.grad = torch.ones_like(p)
    fp.mask_gradients_(live, masks)
    assert torch.equal(live["fc1.weight"], fp.apply_masks(params, mult)["fc1.weight"])
    grad = live["fc1.weight"].grad
    assert grad is not None and torch.equal(grad, masks["fc1.weight"])
    with torch.inference_mode():
        assert torch.equal(fp.functional_call_masked(model, params, masks, (x,)), expected)
        assert torch.equal(fp.functional_call_masked(model, params, mult, (x,)), expected)


def test_functional_call_masked_refuses_names_that_are_no_tensor_of_the_module() -> None:
    """torch.func.functional_call ignores unknown keys: a typo would run unmasked weights."""
    model = lenet()
    params = params_of(model)
    typo = {"fc1.wieght": params["fc1.weight"]}
    mask = {"fc1.wieght": torch.zeros_like(params["fc1.weight"], dtype=torch.bool)}
    with pytest.raises(fp.UnknownNameError, match=r"params has the key 'fc1.wieght'.*did you mean 'fc1.weight'"):
        fp.functional_call_masked(model, typo, mask, (images(1),))
    with pytest.raises(fp.UnknownNameError, match=r"masks has the key 'fc9.weight'"):
        fp.functional_call_masked(model, {}, {"fc9.weight": mask["fc1.wieght"]}, (images(1),))
    with pytest.raises(fp.UnknownNameError, match=r"buffers has the key 'running_mean'"):
        fp.functional_call_masked(model, params, {}, (images(1),), buffers={"running_mean": torch.ones(1)})
    with pytest.raises(TypeError, match="functional_call_masked: module must be a torch.nn.Module, got dict"):
        fp.functional_call_masked(params, params, {}, (images(1),))  # type: ignore[arg-type]


def test_functional_call_masked_on_a_hook_mode_module_points_to_unprune() -> None:
    model = lenet()
    tprune.l1_unstructured(model.fc1, "weight", amount=0.5)
    masks = {"fc1.weight": torch.ones(120, 400, dtype=torch.bool)}
    with pytest.raises(fp.UnknownNameError, match=r"'fc1.weight_orig' is: the module is pruned in hook mode.*unprune_"):
        fp.functional_call_masked(model, dict(model.named_parameters()), masks, (images(1),))


def test_functional_call_masked_is_typed_by_the_modules_forward() -> None:
    """mypy reads the result's type from ``forward``: a Tensor method checks here."""
    model = lenet()
    out = fp.functional_call_masked(model, params_of(model), {}, (images(1),))
    assert_type(out, torch.Tensor)  # mypy --strict fails here if the result is Any
    assert out.shape == (1, 10)


@pytest.mark.parametrize("bad", ["inference", "expanded"])
def test_in_place_functions_write_nothing_when_one_tensor_cannot_be_written(bad: str) -> None:
    def tensors() -> tuple[torch.Tensor, torch.Tensor]:
        if bad == "inference":
            with torch.inference_mode():
                late = torch.ones(2, 3)
        else:
            late = torch.ones(3).expand(2, 3)
        return torch.ones(2, 3), late

    first, late = tensors()
    masks = {"a": torch.zeros(2, 3, dtype=torch.bool), "b": torch.zeros(2, 3, dtype=torch.bool)}
    with pytest.raises(ValueError, match=r"apply_masks_: params\['b'\] is an? .*nothing was written"):
        fp.apply_masks_({"a": first, "b": late}, masks)
    assert bool(first.eq(1).all())  # not half-done
    a, b = torch.nn.Parameter(torch.ones(2, 3)), torch.nn.Parameter(torch.ones(2, 3))
    a.grad, b.grad = tensors()
    with pytest.raises(ValueError, match=r"mask_gradients_: params\['b'\].grad is an? .*nothing was written"):
        fp.mask_gradients_({"a": a, "b": b}, masks)
    assert a.grad is not None and bool(a.grad.eq(1).all())


def test_functional_call_masked_masks_a_parameter_left_out_of_params() -> None:
    lin = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    mask = torch.tensor([[True, False, True], [False, True, True]])
    got = fp.functional_call_masked(lin, {"bias": lin.bias}, {"weight": mask}, x)
    torch.testing.assert_close(got, F.linear(x, lin.weight * mask, lin.bias))
