"""Sparsity reports of mask dicts and of hook-mode modules."""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.utils.prune as tprune
from torch import nn

import funcprune as fp
import funcprune.compat as prune
from _models import LeNet

from compat._helpers import assert_same_fingerprint, fingerprint

WEIGHTS = ["conv1.weight", "conv2.weight", "fc1.weight", "fc2.weight", "fc3.weight"]


def lenet(seed: int = 0) -> LeNet:
    torch.manual_seed(seed)
    return LeNet()


def params_of(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def mask_buffers(module: nn.Module) -> dict[str, torch.Tensor]:
    """The masks as sparsity_report once read a hook-mode module: its ``<name>_mask``
    buffers beside ``<name>_orig`` parameters, module by module, in buffer order."""
    masks: dict[str, torch.Tensor] = {}
    for prefix, sub in module.named_modules():
        own = dict(sub.named_parameters(recurse=False))
        for name, buffer in sub.named_buffers(recurse=False):
            base = name[: -len("_mask")]
            if name.endswith("_mask") and base + "_orig" in own:
                masks[f"{prefix}.{base}" if prefix else base] = buffer
    return masks


def test_counts_fractions_and_global_fraction() -> None:
    masks = {
        "a": torch.tensor([[True, False], [False, False]]),
        "b": torch.tensor([1.0, 0.0, 1.0, 1.0]),
    }
    report = fp.sparsity_report(masks)
    assert [(r.name, r.shape, r.pruned, r.numel) for r in report.rows] == [
        ("a", (2, 2), 3, 4),
        ("b", (4,), 1, 4),
    ]
    assert report.fractions == {"a": 0.75, "b": 0.25}
    assert (report.pruned, report.numel, report.fraction) == (4, 8, 0.5)
    assert report["a"].fraction == 0.75
    with pytest.raises(fp.UnknownNameError, match="no row named 'c'"):
        report["c"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.rows = ()  # type: ignore[misc]


def test_the_table_is_aligned_and_shows_the_tutorials_figures() -> None:
    model = lenet(0)
    masks = fp.global_unstructured(["conv*.weight", "fc*.weight"], fp.L1Unstructured(0.2))(
        params_of(model)
    )
    text = str(fp.sparsity_report(masks))
    lines = text.splitlines()
    assert lines[0].split() == ["tensor", "shape", "pruned", "total", "sparsity"]
    assert [line.split()[0] for line in lines[1:]] == [*WEIGHTS, "global"]
    assert len({len(line) for line in lines}) == 1  # right-aligned numbers end in one column
    assert lines[-1].endswith("20.00%")
    conv1 = masks["conv1.weight"]
    expected = f"{100 * float((~conv1).sum()) / conv1.numel():.2f}%"  # the tutorial's formula
    assert lines[1].split()[1:] == ["6x1x3x3", str(int((~conv1).sum())), "54", expected]
    assert all(re.fullmatch(r"\d+\.\d\d%", line.split()[-1]) for line in lines[1:])


def test_a_hook_mode_module_reports_like_its_mask_dict() -> None:
    model = lenet(1)
    params = params_of(model)
    masks = fp.compose(
        fp.Plan({"conv1.bias": fp.L1Unstructured(3)}),
        fp.global_unstructured(WEIGHTS, fp.L1Unstructured(0.2)),
    )(params)
    reference = copy.deepcopy(model)
    tprune.l1_unstructured(reference.conv1, "bias", amount=3)
    tprune.global_unstructured([(getattr(reference, n.split(".")[0]), "weight") for n in WEIGHTS],
                               tprune.L1Unstructured, amount=0.2)  # fmt: skip
    from_module = fp.sparsity_report(prune.masks_from_module(reference))
    from_masks = fp.sparsity_report(masks)
    assert str(from_module) == str(fp.sparsity_report(mask_buffers(reference)))  # as before
    assert sorted(from_module.rows, key=str) == sorted(from_masks.rows, key=str)
    assert from_module.fraction == from_masks.fraction
    for name in WEIGHTS:  # the tutorial's "weight == 0" agrees with the buffers
        weight = getattr(reference.get_submodule(name.split(".")[0]), "weight")
        assert from_module[name].pruned == int((weight == 0).sum())


def test_params_add_unmasked_rows_in_parameter_order() -> None:
    params = {"w": torch.ones(2, 3), "b": torch.ones(2), "v": torch.ones(4)}
    report = fp.sparsity_report({"v": torch.tensor([False, True, True, True])}, params=params)
    assert [(r.name, r.pruned) for r in report.rows] == [("w", 0), ("b", 0), ("v", 1)]
    assert report.fraction == 1 / 12
    with pytest.raises(ValueError, match=r"mask for 'v' has shape \(3,\)"):
        fp.sparsity_report({"v": torch.ones(3)}, params=params)
    with pytest.raises(fp.UnknownNameError, match="did you mean 'v'"):
        fp.sparsity_report({"vv": torch.ones(4)}, params=params)


def test_empty_reports_and_bad_sources() -> None:
    assert fp.sparsity_report({}).fraction == 0.0
    assert str(fp.sparsity_report({})).splitlines()[-1].split() == ["global", "0", "0", "0.00%"]
    with pytest.raises(TypeError, match="a dict of masks or a module"):
        fp.sparsity_report([torch.ones(1)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="params= goes with a mask dict"):
        fp.sparsity_report(nn.Linear(2, 2), params={})
    with pytest.raises(TypeError, match="mask for 'w' must be a tensor"):
        fp.sparsity_report({"w": [True]})  # type: ignore[dict-item]


def test_a_mask_dict_holding_other_values_than_0_and_1_is_refused() -> None:
    with pytest.raises(ValueError, match=r"sparsity_report: the mask for 'w' must hold only 0 and 1.*0.5"):
        fp.sparsity_report({"w": torch.tensor([0.5, 1.0])})
    with pytest.raises(ValueError, match=r"must hold only 0 and 1"):
        fp.sparsity_report({"w": torch.tensor([0.5, 1.0])}, params={"w": torch.ones(2)})


def test_masks_from_module_gives_the_table_of_the_mask_buffers_for_compat_modules() -> None:
    model = lenet(2)
    prune.l1_unstructured(model.fc1, "weight", amount=0.3)
    prune.ln_structured(model.conv2, "weight", amount=2, n=2, dim=0)
    prune.random_unstructured(model.fc1, "bias", amount=5)
    prune.l1_unstructured(model.fc1, "weight", amount=0.5)  # iterative: a container, same place
    report = fp.sparsity_report(prune.masks_from_module(model))
    assert str(report) == str(fp.sparsity_report(mask_buffers(model)))
    assert [row.name for row in report.rows] == ["conv2.weight", "fc1.weight", "fc1.bias"]


def test_a_plain_module_reports_the_zeros_of_every_parameter() -> None:
    model = lenet(3)
    report = fp.sparsity_report(model)
    assert [row.name for row in report.rows] == [name for name, _ in model.named_parameters()]
    assert report.pruned == 0 and report.numel == sum(p.numel() for p in model.parameters())
    prune.l1_unstructured(model.fc1, "weight", amount=100)
    prune.random_structured(model.conv1, "weight", amount=2, dim=0)
    masks = prune.masks_from_module(model)
    for name in ("fc1.weight", "conv1.weight"):
        prune.remove(model.get_submodule(name.split(".")[0]), "weight")
    baked = fp.sparsity_report(model)
    assert baked["fc1.weight"].pruned == 100 and baked["conv1.weight"].pruned == 2 * 9
    assert baked.pruned == fp.sparsity_report(masks).pruned
    assert baked["fc1.bias"].pruned == 0


def test_a_plain_module_counts_exact_zeros_once_per_tied_parameter() -> None:
    embedding, head = nn.Embedding(4, 3), nn.Linear(3, 4, bias=False)
    head.weight = embedding.weight
    with torch.no_grad():
        embedding.weight.copy_(torch.tensor([[0.0, -0.0, 1e-30]] * 4))
    net = nn.Sequential(embedding, head)
    report = fp.sparsity_report(net)
    assert [(row.name, row.pruned) for row in report.rows] == [("0.weight", 8)]


def torch_pruned_conv(model: LeNet) -> None:
    tprune.l1_unstructured(model.conv1, "weight", amount=3)


def compat_container(model: LeNet) -> None:
    prune.l1_unstructured(model.fc2, "bias", amount=3)
    prune.identity(model.fc2, "bias")


@pytest.mark.parametrize(
    "hook, prune_it",
    [("conv1.weight", torch_pruned_conv), ("fc2.bias", compat_container)],
    ids=["torch", "compat-container"],
)
def test_a_module_in_hook_mode_is_refused_with_the_call_to_make(
    hook: str, prune_it: Callable[[LeNet], None]
) -> None:
    model = lenet(4)
    prune_it(model)
    before = fingerprint(model)
    child, name = hook.split(".")
    call = "fp.sparsity_report(funcprune.compat.masks_from_module(module))"
    for source, shown in ((model, hook), (model.get_submodule(child), name)):
        with pytest.raises(ValueError, match=re.escape(call)) as caught:
            fp.sparsity_report(source)
        assert str(caught.value).startswith(
            f"sparsity_report: the module is in hook mode: {shown!r} has a pruning hook"
        )
    assert_same_fingerprint(before, fingerprint(model))
