"""Lightning's ``ModelPruning`` on ``funcprune.compat`` vs on ``torch.nn.utils.prune``, interleaved.

Run from the repository root (needs ``pip install -c constraints.txt lightning``)::

    python benchmarks/lightning_pruning.py               # 1 thread, then the default count
    python benchmarks/lightning_pruning.py --threads 1   # one setting only
    python benchmarks/lightning_pruning.py --quick       # 2 repetitions, for a smoke run

(``PYTHONPATH=.`` in front times this working tree's funcprune rather than an
installed copy; the first line says which.)

Two comparisons, each alternating compat and torch (A, B, A, B, ...) after an
untimed warm-up round (``_timing.interleaved``), in one process where Lightning
is imported (its heap is what compat's look-ups would scan):

* a fit: ``Trainer.fit`` of an MLP of ``--layers`` ``Linear(64, 64)`` layers
  with an SGD optimizer (momentum, so it holds every parameter), ``--epochs``
  epochs of 8 batches, ``ModelPruning("l1_unstructured", amount=0.2)`` local
  (one ``l1_unstructured`` call per tensor per epoch) and global (one
  ``global_unstructured`` over all of them, Lightning's default); lottery
  tickets and ``make_pruning_permanent`` at their defaults. Building the model
  and the ``Trainer`` is untimed. The two runs are seeded alike: their final
  parameters must be identical (the "checked" column).
* a call: ``--layers`` ``nn.Linear(256, 256)`` layers (then ``Linear(64,
  64)``, the fit's size), an SGD optimizer over them alive, each pruned with
  one ``l1_unstructured(layer, "weight", 0.5)`` call; the time per call (fresh
  layers and optimizer, untimed, before each block); the masks must be
  identical.

The swap is the one ``tests/compat/test_lightning.py`` describes: the three
names that Lightning's ``pruning.py`` binds from the prune module at import
are set to compat's or torch's before each contender runs.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import logging
import os
import platform
import sys
import types
import warnings
from typing import Any

import lightning.pytorch as pl
import lightning.pytorch.callbacks.pruning as lp
import torch
import torch.nn.utils.prune as tprune
from _timing import HEADER, Contender, Row, interleaved
from lightning.pytorch.callbacks import ModelPruning
from torch import nn

import funcprune as fp
import funcprune.compat as cprune

LIBS: dict[str, types.ModuleType] = {"compat": cprune, "torch": tprune}
_FUNCTIONS = tuple(lp._PYTORCH_PRUNING_FUNCTIONS)
_METHODS = {key: method.__name__ for key, method in lp._PYTORCH_PRUNING_METHOD.items()}


def use(lib: types.ModuleType) -> None:
    """Lightning's pruning callback on ``lib`` from now on (the names its import bound)."""
    setattr(lp, "pytorch_prune", lib)
    setattr(lp, "_PYTORCH_PRUNING_FUNCTIONS", {name: getattr(lib, name) for name in _FUNCTIONS})
    setattr(lp, "_PYTORCH_PRUNING_METHOD", {key: getattr(lib, name) for key, name in _METHODS.items()})


class MLP(pl.LightningModule):
    """``layers`` Linear(64, 64) layers with ReLUs; SGD with momentum; 8 batches of 32 an epoch."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        for _ in range(layers):
            blocks += [nn.Linear(64, 64), nn.ReLU()]
        self.net = nn.Sequential(*blocks)
        g = torch.Generator().manual_seed(1)
        self.data = torch.utils.data.TensorDataset(torch.randn(256, 64, generator=g), torch.randn(256, 64, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        x, y = args[0]
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    def train_dataloader(self) -> torch.utils.data.DataLoader[tuple[torch.Tensor, ...]]:
        return torch.utils.data.DataLoader(self.data, batch_size=32)


def fit_contender(lib: types.ModuleType, layers: int, epochs: int, pruning: dict[str, Any],
                  results: dict[str, dict[str, torch.Tensor]], name: str) -> Contender:  # fmt: skip
    """A fit on ``lib``; the model and the Trainer are built untimed, seeded alike for both."""
    state: dict[str, Any] = {}

    def setup() -> None:
        use(lib)
        torch.manual_seed(0)
        state["model"] = MLP(layers)
        state["trainer"] = pl.Trainer(
            accelerator="cpu", devices=1, max_epochs=epochs, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, callbacks=[ModelPruning(**pruning)],
        )  # fmt: skip
        torch.manual_seed(1)

    def run() -> None:
        use(lib)
        state["trainer"].fit(state["model"])
        results[name] = {n: p.detach().clone() for n, p in state["model"].named_parameters()}

    return Contender(run, setup)


def same(results: dict[str, dict[str, torch.Tensor]]) -> str:
    ours, theirs = results["compat"], results["torch"]
    equal = list(ours) == list(theirs) and all(torch.equal(ours[n], theirs[n]) for n in ours)
    return "identical" if equal else "DIFFERENT"


def fits(layers: int, epochs: int, repeats: int) -> list[Row]:
    rows = []
    for mode, global_ in (("local", False), ("global", True)):
        pruning = dict(pruning_fn="l1_unstructured", amount=0.2, use_global_unstructured=global_)
        results: dict[str, dict[str, torch.Tensor]] = {}
        contenders = {name: fit_contender(lib, layers, epochs, pruning, results, name) for name, lib in LIBS.items()}
        times = interleaved(contenders, repeats)
        case = f"ModelPruning fit, {layers} Linear, {epochs} epochs, {mode} L1"
        rows.append(Row(case, "compat", "torch", times, None, masks=f"parameters {same(results)}"))
    return rows


def calls(layers: int, width: int, repeats: int) -> Row:
    """One ``l1_unstructured`` call per layer, an optimizer holding the parameters: time per call."""
    held: dict[str, tuple[nn.ModuleList, torch.optim.Optimizer]] = {}

    def contender(name: str, lib: types.ModuleType) -> Contender:
        def setup() -> None:
            torch.manual_seed(0)
            model = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
            held[name] = (model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))

        def run() -> None:
            for layer in held[name][0]:
                lib.l1_unstructured(layer, "weight", amount=0.5)

        return Contender(run, setup)

    times = interleaved({name: contender(name, lib) for name, lib in LIBS.items()}, repeats)
    per_call = {name: [t / layers for t in ts] for name, ts in times.items()}
    masks = [[layer.weight_mask for layer in held[name][0]] for name in ("compat", "torch")]
    equal = all(torch.equal(a, b) for a, b in zip(*masks, strict=True))
    case = f"l1_unstructured per call, {layers} Linear({width}, {width}), SGD alive"
    return Row(case, "compat", "torch", per_call, None, masks="masks identical" if equal else "masks DIFFERENT")


def quiet() -> None:
    """Lightning's per-fit notices and its warnings about this setting (no workers, no logger)."""
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="The 'train_dataloader' does not have many workers")
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 repetitions per comparison (else 5)")
    parser.add_argument("--threads", default=f"1,{torch.get_num_threads()}", help="comma-separated thread counts")
    parser.add_argument("--layers", type=int, default=100, help="Linear layers of the models (100)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of each fit (3)")
    args = parser.parse_args()
    repeats = 2 if args.quick else 5
    quiet()
    print(f"{datetime.date.today()}: funcprune {fp.__version__} ({os.path.dirname(fp.__file__)}) compat vs "
          f"torch.nn.utils.prune under Lightning {importlib.metadata.version('lightning')}'s ModelPruning, torch {torch.__version__}")  # fmt: skip
    print(f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"{repeats} interleaved repetitions after a warm-up; ratio = compat / torch (< 1: compat faster)\n")
    print(HEADER)
    failed = False
    for threads in sorted({int(t) for t in args.threads.split(",")}):
        torch.set_num_threads(threads)
        rows = [calls(args.layers, 256, repeats), calls(args.layers, 64, repeats), *fits(args.layers, args.epochs, repeats)]
        for row in rows:
            print(row.line(threads), flush=True)
            failed |= "DIFFERENT" in row.masks
    if failed:
        print("compat and torch disagree (see the checked column)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
