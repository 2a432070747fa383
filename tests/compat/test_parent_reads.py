"""Parents that read a pruned child's tensors without calling it.

``MultiheadAttention.forward`` passes ``self.out_proj.weight`` to the
attention function and never calls ``out_proj``, so ``out_proj``'s pruning
hook never runs (pytorch/pytorch#69353, #78109): with torch the second
backward fails, and under ``no_grad`` an optimizer step is not seen. compat
refreshes the pruned tensors before the attention's forward; hook mode then
trains and infers as the functional API does.
"""

from __future__ import annotations

import copy
import io
import types
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
import torch
import torch.nn.utils.prune as tp
from torch import nn

import funcprune as fp
import funcprune.compat as cp
from funcprune.compat._parents import RefreshChild

from ._helpers import assert_same_fingerprint, fingerprint, twins

Tensor = torch.Tensor
Prune = Callable[[types.ModuleType, Any], Any]
PRUNINGS: dict[str, Prune] = {
    "out_proj": lambda lib, m: (
        lib.l1_unstructured(m.out_proj, "weight", 0.5),
        lib.ln_structured(m.out_proj, "weight", 2, n=2, dim=0),
        lib.l1_unstructured(m.out_proj, "bias", 3),
        lib.random_unstructured(m.out_proj, "weight", 0.2)),
    "in_proj_weight": lambda lib, m: lib.l1_unstructured(m, "in_proj_weight", 0.3),
    "global": lambda lib, m: lib.global_unstructured(
        [(m, "in_proj_weight"), (m.out_proj, "weight")], lib.L1Unstructured, amount=0.4),
}


def mha(batch_first: bool) -> nn.MultiheadAttention:
    module = nn.MultiheadAttention(8, 2, batch_first=batch_first)
    with torch.no_grad():  # distinct values (torch initializes it with zeros: ties)
        module.out_proj.bias.copy_(torch.linspace(-0.8, 0.6, 8))
    return module


def inputs(batch_first: bool) -> Tensor:
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(0))
    return x if batch_first else x.transpose(0, 1)


def pruned_pair(batch_first: bool, pruning: str) -> tuple[Any, Any, dict[str, Tensor]]:
    """A module pruned by compat, an unpruned twin, and the masks."""
    hooked, functional = twins(lambda: mha(batch_first))
    torch.manual_seed(1)
    PRUNINGS[pruning](cp, hooked)
    return hooked, functional, cp.masks_from_module(hooked)


def outputs(model: Any, x: Tensor, masks: dict[str, Tensor] | None) -> Tensor:
    """Self-attention output, in hook mode (``masks`` None) or functionally."""
    if masks is None:
        out: Tensor = model(x, x, x)[0]
        return out
    params = dict(model.named_parameters())
    out = fp.functional_call_masked(model, params, masks, (x, x, x))[0]
    return out


def train_step(model: Any, opt: torch.optim.Optimizer, x: Tensor,
               masks: dict[str, Tensor] | None) -> tuple[Tensor, dict[str, Tensor]]:
    """Output and gradients (by plain parameter name) of one training step."""
    out = outputs(model, x, masks)
    out.square().mean().backward()  # type: ignore[no-untyped-call]
    grads = {name.removesuffix("_orig"): p.grad.clone() for name, p in model.named_parameters()
             if p.grad is not None}
    opt.step()
    opt.zero_grad()
    return out.detach(), grads


def assert_close(a: Tensor, b: Tensor) -> None:
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


@pytest.mark.parametrize("pruning", list(PRUNINGS))
@pytest.mark.parametrize("batch_first", [False, True])
def test_hook_mode_trains_and_infers_like_the_functional_api(batch_first: bool,
                                                               pruning: str) -> None:
    hooked, functional, masks = pruned_pair(batch_first, pruning)
    x = inputs(batch_first)
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (hooked, functional)]
    for _ in range(3):  # the second backward would fail on a stale graph
        (ya, ga), (yb, gb) = train_step(hooked, opts[0], x, None), train_step(
            functional, opts[1], x, masks)
        assert_close(ya, yb)
        assert sorted(ga) == sorted(gb)
        for name in ga:
            assert_close(ga[name], gb[name])
    with torch.no_grad():  # the optimizer's last step must be seen
        assert_close(outputs(hooked, x, None), outputs(functional, x, masks))
    for model in (hooked, functional):
        model.eval()
    assert_close(outputs(hooked, x, None), outputs(functional, x, masks))
    with torch.no_grad():  # batch_first: MultiheadAttention's fast path
        assert_close(outputs(hooked, x, None), outputs(functional, x, masks))


def test_the_fast_path_sees_the_refreshed_weight() -> None:
    hooked, functional, masks = pruned_pair(True, "out_proj")
    hooked.eval()
    functional.eval()
    x = inputs(True)
    with torch.no_grad():
        hooked.out_proj.weight_orig.mul_(2.0)
        functional.out_proj.weight.mul_(2.0)
        with mock.patch.object(torch, "_native_multi_head_attention",
                               wraps=torch._native_multi_head_attention) as fast:
            got = outputs(hooked, x, None)
        assert fast.call_count == 1
        assert_close(got, outputs(functional, x, masks))


def refreshers(module: nn.Module) -> list[str]:
    return [h.child for h in module._forward_pre_hooks.values() if isinstance(h, RefreshChild)]


def test_one_refresher_while_the_child_is_pruned() -> None:
    model: Any = mha(False)
    cp.l1_unstructured(model.out_proj, "weight", 0.5)
    cp.l1_unstructured(model.out_proj, "bias", 2)
    cp.l1_unstructured(model.out_proj, "weight", 0.1)
    cp.l1_unstructured(model, "in_proj_weight", 0.1)
    assert refreshers(model) == ["out_proj"]
    cp.remove(model.out_proj, "weight")
    assert refreshers(model) == ["out_proj"]  # the bias is still pruned
    cp.remove(model.out_proj, "bias")
    assert refreshers(model) == []
    masks = cp.unprune_(model)
    cp.install_masks_(model, {**masks, "out_proj.weight": torch.rand(8, 8) > 0.5})
    assert refreshers(model) == ["out_proj"]
    cp.unprune_(model)
    assert refreshers(model) == [] and not model._forward_pre_hooks


def test_state_dict_keys_like_torch() -> None:
    ours, theirs = twins(lambda: mha(True))
    for lib, model in ((cp, ours), (tp, theirs)):
        torch.manual_seed(0)
        PRUNINGS["out_proj"](lib, model)
        PRUNINGS["in_proj_weight"](lib, model)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for key, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key


@pytest.mark.parametrize("how", ["deepcopy", "torch.save"])
def test_copies_keep_refreshing(how: str) -> None:
    hooked, functional, masks = pruned_pair(False, "out_proj")
    x = inputs(False)
    if how == "deepcopy":
        clone = copy.deepcopy(hooked)
    else:
        buffer = io.BytesIO()
        torch.save(hooked, buffer)
        clone = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    assert refreshers(clone) == ["out_proj"]
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (clone, functional)]
    for _ in range(2):
        assert_close(train_step(clone, opts[0], x, None)[0],
                     train_step(functional, opts[1], x, masks)[0])
    with torch.no_grad():
        assert_close(outputs(clone, x, None), outputs(functional, x, masks))


class Block(nn.Module):
    """A model holding an attention and a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = mha(True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc(self.attn(x, x, x)[0])
        return out


def test_a_failing_call_leaves_the_parent_as_it_was() -> None:
    model: Any = Block()
    model.fc.bias_mask = torch.ones(3)  # a plain attribute: registering the buffer fails
    before = fingerprint(model)
    with pytest.raises(KeyError, match="already exists"):
        cp.install_masks_(model, {"attn.out_proj.weight": torch.rand(8, 8) > 0.5,
                                  "fc.bias": torch.ones(3, dtype=torch.bool)})
    assert_same_fingerprint(before, fingerprint(model))
    assert refreshers(model.attn) == []
    with pytest.raises(KeyError, match="already exists"):
        cp.global_unstructured([(model.attn.out_proj, "weight"), (model.fc, "bias")],
                               cp.L1Unstructured, amount=2)
    assert_same_fingerprint(before, fingerprint(model))


def test_inside_a_model_like_the_functional_api() -> None:
    hooked, functional = twins(Block)
    cp.l1_unstructured(hooked.attn.out_proj, "weight", 0.5)
    masks = cp.masks_from_module(hooked)
    x = inputs(True)
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (hooked, functional)]
    for _ in range(2):
        for model, opt, m in ((hooked, opts[0], None), (functional, opts[1], masks)):
            out = model(x) if m is None else fp.functional_call_masked(
                model, dict(model.named_parameters()), m, (x,))
            out.square().mean().backward()
            opt.step()
            opt.zero_grad()
    with torch.no_grad():
        assert_close(hooked(x), fp.functional_call_masked(
            functional, dict(functional.named_parameters()), masks, (x,)))
