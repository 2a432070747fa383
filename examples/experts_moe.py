"""Experts removed from a mixture-of-experts decoder trained here: REAP, frequency, EAN, weight norm, random.

The corpus, its splits, the tokens (UTF-8 bytes), the training recipe and
the calibration and held-out sets are those of ``examples/oneshot_llm.py``
(imported), the evaluation and the saved weights those of
``examples/depth_width_llm.py`` (imported), with a mixture-of-experts model:
a ``transformers.Qwen3MoeForCausalLM`` of 4 decoder layers, each holding a
sparse MoE block of 8 experts of which each token goes to 2 (the top 2 of
the router's softmax, renormalised: ``norm_topk_prob``). It is trained with
the routers' load-balancing loss (transformers' ``aux_loss``, times
:attr:`Config.router_loss`) beside the next-token loss. The trained weights
are saved (``--weights``, a directory under the system's temporary
directory by default) and reused by a later run of the same configuration
unless ``--retrain`` is given; the report says which.

The trained model is then pruned without retraining, and each pruned
model's held-out perplexity is measured (``exp`` of the mean next-token
loss over every held-out token, per byte):

- **experts removed**: 25% and 50% of the experts (2 and 4 of the 8 of
  every layer with ``scope="group"``; 8 and 16 of the 32 of the model,
  spread as the scores fall, with ``scope="global"``), the lowest-scored
  going first, scored by :func:`funcprune.expert_stats` on the calibration
  set (``"reap"``: the mean over the tokens routed to an expert of its gate
  times the norm of its output, Lasby et al. 2025, its gate the softmax
  over all the experts as in reap's default, and ``"reap renormalized"``,
  its gate renormalised over the 2 routed experts as this model weighs
  their outputs; ``"frequency"``: how
  many tokens are routed to it; ``"ean"``: ``"ean_sum"``, the summed norm
  of its outputs), by weight norm (``fp.LnStructured``'s own L2 norm of
  each expert's entries: its router row and its slices of the stacked
  expert weights) and at random (``fp.RandomStructured`` with a generator
  seeded by the seed). The masks come from the ``"experts"`` unit groups
  of :func:`funcprune.structure` (one per layer) through
  :func:`funcprune.structured`; a removed expert is never routed to by the
  masked model (:func:`funcprune.functional_call_masked`), so the masked
  model is the model without it. Every ``"reap"`` row is also removed with
  :func:`funcprune.shrink`, saved with ``save_pretrained``, reloaded (plain
  ``from_pretrained`` where every layer keeps as many experts,
  :func:`funcprune.load_shrunk` where not) and measured again.
- **inside the experts**: 50% of every expert weight and 2:4 by
  :func:`funcprune.oneshot` (``"magnitude"``, ``"wanda"``,
  ``"sparsegpt"``), the stacked expert weights only (attention, routers,
  embeddings and head dense).

To read the random rows against something, :data:`DRAWS` more random
draws of each (from a generator seeded by the seed plus 1) are measured too.

Run it (600 training steps: 184 s alone on a quiet CPU core at 1 thread,
10 minutes with two seeds at once beside other jobs on 2 shared cores; then
about 5 minutes of pruning and measuring; ``--quick``, a tiny 2-layer
model trained a few seconds: about 15 seconds in all)::

    python examples/experts_moe.py [--quick] [--steps N] [--seed N] [--threads N] [--weights DIR] [--retrain]

It is also a module (:func:`run`, :func:`report`, :func:`main`):
``tests/test_experts_example.py`` imports it.
"""

from __future__ import annotations

import sys
import types

# transformers imports torchvision where it is installed; this machine's torchvision wheel does not load beside
# the CPU torch (docs/development.md): stub the one module that fails, before anything imports it.
sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))

import argparse  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass, field, replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Literal  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402

import depth_width_llm as dw  # noqa: E402
import funcprune as fp  # noqa: E402
import oneshot_llm as ol  # noqa: E402

Tensor = torch.Tensor
Scope = Literal["group", "global"]

#: The fractions of the experts removed.
FRACTIONS = (0.25, 0.5)
#: How the experts removed are chosen, in the order of the table.
METHODS = ("reap", "reap renormalized", "frequency", "ean", "norm", "random")
#: The statistic of :func:`funcprune.expert_stats` each scored method ranks by (the lowest go first), and
#: whether the gates are renormalised over the routed experts (``renormalize=``).
STATISTICS = {"reap": ("reap", False), "reap renormalized": ("reap", True), "frequency": ("frequency", False),
              "ean": ("ean_sum", False)}  # fmt: skip
#: Per layer (``"group"``: the same count in every layer) and over the model (``"global"``).
SCOPES: tuple[Scope, ...] = ("group", "global")
#: The criteria of the rows inside the experts, and their settings.
INSIDE = ("magnitude", "wanda", "sparsegpt")
#: Random draws beyond the table's, for the spread of a random choice (a generator seeded by the seed plus 1).
DRAWS = 5


@dataclass(frozen=True)
class Config(ol.Config):
    """The one-shot example's configuration, its MLPs mixtures of experts.

    Attributes:
        intermediate: each expert's width (``moe_intermediate_size``; a multiple of 4, for 2:4).
        experts: experts in every layer.
        top_k: experts each token goes to.
        router_loss: the weight of the routers' load-balancing loss in training.
    """

    intermediate: int = 128
    experts: int = 8
    top_k: int = 2
    router_loss: float = 0.01

    @staticmethod
    def quick(seed: int = 0) -> Config:
        """A tiny model of 2 layers of 8 experts of width 16, trained a few seconds."""
        return Config(
            hidden=32, layers=2, heads=4, kv_heads=2, intermediate=16, context=64, batch=16,
            steps=200, lr=1e-2, calibration=32, calibration_batch=16, heldout=64, seed=seed,
        )  # fmt: skip

    def qwen3_moe(self) -> transformers.Qwen3MoeConfig:
        """The model's configuration: every layer a sparse MoE block, its own output head."""
        return transformers.Qwen3MoeConfig(
            vocab_size=256, hidden_size=self.hidden, intermediate_size=self.intermediate,
            moe_intermediate_size=self.intermediate, num_experts=self.experts, num_experts_per_tok=self.top_k,
            norm_topk_prob=True, num_hidden_layers=self.layers, num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads, max_position_embeddings=self.context, router_aux_loss_coef=self.router_loss,
            tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, use_cache=False,
        )  # fmt: skip


def config_of(seed: int = 0, *, quick: bool = False, steps: int | None = None) -> Config:
    """The example's configuration (``quick``: the tiny one), ``steps`` training steps if given."""
    config = Config.quick(seed) if quick else Config(seed=seed)
    return config if steps is None else replace(config, steps=steps)


def make_model(config: Config) -> transformers.Qwen3MoeForCausalLM:
    """A randomly initialized Qwen3-MoE decoder (seeded by ``config.seed``), in eval mode."""
    torch.manual_seed(config.seed)
    model = transformers.Qwen3MoeForCausalLM(config.qwen3_moe())
    model.train(False)
    return model


# --------------------------------------------------------------------------- the trained model


def trained(
    config: Config, corpus: ol.Corpus, directory: Path | None, *, retrain: bool = False
) -> dw.Trained[transformers.Qwen3MoeForCausalLM]:
    """The model of ``config`` trained on ``corpus`` (with the load-balancing loss): loaded from ``directory`` if
    saved there, else trained and saved there (``depth_width_llm.saved_or_trained``)."""
    model = make_model(config)
    stem = f"qwen3moe-{config.layers}x{config.experts}x{config.intermediate}"
    path = None if directory is None else dw.weights_path(config, directory, stem)
    return dw.saved_or_trained(
        model, lambda: ol.train_(model, corpus.train, config, router_loss=config.router_loss), path, retrain=retrain
    )


# --------------------------------------------------------------------------- pruning


def expert_groups(structure: fp.Structure, config: Config) -> list[str]:
    """The structure's ``"experts"`` groups, one per layer of ``config.experts`` units, in layer order."""
    groups = structure.of_kinds("experts").groups
    names = list(groups)
    if len(names) != config.layers or any(groups[n].size != config.experts for n in names):
        sizes = {n: groups[n].size for n in names}
        raise ValueError(f"expected {config.layers} 'experts' groups of {config.experts} units, got {sizes}")
    return names


def expert_masks(
    structure: fp.Structure, params: fp.Params, fraction: float, scope: Scope, method: str,
    stats: dict[bool, dict[str, dict[str, Tensor]]], generator: torch.Generator,
) -> dict[str, Tensor]:  # fmt: skip
    """Masks removing ``fraction`` of the experts, per layer or over the model, chosen by ``method``
    (``stats``: :func:`funcprune.expert_stats`'s, by ``renormalize``)."""
    if method == "random":
        plan = fp.structured(structure, fp.RandomStructured(fraction), kinds="experts", scope=scope)
        return plan(params, generator=generator)
    plan = fp.structured(structure, fp.LnStructured(fraction, n=2), kinds="experts", scope=scope)
    if method == "norm":
        return plan(params)
    if method not in STATISTICS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    statistic, renormalize = STATISTICS[method]
    return plan(params, unit_scores={group: values[statistic] for group, values in stats[renormalize].items()})


def experts_per_layer(model: torch.nn.Module, layers: int) -> tuple[int, ...]:
    """How many experts each layer's router routes to (the rows of its weight)."""
    return tuple(model.get_parameter(f"model.layers.{i}.mlp.gate.weight").shape[0] for i in range(layers))


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Row:
    """One line of the experts table.

    Attributes:
        method: how the experts were chosen.
        scope: ``"group"`` (per layer) or ``"global"``.
        fraction: the fraction of all experts removed.
        removed: the experts removed, layer by layer.
        perplexity: held-out perplexity of the masked model.
        seconds: the wall time of the row (masks, evaluation).
        parameters: the parameters the shrunk model would have.
    """

    method: str
    scope: str
    fraction: float
    removed: tuple[tuple[int, ...], ...]
    perplexity: float
    seconds: float
    parameters: int


@dataclass(frozen=True)
class Reload:
    """A row's pruned model shrunk, saved, reloaded and measured again.

    Attributes:
        method: the row's method.
        scope: the row's scope.
        fraction: the row's fraction.
        perplexity: the reloaded model's held-out perplexity.
        masked: the masked model's.
        parameters: the reloaded model's parameters.
        experts: its experts, layer by layer.
        loader: what reloaded it.
        seconds: shrink, save, reload and measure.
    """

    method: str
    scope: str
    fraction: float
    perplexity: float
    masked: float
    parameters: int
    experts: tuple[int, ...]
    loader: str
    seconds: float


@dataclass(frozen=True)
class Inside:
    """One line of the table inside the experts: :func:`funcprune.oneshot` on the stacked expert weights.

    Attributes:
        method: the criterion.
        setting: ``"50%"`` or ``"2:4"``.
        sparsity: the fraction of the pruned weights' entries that are zero.
        perplexity: held-out perplexity.
        seconds: the time :func:`funcprune.oneshot` took.
        names: the weights pruned.
        unrouted: the :class:`funcprune.UnroutedExpertsWarning` messages (experts no calibration token
            reached, pruned by magnitude).
    """

    method: str
    setting: str
    sparsity: float
    perplexity: float
    seconds: float
    names: tuple[str, ...]
    unrouted: tuple[str, ...] = ()


@dataclass
class Result:
    """What :func:`run` measured, with the model and data it used.

    Attributes:
        config: the configuration.
        corpus: the documents and token streams.
        trained: the trained model and how it was obtained.
        calibration: the calibration batches.
        heldout: the held-out sequences.
        groups: the ``"experts"`` groups, in layer order.
        stats: what :func:`funcprune.expert_stats` gave on the calibration set, by ``renormalize``.
        dense: the dense model's held-out perplexity.
        rows: the experts-removed rows.
        reloads: the shrunk-and-reloaded checks (the ``"reap"`` rows).
        draws: the perplexities of the random rows' draw and :data:`DRAWS` more (``"group 0.25"``...).
        inside: the rows inside the experts.
        seconds: wall times by phase.
    """

    config: Config
    corpus: ol.Corpus
    trained: dw.Trained[transformers.Qwen3MoeForCausalLM]
    calibration: list[dict[str, Tensor]]
    heldout: Tensor
    groups: list[str] = field(default_factory=list)
    stats: dict[bool, dict[str, dict[str, Tensor]]] = field(default_factory=dict)
    dense: float = math.nan
    rows: list[Row] = field(default_factory=list)
    reloads: list[Reload] = field(default_factory=list)
    draws: dict[str, list[float]] = field(default_factory=dict)
    inside: list[Inside] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def row(self, method: str, scope: str, fraction: float) -> Row:
        """The experts-removed row of ``method``, ``scope`` and ``fraction``."""
        return next(r for r in self.rows if (r.method, r.scope, r.fraction) == (method, scope, fraction))


def reload_row(result: Result, masks: fp.Masks, row: Row) -> Reload:
    """Shrink, save, reload and measure one row's pruned model."""
    start = time.perf_counter()
    example = result.calibration[0]["input_ids"][:4]
    again, loader = dw.shrunk_and_reloaded(result.trained.model, masks, example)
    got = dw.perplexity(again, result.heldout)
    parameters = sum(p.numel() for p in again.parameters())
    experts = experts_per_layer(again, result.config.layers)
    elapsed = time.perf_counter() - start
    return Reload(row.method, row.scope, row.fraction, got, row.perplexity, parameters, experts, loader, elapsed)


def run_removal(result: Result, structure: fp.Structure, say: Callable[[str], None]) -> None:
    """The experts-removed rows, the ``"reap"`` ones shrunk and reloaded, and the random rows' draws."""
    model, heldout = result.trained.model, result.heldout
    params = dict(model.named_parameters())
    generator = torch.Generator().manual_seed(result.config.seed)  # the random rows draw from it in turn
    for fraction in FRACTIONS:
        for method in METHODS:
            for scope in SCOPES:
                start = time.perf_counter()
                masks = expert_masks(structure, params, fraction, scope, method, result.stats, generator)
                value = dw.perplexity(model, heldout, params, masks)
                removed = tuple(tuple(dw.pruned_units(structure[g], masks)) for g in result.groups)
                elapsed = time.perf_counter() - start
                row = Row(method, scope, fraction, removed, value, elapsed, dw.kept_parameters(params, masks))
                result.rows.append(row)
                say(f"{method} {scope} -{fraction:.0%}: experts removed {list(removed)}, perplexity {value:.3f} "
                    f"({elapsed:.1f} s)")  # fmt: skip
                if method == "reap":
                    result.reloads.append(reload_row(result, masks, row))
                    say(f"  shrunk and reloaded ({result.reloads[-1].loader}): perplexity "
                        f"{result.reloads[-1].perplexity:.6f}")  # fmt: skip
                if method == "random":
                    result.draws[f"{scope} {fraction}"] = [value]
    start = time.perf_counter()
    more = torch.Generator().manual_seed(result.config.seed + 1)
    for fraction in FRACTIONS:
        for scope in SCOPES:
            for _ in range(DRAWS):
                masks = expert_masks(structure, params, fraction, scope, "random", result.stats, more)
                result.draws[f"{scope} {fraction}"].append(dw.perplexity(model, heldout, params, masks))
    result.seconds["random draws"] = time.perf_counter() - start


def inside_settings() -> list[tuple[str, fp.Spec]]:
    """The settings inside the experts: 50% of every expert weight, and 2:4."""
    return [("50%", fp.L1Unstructured(0.5)), ("2:4", fp.NM(2, 4))]


def expert_weights(structure: fp.Structure, groups: Sequence[str]) -> list[str]:
    """The stacked expert weights of ``groups`` (their members but the routers' weights)."""
    return [m.name for g in groups for m in structure[g].members if ".experts." in m.name]


def run_inside(result: Result, structure: fp.Structure, say: Callable[[str], None]) -> None:
    """The rows inside the experts: :func:`funcprune.oneshot` on the stacked expert weights alone."""
    model, heldout = result.trained.model, result.heldout
    names = expert_weights(structure, result.groups)
    for setting, spec in inside_settings():
        for method in INSIDE:
            start = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", fp.UnroutedExpertsWarning)
                params, masks = fp.oneshot(model, result.calibration, method=method, spec=spec, names=names)
            elapsed = time.perf_counter() - start
            for w in caught:
                if not issubclass(w.category, fp.UnroutedExpertsWarning):
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            unrouted = tuple(str(w.message) for w in caught if issubclass(w.category, fp.UnroutedExpertsWarning))
            value = dw.perplexity(model, heldout, params, masks)
            fraction = fp.sparsity_report(masks).fraction
            result.inside.append(Inside(method, setting, fraction, value, elapsed, tuple(masks), unrouted))
            say(f"inside {method} {setting}: perplexity {value:.3f} ({elapsed:.1f} s)")


def run(
    config: Config, *, weights: Path | None = None, retrain: bool = False, inside: bool = True,
    documents: dict[str, str] | None = None, log: Callable[[str], None] | None = None,
) -> Result:  # fmt: skip
    """Build the corpus, train (or load) the model, remove experts every way of the table, measure all.

    Args:
        config: the sizes (:func:`config_of`).
        weights: where trained weights are saved and looked for (``None``: train, save nothing).
        retrain: train even if weights are saved.
        inside: also prune inside the experts (:func:`funcprune.oneshot`).
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
    calibration, heldout = dw.data(config, corpus)
    result = Result(config, corpus, model, calibration, heldout, seconds=seconds)
    start = time.perf_counter()
    result.dense = dw.perplexity(model.model, heldout)
    seconds["dense"] = time.perf_counter() - start
    say(f"dense: perplexity {result.dense:.3f}")
    start = time.perf_counter()
    structure = fp.structure(model.model, calibration[0]["input_ids"][:4])
    result.groups = expert_groups(structure, config)
    seconds["structure"] = time.perf_counter() - start
    start = time.perf_counter()
    result.stats = {r: fp.expert_stats(model.model, calibration, renormalize=r) for r in (False, True)}
    seconds["expert_stats"] = time.perf_counter() - start
    start = time.perf_counter()
    run_removal(result, structure, say)
    seconds["experts removed"] = time.perf_counter() - start
    if inside:
        start = time.perf_counter()
        run_inside(result, structure, say)
        seconds["inside the experts"] = time.perf_counter() - start
    seconds["total"] = time.perf_counter() - begin
    return result


# --------------------------------------------------------------------------- the report


def _floats(values: Tensor, digits: int = 4) -> str:
    return ", ".join(f"{float(x):.{digits}g}" for x in values)


def report(result: Result) -> str:
    """The tables :func:`main` prints, with what was trained and the wall times."""
    config, corpus, model = result.config, result.corpus, result.trained
    parameters = sum(p.numel() for p in model.model.parameters())
    experts = sum(p.numel() for n, p in model.model.named_parameters() if ".mlp.experts." in n)
    if model.reused:
        where = f"loaded from {model.path} (trained by an earlier run in {model.seconds:.0f} s)"
    else:
        where = f"trained by this run in {model.seconds:.0f} s" + (f", saved to {model.path}" if model.path else "")
    lines = [
        (f"corpus: {len(corpus.documents)} documents, {corpus.characters} characters; tokens (bytes): train "
         f"{len(corpus.train)}, calibration {len(corpus.calibration)}, held-out {len(corpus.heldout)}"),
        (f"model: Qwen3MoeForCausalLM, {config.layers} layers, hidden {config.hidden}, {config.heads} heads "
         f"({config.kv_heads} key/value heads), {config.experts} experts of width {config.intermediate}, top "
         f"{config.top_k}, context {config.context}; {parameters} parameters, {experts} in the experts"),
        (f"{config.steps} steps of {config.batch}x{config.context} tokens, load-balancing loss x{config.router_loss}, "
         f"{where}; training loss {model.losses[0]:.2f} -> {model.losses[-1]:.2f}"),
        (f"calibration: {len(result.calibration)} batches, "
         f"{sum(b['input_ids'].numel() for b in result.calibration)} tokens; held-out: {result.heldout.shape[0]} "
         f"sequences, {result.heldout[:, 1:].numel()} tokens predicted; threads {torch.get_num_threads()}"),
        "",
        f"dense: perplexity {result.dense:.3f}",
        "",
        f"{'method':<17} {'scope':<7} {'removed':>7} {'kept per layer':<16} {'params':>9} {'perplexity':>10} {'time':>7}",
    ]  # fmt: skip
    for row in result.rows:
        kept = ",".join(str(config.experts - len(r)) for r in row.removed)
        lines.append(f"{row.method:<17} {row.scope:<7} {row.fraction:>7.0%} {kept:<16} {row.parameters:>9} "
                     f"{row.perplexity:10.3f} {row.seconds:6.1f}s")  # fmt: skip
    lines.append("")
    for row in result.rows:
        lines.append(f"{row.method} {row.scope} {row.fraction:.0%}: experts removed, layer by layer: "
                     f"{'; '.join(str(list(r)) for r in row.removed)}")  # fmt: skip
    lines.append("")
    for name, values in result.draws.items():
        lines.append(f"random {name}, the table's draw and {len(values) - 1} more: "
                     f"{', '.join(f'{x:.3f}' for x in values)} (median {statistics.median(values):.3f})")  # fmt: skip
    lines.append("")
    for r in result.reloads:
        lines.append(f"{r.method} {r.scope} {r.fraction:.0%}: shrunk, saved, reloaded with {r.loader} (experts "
                     f"{list(r.experts)}; {r.parameters} parameters): perplexity {r.perplexity:.6f}, masked "
                     f"{r.masked:.6f} ({r.seconds:.1f} s)")  # fmt: skip
    if result.inside:
        lines += ["", f"{'inside':<10} {'setting':<8} {'sparsity':>8} {'perplexity':>10} {'oneshot':>8}"]
        for i in result.inside:
            lines.append(f"{i.method:<10} {i.setting:<8} {100 * i.sparsity:7.1f}% {i.perplexity:10.3f} "
                         f"{i.seconds:7.1f}s")  # fmt: skip
        for i in result.inside:
            lines += [f"{i.method} {i.setting}: {message}" for message in i.unrouted]
    lines.append("")
    for group, stats in result.stats[False].items():
        tokens = stats["frequency"].sum()
        lines.append(f"{group}: share of routed tokens {_floats(stats['frequency'] / tokens, 3)}")
        renormalized = result.stats[True][group]["reap"]
        lines.append(f"{group}: reap {_floats(stats['reap'])}; renormalized {_floats(renormalized)}")
        lines.append(f"{group}: ean_sum {_floats(stats['ean_sum'])}; max_activation {_floats(stats['max_activation'])}")
    supers = {g: flags.nonzero().flatten().tolist() for g, flags in fp.super_experts(result.stats[False]).items()}
    lines.append(f"super experts (fp.super_experts): {supers}")
    lines.append("")
    lines.append("wall times: " + ", ".join(f"{k} {v:.1f} s" for k, v in result.seconds.items()))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python examples/experts_moe.py [--quick] [--steps N] [--seed N] [--threads N]
    [--weights DIR] [--retrain] [--no-inside]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a tiny 2-layer model, trained a few seconds")
    parser.add_argument("--steps", type=int, help="training steps (default: 600, --quick 200)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the splits, the model, the training (default 0)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    default = Path(tempfile.gettempdir()) / "funcprune-experts"
    parser.add_argument("--weights", type=Path, default=default, help=f"saved trained weights (default {default})")
    parser.add_argument("--retrain", action="store_true", help="train even if weights are saved")
    parser.add_argument("--no-inside", action="store_true", help="leave out the rows inside the experts")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = config_of(args.seed, quick=args.quick, steps=args.steps)
    result = run(config, weights=args.weights, retrain=args.retrain, inside=not args.no_inside,
                 log=lambda line: print(line, file=sys.stderr, flush=True))  # fmt: skip
    print(report(result))


if __name__ == "__main__":
    main()
