"""Model surgery side by side: funcprune's analysis + shrink beside Torch-Pruning 1.6.1 on torchvision models.

Each model (random weights, seeded, eval mode, one 1x3x224x224 input; ViT-B/16
cut to 4 layers) loses 30% of the output channels of every prunable layer,
each layer ranked by the L2 norm of its channels, the classifier kept, by:

- **funcprune**: ``fp.structure(model, x)``, then
  ``fp.structured(s, fp.LnStructured(0.3, n=2), kinds="channels",
  scope="group")`` (each group of channels ranked alone), then
  ``fp.shrink(model, masks, x, structure=s)`` (the analysis taken back);
  the shrunk model is checked against the masked model by ``shrink`` itself;
- **Torch-Pruning**: ``tp.pruner.MetaPruner(model, x,
  tp.importance.MagnitudeImportance(p=2), pruning_ratio=0.3,
  ignored_layers=[classifier], global_pruning=False)`` and ``step()`` (its
  dependency graph built in the constructor), on a fresh copy.

Interleaved (funcprune, Torch-Pruning, funcprune, ...) after one warm-up
each, ``--repeats`` times per model, at ``--threads`` torch threads; reports
the median and minimum of each, the median of the per-repetition ratios
funcprune / Torch-Pruning, and each result's parameters and MACs
(``tp.utils.count_ops_and_params``, both models) against the dense
model's. Run::

    python benchmarks/surgery.py [--threads 1] [--repeats 3] [--models resnet18,...]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch

sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))

import funcprune as fp  # noqa: E402

MODELS = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny",
          "vit_b_16", "densenet121", "regnet_y_400mf"]  # fmt: skip
RATIO = 0.3


def build(name: str) -> Any:
    import torchvision  # type: ignore[import-untyped]

    torch.manual_seed(0)
    if name == "vit_b_16":
        model: Any = torchvision.models.VisionTransformer(image_size=224, patch_size=16, num_layers=4, num_heads=12,
                                                          hidden_dim=768, mlp_dim=3072)  # fmt: skip
    else:
        model = getattr(torchvision.models, name)()
    return model.eval()


def classifier(model: Any) -> torch.nn.Module:
    """The last Linear: the layer both tools keep."""
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]


def ours(model: Any, x: torch.Tensor) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = fp.structure(model, x)
        masks = fp.structured(s, fp.LnStructured(RATIO, n=2), kinds="channels", scope="group")(
            dict(model.named_parameters()))  # fmt: skip
        return fp.shrink(model, masks, x, structure=s)


def theirs(model: Any, x: torch.Tensor) -> Any:
    import torch_pruning as tp  # type: ignore[import-untyped]

    model = copy.deepcopy(model)  # Torch-Pruning prunes in place; funcprune returns a copy (both pay one)
    heads = {m: m.num_heads for m in model.modules() if isinstance(m, torch.nn.MultiheadAttention)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pruner = tp.pruner.MetaPruner(model, x, tp.importance.MagnitudeImportance(p=2), pruning_ratio=RATIO,
                                      ignored_layers=[classifier(model)], global_pruning=False,
                                      num_heads=heads)  # fmt: skip
        pruner.step()
    return model


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import torch_pruning as tp

    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.repeats} repetitions, ratio {RATIO}")
    print("| model | funcprune median (min) | Torch-Pruning median (min) | funcprune / TP, median (min) | "
          "params: dense, funcprune, TP | MACs: dense, funcprune, TP |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        model = build(name)
        x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
        dense_macs, dense_params = tp.utils.count_ops_and_params(model, x)
        a_times: list[float] = []
        b_times: list[float] = []
        small_a = small_b = None
        error = ""
        for r in range(args.repeats + 1):  # the first: a warm-up
            ta, small_a = timed(lambda: ours(model, x))
            try:
                tb, small_b = timed(lambda: theirs(model, x))
            except Exception as e:  # noqa: BLE001 (reported in the table)
                error, tb, small_b = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}", float("nan"), None
            if r:
                a_times.append(ta)
                b_times.append(tb)
        macs_a, params_a = tp.utils.count_ops_and_params(small_a, x)
        ratios = [a / b for a, b in zip(a_times, b_times, strict=True)]
        if small_b is not None:
            macs_b, params_b = tp.utils.count_ops_and_params(small_b, x)
            tp_cell = f"{statistics.median(b_times):.2f} s ({min(b_times):.2f})"
            ratio_cell = f"{statistics.median(ratios):.2f} ({min(ratios):.2f})"
            b_params, b_macs = f"{params_b / 1e6:.2f}M", f"{macs_b / 1e9:.2f}G"
        else:
            tp_cell, ratio_cell, b_params, b_macs = f"failed: {error}", "-", "-", "-"
        print(f"| {name} | {statistics.median(a_times):.2f} s ({min(a_times):.2f}) | {tp_cell} | {ratio_cell} | "
              f"{dense_params / 1e6:.2f}M, {params_a / 1e6:.2f}M, {b_params} | "
              f"{dense_macs / 1e9:.2f}G, {macs_a / 1e9:.2f}G, {b_macs} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
