"""Depth and width pruning of a Llama trained here: whole blocks, and a quarter of the hidden size.

The corpus, its splits, the tokens (UTF-8 bytes), the training and the
calibration and held-out sets are those of ``examples/oneshot_llm.py``
(imported: :func:`oneshot_llm.make_corpus`, :func:`oneshot_llm.train_`...),
with a deeper model: a ``transformers.LlamaForCausalLM`` of 8 decoder
layers (grouped-query attention, the widths of the one-shot example). The
trained weights are saved (``--weights``, a directory under the system's
temporary directory by default) and reused by a later run of the same
configuration unless ``--retrain`` is given; the report says which.

The trained model is then pruned without retraining, and each pruned model's
held-out perplexity is measured (:func:`perplexity`: ``exp`` of the mean
next-token loss over every held-out token, per byte):

- **depth**: 1, 2 and 3 of the 8 blocks dropped, chosen by
  :func:`funcprune.layer_scores` (``"bi"``: ShortGPT's block influence;
  ``"angular"`` with ``n=k``: Gromov et al.'s run of ``k`` contiguous
  blocks of least angular distance; ``"cosine"``: Minitron's depth
  importance), the last ``k`` blocks, and ``k`` blocks drawn at random
  (``fp.RandomStructured`` with a generator seeded by the seed). The masks
  come from the ``"layers"`` unit group of :func:`funcprune.structure`
  (one group, ``model.layers``, one unit per block) through
  :func:`funcprune.structured` with ``unit_scores=``. A masked block is the
  identity (a pre-norm residual block with every parameter zero), so the
  model runs through :func:`funcprune.functional_call_masked`; the ``"bi"``
  rows are also removed with :func:`funcprune.shrink`, saved with
  ``save_pretrained``, reloaded with plain ``LlamaForCausalLM.from_pretrained``
  and measured again.
- **width**: 25% of the hidden size (the residual stream's channels: the
  ``"hidden"`` unit group) removed by activation (:func:`funcprune.hidden_scores`,
  Minitron's), by the L2 norm of each channel's weights, and at random,
  measured masked; the activation row is also shrunk and reloaded. These
  rows need a ``"hidden"`` group in the structure; without one the report
  says so and gives the depth table alone.

To read the random rows against something: the perplexity with each block
dropped alone (8 rows), and :data:`DRAWS` more random draws of each random
row (from a generator seeded by the seed plus 1), are measured too.

Run it (600 training steps of the 8-layer model: under 6 minutes on 2
shared CPU cores at 1 thread, about 8.5 minutes in all with the pruning;
``--quick``, a tiny 4-layer model trained a few seconds: about 10 seconds)::

    python examples/depth_width_llm.py [--quick] [--steps N] [--seed N] [--threads N] [--weights DIR] [--retrain]

It is also a module (:func:`run`, :func:`report`, :func:`main`):
``tests/test_depth_width_example.py`` imports it.
"""

from __future__ import annotations

import sys
import types

# transformers imports torchvision where it is installed; this machine's torchvision wheel does not load beside
# the CPU torch (docs/development.md): stub the one module that fails, before anything imports it.
sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))

import argparse  # noqa: E402
import hashlib  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass, field, replace  # noqa: E402
from typing import Generic, TypeVar  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

import funcprune as fp  # noqa: E402
import oneshot_llm as ol  # noqa: E402

Tensor = torch.Tensor

#: Blocks dropped, row by row.
DEPTHS = (1, 2, 3)
#: How the dropped blocks are chosen, in the order of the table.
DEPTH_METHODS = ("bi", "angular", "cosine", "last", "random")
#: How the hidden channels removed are chosen, in the order of the table.
WIDTH_METHODS = ("activation", "norm", "random")
#: The fraction of the hidden size removed.
WIDTH = 0.25
#: Random draws beyond the table's, for the spread of a random choice (a generator seeded by the seed plus 1).
DRAWS = 5


def config_of(seed: int = 0, *, quick: bool = False, steps: int | None = None) -> ol.Config:
    """The one-shot example's configuration with 8 decoder layers (``quick``: its tiny one with 4)."""
    config = replace(ol.Config.quick(seed), layers=4) if quick else replace(ol.Config(seed=seed), layers=8)
    return config if steps is None else replace(config, steps=steps)


# --------------------------------------------------------------------------- evaluation


#: Held-out perplexity: the one-shot example's (:func:`funcprune.perplexity` over every held-out token after
#: the first of each window), of a model as it is or run on masked parameters.
perplexity = ol.perplexity


# --------------------------------------------------------------------------- the trained model


#: A transformers model class (the one-shot example's Llama; the experts example's Qwen3-MoE).
M = TypeVar("M", bound=transformers.PreTrainedModel)


@dataclass(frozen=True)
class Trained(Generic[M]):
    """The trained model and how it was obtained.

    Attributes:
        model: the trained model, in eval mode.
        losses: the training loss of every step.
        seconds: the training's wall time (of the run that trained it, if reused).
        path: where its weights are saved (``None``: nowhere).
        reused: whether they were loaded from ``path`` rather than trained by this run.
    """

    model: M
    losses: list[float]
    seconds: float
    path: Path | None
    reused: bool


def weights_path(config: ol.Config, directory: Path, stem: str | None = None) -> Path:
    """Where the weights trained on ``config`` are saved: a name keyed by every field of it and the versions
    (``stem`` first: the model's kind and size, ``llama-LxH`` by default)."""
    key = f"{config!r} torch {torch.__version__} transformers {transformers.__version__}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return directory / f"{stem or f'llama-{config.layers}x{config.hidden}'}-seed{config.seed}-{digest}.pt"


def trained(config: ol.Config, corpus: ol.Corpus, directory: Path | None, *, retrain: bool = False) -> Trained[transformers.LlamaForCausalLM]:
    """The model of ``config`` trained on ``corpus``: loaded from ``directory`` if saved there, else trained
    (and saved there)."""
    model = ol.make_model(config)
    return saved_or_trained(model, lambda: ol.train_(model, corpus.train, config),
                            None if directory is None else weights_path(config, directory), retrain=retrain)  # fmt: skip


def saved_or_trained(model: M, train: Callable[[], list[float]], path: Path | None, *, retrain: bool = False) -> Trained[M]:
    """``model`` with the weights saved at ``path`` if there are some (and not ``retrain``), else trained by
    ``train`` (which returns its losses) and saved there."""
    if path is not None and path.exists() and not retrain:
        saved = torch.load(path, weights_only=True)
        model.load_state_dict(saved["state"])
        return Trained(model, list(saved["losses"]), float(saved["seconds"]), path, True)
    start = time.perf_counter()
    losses = train()
    seconds = time.perf_counter() - start
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"state": model.state_dict(), "losses": losses, "seconds": seconds}, path)
    return Trained(model, losses, seconds, path, False)


# --------------------------------------------------------------------------- pruning


def only_group(structure: fp.Structure, kind: fp.Kind) -> str | None:
    """The name of the structure's one group of ``kind`` (``None`` when it has none)."""
    names = list(structure.of_kinds(kind).groups)
    if len(names) > 1:
        raise ValueError(f"expected one {kind!r} group, got {names}")
    return names[0] if names else None


def pruned_units(group: fp.UnitGroup, masks: fp.Masks) -> list[int]:
    """The units of ``group`` whose every member slice ``masks`` prune."""
    out = []
    for u in range(group.size):
        slices = [masks[m.name].index_select(m.dim, torch.tensor(m.indices(u))) for m in group.members
                  if len(m.indices(u)) and m.name in masks]  # fmt: skip
        if slices and not any(bool(s.any()) for s in slices):
            out.append(u)
    return out


def depth_masks(
    structure: fp.Structure, params: fp.Params, k: int, scores: Tensor | None, generator: torch.Generator
) -> dict[str, Tensor]:
    """Masks dropping ``k`` blocks: the ``k`` of lowest ``scores``, or ``k`` drawn by ``generator`` (no scores)."""
    name = only_group(structure, "layers")
    if name is None:
        raise ValueError("the structure has no 'layers' group: no blocks can go")
    if scores is None:
        return fp.structured(structure, fp.RandomStructured(k), kinds="layers")(params, generator=generator)
    return fp.structured(structure, fp.LnStructured(k, n=2), kinds="layers")(params, unit_scores={name: scores})


def width_masks(
    structure: fp.Structure, params: fp.Params, method: str, scores: Tensor | None, generator: torch.Generator
) -> dict[str, Tensor]:
    """Masks removing :data:`WIDTH` of the hidden channels: by ``scores`` (activation), by weight norm, at random."""
    name = only_group(structure, "hidden")
    if name is None:
        raise ValueError("the structure has no 'hidden' group")
    if method == "random":
        return fp.structured(structure, fp.RandomStructured(WIDTH), kinds="hidden")(params, generator=generator)
    plan = fp.structured(structure, fp.LnStructured(WIDTH, n=2), kinds="hidden")
    return plan(params) if scores is None else plan(params, unit_scores={name: scores})


def shrunk_and_reloaded(model: M, masks: fp.Masks, example: Tensor) -> tuple[M, str]:
    """:func:`funcprune.shrink`, ``save_pretrained``, then plain ``from_pretrained`` of the model's class
    (``fp.load_shrunk`` if the config carries shrink's record: widths or counts that differ by layer); returns
    the reloaded model and the loader used."""
    cls = type(model)
    small = fp.shrink(model, masks, example)
    with ol.no_progress_bars(), tempfile.TemporaryDirectory() as directory:
        small.save_pretrained(directory)
        if hasattr(small.config, "funcprune_shrunk"):
            again, loader = fp.load_shrunk(directory), "fp.load_shrunk"
        else:
            again = cls.from_pretrained(directory)
            loader = f"{cls.__name__}.from_pretrained"
    if not isinstance(again, cls):
        raise TypeError(f"reloaded a {type(again).__name__}, expected a {cls.__name__}")
    again.train(False)
    return again, loader


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Row:
    """One line of a table.

    Attributes:
        method: how the units were chosen (``"dense"`` for the dense model).
        amount: blocks dropped (depth) or hidden channels removed (width).
        units: which blocks or channels went.
        perplexity: held-out perplexity of the masked model.
        seconds: the wall time of the row (scores, masks, evaluation).
        parameters: the parameters the shrunk model would have.
    """

    method: str
    amount: int
    units: tuple[int, ...]
    perplexity: float
    seconds: float
    parameters: int


@dataclass(frozen=True)
class Reload:
    """A row's pruned model shrunk, saved, reloaded and measured again."""

    method: str
    amount: int
    perplexity: float
    masked: float
    parameters: int
    loader: str
    seconds: float
    detail: str = ""


@dataclass
class Result:
    """What :func:`run` measured, with the model and data it used.

    Attributes:
        config: the configuration.
        corpus: the documents and token streams.
        trained: the trained model and how it was obtained.
        calibration: the calibration batches.
        heldout: the held-out sequences.
        dense: the dense model's held-out perplexity.
        depth: the depth rows.
        width: the width rows (empty without a ``"hidden"`` group).
        reloads: the shrunk-and-reloaded checks.
        layer_scores: the scores of each metric (``"angular k"`` for runs of ``k``).
        alone: the held-out perplexity with each block dropped alone, block by block.
        draws: the perplexities of the random rows' draw and :data:`DRAWS` more (``"depth k"``, ``"width"``).
        width_note: why the width rows are missing, if they are.
        seconds: wall times by phase.
    """

    config: ol.Config
    corpus: ol.Corpus
    trained: Trained[transformers.LlamaForCausalLM]
    calibration: list[dict[str, Tensor]]
    heldout: Tensor
    dense: float = math.nan
    depth: list[Row] = field(default_factory=list)
    width: list[Row] = field(default_factory=list)
    reloads: list[Reload] = field(default_factory=list)
    layer_scores: dict[str, Tensor] = field(default_factory=dict)
    alone: list[float] = field(default_factory=list)
    draws: dict[str, list[float]] = field(default_factory=dict)
    width_note: str = ""
    seconds: dict[str, float] = field(default_factory=dict)


def data(config: ol.Config, corpus: ol.Corpus) -> tuple[list[dict[str, Tensor]], Tensor]:
    """The one-shot example's calibration batches and held-out sequences."""
    count = min(config.calibration, len(corpus.calibration) // config.context)
    sequences = corpus.calibration[: count * config.context].view(count, config.context)
    calibration = [{"input_ids": ids} for ids in torch.split(sequences, config.calibration_batch)]
    return calibration, ol.windows(corpus.heldout, config.context + 1, config.heldout)


def kept_parameters(params: fp.Params, masks: fp.Masks) -> int:
    """The parameters left when every slice (a row, a column, a whole tensor) the masks prune entirely is
    removed: for each tensor, the product over its dims of the indices along that dim holding a kept entry."""
    total = 0
    for name, p in params.items():
        mask = masks.get(name)
        shape = p.shape if mask is None else [int(mask.movedim(d, 0).reshape(mask.shape[d], -1).any(1).sum())
                                              for d in range(mask.dim())]  # fmt: skip
        total += math.prod(shape)
    return total


def run_depth(result: Result, structure: fp.Structure, say: Callable[[str], None]) -> None:
    """The depth rows, with ``"bi"`` shrunk and reloaded at every depth."""
    model, params, heldout = result.trained.model, dict(result.trained.model.named_parameters()), result.heldout
    name = only_group(structure, "layers")
    if name is None or structure[name].size != result.config.layers:
        got = structure.of_kinds("layers")
        raise ValueError(f"expected one 'layers' group of {result.config.layers} blocks, got {got}")
    group = structure[name]
    generator = torch.Generator().manual_seed(result.config.seed)  # the random rows draw from it in turn
    for metric in ("bi", "cosine"):
        start = time.perf_counter()
        result.layer_scores[metric] = fp.layer_scores(model, result.calibration, metric=metric)
        result.seconds[f"layer_scores {metric}"] = time.perf_counter() - start
    example = result.calibration[0]["input_ids"][:4]
    for k in DEPTHS:
        start = time.perf_counter()
        result.layer_scores[f"angular {k}"] = fp.layer_scores(model, result.calibration, metric="angular", n=k)
        result.seconds[f"layer_scores angular {k}"] = time.perf_counter() - start
        for method in DEPTH_METHODS:
            start = time.perf_counter()
            # The lowest scores go first: the last blocks score lowest for "last".
            scores = {"bi": result.layer_scores["bi"], "cosine": result.layer_scores["cosine"],
                      "angular": result.layer_scores[f"angular {k}"], "random": None,
                      "last": -torch.arange(group.size, dtype=torch.float64)}[method]  # fmt: skip
            masks = depth_masks(structure, params, k, scores, generator)
            value = perplexity(model, heldout, params, masks)
            blocks = tuple(pruned_units(group, masks))
            elapsed = time.perf_counter() - start
            result.depth.append(Row(method, k, blocks, value, elapsed, kept_parameters(params, masks)))
            say(f"depth {method} -{k} blocks {list(blocks)}: perplexity {value:.3f} ({elapsed:.1f} s)")
            if method == "bi":
                result.reloads.append(reload_row(model, masks, example, heldout, method, k, value))
                say(f"  shrunk and reloaded: perplexity {result.reloads[-1].perplexity:.3f}")
            if method == "random":
                result.draws[f"depth {k}"] = [value]
    start = time.perf_counter()
    for i in range(group.size):
        masks = depth_masks(structure, params, 1, (torch.arange(group.size) != i).double(), generator)
        result.alone.append(perplexity(model, heldout, params, masks))
    result.seconds["each block alone"] = time.perf_counter() - start
    say("each block alone: " + ", ".join(f"{x:.3f}" for x in result.alone))
    start = time.perf_counter()
    more = torch.Generator().manual_seed(result.config.seed + 1)
    for k in DEPTHS:
        for _ in range(DRAWS):
            masks = depth_masks(structure, params, k, None, more)
            result.draws[f"depth {k}"].append(perplexity(model, heldout, params, masks))
    result.seconds["random depth draws"] = time.perf_counter() - start


def reload_row(
    model: transformers.LlamaForCausalLM, masks: fp.Masks, example: Tensor, heldout: Tensor, method: str, amount: int,
    value: float,
) -> Reload:  # fmt: skip
    """Shrink, save, reload and measure one row's pruned model."""
    start = time.perf_counter()
    again, loader = shrunk_and_reloaded(model, masks, example)
    detail = (f"{again.config.num_hidden_layers} layers, hidden {again.config.hidden_size}, "
              f"intermediate {again.config.intermediate_size}")  # fmt: skip
    got = perplexity(again, heldout)
    parameters = sum(p.numel() for p in again.parameters())
    return Reload(method, amount, got, value, parameters, loader, time.perf_counter() - start, detail)


def run_width(result: Result, structure: fp.Structure, say: Callable[[str], None], *, shrink: bool = True) -> None:
    """The width rows (if the structure has a ``"hidden"`` group), the activation row shrunk and reloaded."""
    name = only_group(structure, "hidden")
    if name is None:
        result.width_note = "the structure has no 'hidden' group: no width rows"
        say(result.width_note)
        return
    model, params, heldout = result.trained.model, dict(result.trained.model.named_parameters()), result.heldout
    group = structure[name]
    generator = torch.Generator().manual_seed(result.config.seed)
    start = time.perf_counter()
    activation = fp.hidden_scores(model, result.calibration)
    result.seconds["hidden_scores"] = time.perf_counter() - start
    for method in WIDTH_METHODS:
        start = time.perf_counter()
        masks = width_masks(structure, params, method, activation if method == "activation" else None, generator)
        value = perplexity(model, heldout, params, masks)
        channels = tuple(pruned_units(group, masks))
        elapsed = time.perf_counter() - start
        result.width.append(Row(method, len(channels), channels, value, elapsed, kept_parameters(params, masks)))
        say(f"width {method} -{len(channels)} channels: perplexity {value:.3f} ({elapsed:.1f} s)")
        if method == "activation" and shrink:
            example = result.calibration[0]["input_ids"][:4]
            result.reloads.append(reload_row(model, masks, example, heldout, "hidden " + method, len(channels), value))
            say(f"  shrunk and reloaded: perplexity {result.reloads[-1].perplexity:.3f}")
        if method == "random":
            result.draws["width"] = [value]
    start = time.perf_counter()
    more = torch.Generator().manual_seed(result.config.seed + 1)
    for _ in range(DRAWS):
        masks = width_masks(structure, params, "random", None, more)
        result.draws["width"].append(perplexity(model, heldout, params, masks))
    result.seconds["random width draws"] = time.perf_counter() - start


def run(
    config: ol.Config, *, weights: Path | None = None, retrain: bool = False, shrink_width: bool = True,
    documents: dict[str, str] | None = None, log: Callable[[str], None] | None = None,
) -> Result:  # fmt: skip
    """Build the corpus, train (or load) the model, prune it every way of the tables, measure all.

    Args:
        config: the sizes (:func:`config_of`).
        weights: where trained weights are saved and looked for (``None``: train, save nothing).
        retrain: train even if weights are saved.
        shrink_width: also shrink and reload the width activation row.
        documents: the corpus's documents (default: :func:`oneshot_llm.stdlib_documents`).
        log: called with a line of progress (default: silent).
    """
    say = log or (lambda line: None)
    seconds: dict[str, float] = {}
    begin = start = time.perf_counter()
    corpus = ol.make_corpus(config, documents)
    seconds["corpus"] = time.perf_counter() - start
    start = time.perf_counter()
    model = trained(config, corpus, weights, retrain=retrain)
    seconds["train or load"] = time.perf_counter() - start
    say(f"{'loaded' if model.reused else 'trained'} {model.path or ''}: final loss {model.losses[-1]:.3f}, "
        f"training took {model.seconds:.0f} s")  # fmt: skip
    calibration, heldout = data(config, corpus)
    result = Result(config, corpus, model, calibration, heldout, seconds=seconds)
    start = time.perf_counter()
    result.dense = perplexity(model.model, heldout)
    seconds["dense"] = time.perf_counter() - start
    say(f"dense: perplexity {result.dense:.3f}")
    start = time.perf_counter()
    structure = fp.structure(model.model, calibration[0]["input_ids"][:4])
    seconds["structure"] = time.perf_counter() - start
    start = time.perf_counter()
    run_depth(result, structure, say)
    seconds["depth"] = time.perf_counter() - start
    start = time.perf_counter()
    run_width(result, structure, say, shrink=shrink_width)
    seconds["width"] = time.perf_counter() - start
    seconds["total"] = time.perf_counter() - begin
    return result


# --------------------------------------------------------------------------- the report


def _units(units: Sequence[int], limit: int = 12) -> str:
    shown = ", ".join(map(str, units[:limit]))
    return f"[{shown}{', ...' if len(units) > limit else ''}]"


def report(result: Result) -> str:
    """The tables :func:`main` prints, with what was trained and the wall times."""
    config, corpus, model = result.config, result.corpus, result.trained
    parameters = sum(p.numel() for p in model.model.parameters())
    if model.reused:
        where = f"loaded from {model.path} (trained by an earlier run in {model.seconds:.0f} s)"
    else:
        where = f"trained by this run in {model.seconds:.0f} s" + (f", saved to {model.path}" if model.path else "")
    lines = [
        (f"corpus: {len(corpus.documents)} documents, {corpus.characters} characters; tokens (bytes): train "
         f"{len(corpus.train)}, calibration {len(corpus.calibration)}, held-out {len(corpus.heldout)}"),
        (f"model: LlamaForCausalLM, {config.layers} layers, hidden {config.hidden}, {config.heads} heads "
         f"({config.kv_heads} key/value heads), MLP {config.intermediate}, context {config.context}; "
         f"{parameters} parameters"),
        (f"{config.steps} steps of {config.batch}x{config.context} tokens, {where}; "
         f"training loss {model.losses[0]:.2f} -> {model.losses[-1]:.2f}"),
        (f"calibration: {len(result.calibration)} batches, "
         f"{sum(b['input_ids'].numel() for b in result.calibration)} tokens; held-out: {result.heldout.shape[0]} "
         f"sequences, {result.heldout[:, 1:].numel()} tokens predicted; threads {torch.get_num_threads()}"),
        "",
        f"dense: perplexity {result.dense:.3f}",
        "",
        f"{'depth':<10} {'dropped':>7} {'blocks':<12} {'params':>9} {'perplexity':>10} {'time':>7}",
    ]  # fmt: skip
    for row in result.depth:
        lines.append(f"{row.method:<10} {row.amount:>7} {_units(row.units):<12} {row.parameters:>9} "
                     f"{row.perplexity:10.3f} {row.seconds:6.1f}s")  # fmt: skip
    lines.append("")
    lines.append("each block dropped alone: " + ", ".join(f"{i}: {x:.3f}" for i, x in enumerate(result.alone)))
    for name, scores in result.layer_scores.items():
        lines.append(f"layer_scores {name}: {', '.join(f'{float(x):.4g}' for x in scores)}")
    if result.width:
        lines += ["", f"{'width':<10} {'removed':>7} {'params':>9} {'perplexity':>10} {'time':>7}"]
        for row in result.width:
            lines.append(f"{row.method:<10} {row.amount:>7} {row.parameters:>9} {row.perplexity:10.3f} "
                         f"{row.seconds:6.1f}s")  # fmt: skip
            lines.append(f"  channels removed: {_units(row.units, 48)}")
    if result.width_note:
        lines += ["", result.width_note]
    lines.append("")
    for name, values in result.draws.items():
        lines.append(f"random {name}, the table's draw and {len(values) - 1} more: "
                     f"{', '.join(f'{x:.3f}' for x in values)} (median {statistics.median(values):.3f})")  # fmt: skip
    lines.append("")
    for r in result.reloads:
        lines.append(f"{r.method} -{r.amount}: shrunk, saved, reloaded with {r.loader} ({r.detail}; "
                     f"{r.parameters} parameters): perplexity {r.perplexity:.6f}, masked {r.masked:.6f} "
                     f"({r.seconds:.1f} s)")  # fmt: skip
    lines.append("")
    lines.append("wall times: " + ", ".join(f"{k} {v:.1f} s" for k, v in result.seconds.items()))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python examples/depth_width_llm.py [--quick] [--steps N] [--seed N] [--threads N]
    [--weights DIR] [--retrain]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a tiny 4-layer model, trained a few seconds")
    parser.add_argument("--steps", type=int, help="training steps (default: 600, --quick 200)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the splits, the model, the training (default 0)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    default = Path(tempfile.gettempdir()) / "funcprune-depth-width"
    parser.add_argument("--weights", type=Path, default=default, help=f"saved trained weights (default {default})")
    parser.add_argument("--retrain", action="store_true", help="train even if weights are saved")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = config_of(args.seed, quick=args.quick, steps=args.steps)
    result = run(config, weights=args.weights, retrain=args.retrain,
                 log=lambda line: print(line, file=sys.stderr, flush=True))  # fmt: skip
    print(report(result))


if __name__ == "__main__":
    main()
