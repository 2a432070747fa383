"""How much of a trained Llama's quality structured pruning keeps, and how much recovery gets back.

The model, corpus, training, calibration and held-out sets are those of
``examples/depth_width_llm.py`` (an 8-layer ``LlamaForCausalLM`` with
grouped-query attention trained 600 steps on the docstrings of Python's
standard library, tokens = bytes; its saved weights are reused:
``--weights``, by default the directory that example saves to).

Each row removes a fraction of the model's parameters (all of them, the
embeddings and head included, which stay) by structured pruning: MLP
channels and KV groups (a key/value head with its query heads) ranked
together in one global ranking (:func:`funcprune.structured`,
``scope="global"``, ``normalize="mean"`` so that each group's scores are
divided by their mean and groups of different kinds compete), so that the
per-layer widths come out of the ranking. The count of units is the
smallest whose removal reaches the fraction (the parameters removed are
at least the fraction, within one KV group's 36,864). The criteria:

- ``norm``: the L2 norm of each unit's weights;
- ``taylor``: ``Σ (w · g)²`` over each unit's weights, ``g`` the
  gradient of the next-token loss summed over the calibration batches
  (:func:`funcprune.taylor`);
- ``fluctuation``: FLAP's ``var(x_j) · ‖W[:, j]‖²`` of each input channel
  of ``o_proj`` and ``down_proj`` (:func:`funcprune.input_moments`,
  :func:`funcprune.fluctuation`), summed in squares per KV group.

Each pruned model is measured (held-out perplexity, per byte) with

- ``none``: no recovery;
- ``compensate``: FLAP's bias compensation (:func:`funcprune.compensate`,
  run through :func:`funcprune.with_biases`), no training;
- ``ce``, ``kd``, ``ce+kd``: :data:`STEPS` steps of AdamW on the masked
  student (``functional_call_masked`` on one trainable copy of the
  parameters) with the next-token loss, the distillation loss
  (:func:`funcprune.distill_loss`, temperature 1, the teacher the frozen
  dense parameters of the same module through ``functional_call``), or
  their mean; the same batches (the same tokens) for all three.

For contrast, the one-shot unstructured methods (:func:`funcprune.oneshot`:
magnitude, Wanda, SparseGPT) remove as many weights of the decoder's Linear
layers as the structured rows remove parameters; and a dense Llama of the
pruned size (the MLP width reduced, everything else alike) is trained from
scratch for the dense model's steps plus :data:`STEPS` (the same total
tokens as pruning plus recovery): the train-small baseline. Its weights are
saved beside the dense model's.

Run it::

    python examples/recovery_llm.py [--seed N] [--fractions 0.25,0.4] [--criteria norm,taylor,fluctuation]
        [--no-oneshot] [--no-small] [--threads N] [--weights DIR]

Results (held-out perplexity per byte; 1 thread on 2 shared CPU cores; a
structured row's time is its scores, masks, recovery and evaluation, the
train-small row's its training; seed 0 dense 4.897)::

    seed 0        -25% (2,508,672 params)             -40% (2,000,064-2,006,976 params)
    route         norm    taylor  fluct.              norm    taylor  fluct.
    none          5.072   4.962   4.963               11.082  5.266   5.217
    compensate    5.049   4.940   4.936               12.326  5.253   5.159
    ce  (30 st.)  5.016   4.968   4.966               5.927   5.078   5.021
    kd  (30 st.)  5.013   4.967   4.964               5.847   5.066   5.011
    ce+kd         4.951   4.907   4.902               5.846   5.016   4.959
    one-shot      magnitude 4.911, Wanda 4.916,       magnitude 4.979, Wanda 4.973,
    unstructured  SparseGPT 4.898                     SparseGPT 4.908
    train small   MLP 332, 630 steps: 4.932 (366 s)   MLP 220, 630 steps: 4.964 (329 s)
    times         none 3-8 s, compensate 3-9 s, ce 20-27 s, kd and ce+kd 26-32 s; one-shot 3-8 s

    seed 1        -25% (2,494,272 norm, 2,508,672)    -40% (1,975,872 norm and Taylor, 2,006,976)
    dense 5.006   norm    taylor  fluct.              norm    taylor  fluct.
    none          5.577   5.070   5.071               6.159   5.443   5.375
    compensate    5.438   5.046   5.041               5.971   5.417   5.334
    ce  (30 st.)  5.136   5.064   5.072               5.344   5.174   5.178
    kd  (30 st.)  5.136   5.063   5.061               5.329   5.165   5.144
    ce+kd         5.077   5.001   5.007               5.277   5.107   5.093
    one-shot      magnitude 5.017, Wanda 5.017,       magnitude 5.084, Wanda 5.075,
    unstructured  SparseGPT 5.008                     SparseGPT 5.019
    train small   MLP 332, 630 steps: 4.881 (325 s)   MLP 220, 630 steps: 5.325 (309 s)
    times         as for seed 0 (Taylor's scores 8-12 s more)

Depth (``--parts depth``: 2 and 3 of the 8 blocks, by block influence), hidden
size (``hidden``: 48 and 77 of 192 channels, by activation) and experts
(``experts``: 10 and 16 of the 32 experts of the experts example's
mixture of experts, by REAP over the model; dense 4.231 and 4.450), the
same routes but ``compensate`` (no Linear keeps an output whose inputs
these cut)::

    seed 0        -25%                        -40%
    route         depth   hidden  experts     depth   hidden  experts
    none          6.075   6.340   4.251       7.374   9.038   4.972
    ce  (30 st.)  5.276   5.137   4.297       5.586   5.431   4.420
    kd  (30 st.)  5.246   5.099   4.269       5.539   5.372   4.404
    ce+kd         5.199   5.063   4.238       5.505   5.342   4.366
    train small   (MoE: 6 experts, 630 steps: 4.371)   (MoE: 4 experts: 4.388)

    seed 1
    none          5.913   6.171   4.453       8.389   8.212   5.225
    ce  (30 st.)  5.318   5.206   4.482       5.853   5.498   4.544
    kd  (30 st.)  5.299   5.203   4.470       5.787   5.437   4.538
    ce+kd         5.246   5.148   4.427       5.759   5.416   4.496
    train small   (MoE: 6 experts, 630 steps: 4.389)   (MoE: 4 experts: 4.479)

    parameters    2,533,824 (depth), 2,509,200 (hidden), 2,168,896 (experts; the
                  6-expert MoE 2,316,736) at -25%; 2,127,936, 2,003,875 and
                  1,725,376 (the 4-expert MoE the same) at -40%

Reading (two seeds; their dense models differ by 0.11, as much as many
of the effects): Taylor and fluctuation rank alike and cost least
(+0.06 at -25%, +0.32 to +0.44 at -40%); weight norm costs far more, and at
-40% removes a third of the KV groups (``normalize="mean"`` lets attention
compete with the MLPs) where the others remove one to three. Compensation,
free, gains 0.01 to 0.19 in every cell but one (seed 0, norm, -40%, where
it hurts). With 30 steps (5% of the training), cross-entropy alone and
distillation alone give about the same, and for Taylor and fluctuation at
-25% nothing over no recovery (the learning rate, 1e-3, was not tuned);
their mean gains the most in every column of both seeds, bringing
Taylor and fluctuation back within 0.01 of the dense model at -25%,
and to +0.06 to +0.12 at -40%. Does pruning plus recovery beat training
small? These runs do not settle it: the dense model of the pruned size
trained from scratch for the same total tokens is within 0.03 of the best
route on seed 0 (4.932 and 4.964 against 4.902 and 4.959); on seed 1 it
beats every route and the dense model itself at -25% (4.881) and at -40%
loses to every Taylor and fluctuation route with training and to norm's
ce+kd (5.325 against 5.09 to 5.28). The
baseline itself varies by 0.44 between seeds at -40%: one training run
per seed and size is too few to say more. Depth and hidden-size cuts lose
far more than width before training (5.9 to 9.0) and 30 steps of ce+kd
win most of it back (5.06 to 5.76), not all; experts are the cheapest cut
of the mixture of experts (+0.02 and +0.003 at -25% with no recovery), and
there the untuned recovery of ce or kd alone makes it worse. The train-small
MoE, against pruning with ce+kd, wins on one seed and loses on the other at
both fractions. docs/examples/recovery-llm.md has the whole reading. Unstructured pruning at the same count of nonzeros
keeps more than any structured route without recovery, but makes no
smaller dense model. None of this says how the routes order on large
models.
"""

from __future__ import annotations

import sys
import types

sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))

import argparse  # noqa: E402
import math  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass, field, replace  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

import depth_width_llm as dw  # noqa: E402
import experts_moe as em  # noqa: E402
import funcprune as fp  # noqa: E402
import oneshot_llm as ol  # noqa: E402

Tensor = torch.Tensor

#: Recovery steps: 5% of the dense model's 600 training steps, of the training's batch (16 x 128 tokens).
STEPS = 30
#: The recovery's peak learning rate (AdamW, a cosine decay to a tenth of it, no weight decay).
LR = 1e-3
#: The fractions of the parameters removed.
FRACTIONS = (0.25, 0.40)
#: The structured criteria, in the order of the table.
CRITERIA = ("norm", "taylor", "fluctuation")
#: The recovery routes, in the order of the table.
ROUTES = ("none", "compensate", "ce", "kd", "ce+kd")
#: The unit kinds a width plan removes.
KINDS: tuple[fp.Kind, ...] = ("channels", "kv_groups")
#: The parts of the table: MLP channels and KV groups (``width``), blocks (``depth``), the hidden size
#: (``hidden``), and experts of the mixture-of-experts example's model (``experts``).
PARTS = ("width", "depth", "hidden", "experts")
#: The routes of the depth, hidden-size and expert rows (compensation has no Linear input column to act on).
TRAINED_ROUTES = ("none", "ce", "kd", "ce+kd")


@dataclass(frozen=True)
class Row:
    """One line of the table: ``kind`` is ``"structured"``, ``"oneshot"``, ``"dense"`` or ``"small"``."""

    kind: str
    fraction: float
    method: str
    route: str
    perplexity: float
    parameters: int
    seconds: float


@dataclass
class Setup:
    """The trained model and the data, shared by every row of a seed."""

    config: ol.Config
    corpus: ol.Corpus
    model: transformers.PreTrainedModel
    params: dict[str, Tensor]
    calibration: list[dict[str, Tensor]]
    heldout: Tensor
    structure: fp.Structure
    moments: dict[str, fp.Moments] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)


def setup(config: ol.Config, weights: Path | None) -> Setup:
    """Load (or train) the depth-width example's model and build the data and the structure."""
    corpus = ol.make_corpus(config)
    model = dw.trained(config, corpus, weights).model
    for p in model.parameters():
        p.requires_grad_(False)
    calibration, heldout = dw.data(config, corpus)
    structure = fp.structure(model, calibration[0]["input_ids"][:4])
    params = {n: p.detach() for n, p in model.named_parameters()}  # the module's tensors, not a copy
    names = [n for n in params if n.endswith(("o_proj.weight", "down_proj.weight"))]
    moments = fp.input_moments(model, calibration, names)
    return Setup(config, corpus, model, params, calibration, heldout, structure, moments)


def moe_setup(config: em.Config, weights: Path | None) -> Setup:
    """Load (or train) the mixture-of-experts example's model (:mod:`experts_moe`) and its data and structure."""
    corpus = ol.make_corpus(config)
    model = em.trained(config, corpus, weights).model
    for p in model.parameters():
        p.requires_grad_(False)
    calibration, heldout = dw.data(config, corpus)
    structure = fp.structure(model, calibration[0]["input_ids"][:4])
    params = {n: p.detach() for n, p in model.named_parameters()}
    return Setup(config, corpus, model, params, calibration, heldout, structure)


def scores_of(s: Setup, criterion: str) -> tuple[dict[str, Tensor] | None, int]:
    """The scores a plan ranks by (``None``: the weights) and the norm ``n`` it takes of each unit's."""
    if criterion == "norm":
        return None, 2
    if criterion == "taylor":
        student = {n: p.detach().clone().requires_grad_() for n, p in s.params.items()}
        total = {n: torch.zeros_like(p) for n, p in student.items()}
        for batch in s.calibration:
            ids = batch["input_ids"]
            logits = torch.func.functional_call(s.model, student, (ids,)).logits
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
            grads = torch.autograd.grad(loss, list(student.values()))
            total = {n: total[n] + g for n, g in zip(student, grads)}
        return fp.taylor(s.params, total), 1
    if criterion == "fluctuation":
        zeros = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in s.params.items()}
        return zeros | fp.fluctuation(s.params, s.moments), 2
    raise ValueError(f"criterion: expected one of {CRITERIA}, got {criterion!r}")


def fewest(
    s: Setup, fraction: float, plan: Callable[[int], dict[str, Tensor]], units: int, *, nearest: bool = False
) -> dict[str, Tensor]:
    """The masks of ``plan(k)`` for the smallest ``k`` (of at most ``units``) whose removal takes ``fraction`` of
    the parameters (``nearest``: or ``k - 1`` where its count of parameters is nearer the fraction's)."""
    total = sum(p.numel() for p in s.params.values())
    goal = (1 - fraction) * total
    lo, hi = 0, units  # the smallest k with kept <= goal
    while lo < hi:
        mid = (lo + hi) // 2
        if dw.kept_parameters(s.params, plan(mid)) <= goal:
            hi = mid
        else:
            lo = mid + 1
    masks = plan(lo)
    if nearest and lo > 0:
        fewer = plan(lo - 1)
        if abs(dw.kept_parameters(s.params, fewer) - goal) < abs(dw.kept_parameters(s.params, masks) - goal):
            return fewer
    return masks


def masks_at(s: Setup, fraction: float, scores: dict[str, Tensor] | None, n: int) -> dict[str, Tensor]:
    """The masks of the fewest globally ranked units whose removal takes ``fraction`` of the parameters."""
    units = sum(g.size - 1 for g in s.structure.of_kinds(*KINDS).groups.values())

    def plan(k: int) -> dict[str, Tensor]:
        p = fp.structured(s.structure, fp.LnStructured(k, n=n), kinds=KINDS, normalize="mean")
        return p(s.params) if scores is None else p(s.params, scores=scores)

    return fewest(s, fraction, plan, units)


def unit_masks(s: Setup, part: str, fraction: float) -> tuple[str, dict[str, Tensor]]:
    """One part's scores and masks at ``fraction``: ``depth``, the blocks of lowest block influence
    (:func:`funcprune.layer_scores`, ``"bi"``), as many as come nearest the fraction; ``hidden``, the hidden
    channels of lowest activation (:func:`funcprune.hidden_scores`); ``experts``, the experts of lowest REAP
    score (:func:`funcprune.expert_stats`) over the whole model (``scope="global"``, each layer keeping its
    router's top k). Returns the criterion's name and the masks."""
    kind: fp.Kind
    if part == "depth":
        kind, criterion, scores = "layers", "bi", {"": fp.layer_scores(s.model, s.calibration, metric="bi")}
    elif part == "hidden":
        kind, criterion, scores = "hidden", "activation", {"": fp.hidden_scores(s.model, s.calibration)}
    elif part == "experts":
        stats = fp.expert_stats(s.model, s.calibration)
        kind, criterion, scores = "experts", "reap", {g: values["reap"] for g, values in stats.items()}
    else:
        raise ValueError(f"part: expected one of {PARTS[1:]}, got {part!r}")
    groups = s.structure.of_kinds(kind).groups
    if "" in scores:  # one group of this kind: depth's blocks, the hidden size
        name = dw.only_group(s.structure, kind)
        if name is None:
            raise ValueError(f"the structure has no {kind!r} group")
        scores = {name: scores[""]}
    units = sum(g.size - g.least for g in groups.values())

    def plan(k: int) -> dict[str, Tensor]:
        scope: em.Scope = "global" if len(groups) > 1 else "group"
        return fp.structured(s.structure, fp.LnStructured(k, n=2), kinds=kind, scope=scope)(s.params,
                                                                                            unit_scores=scores)

    return criterion, fewest(s, fraction, plan, units, nearest=part == "depth")


def batches(s: Setup, steps: int) -> list[Tensor]:
    """The recovery's batches: ``steps`` of the training's size at random offsets of the training stream."""
    generator = torch.Generator().manual_seed(s.config.seed + 2)
    offsets = torch.arange(s.config.context + 1)
    return [s.corpus.train[torch.randint(0, len(s.corpus.train) - s.config.context - 1, (s.config.batch, 1),
                                         generator=generator) + offsets] for _ in range(steps)]  # fmt: skip


def unit_rows(s: Setup, part: str, fraction: float, say: Callable[[str], None]) -> None:
    """The rows of one part (depth, hidden size or experts) at one fraction: no recovery and the training
    routes."""
    start = time.perf_counter()
    criterion, masks = unit_masks(s, part, fraction)
    base = time.perf_counter() - start
    kept = dw.kept_parameters(s.params, masks)
    kinds: dict[str, fp.Kind] = {"depth": "layers", "hidden": "hidden", "experts": "experts"}
    kind = kinds[part]
    removed = [len(dw.pruned_units(g, masks)) for g in s.structure.of_kinds(kind).groups.values()]
    say(f"-{100 * fraction:.0f}% {part} by {criterion}: units removed {removed}")
    data = batches(s, STEPS)
    for route in TRAINED_ROUTES:
        start = time.perf_counter()
        params = s.params if route == "none" else recover(s, masks, route, data)
        value = ol.perplexity(s.model, s.heldout, params, masks)
        seconds = base + time.perf_counter() - start
        s.rows.append(Row(part, fraction, criterion, route, value, kept, seconds))
        say(f"-{100 * fraction:.0f}% {part} {criterion} {route}: perplexity {value:.3f}, {kept} parameters "
            f"({seconds:.1f} s)")  # fmt: skip


def recover(s: Setup, masks: dict[str, Tensor], route: str, data: Sequence[Tensor]) -> dict[str, Tensor]:
    """Train one copy of the parameters through the masks on ``data`` with the route's loss; the teacher is
    the module's own frozen parameters (one module, one copy of the frozen weights)."""
    teacher = s.params
    student = {n: p.detach().clone().requires_grad_() for n, p in teacher.items()}
    optimizer = torch.optim.AdamW(list(student.values()), lr=LR, betas=(0.9, 0.95), weight_decay=0.0)
    for step, batch in enumerate(data):
        for group in optimizer.param_groups:
            group["lr"] = LR * (0.1 + 0.45 * (1 + math.cos(math.pi * step / max(1, len(data) - 1))))
        x, y = batch[:, :-1], batch[:, 1:]
        logits = fp.functional_call_masked(s.model, student, masks, (x,)).logits
        ce = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        if route == "ce":
            loss = ce
        else:
            with torch.no_grad():
                t = torch.func.functional_call(s.model, teacher, (x,)).logits
            kd = fp.distill_loss(logits, t)
            loss = kd if route == "kd" else 0.5 * (ce + kd)
        optimizer.zero_grad()
        torch.autograd.backward(loss)
        optimizer.step()
    return {n: p.detach() for n, p in student.items()}


def widths(s: Setup, masks: dict[str, Tensor]) -> str:
    """The per-layer widths the global ranking left: MLP channels and KV groups kept, block by block."""
    groups = s.structure.of_kinds(*KINDS).groups
    mlp = [g.size - len(dw.pruned_units(g, masks)) for g in groups.values() if g.kind == "channels"]
    kv = [g.size - len(dw.pruned_units(g, masks)) for g in groups.values() if g.kind == "kv_groups"]
    return f"MLP channels kept {mlp}, KV groups kept {kv}"


def structured_rows(s: Setup, fraction: float, criterion: str, say: Callable[[str], None]) -> None:
    """Every route of one criterion at one fraction."""
    start = time.perf_counter()
    scores, n = scores_of(s, criterion)
    masks = masks_at(s, fraction, scores, n)
    base = time.perf_counter() - start  # the scores and the masks, counted in every route's time
    kept = dw.kept_parameters(s.params, masks)
    say(f"-{100 * fraction:.0f}% {criterion}: {widths(s, masks)}")
    data = batches(s, STEPS)
    for route in ROUTES:
        start = time.perf_counter()
        if route == "none":
            value = ol.perplexity(s.model, s.heldout, s.params, masks)
        elif route == "compensate":
            model = fp.with_biases(s.model, fp.compensate(s.params, masks, s.moments))
            value = ol.perplexity(model, s.heldout, dict(model.named_parameters()), masks)
        else:
            value = ol.perplexity(s.model, s.heldout, recover(s, masks, route, data), masks)
        seconds = base + time.perf_counter() - start
        s.rows.append(Row("structured", fraction, criterion, route, value, kept, seconds))
        say(f"-{100 * fraction:.0f}% {criterion} {route}: perplexity {value:.3f}, {kept} parameters ({seconds:.1f} s)")


def oneshot_rows(s: Setup, fraction: float, say: Callable[[str], None]) -> None:
    """The one-shot unstructured methods removing as many decoder Linear weights as the fraction of all."""
    total = sum(p.numel() for p in s.params.values())
    linear = sum(p.numel() for n, p in s.params.items() if n.startswith("model.layers.") and p.dim() == 2)
    sparsity = fraction * total / linear
    for method in ol.METHODS:
        start = time.perf_counter()
        params, masks = fp.oneshot(s.model, s.calibration, method=method, spec=fp.L1Unstructured(sparsity))
        value = ol.perplexity(s.model, s.heldout, params, masks)
        seconds = time.perf_counter() - start
        kept = total - sum(int((~m).sum()) for m in masks.values())
        s.rows.append(Row("oneshot", fraction, method, "none", value, kept, seconds))
        say(f"-{100 * fraction:.0f}% oneshot {method} ({100 * sparsity:.1f}% of the decoder's Linear weights): "
            f"perplexity {value:.3f}, {kept} nonzero parameters ({seconds:.1f} s)")  # fmt: skip


def small_config(config: ol.Config, fraction: float) -> ol.Config:
    """The dense configuration of ``fraction`` fewer parameters: the MLP width reduced (to a multiple of 4),
    trained for the dense model's steps plus :data:`STEPS`."""
    per_channel = 3 * config.hidden * config.layers
    total = sum(p.numel() for p in transformers.LlamaForCausalLM(config.llama()).parameters())
    width = config.intermediate - round(fraction * total / per_channel / 4) * 4
    return replace(config, intermediate=width, steps=config.steps + STEPS)


def small_row(s: Setup, fraction: float, weights: Path | None, say: Callable[[str], None]) -> None:
    """The train-small baseline of one fraction (trained, or loaded if saved)."""
    config = small_config(s.config, fraction)
    model = ol.make_model(config)
    got = dw.saved_or_trained(model, lambda: ol.train_(model, s.corpus.train, config),
                              None if weights is None else dw.weights_path(config, weights))  # fmt: skip
    value = ol.perplexity(got.model, s.heldout)
    parameters = sum(p.numel() for p in got.model.parameters())
    s.rows.append(Row("small", fraction, f"MLP {config.intermediate}", f"{config.steps} steps", value, parameters,
                      got.seconds))  # fmt: skip
    say(f"-{100 * fraction:.0f}% trained small (MLP {config.intermediate}, {config.steps} steps, "
        f"{'reused' if got.reused else 'trained'}): perplexity {value:.3f}, {parameters} parameters "
        f"({got.seconds:.0f} s)")  # fmt: skip


def moe_small_config(config: em.Config, fraction: float) -> em.Config:
    """The mixture-of-experts configuration of about ``fraction`` fewer parameters: fewer experts in every
    layer (the count nearest), trained for the dense model's steps plus :data:`STEPS`."""

    def size(experts: int) -> int:
        return sum(p.numel() for p in transformers.Qwen3MoeForCausalLM(
            replace(config, experts=experts).qwen3_moe()).parameters())  # fmt: skip

    goal = (1 - fraction) * size(config.experts)
    experts = min(range(config.top_k, config.experts + 1), key=lambda e: abs(size(e) - goal))
    return replace(config, experts=experts, steps=config.steps + STEPS)


def moe_small_row(s: Setup, fraction: float, weights: Path | None, say: Callable[[str], None]) -> None:
    """The mixture-of-experts train-small baseline of one fraction (trained, or loaded if saved)."""
    if not isinstance(s.config, em.Config):
        raise TypeError(f"expected the experts example's configuration, got {type(s.config).__name__}")
    config = moe_small_config(s.config, fraction)
    got = em.trained(config, s.corpus, weights)
    value = ol.perplexity(got.model, s.heldout)
    parameters = sum(p.numel() for p in got.model.parameters())
    s.rows.append(Row("small", fraction, f"{config.experts} experts", f"{config.steps} steps", value, parameters,
                      got.seconds))  # fmt: skip
    say(f"-{100 * fraction:.0f}% trained small ({config.experts} experts, {config.steps} steps, "
        f"{'reused' if got.reused else 'trained'}): perplexity {value:.3f}, {parameters} parameters "
        f"({got.seconds:.0f} s)")  # fmt: skip


def report(s: Setup) -> str:
    """The table of one seed."""
    header = f"{'kind':<10} {'removed':>7} {'method':<12} {'route':<10} {'params':>8} {'perplexity':>10} {'time':>7}"
    lines = [f"{type(s.model).__name__}, seed {s.config.seed}; recovery {STEPS} steps of {s.config.batch}x{s.config.context} tokens, "
             f"AdamW lr {LR}; threads {torch.get_num_threads()}", header]  # fmt: skip
    for r in s.rows:
        lines.append(f"{r.kind:<10} {100 * r.fraction:6.0f}% {r.method:<12} {r.route:<10} {r.parameters:>8} "
                     f"{r.perplexity:10.3f} {r.seconds:6.1f}s")  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fractions", default=",".join(map(str, FRACTIONS)))
    parser.add_argument("--criteria", default=",".join(CRITERIA))
    parser.add_argument("--parts", default=",".join(PARTS), help=f"of {','.join(PARTS)}")
    parser.add_argument("--no-oneshot", action="store_true")
    parser.add_argument("--no-small", action="store_true")
    parser.add_argument("--only-small", action="store_true", help="the train-small baselines alone")
    parser.add_argument("--threads", type=int, default=1)
    default = Path(tempfile.gettempdir()) / "funcprune-depth-width"
    parser.add_argument("--weights", type=Path, default=default)
    moe_default = Path(tempfile.gettempdir()) / "funcprune-experts"
    parser.add_argument("--moe-weights", type=Path, default=moe_default)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    parts = args.parts.split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"--parts: expected some of {','.join(PARTS)}, got {','.join(unknown)}")
    fractions = [float(f) for f in args.fractions.split(",")]
    llama = [p for p in parts if p != "experts"]
    if llama:
        s = setup(dw.config_of(args.seed), args.weights)
        dense_row(s, say)
        for fraction in fractions:
            if not args.only_small:
                if "width" in llama:
                    for criterion in args.criteria.split(","):
                        structured_rows(s, fraction, criterion, say)
                    if not args.no_oneshot:
                        oneshot_rows(s, fraction, say)
                for part in llama:
                    if part != "width":
                        unit_rows(s, part, fraction, say)
            if not args.no_small:
                small_row(s, fraction, args.weights, say)
        print(report(s))
    if "experts" in parts:
        s = moe_setup(em.config_of(args.seed), args.moe_weights)
        dense_row(s, say)
        for fraction in fractions:
            if not args.only_small:
                unit_rows(s, "experts", fraction, say)
            if not args.no_small:
                moe_small_row(s, fraction, args.moe_weights, say)
        print(report(s))


def dense_row(s: Setup, say: Callable[[str], None]) -> None:
    """The dense model's row."""
    start = time.perf_counter()
    dense = ol.perplexity(s.model, s.heldout)
    s.rows.append(Row("dense", 0.0, "-", "-", dense, sum(p.numel() for p in s.params.values()),
                      time.perf_counter() - start))  # fmt: skip
    say(f"{type(s.model).__name__} dense: perplexity {dense:.3f}")

if __name__ == "__main__":
    main()
