"""One-shot pruning of a small language model, block by block: Wanda against magnitude.

A decoder-only transformer built here (no download) learns a synthetic
language generated here: a lexicon of random words, each word followed by one
of a few successors with fixed probabilities, words separated by a space
token. Predicting the next token takes the spelling of the current word and
the identity of the previous one, so the model must use its attention and
its MLPs, and perplexity on held-out text measures how much of the language
it knows: the uniform guess scores the vocabulary size, the source itself
(its entropy rate) a little above 1.

The trained model is then pruned once, without retraining, to 50% of every
output row and to 2:4 (two of every four consecutive inputs of an output),
every Linear weight of its blocks, with two criteria: magnitude (``|W|``)
and Wanda (``|W|`` times the L2 norm of its input feature over calibration
tokens; Sun et al. 2023, "A Simple and Effective Pruning Approach for Large
Language Models"). The embeddings and the output head, whose weight is tied
to the token embedding, stay dense.

Wanda runs block by block as in the paper's code: the calibration batches go
through the embeddings once; then, for each block in turn, the input norms of
its Linears are collected from the hidden states that reach it, its masks
computed, and the hidden states advanced through the *pruned* block, so that
later blocks are calibrated on what the pruned model computes. Only one
block's input and output hidden states over the calibration set are held at
a time. The model is never modified: masks are a dict, and the pruned block
runs through :func:`funcprune.functional_call_masked`.

Run it (about a minute on a 2-core CPU VM, at 1 thread; ``--quick``, a
smaller model trained less: about 8 seconds)::

    python examples/oneshot_llm.py [--quick] [--seed N]

It is also a module: ``tests/test_oneshot_llm.py`` imports it.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import funcprune as fp

Tensor = torch.Tensor


@dataclass(frozen=True)
class Config:
    """The sizes of the language, the model, its training and its calibration.

    Attributes:
        vocab: tokens, the space (token 0) included.
        words: words in the lexicon, each 2 to 5 letters (tokens 1 to ``vocab - 1``).
        successors: the words that may follow a word.
        width: the model's hidden size (the MLP's is 4 times it).
        heads: attention heads.
        blocks: transformer blocks.
        context: tokens per sequence.
        batch: sequences per training step.
        steps: training steps (AdamW, linear warm-up then linear decay).
        lr: the peak learning rate.
        train_sequences: sequences in the training set.
        calibration_batches: calibration batches, as in Wanda's 128 sequences.
        calibration_batch: sequences per calibration batch.
        heldout_sequences: held-out sequences for perplexity.
        seed: seeds the language, the splits, the initialization and the batches.
    """

    vocab: int = 64
    words: int = 256
    successors: int = 4
    width: int = 96
    heads: int = 4
    blocks: int = 3
    context: int = 48
    batch: int = 32
    steps: int = 800
    lr: float = 5e-3
    train_sequences: int = 16384
    calibration_batches: int = 8
    calibration_batch: int = 16
    heldout_sequences: int = 512
    seed: int = 0

    @staticmethod
    def quick(seed: int = 0) -> Config:
        """A configuration that trains and prunes in a few seconds on 2 cores."""
        return Config(
            words=64, width=64, blocks=2, context=32, steps=250, lr=6e-3, train_sequences=4096,
            calibration_batches=4, calibration_batch=16, heldout_sequences=256, seed=seed,
        )  # fmt: skip


# --------------------------------------------------------------------------- the language


@dataclass(frozen=True)
class Language:
    """A random language of words: a lexicon and, for each word, its possible successors.

    Attributes:
        spellings: ``(words, 6)`` tokens of each word followed by the space
            (token 0), padded with -1.
        successors: ``(words, successors)`` the words that may follow each word.
        probs: ``(successors,)`` the probability of each successor (the same
            for every word; the successors themselves differ).
    """

    spellings: Tensor
    successors: Tensor
    probs: Tensor

    def entropy_rate(self) -> float:
        """The source's entropy in nats per token: no model can beat ``exp`` of it.

        Words are uniquely spelled and separated by spaces, so the token
        stream and the word chain determine each other: the entropy per token
        is the chain's entropy per word over the mean tokens per word (space
        included), both under the chain's stationary distribution.
        """
        words = self.successors.shape[0]
        chain = torch.zeros(words, words, dtype=torch.float64)
        chain.scatter_add_(1, self.successors, self.probs.double().expand(words, -1))
        stationary = torch.full((words,), 1.0 / words, dtype=torch.float64)
        for _ in range(1000):  # the lazy chain: the same stationary distribution, never periodic
            stationary = 0.5 * (stationary + stationary @ chain)
        tokens_per_word = float(stationary @ (self.spellings >= 0).sum(1).double())
        per_word = -float((self.probs.double() * self.probs.double().log()).sum())
        return per_word / tokens_per_word


def make_language(config: Config) -> Language:
    """The language of ``config``: distinct random spellings, random successors."""
    generator = torch.Generator().manual_seed(config.seed)
    spellings: dict[tuple[int, ...], None] = {}
    while len(spellings) < config.words:
        length = int(torch.randint(2, 6, (), generator=generator))
        letters = torch.randint(1, config.vocab, (length,), generator=generator)
        spellings[tuple(letters.tolist())] = None
    table = torch.full((config.words, 6), -1, dtype=torch.long)
    for w, spelling in enumerate(spellings):
        table[w, : len(spelling) + 1] = torch.tensor([*spelling, 0])
    successors = torch.stack(
        [torch.randperm(config.words, generator=generator)[: config.successors] for _ in range(config.words)]
    )
    probs = 1.0 / torch.arange(1, config.successors + 1, dtype=torch.float32)  # Zipf
    return Language(table, successors, probs / probs.sum())


def sample(language: Language, sequences: int, length: int, generator: torch.Generator) -> Tensor:
    """``(sequences, length)`` tokens: windows of independent texts, each starting anywhere in a word."""
    words = language.successors.shape[0]
    count = length // 3 + 3  # a word and its space take at least 3 tokens
    chain = [torch.randint(0, words, (sequences,), generator=generator)]
    choices = torch.multinomial(language.probs, sequences * count, replacement=True, generator=generator)
    for choice in choices.view(count, sequences):
        chain.append(language.successors[chain[-1], choice])
    spelled = language.spellings[torch.stack(chain, 1)].flatten(1)  # (sequences, tokens with -1 pads)
    starts = torch.randint(0, 5, (sequences,), generator=generator)
    return torch.stack(
        [row[row >= 0][int(start) : int(start) + length] for row, start in zip(spelled, starts)]
    )


@dataclass(frozen=True)
class Splits:
    """Token data: ``(sequences, context)`` tensors drawn independently from one language.

    Attributes:
        train: the training set.
        calibration: the calibration batches, one tensor each.
        heldout: the held-out sequences perplexity is measured on.
    """

    train: Tensor
    calibration: list[Tensor]
    heldout: Tensor


def make_splits(language: Language, config: Config) -> Splits:
    """Training, calibration and held-out tokens, each from its own seeded generator."""

    def draw(sequences: int, stream: int) -> Tensor:
        generator = torch.Generator().manual_seed(1000 * config.seed + stream)
        return sample(language, sequences, config.context, generator)

    calibration = draw(config.calibration_batches * config.calibration_batch, 2)
    return Splits(
        train=draw(config.train_sequences, 1),
        calibration=list(torch.split(calibration, config.calibration_batch)),
        heldout=draw(config.heldout_sequences, 3),
    )


# --------------------------------------------------------------------------- the model


class Attention(nn.Module):
    """Causal multi-head self-attention from four Linear projections: q, k, v and out."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape

        def split(y: Tensor) -> Tensor:
            return y.view(batch, length, self.heads, width // self.heads).transpose(1, 2)

        y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True)
        out: Tensor = self.out(y.transpose(1, 2).reshape(batch, length, width))
        return out


class Block(nn.Module):
    """A pre-LayerNorm transformer block: attention, then an MLP (fc1, GELU, fc2)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        out: Tensor = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return out


class TinyLM(nn.Module):
    """A decoder-only transformer: token and position embeddings, blocks, a final
    LayerNorm, and an output head whose weight is the token embedding's (tied)."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.tok = nn.Embedding(config.vocab, config.width)
        self.pos = nn.Embedding(config.context, config.width)
        self.blocks = nn.ModuleList(Block(config.width, config.heads) for _ in range(config.blocks))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab, bias=False)
        self.head.weight = self.tok.weight
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def embed(self, tokens: Tensor) -> Tensor:
        """The hidden states entering the first block."""
        positions = torch.arange(tokens.shape[-1], device=tokens.device)
        hidden: Tensor = self.tok(tokens) + self.pos(positions)
        return hidden

    def readout(self, hidden: Tensor) -> Tensor:
        """The logits from the hidden states leaving the last block."""
        logits: Tensor = self.head(self.norm(hidden))
        return logits

    def forward(self, tokens: Tensor) -> Tensor:
        hidden = self.embed(tokens)
        for block in self.blocks:
            hidden = block(hidden)
        return self.readout(hidden)


def train_(model: TinyLM, tokens: Tensor, config: Config) -> list[float]:
    """Train ``model`` in place on next-token prediction; returns the loss of every step.

    AdamW (betas 0.9, 0.95, weight decay 0.01 on the weight matrices),
    ``config.lr`` after a linear warm-up over the first 10% of the steps,
    then a linear decay to zero; batches drawn with their own seeded
    generator.
    """
    matrices = [p for p in model.parameters() if p.dim() == 2]
    others = [p for p in model.parameters() if p.dim() != 2]
    groups = [{"params": matrices, "weight_decay": 0.01}, {"params": others, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(1000 * config.seed + 4)
    warmup = max(1, config.steps // 10)
    losses = []
    model.train()
    for step in range(config.steps):
        scale = min((step + 1) / warmup, (config.steps - step) / (config.steps - warmup))
        for group in optimizer.param_groups:
            group["lr"] = config.lr * scale
        batch = tokens[torch.randint(0, len(tokens), (config.batch,), generator=generator)]
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad()
        torch.autograd.backward(loss)
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def perplexity(model: TinyLM, tokens: Tensor, masks: fp.Masks | None = None, *, batch: int = 64) -> float:
    """``exp`` of the mean next-token loss on ``tokens``, of the model pruned by ``masks``."""
    params = dict(model.named_parameters())
    total = 0.0
    with torch.no_grad():
        for chunk in torch.split(tokens, batch):
            logits = fp.functional_call_masked(model, params, masks or {}, chunk[:, :-1])
            total += float(F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum"))
    return math.exp(total / (tokens.shape[0] * (tokens.shape[1] - 1)))


# --------------------------------------------------------------------------- pruning


def linear_names(model: TinyLM) -> list[str]:
    """The weights to prune: every Linear of the blocks; not the embeddings, not the head.

    ``fp.prunable(model)`` leaves out the embeddings and the head, whose
    weight is tied to the token embedding (``outputs=True`` would list it,
    as ``tok.weight``, the first name ``named_parameters()`` gives it).
    """
    return fp.prunable(model)


def magnitude_masks(model: TinyLM, spec: fp.Spec) -> fp.Masks:
    """Masks of every Linear weight of the blocks by ``spec`` on the weights themselves."""
    with torch.no_grad():
        return fp.Plan({name: spec for name in linear_names(model)})(dict(model.named_parameters()))


def wanda_masks(model: TinyLM, calibration: Sequence[Tensor], spec: fp.Spec) -> fp.Masks:
    """Wanda masks of every Linear weight of the blocks by ``spec``, block by block.

    The calibration tokens go through the embeddings; then each block in
    turn gets its Linears' input norms from the hidden states that reach it
    (through the dense block), its masks from the Wanda scores, and passes
    the hidden states on through the block pruned by those masks. Held at a
    time: one block's input and output hidden states over the calibration
    set, and one batch's activations inside the block.

    Args:
        model: the trained model; it is not modified.
        calibration: batches of ``(sequences, length)`` tokens.
        spec: the mask shape and sparsity, such as ``fp.NM(2, 4)`` or
            ``fp.PerSlice(fp.L1Unstructured(0.5), dim=0)``.

    Returns:
        Masks keyed like ``model.named_parameters()``, one per Linear weight
        of the blocks.
    """
    masks: fp.Masks = {}
    with torch.no_grad():
        hidden = [model.embed(tokens) for tokens in calibration]
        for i, block in enumerate(model.blocks):
            params = dict(block.named_parameters())
            names = fp.prunable(block)
            norms = fp.input_norms(block, hidden, names)
            block_masks = fp.Plan({name: spec for name in names})(params, scores=fp.wanda(params, norms))
            hidden = [fp.functional_call_masked(block, params, block_masks, h) for h in hidden]
            masks.update({f"blocks.{i}.{name}": mask for name, mask in block_masks.items()})
    return masks


# --------------------------------------------------------------------------- the run

#: The mask shapes compared, at 50% sparsity each.
SHAPES: dict[str, fp.Spec] = {
    "50% per row": fp.PerSlice(fp.L1Unstructured(0.5), dim=0),
    "2:4": fp.NM(2, 4),
}


@dataclass(frozen=True)
class Row:
    """One line of the table: a method, a mask shape, and what it gives."""

    method: str
    shape: str
    sparsity: float
    perplexity: float


@dataclass(frozen=True)
class Result:
    """What :func:`run` measured, with the model and data it used."""

    config: Config
    language: Language
    splits: Splits
    model: TinyLM
    losses: list[float]
    masks: dict[tuple[str, str], fp.Masks]
    rows: list[Row]
    seconds: dict[str, float]

    def perplexity(self, method: str, shape: str = "-") -> float:
        """The held-out perplexity of one row."""
        return next(r.perplexity for r in self.rows if (r.method, r.shape) == (method, shape))


def prune_all(model: TinyLM, calibration: Sequence[Tensor]) -> dict[tuple[str, str], fp.Masks]:
    """The masks of both criteria at both shapes, keyed by (method, shape)."""
    out: dict[tuple[str, str], fp.Masks] = {}
    for shape, spec in SHAPES.items():
        out["magnitude", shape] = magnitude_masks(model, spec)
        out["wanda", shape] = wanda_masks(model, calibration, spec)
    return out


def run(config: Config) -> Result:
    """Make the language and its splits, train the model, prune it, measure perplexities."""
    seconds = {}
    start = time.perf_counter()
    language = make_language(config)
    splits = make_splits(language, config)
    torch.manual_seed(config.seed)
    model = TinyLM(config)
    losses = train_(model, splits.train, config)
    seconds["train"] = time.perf_counter() - start
    rows = [Row("dense", "-", 0.0, perplexity(model, splits.heldout))]
    start = time.perf_counter()
    all_masks = prune_all(model, splits.calibration)
    seconds["prune"] = time.perf_counter() - start
    for (method, shape), masks in all_masks.items():
        sparsity = fp.sparsity_report(masks).fraction
        rows.append(Row(method, shape, sparsity, perplexity(model, splits.heldout, masks)))
    rows[1:] = sorted(rows[1:], key=lambda r: (list(SHAPES).index(r.shape), r.method))
    return Result(config, language, splits, model, losses, all_masks, rows, seconds)


def report(result: Result) -> str:
    """The table :func:`main` prints."""
    config, model = result.config, result.model
    heldout = result.splits.heldout
    calibration_tokens = sum(batch.numel() for batch in result.splits.calibration)
    weights = sum(dict(model.named_parameters())[n].numel() for n in linear_names(model))
    lines = [
        f"language: {config.words} words over {config.vocab - 1} letters and a space, "
        f"{config.successors} possible successors per word",
        f"model: {config.blocks} blocks, width {config.width}, {config.heads} heads, "
        f"{sum(p.numel() for p in model.parameters())} parameters ({weights} in the pruned Linears)",
        f"trained {config.steps} steps of {config.batch}x{config.context} tokens "
        f"in {result.seconds['train']:.1f} s; final training loss {result.losses[-1]:.3f}",
        f"calibration: {config.calibration_batches} batches, {calibration_tokens} tokens; "
        f"pruning (4 mask sets) took {result.seconds['prune']:.1f} s",
        f"held-out: {heldout.numel()} tokens; uniform guess perplexity {config.vocab}, "
        f"source entropy rate {math.exp(result.language.entropy_rate()):.2f} (lower bound)",
        "",
        f"{'method':<10} {'mask shape':<12} {'sparsity':>8}  {'perplexity':>10}",
    ]
    for row in result.rows:
        lines.append(f"{row.method:<10} {row.shape:<12} {100 * row.sparsity:7.1f}%  {row.perplexity:10.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python examples/oneshot_llm.py [--quick] [--seed N]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smaller model, trained less (seconds)")
    parser.add_argument("--seed", type=int, default=0, help="seeds everything (default 0)")
    args = parser.parse_args(argv)
    config = Config.quick(args.seed) if args.quick else Config(seed=args.seed)
    # The model's ops are too small to gain from a second thread, and they slow
    # down many times over when another process keeps the other core busy.
    torch.set_num_threads(1)
    print(report(run(config)))


if __name__ == "__main__":
    main()
