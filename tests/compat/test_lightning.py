"""Lightning's ``ModelPruning`` callback on ``funcprune.compat``, against the same run on torch.

Every test fits a tiny ``LightningModule`` for a few epochs twice in this
process, seeded alike (``torch.manual_seed`` before the model is built and
before ``fit``): once with ``ModelPruning`` on ``torch.nn.utils.prune``, once
on ``funcprune.compat``; parameters, ``*_mask`` buffers, hooks, the pruned
attributes, ``is_pruned`` and a forward output must be equal
(:func:`assert_same_state`, ``torch.equal``). Random methods and
``resample_parameters`` draw from torch's global generator: compat draws
exactly what torch draws, so the runs stay identical. The whole module is
skipped without Lightning (the ``lightning`` extra); its fits run on one
thread (tiny models; :func:`one_thread`).

How the swap works (:func:`installed`)
--------------------------------------
``lightning/pytorch/callbacks/pruning.py`` runs ``import torch.nn.utils.prune
as pytorch_prune`` when it is imported, and builds two dicts from that module
at the same time: ``_PYTORCH_PRUNING_FUNCTIONS`` (name -> function: what local
pruning calls) and ``_PYTORCH_PRUNING_METHOD`` (name -> class: what global
pruning hands to ``global_unstructured``). Everything else goes through the
global name ``pytorch_prune``, looked up at each call: ``global_unstructured``,
and ``BasePruningMethod`` (is ``pruning_fn`` a method class; which forward
pre-hooks ``make_pruning_permanent`` removes). :func:`installed` sets exactly
these three globals (undone on exit) to what that import would have bound had
``funcprune.compat`` been ``torch.nn.utils.prune``: the module, and the two
dicts rebuilt from it under the same names. So a run inside it is the run of
a process where compat was installed before Lightning was imported.
:func:`test_the_swap_rebinds_every_name` scans the callback module's globals
(and ``ModelPruning``'s attributes and defaults) for anything still bound to
torch's module, so that a binding added by a later Lightning fails there
instead of silently running torch. The callback resolves a ``pruning_fn``
given by name in ``__init__``: it is built inside the swap, and fitted there.

:func:`test_installed_before_lightning_is_imported` does the real thing, in a
subprocess (in the background from the end of collection,
``tests/_background.py``): compat put in place of ``torch.nn.utils.prune``,
then Lightning imported, then a fit of this module's :class:`Net`, whose
masks and weights equal the same fit under :func:`installed`. Replacing
``sys.modules["torch.nn.utils.prune"]`` alone is not enough once torch's module
has been imported (``funcprune.compat`` imports it, to subclass its classes):
``import a.b.c as d`` reads the attribute ``c`` of the package ``a.b`` first,
and falls back to ``sys.modules`` only when it is missing; so the install also
sets the attribute ``torch.nn.utils.prune``.

Documented differences, where the two runs are not compared value for value:

* a tied weight (``head.weight = embedding.weight``) pruned globally: compat
  ranks the shared Parameter once and gives every holder the same mask;
  torch ranks it once per holder and may give the holders different masks.
  :func:`test_tied_language_model_global_pruning` checks compat against an
  independent computation of the global L1 ranking over the distinct
  Parameters, and only that torch's run runs.
* the order of a module's forward pre-hooks after re-pruning (compat keeps a
  hook's place, torch moves it to the end): hooks are compared by name.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypedDict

import pytest
import torch

pytest.importorskip("lightning")

import lightning.pytorch as pl
import lightning.pytorch.callbacks.pruning as lp
import torch.nn.functional as F
import torch.nn.utils.prune as tp
from _background import Job
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, ModelPruning
from torch import nn

import funcprune.compat as cp

from ._helpers import assert_same_state

Tensor = torch.Tensor
ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

#: Lightning's own warnings about the tiny runs here (pyproject turns warnings into errors).
pytestmark = [
    # one process, no DataLoader workers: on purpose
    pytest.mark.filterwarnings("ignore:The '(train|val)_dataloader' does not have many workers:UserWarning"),
    # torch 2.13 deprecates the LeafSpec that Lightning's _pytree still builds
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning"),
]

#: The names ``pruning.py`` binds from torch's module when it is imported.
BOUND = ("pytorch_prune", "_PYTORCH_PRUNING_FUNCTIONS", "_PYTORCH_PRUNING_METHOD")
#: ``_PYTORCH_PRUNING_FUNCTIONS`` and ``_PYTORCH_PRUNING_METHOD`` as Lightning built them.
FUNCTION_NAMES = tuple(lp._PYTORCH_PRUNING_FUNCTIONS)
METHOD_NAMES = {key: method.__name__ for key, method in lp._PYTORCH_PRUNING_METHOD.items()}


# ----------------------------------------------------------------------------- the swap


@contextlib.contextmanager
def installed(lib: types.ModuleType) -> Iterator[None]:
    """Lightning's pruning callback on ``lib``, as if ``lib`` had been
    ``torch.nn.utils.prune`` when Lightning imported it (module docstring)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lp, "pytorch_prune", lib)
        patch.setattr(lp, "_PYTORCH_PRUNING_FUNCTIONS", {name: getattr(lib, name) for name in FUNCTION_NAMES})
        patch.setattr(
            lp, "_PYTORCH_PRUNING_METHOD", {key: getattr(lib, name) for key, name in METHOD_NAMES.items()}
        )
        yield


def from_torch(value: object) -> bool:
    """Whether ``value`` is torch's pruning module or one of its functions or classes."""
    if isinstance(value, types.ModuleType):
        return value.__name__ == "torch.nn.utils.prune"
    return getattr(value, "__module__", None) == "torch.nn.utils.prune"


def torch_bindings(module: types.ModuleType) -> set[str]:
    """The globals of ``module`` (and attributes of its ``ModelPruning``) bound to torch's pruning."""
    found: set[str] = set()
    for name, value in vars(module).items():
        inner = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
        if from_torch(value) or any(from_torch(item) for item in inner):
            found.add(name)
    for name, value in vars(module.ModelPruning).items():
        function = getattr(value, "__func__", value)
        defaults = [*(getattr(function, "__defaults__", None) or ())]
        defaults += (getattr(function, "__kwdefaults__", None) or {}).values()
        if from_torch(value) or any(from_torch(item) for item in defaults):
            found.add(f"ModelPruning.{name}")
    return found


def test_the_swap_rebinds_every_name() -> None:
    """The swap covers every name the callback module binds to torch's pruning, and is undone."""
    original = {name: getattr(lp, name) for name in BOUND}
    assert torch_bindings(lp) == set(BOUND)  # a new binding in Lightning: patch it in installed()
    with installed(cp):
        assert torch_bindings(lp) == set()
        assert vars(lp)["pytorch_prune"] is cp
        assert all(fn.__module__.startswith("funcprune.compat") for fn in lp._PYTORCH_PRUNING_FUNCTIONS.values())
        assert all(issubclass(m, cp.BasePruningMethod) for m in lp._PYTORCH_PRUNING_METHOD.values())
    with installed(tp):  # the torch run: the very objects the import bound
        assert {name: getattr(lp, name) for name in BOUND} == original
    assert all(getattr(lp, name) is original[name] for name in BOUND)


# ----------------------------------------------------------------------------- models and runs


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread: the models are tiny (a pool of two costs tenfold on a busy machine),
    and the subprocess fits on one thread too."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def loader(*tensors: Tensor) -> torch.utils.data.DataLoader[tuple[Tensor, ...]]:
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*tensors), batch_size=8)


class Net(pl.LightningModule):
    """conv -> relu -> linear: 4-D and 2-D weights and biases; 3 batches an epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.fc = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc(F.relu(self.conv(x)).flatten(1))
        return out

    def training_step(self, *args: Any, **kwargs: Any) -> Tensor:
        x, y = args[0]
        return F.mse_loss(self(x), y)

    def validation_step(self, *args: Any, **kwargs: Any) -> None:
        x, y = args[0]
        F.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def train_dataloader(self) -> torch.utils.data.DataLoader[tuple[Tensor, ...]]:
        g = torch.Generator().manual_seed(1)
        return loader(torch.randn(24, 2, 4, 4, generator=g), torch.randn(24, 3, generator=g))

    def val_dataloader(self) -> torch.utils.data.DataLoader[tuple[Tensor, ...]]:
        g = torch.Generator().manual_seed(2)
        return loader(torch.randn(16, 2, 4, 4, generator=g), torch.randn(16, 3, generator=g))


VOCAB, DIM = 13, 6


class TiedLM(pl.LightningModule):
    """embedding -> linear -> head, with ``head.weight = embedding.weight`` (one Parameter)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, DIM)
        self.linear = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, tokens: Tensor) -> Tensor:
        out: Tensor = self.head(torch.tanh(self.linear(self.embedding(tokens))))
        return out

    def training_step(self, *args: Any, **kwargs: Any) -> Tensor:
        tokens, targets = args[0]
        return F.cross_entropy(self(tokens).flatten(0, 1), targets.flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)

    def train_dataloader(self) -> torch.utils.data.DataLoader[tuple[Tensor, ...]]:
        tokens = torch.randint(0, VOCAB, (24, 6), generator=torch.Generator().manual_seed(3))
        return loader(tokens, tokens.roll(-1, dims=1))


#: A fixed input of :class:`Net`, to compare outputs.
INPUT = torch.randn(5, 2, 4, 4, generator=torch.Generator().manual_seed(4))


def trainer(epochs: int = 3, callbacks: Sequence[Callback] = (), **kwargs: Any) -> pl.Trainer:
    options: dict[str, Any] = dict(
        accelerator="cpu", devices=1, max_epochs=epochs, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
    )  # fmt: skip
    options.update(kwargs)
    return pl.Trainer(callbacks=list(callbacks), **options)


def fit(
    lib: types.ModuleType | None,
    *,
    pruning: dict[str, Any],
    epochs: int = 3,
    after: Sequence[Callback] = (),
    ckpt_path: Path | None = None,
    **trainer_kwargs: Any,
) -> Any:
    """A :class:`Net` fitted with ``ModelPruning(**pruning)`` on ``lib`` (``None``: whatever Lightning imported).

    ``pruning["pruning_fn"]`` may be a function of the library (a method class of it).
    """
    with installed(lib) if lib is not None else contextlib.nullcontext():
        options = dict(pruning)
        if callable(options["pruning_fn"]):
            options["pruning_fn"] = options["pruning_fn"](vars(lp)["pytorch_prune"])
        torch.manual_seed(0)
        model = Net()
        callbacks = [ModelPruning(**options), *after]
        torch.manual_seed(1)
        trainer(epochs, callbacks, **trainer_kwargs).fit(model, ckpt_path=ckpt_path)
    return model


class Observed(TypedDict):
    """What a run leaves to compare, as plain data (the subprocess saves it)."""

    parameters: dict[str, Tensor]
    masks: dict[str, Tensor]
    pruned: bool
    hooks: dict[str, str]  # "fc.weight": "PruningContainer"
    output: Tensor


def observe(model: Net, lib: types.ModuleType) -> Observed:
    hooks = {
        f"{prefix}.{hook._tensor_name}".lstrip("."): type(hook).__name__
        for prefix, sub in model.named_modules()
        for hook in sub._forward_pre_hooks.values()
        if isinstance(hook, tp.BasePruningMethod)
    }
    with torch.no_grad():
        output = model(INPUT)
    return Observed(
        parameters={name: p.detach().clone() for name, p in model.named_parameters()},
        masks={name: b.clone() for name, b in model.named_buffers() if name.endswith("_mask")},
        pruned=lib.is_pruned(model),
        hooks=hooks,
        output=output,
    )


def assert_same_observed(ours: Observed, theirs: Observed) -> None:
    for field in ("parameters", "masks"):
        a, b = ours[field], theirs[field]
        assert list(a) == list(b), field
        for name in a:
            assert torch.equal(a[name], b[name]), (field, name)
    assert ours["pruned"] == theirs["pruned"]
    assert ours["hooks"] == theirs["hooks"]
    assert torch.equal(ours["output"], theirs["output"])


def sparsity(observed: Observed) -> float:
    """The fraction of zeros among the masks (if pruned) or the parameters (if made permanent)."""
    tensors = list(observed["masks"].values()) or list(observed["parameters"].values())
    return sum(int((t == 0).sum()) for t in tensors) / sum(t.numel() for t in tensors)


def pruning_hooks(model: nn.Module) -> list[tp.BasePruningMethod]:
    return [hook for m in model.modules() for hook in m._forward_pre_hooks.values() if isinstance(hook, tp.BasePruningMethod)]


def compare(**kwargs: Any) -> tuple[Any, Observed]:
    """Fit on torch, then on compat; everything observable must be equal. Returns compat's model and observation."""
    theirs = fit(tp, **kwargs)
    ours = fit(cp, **kwargs)
    assert all(isinstance(hook, cp.BasePruningMethod) for hook in pruning_hooks(ours))  # each ran on its library
    assert not any(isinstance(hook, cp.BasePruningMethod) for hook in pruning_hooks(theirs))
    assert_same_state(theirs, ours)
    observed = observe(ours, cp)
    assert_same_observed(observed, observe(theirs, tp))
    assert sparsity(observed) > 0  # the comparison is not vacuous
    return ours, observed


# ----------------------------------------------------------------------------- the methods


#: Every method Lightning accepts by name, local (per tensor) and global.
METHODS: dict[str, dict[str, Any]] = {
    # an int, a float, then no pruning (amount 0 skips the epoch)
    "local-l1_unstructured": dict(pruning_fn="l1_unstructured", use_global_unstructured=False, amount=lambda epoch: (3, 0.3, 0)[epoch]),
    "local-random_unstructured": dict(pruning_fn="random_unstructured", use_global_unstructured=False, amount=0.3),
    "local-ln_structured": dict(pruning_fn="ln_structured", use_global_unstructured=False, amount=0.3, pruning_dim=0, pruning_norm=2, parameter_names=["weight"]),
    "local-random_structured": dict(pruning_fn="random_structured", use_global_unstructured=False, amount=0.3, pruning_dim=1, parameter_names=["weight"]),
    "global-l1_unstructured": dict(pruning_fn="l1_unstructured", amount=0.4),
    "global-random_unstructured": dict(pruning_fn="random_unstructured", amount=0.4),
    # a method class instead of a name (compat's own class on the compat run)
    "global-L1Unstructured-class": dict(pruning_fn=lambda lib: lib.L1Unstructured, amount=0.4),
}  # fmt: skip


@pytest.mark.parametrize("case", list(METHODS))
def test_builtin_methods_match_torch(case: str) -> None:
    """Every built-in method, local and global, over 3 epochs of re-pruning (masks kept)."""
    _, observed = compare(pruning=dict(METHODS[case], make_pruning_permanent=False, use_lottery_ticket_hypothesis=False))
    assert observed["pruned"]
    assert set(observed["hooks"].values()) == {"PruningContainer"}  # every tensor pruned more than once


@pytest.mark.parametrize("lib", [tp, cp], ids=["torch", "compat"])
@pytest.mark.parametrize("method", ["ln_structured", "random_structured"])
def test_global_mode_refuses_structured_methods(lib: types.ModuleType, method: str) -> None:
    """Global pruning (the default) takes unstructured methods only, on both."""
    with installed(lib), pytest.raises(MisconfigurationException, match='Only the "unstructured" PRUNING_TYPE'):
        ModelPruning(method, pruning_dim=0, pruning_norm=2)


# ----------------------------------------------------------------------------- lottery tickets, permanence


LOTTERY: dict[str, dict[str, Any]] = {
    "global-l1": dict(pruning_fn="l1_unstructured", amount=0.5),
    "local-l1-resampled": dict(pruning_fn="l1_unstructured", use_global_unstructured=False, amount=0.5, resample_parameters=True),
    # random masks and resampled parameters: both draw from torch's generator
    "global-random-resampled": dict(pruning_fn="random_unstructured", amount=0.5, resample_parameters=True, verbose=2),
    "local-ln-every-other-epoch": dict(pruning_fn="ln_structured", use_global_unstructured=False, amount=0.5, pruning_dim=0, pruning_norm=1, parameter_names=["weight"], use_lottery_ticket_hypothesis=lambda epoch: epoch % 2 == 0),
}  # fmt: skip


class Originals(Callback):
    """The ``*_orig`` parameters at each epoch's end (placed after ``ModelPruning``), one list per fit."""

    def __init__(self) -> None:
        self.fits: list[list[dict[str, Tensor]]] = []

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.fits.append([])

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        params = pl_module.named_parameters()
        self.fits[-1].append({name: p.detach().clone() for name, p in params if name.endswith("_orig")})


@pytest.mark.parametrize("case", list(LOTTERY))
def test_lottery_ticket_resets_match_torch(case: str) -> None:
    """After a pruning the pruned tensors go back to their initial (or resampled) values.

    Only the first reset restores the initial values: Lightning's ``_copy_param``
    does ``weight_orig.data = saved.data``, so training then updates the saved
    copy in place and later resets are no-ops (Lightning 2.6, torch and compat
    alike).
    """
    pruning = dict(use_lottery_ticket_hypothesis=True, make_pruning_permanent=False) | LOTTERY[case]
    originals = Originals()
    compare(pruning=pruning, after=[originals])
    assert len(originals.fits) == 2  # torch's fit, then compat's
    if not pruning.get("resample_parameters"):
        torch.manual_seed(0)
        start = dict(Net().named_parameters())
        for epochs in originals.fits:
            assert epochs[0]  # the first epoch pruned, and reset
            for name, value in epochs[0].items():
                assert torch.equal(value, start[name.removesuffix("_orig")]), name


@pytest.mark.parametrize(
    ("permanent", "on_train_epoch_end"), [(True, True), (True, False), (False, False)],
    ids=["permanent", "permanent-on-validation", "kept-on-validation"],
)  # fmt: skip
def test_make_pruning_permanent_matches_torch(permanent: bool, on_train_epoch_end: bool) -> None:
    """``make_pruning_permanent`` removes the hooks at the end of training (``prune.remove`` per hook);
    pruning runs at the end of the training or of the validation epoch."""
    pruning = dict(pruning_fn="l1_unstructured", amount=0.5, make_pruning_permanent=permanent,
                   prune_on_train_epoch_end=on_train_epoch_end)  # fmt: skip
    _, observed = compare(pruning=pruning, limit_val_batches=None)
    if permanent:  # plain parameters again, with the pruned entries zero
        assert not observed["pruned"] and not observed["masks"]
        assert set(observed["parameters"]) == {"conv.weight", "conv.bias", "fc.weight", "fc.bias"}
    else:
        assert observed["pruned"] and set(observed["masks"]) == {f"{n}_mask" for n in ("conv.weight", "conv.bias", "fc.weight", "fc.bias")}


# ----------------------------------------------------------------------------- checkpoints


def checkpoints(lib: types.ModuleType, directory: Path, permanent: bool) -> dict[str, dict[str, Tensor]]:
    """The state dicts ``ModelCheckpoint`` saved after each epoch's pruning, by file name."""
    fit(lib, pruning=dict(pruning_fn="l1_unstructured", amount=0.5, make_pruning_permanent=permanent),
        after=[ModelCheckpoint(dirpath=directory, filename="{epoch}", save_top_k=-1)],
        enable_checkpointing=True, default_root_dir=directory)  # fmt: skip
    saved = {path.name: torch.load(path, weights_only=True) for path in sorted(directory.glob("*.ckpt"))}
    return {name: checkpoint["state_dict"] for name, checkpoint in saved.items()}


def assert_same_state_dicts(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
    assert list(a) == list(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


# resuming saves its checkpoints beside the one it resumes from, as a user would
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty:UserWarning")
@pytest.mark.parametrize("permanent", [True, False], ids=["permanent", "kept"])
def test_checkpoints_save_and_reload_alike(tmp_path: Path, permanent: bool) -> None:
    """Checkpoints saved mid-training (Lightning makes the pruning permanent in the saved state dict
    when ``make_pruning_permanent``), loaded with ``load_from_checkpoint`` and resumed with ``ckpt_path``."""
    theirs = checkpoints(tp, tmp_path / "torch", permanent)
    ours = checkpoints(cp, tmp_path / "compat", permanent)
    assert list(ours) == ["epoch=0.ckpt", "epoch=1.ckpt", "epoch=2.ckpt"] == list(theirs)
    for name in ours:
        assert_same_state_dicts(ours[name], theirs[name])
        assert any(key.endswith("_mask") for key in ours[name]) is not permanent
    if not permanent:
        return
    # the saved weights are the pruned ones: load them, and resume training from them
    loaded = {lib: Net.load_from_checkpoint(tmp_path / lib / "epoch=1.ckpt") for lib in ("torch", "compat")}
    assert_same_state_dicts(loaded["compat"].state_dict(), loaded["torch"].state_dict())
    assert (loaded["compat"].fc.weight == 0).any()
    resumed = [
        fit(lib, pruning=dict(pruning_fn="l1_unstructured", amount=0.5, make_pruning_permanent=False), epochs=5,
            ckpt_path=tmp_path / name / "epoch=1.ckpt", enable_checkpointing=True,
            after=[ModelCheckpoint(dirpath=tmp_path / name, filename="{epoch}", save_top_k=-1)])
        for lib, name in ((tp, "torch"), (cp, "compat"))
    ]  # fmt: skip
    assert_same_state(*resumed)
    assert_same_observed(observe(resumed[1], cp), observe(resumed[0], tp))
    saved = {name: sorted(path.name for path in (tmp_path / name).glob("*.ckpt")) for name in ("torch", "compat")}
    assert saved["compat"] == saved["torch"] and "epoch=4.ckpt" in saved["compat"]  # epoch=2-v1.ckpt: resumed
    for file in saved["compat"]:
        assert_same_state_dicts(torch.load(tmp_path / "compat" / file, weights_only=True)["state_dict"],
                                torch.load(tmp_path / "torch" / file, weights_only=True)["state_dict"])  # fmt: skip


# ----------------------------------------------------------------------------- tied weights


class Snapshot(Callback):
    """At each epoch's end, per pair of ``pruning``: the Parameter, and the pruned tensor and mask
    that ``ModelPruning`` is about to read (placed before it) or has just written (placed after it)."""

    def __init__(self, pruning: ModelPruning) -> None:
        self.pruning = pruning
        self.epochs: list[list[tuple[nn.Parameter, Tensor, Tensor]]] = []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        rows = []
        for module, name in self.pruning._parameters_to_prune:
            param = module._parameters.get(name + "_orig", module._parameters.get(name))
            assert isinstance(param, nn.Parameter)
            tensor = getattr(module, name).detach().clone()
            rows.append((param, tensor, getattr(module, name + "_mask", torch.ones_like(tensor)).clone()))
        self.epochs.append(rows)


Rows = list[tuple[nn.Parameter, Tensor, Tensor]]


def global_l1_over_distinct_parameters(rows: Rows, amount: float) -> list[Tensor]:
    """Each pair's new mask: global L1 over the unpruned entries of the *distinct* Parameters
    (each counted once), computed here with ``torch.topk``."""
    first: dict[int, int] = {}
    for i, (param, _, _) in enumerate(rows):
        first.setdefault(id(param), i)
    for param, tensor, mask in rows:  # the holders of one Parameter agree before pruning
        _, tensor0, mask0 = rows[first[id(param)]]
        assert torch.equal(tensor, tensor0) and torch.equal(mask, mask0)
    distinct = list(first.values())
    scores = torch.cat([rows[i][1].reshape(-1) for i in distinct]).abs()
    mask = torch.cat([rows[i][2].reshape(-1) for i in distinct])
    unpruned = (mask == 1).nonzero().squeeze(1)
    k = round(amount * unpruned.numel())
    ranked = torch.sort(scores[unpruned]).values
    assert 0 < k < unpruned.numel() and ranked[k - 1] < ranked[k]  # no tie at the cut: one answer
    new = mask.clone()
    new[unpruned[torch.topk(scores[unpruned], k, largest=False).indices]] = 0
    slices = dict(zip(distinct, torch.split(new, [rows[i][1].numel() for i in distinct])))
    return [slices[first[id(param)]].view_as(tensor) for param, tensor, _ in rows]


def tied_fit(lib: types.ModuleType, amount: float) -> tuple[Any, Snapshot, Snapshot]:
    """Default ``ModelPruning`` (global L1, lottery tickets, made permanent) on :class:`TiedLM`."""
    with installed(lib):
        torch.manual_seed(0)
        model = TiedLM()
        pruning = ModelPruning("l1_unstructured", amount=amount)
        before, after = Snapshot(pruning), Snapshot(pruning)
        torch.manual_seed(1)
        trainer(3, [before, pruning, after]).fit(model)
    return model, before, after


def test_tied_language_model_global_pruning() -> None:
    """Default global L1 on a model whose head is tied to its embedding (``head.weight = embedding.weight``).

    compat counts the shared Parameter once in the global ranking and gives
    every holder the same mask: each epoch's masks equal an independent global
    L1 over the distinct Parameters; the holders stay tied (one ``weight_orig``,
    and one ``weight`` again once the pruning is made permanent). torch ranks
    the shared tensor once per holder and may give the holders different
    masks: its run must only run.
    """
    theirs, _, _ = tied_fit(tp, 0.4)
    assert (theirs.embedding.weight == 0).any() and (theirs.head.weight == 0).any()

    model, before, after = tied_fit(cp, 0.4)
    assert len(before.epochs) == len(after.epochs) == 3
    module_names = {id(module): name for name, module in model.named_modules()}
    names = [f"{module_names[id(m)]}.{n}" for m, n in after.pruning._parameters_to_prune]
    assert names == ["embedding.weight", "linear.weight", "head.weight", "linear.bias"]  # Lightning's order
    for rows_before, rows_after in zip(before.epochs, after.epochs, strict=True):
        expected = global_l1_over_distinct_parameters(rows_before, 0.4)
        for name, (_, _, mask), want in zip(names, rows_after, expected, strict=True):
            assert torch.equal(mask, want), name
        assert rows_after[0][0] is rows_after[2][0]  # embedding and head: still one Parameter (weight_orig)
    assert model.embedding.weight is model.head.weight  # made permanent: one Parameter again
    final = after.epochs[-1][0][2]
    assert torch.equal(model.embedding.weight == 0, final == 0)
    assert not cp.is_pruned(model)


# ----------------------------------------------------------------------------- a real install


#: The fit that the subprocess runs with compat really installed (Lightning's defaults: global L1,
#: lottery tickets), its masks kept to be compared.
INSTALLED = dict(pruning_fn="l1_unstructured", amount=0.5, make_pruning_permanent=False)


def _installed_script(directory: Path) -> list[str]:
    """A script that installs compat as ``torch.nn.utils.prune``, then imports Lightning and fits."""
    script = directory / "installed.py"
    script.write_text(f"""\
import sys

sys.path.insert(0, {str(TESTS)!r})
import _torchvision  # before Lightning imports torchvision
import torch

import funcprune.compat
import torch.nn.utils.prune  # what funcprune.compat subclasses: imported already

assert "lightning" not in sys.modules
sys.modules["torch.nn.utils.prune"] = funcprune.compat
torch.nn.utils.prune = funcprune.compat  # "import a.b.c as d" reads the attribute of a.b first

from compat import test_lightning as t  # imports Lightning now
import lightning.pytorch.callbacks.pruning as lp

assert lp.pytorch_prune is funcprune.compat, lp.pytorch_prune
assert t.torch_bindings(lp) == set(), t.torch_bindings(lp)
torch.set_num_threads(1)
model = t.fit(None, pruning=t.INSTALLED)
hooks = [hook for m in model.modules() for hook in m._forward_pre_hooks.values()]
assert hooks and all(isinstance(hook, funcprune.compat.BasePruningMethod) for hook in hooks), hooks
torch.save(t.observe(model, funcprune.compat), "observed.pt")
print("pruned:", funcprune.compat.is_pruned(model))
""")
    return [sys.executable, str(script)]


#: Importing Lightning takes seconds: the subprocess runs in the background from the end of collection.
INSTALL = Job(
    _installed_script,
    env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
    timeout=300,
)
BACKGROUND = {"installed_run": INSTALL}


@pytest.fixture
def installed_run() -> subprocess.CompletedProcess[str]:
    return INSTALL.result()


def test_installed_before_lightning_is_imported(installed_run: subprocess.CompletedProcess[str]) -> None:
    """compat in place of ``torch.nn.utils.prune`` before Lightning is imported: the callback prunes
    with compat's hooks, and the result equals the in-process swap's (and torch's) run."""
    assert installed_run.returncode == 0, installed_run.stderr
    assert "pruned: True" in installed_run.stdout
    observed = torch.load(INSTALL.directory / "observed.pt", weights_only=True)
    assert observed["pruned"] and sparsity(observed) > 0
    swapped = observe(fit(cp, pruning=INSTALLED), cp)  # on one thread, as the subprocess (one_thread)
    reference = observe(fit(tp, pruning=INSTALLED), tp)
    assert_same_observed(observed, swapped)
    assert_same_observed(observed, reference)
