"""Vision models through both paths (issue 35 item 8): torchvision's CNNs, Swin and a ViT, random weights, float64.

- the structure path: ``fp.structure`` + ``fp.structured`` + ``fp.shrink``:
  what the plan prunes is exactly what goes, and the shrunk model computes the
  masked model to float64 rounding;
- the plain path: a channel plan per conv weight + ``fp.propagate`` +
  ``fp.shrink``: in-place activations and dropout, ``roll`` and window
  partitions are followed; the shrunk model computes the closure-masked model.

torchvision 0.28 runs here beside the CPU torch wheel with its meta
registrations stubbed (``tests/_torchvision.py``, ``conftest.py``). Inputs are
small (32x32, or 64x64 where a model needs it) to keep the suite fast; the
models are built with ``num_classes=10``.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import _torchvision  # noqa: F401 (torchvision imports beside the CPU torch)
import pytest
import torch
from torch import nn

import funcprune as fp

torchvision = pytest.importorskip("torchvision")
Tensor = torch.Tensor

#: The models, the input size each runs on, and whether the default run takes it (the others: ci only; ShuffleNet's
#: channel shuffle has its own default test in tests/payoff/test_shrink.py).
MODELS: dict[str, tuple[int, bool]] = {
    "mobilenet_v3_small": (32, False), "efficientnet_b0": (32, False), "swin_t": (64, False),
    "shufflenet_v2_x0_5": (32, False), "regnet_y_400mf": (32, False), "convnext_tiny": (32, False),
    "vit": (32, True), "densenet121": (32, False),
}  # fmt: skip


def params(name: str) -> list[Any]:
    return [pytest.param(n, marks=() if fast else pytest.mark.ci) for n, (_, fast) in MODELS.items()]


@functools.cache
def model_and_input(name: str) -> tuple[nn.Module, Tensor]:
    torch.manual_seed(0)
    if name == "vit":
        model: nn.Module = torchvision.models.VisionTransformer(
            image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=10
        )
    else:
        model = getattr(torchvision.models, name)(num_classes=10)
    size = MODELS[name][0]
    model = model.double().eval()
    return model, torch.randn(2, 3, size, size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def assert_float64_close(got: Tensor, want: Tensor) -> None:
    scale = float(want.abs().max())
    assert float((got - want).abs().max()) <= 1e-10 * max(scale, 1e-300), float((got - want).abs().max())


@pytest.mark.parametrize("name", params("structure"))
def test_the_structure_path_removes_exactly_what_the_plan_prunes(name: str) -> None:
    model, x = model_and_input(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fp.UnitsLeftOutWarning)  # what cannot go (a channel shuffle's halves...)
        s = fp.structure(model, x)
    assert s and all(g.kind in {"channels", "heads", "layers"} for g in s.values())
    p = dict(model.named_parameters())
    kinds: tuple[fp.Kind, ...] = ("channels", "heads", "layers")  # whole residual blocks of a stage too, where they can go
    masks = fp.structured(s, fp.LnStructured(0.3, n=2), scope="group", kinds=kinds)(p)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fp.KeptChannelsWarning)  # every unit the plan prunes goes
        small = fp.shrink(model, masks, x)
    removed = sum(t.numel() for t in model.parameters()) - sum(t.numel() for t in small.parameters())
    assert removed == sum(int((~m).sum()) for m in masks.values()) > 0
    with torch.no_grad():
        assert_float64_close(small(x), fp.functional_call_masked(model, p, masks, x))


@pytest.mark.parametrize("name", params("plain"))
def test_the_plain_path_shrinks_to_the_closure_masked_model(name: str) -> None:
    model, x = model_and_input(name)
    p = dict(model.named_parameters())
    outputs = {n for n, t in p.items() if t.dim() == 2 and t.shape[0] == 10}  # the classifier: left out
    plan = fp.Plan({n: fp.LnStructured(0.3, n=2, dim=0) for n, t in p.items() if t.dim() >= 2 and n not in outputs})
    masks = plan(p)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fp.KeptChannelsWarning)  # coupled channels another layer keeps stay
        closure = fp.propagate(model, masks, x)
        small = fp.shrink(model, masks, x)
    assert sum(t.numel() for t in small.parameters()) < sum(t.numel() for t in model.parameters())
    with torch.no_grad():
        assert_float64_close(small(x), fp.functional_call_masked(model, p, closure, x))


def test_in_place_activations_and_dropout_are_followed_and_nothing_is_left_out_silently() -> None:
    # mobilenet_v3_small: hardswish_, hardsigmoid_, dropout_ (its channels were once left out without a word)
    model, x = model_and_input("mobilenet_v3_small")
    with warnings.catch_warnings():
        warnings.simplefilter("error", fp.UnitsLeftOutWarning)
        s = fp.structure(model, x)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d) and m.groups == 1]
    listed = {m.name for g in s.values() for m in g.members}
    assert all(f"{n}.weight" in listed for n, m in model.named_modules() if m in convs and m.out_channels != 10)


def test_the_heads_of_multihead_attention_are_left_out_and_said_why() -> None:
    # nn.MultiheadAttention needs its inner width to be its embed_dim: no head of it can go
    model, x = model_and_input("vit")
    with pytest.warns(fp.UnitsLeftOutWarning, match=r"'encoder.layers.encoder_layer_0.self_attention' \(heads\): "
                      r"removing one changes what the model computes \(AssertionError: embed_dim 32 not divisible"):  # fmt: skip
        s = fp.structure(model, x)
    assert {g.kind for g in s.values()} == {"channels", "layers"}  # its pre-norm encoder blocks can go
