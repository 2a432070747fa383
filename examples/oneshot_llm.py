"""One-shot pruning of a Llama trained here: magnitude, Wanda and SparseGPT, with and without OWL.

A ``transformers.LlamaForCausalLM`` with grouped-query attention (half as
many key/value heads as query heads) is built from a small ``LlamaConfig``,
randomly initialized (seeded), and trained here for a few minutes on a text
corpus that ships with Python: the docstrings of a fixed, sorted list of
modules of Python 3.11's standard library (:data:`MODULES`; each module's
own docstring and those of its public functions, classes and methods, read
from ``__doc__``, each text once: 2743 documents, 701,315 characters on
Python 3.11.7). Nothing is downloaded: the tokens are the text's UTF-8
bytes (a vocabulary of 256, no tokenizer), and each document (one
docstring) goes whole to one split, drawn by the seed: 5% to calibration,
5% to held-out, the rest to training.

The trained model is then pruned once, without retraining, by
:func:`funcprune.oneshot`, one call per row of the table: every Linear
weight of the decoder blocks (the query, key, value and output projections
and the gate, up and down projections of the MLPs; the embeddings and
``lm_head`` stay dense) to

- 50% of each weight (``fp.L1Unstructured(0.5)``) and 2:4
  (``fp.NM(2, 4)``: 2 of every 4 consecutive inputs of each output), and
- 70% of each weight, the same in every block (``allocation="uniform"``)
  or per block by OWL (``allocation="owl"``: blocks whose Wanda scores have
  more outliers keep more weights; the blocks' sparsities span 16 points
  and average to 70%; Yin et al. 2023, "Outlier Weighed Layerwise
  Sparsity"),

each by three criteria: magnitude (``|W|``), Wanda (``|W|`` times the norm
of its input feature over the calibration tokens; Sun et al. 2023) and
SparseGPT (which also updates the weights it keeps to reconstruct each
layer's outputs on the calibration tokens; Frantar and Alistarh 2023).
The model is never modified: each call returns the parameters (SparseGPT's
updated ones) and the masks as dicts, the pruned model runs through
:func:`funcprune.functional_call_masked`, and the perplexity of each is
measured on the held-out split (``exp`` of the mean next-token loss, per
byte). One pruned model (SparseGPT 2:4) is saved with :func:`funcprune.bake`
and ``save_pretrained``, reloaded with ``LlamaForCausalLM.from_pretrained``
and measured again.

What a model this small can show: the pipeline, on a real ``transformers``
Llama with GQA, with the same names and calls as on a published checkpoint;
masks with exactly the sparsity asked for (every weight, every 2:4 group,
every OWL block); embeddings and head left dense; SparseGPT changing only
the weights it prunes; a baked model that saves, reloads and gives the
masked one's perplexity; and that pruning costs perplexity, more at 70%
than at 50%. What it cannot show is how the methods compare on large
language models. The published orderings (Wanda and SparseGPT far ahead of
magnitude on LLaMA at 50% and 2:4, OWL's gains at 70%) come from models of
billions of parameters trained on a trillion tokens or more, whose
activations have a few input features of very large norm, the outliers
Wanda and OWL are built on. A model of 1.7 million parameters trained for
minutes on 0.6 MB of text need not have them: here Wanda against
magnitude, and OWL against uniform, differ by about as much as a row
changes with the seed, and swap places from one seed to the next;
SparseGPT came first in every row of the two full runs made (seeds 0 and
1), but not in every row of every quick run. Perplexities are per byte,
not per (sub)word token: they are not comparable with published figures.
Times are those of a small model on a CPU.

Run it (600 training steps: 5 to 8 minutes on 2 shared CPU cores at 1
thread, then 12 pruning calls of a few seconds each; ``--quick``, a tiny
model trained a few seconds: 10 to 15 seconds in all)::

    python examples/oneshot_llm.py [--quick] [--steps N] [--seed N] [--threads N]

It is also a module (:func:`run`, :func:`report`, :func:`main`):
``tests/test_oneshot_llm.py`` imports it.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import inspect
import math
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
import transformers

import funcprune as fp

Tensor = torch.Tensor

#: The standard-library modules whose docstrings make the corpus, sorted. All
#: pure Python or always built in, none deprecated, the same on every platform.
MODULES: tuple[str, ...] = (
    "abc", "argparse", "ast", "base64", "bdb", "bisect", "calendar", "cmd", "code", "codecs",
    "codeop", "collections", "colorsys", "compileall", "concurrent.futures", "configparser",
    "contextlib", "copy", "copyreg", "csv", "dataclasses", "datetime", "difflib", "dis", "doctest",
    "email.message", "email.parser", "email.utils", "enum", "filecmp", "fileinput", "fnmatch",
    "fractions", "ftplib", "functools", "getopt", "gettext", "glob", "graphlib", "gzip", "heapq",
    "hmac", "html", "html.parser", "http.client", "http.cookiejar", "http.cookies", "http.server",
    "imaplib", "inspect", "io", "ipaddress", "itertools", "json", "json.decoder", "json.encoder",
    "keyword", "linecache", "locale", "logging", "logging.handlers", "mailbox", "math", "mimetypes",
    "netrc", "numbers", "operator", "optparse", "pathlib", "pdb", "pickle", "pickletools", "pkgutil",
    "platform", "plistlib", "poplib", "pprint", "profile", "pstats", "py_compile", "pyclbr", "pydoc",
    "queue", "quopri", "random", "re", "reprlib", "rlcompleter", "runpy", "sched", "secrets",
    "shelve", "shlex", "shutil", "smtplib", "socketserver", "stat", "statistics", "string",
    "struct", "symtable", "tabnanny", "tarfile", "tempfile", "textwrap", "threading", "timeit",
    "tokenize", "trace", "traceback", "types", "unittest.case", "unittest.loader",
    "unittest.mock", "unittest.result", "unittest.runner", "unittest.suite", "urllib.parse",
    "urllib.request", "urllib.robotparser", "uuid", "warnings", "wave", "weakref",
    "wsgiref.handlers", "wsgiref.simple_server", "wsgiref.util", "wsgiref.validate",
    "xml.dom.minidom", "xml.etree.ElementTree", "xml.sax.handler", "xml.sax.saxutils",
    "xmlrpc.client", "xmlrpc.server", "zipapp", "zipfile", "zipimport",
)  # fmt: skip


@dataclass(frozen=True)
class Config:
    """The sizes of the model, its training, its calibration and its evaluation.

    Attributes:
        hidden: the hidden size.
        layers: decoder blocks.
        heads: query heads.
        kv_heads: key/value heads (grouped-query attention: ``heads // kv_heads`` queries share one).
        intermediate: the MLP's width (a multiple of 4, for 2:4 on ``down_proj``).
        context: tokens (bytes) per sequence.
        batch: sequences per training step.
        steps: training steps (AdamW, a linear warm-up, then a cosine decay to a tenth).
        lr: the peak learning rate.
        calibration: calibration sequences of ``context`` tokens.
        calibration_batch: calibration sequences per batch given to :func:`funcprune.oneshot`.
        heldout: held-out sequences perplexity is measured on, at most.
        sparsity: the sparsity of the 50% rows.
        high: the sparsity of the 70% rows, uniform and OWL.
        splits: the fractions of the documents that go to calibration and to held-out (the rest trains).
        seed: seeds the splits, the initialization and the training batches.
    """

    hidden: int = 192
    layers: int = 4
    heads: int = 6
    kv_heads: int = 3
    intermediate: int = 512
    context: int = 128
    batch: int = 16
    steps: int = 600
    lr: float = 4e-3
    calibration: int = 128
    calibration_batch: int = 32
    heldout: int = 256
    sparsity: float = 0.5
    high: float = 0.7
    splits: tuple[float, float] = (0.05, 0.05)
    seed: int = 0

    @staticmethod
    def quick(seed: int = 0) -> Config:
        """A tiny model, trained a few seconds: the whole run takes 10 to 15 seconds at 1 thread."""
        return Config(
            hidden=32, layers=2, heads=4, kv_heads=2, intermediate=88, context=64, batch=16,
            steps=200, lr=1e-2, calibration=32, calibration_batch=16, heldout=64, seed=seed,
        )  # fmt: skip

    def llama(self) -> transformers.LlamaConfig:
        """The model's configuration: a Llama with grouped-query attention, its own output head."""
        return transformers.LlamaConfig(
            vocab_size=256, hidden_size=self.hidden, intermediate_size=self.intermediate,
            num_hidden_layers=self.layers, num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads, max_position_embeddings=self.context,
            tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, use_cache=False,
        )  # fmt: skip


# --------------------------------------------------------------------------- the corpus


def own_doc(obj: object) -> str:
    """The docstring ``obj`` itself has (not one it inherits), cleaned as ``inspect.cleandoc`` does."""
    doc = getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) else ""


def stdlib_documents(modules: Sequence[str] = MODULES) -> dict[str, str]:
    """The docstrings of ``modules``, keyed by qualified name, sorted: one document each.

    A module's own docstring, then those of its public functions and classes
    (those whose ``__module__`` is the module: none imported from elsewhere)
    and of the public methods of those classes. Empty ones are left out, and
    a text met again under another name (an alias, a docstring copied from
    another) is kept once, under the first name in sorted order, so that no
    text is in two splits.
    """
    documents: dict[str, str] = {}
    seen: set[str] = set()

    def add(name: str, obj: object) -> None:
        if text := own_doc(obj):
            documents[name] = text

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # importing, not using
        for module_name in modules:
            module = importlib.import_module(module_name)
            add(module_name, module)
            for name, obj in sorted(vars(module).items()):
                if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                    continue
                if inspect.isclass(obj):
                    add(f"{module_name}.{name}", obj)
                    for attr, member in sorted(vars(obj).items()):
                        method = inspect.isfunction(member) or inspect.ismethoddescriptor(member)
                        if method and not attr.startswith("_"):
                            add(f"{module_name}.{name}.{attr}", member)
                elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
                    add(f"{module_name}.{name}", obj)
    if not documents:
        raise RuntimeError("no docstrings: is Python running with -OO?")
    unique: dict[str, str] = {}
    for name, text in sorted(documents.items()):
        if text not in seen:
            seen.add(text)
            unique[name] = text
    return unique


def encode(documents: Sequence[str]) -> Tensor:
    """The UTF-8 bytes of the documents, each followed by a blank line, as ``int64`` tokens."""
    data = "".join(f"{text}\n\n" for text in documents).encode()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


@dataclass(frozen=True)
class Corpus:
    """The documents and their token streams, one per split.

    Attributes:
        documents: every document, by qualified name.
        train: the training stream.
        calibration: the calibration stream.
        heldout: the held-out stream.
        names: which documents went to each split, by split name.
    """

    documents: dict[str, str]
    train: Tensor
    calibration: Tensor
    heldout: Tensor
    names: dict[str, list[str]]

    @property
    def characters(self) -> int:
        """Characters of all the docstrings."""
        return sum(len(text) for text in self.documents.values())


def make_corpus(config: Config, documents: dict[str, str] | None = None) -> Corpus:
    """Split the documents at random (seeded), whole: calibration, held-out, and training the rest."""
    documents = stdlib_documents() if documents is None else documents
    names = list(documents)
    order = torch.randperm(len(names), generator=torch.Generator().manual_seed(config.seed)).tolist()
    calibration = round(config.splits[0] * len(names))
    heldout = round(config.splits[1] * len(names))
    split = {
        "calibration": sorted(names[i] for i in order[:calibration]),
        "heldout": sorted(names[i] for i in order[calibration : calibration + heldout]),
        "train": sorted(names[i] for i in order[calibration + heldout :]),
    }
    streams = {key: encode([documents[n] for n in value]) for key, value in split.items()}
    return Corpus(documents, streams["train"], streams["calibration"], streams["heldout"], split)


def windows(stream: Tensor, length: int, count: int) -> Tensor:
    """``(count, length)``: consecutive windows of ``stream`` overlapping by one token, so that,
    predicting each window's tokens from those before, every token after the first is predicted once."""
    count = min(count, (len(stream) - 1) // (length - 1))
    return stream[: count * (length - 1) + 1].unfold(0, length, length - 1)


# --------------------------------------------------------------------------- the model


def make_model(config: Config) -> transformers.LlamaForCausalLM:
    """A randomly initialized Llama (seeded by ``config.seed``), in eval mode."""
    torch.manual_seed(config.seed)
    model = transformers.LlamaForCausalLM(config.llama())
    model.train(False)  # eval mode
    return model


def train_(
    model: transformers.PreTrainedModel, stream: Tensor, config: Config, *, router_loss: float = 0.0
) -> list[float]:
    """Train ``model`` in place on next-token prediction; returns the loss of every step.

    Each step takes ``config.batch`` windows of ``config.context + 1`` tokens
    at random offsets of ``stream`` (a seeded generator). AdamW (betas 0.9,
    0.95; weight decay 0.1 on the weight matrices, a mixture of experts'
    stacked ones included), the gradient clipped to norm 1, ``config.lr``
    after a linear warm-up over the first 5% of the steps, then a cosine
    decay to a tenth of it. With ``router_loss``, a mixture-of-experts model
    is asked for its routers' load-balancing loss (``output_router_logits``:
    transformers' ``aux_loss``), added to the loss times ``router_loss``; the
    losses returned are the next-token losses alone.
    """
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": matrices, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(config.seed + 1)
    warmup = max(1, config.steps // 20)
    offsets = torch.arange(config.context + 1)
    losses = []
    model.train()
    for step in range(config.steps):
        progress = max(0.0, (step - warmup) / max(1, config.steps - warmup))
        scale = min((step + 1) / warmup, 0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = config.lr * scale
        starts = torch.randint(0, len(stream) - config.context, (config.batch, 1), generator=generator)
        batch = stream[starts + offsets]
        if router_loss:
            out = model(input_ids=batch[:, :-1], output_router_logits=True)
        else:
            out = model(input_ids=batch[:, :-1])
        loss = F.cross_entropy(out.logits.flatten(0, 1), batch[:, 1:].flatten())
        total = loss + router_loss * out.aux_loss if router_loss else loss
        optimizer.zero_grad()
        torch.autograd.backward(total)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
    model.train(False)
    return losses


def perplexity(
    model: torch.nn.Module,
    tokens: Tensor,
    params: fp.Params | None = None,
    masks: fp.Masks | None = None,
    *,
    batch: int = 32,
) -> float:
    """:func:`funcprune.perplexity` on ``tokens``, each row a sequence: ``exp`` of the mean loss of every token
    after the first, predicted from those before (``input_ids`` all but the last, ``shift_labels`` all but the
    first), by the model run on ``params`` pruned by ``masks`` (:func:`funcprune.functional_call_masked`), or by
    the model itself, called as it is, without either."""
    batches = [{"input_ids": chunk[:, :-1], "shift_labels": chunk[:, 1:]} for chunk in torch.split(tokens, batch)]
    return fp.perplexity(model, batches, params=params, masks=masks).perplexity


# --------------------------------------------------------------------------- pruning


#: The criteria, in the order of the table.
METHODS = ("magnitude", "wanda", "sparsegpt")


@dataclass(frozen=True)
class Setting:
    """A column of the pruning: what each weight keeps, and how the sparsity is spread over the blocks."""

    label: str
    spec: fp.Spec
    allocation: str | None


def settings(config: Config) -> list[Setting]:
    """The table's settings: 50% and 2:4, then the high sparsity, uniform and by OWL."""
    high = f"{100 * config.high:.0f}%"
    return [
        Setting(f"{100 * config.sparsity:.0f}%", fp.L1Unstructured(config.sparsity), "uniform"),
        Setting("2:4", fp.NM(2, 4), "uniform"),
        Setting(high, fp.L1Unstructured(config.high), "uniform"),
        Setting(f"{high} OWL", fp.L1Unstructured(config.high), "owl"),
    ]


@dataclass(frozen=True)
class Row:
    """One line of the table.

    Attributes:
        method: ``"dense"`` or the criterion.
        setting: the setting's label (``"-"`` for the dense model).
        sparsity: the fraction of the pruned weights' entries that are zero.
        perplexity: held-out perplexity.
        seconds: the time :func:`funcprune.oneshot` took.
    """

    method: str
    setting: str
    sparsity: float
    perplexity: float
    seconds: float


@dataclass
class Result:
    """What :func:`run` measured, with the model and data it used.

    Attributes:
        config: the configuration.
        corpus: the documents and token streams.
        model: the trained dense model.
        losses: the training loss of every step.
        calibration: the calibration batches given to :func:`funcprune.oneshot`.
        heldout: the held-out sequences.
        rows: the table, dense first.
        params: what :func:`funcprune.oneshot` returned, by (method, setting).
        masks: what :func:`funcprune.oneshot` returned, by (method, setting).
        saved: which (method, setting) was baked, saved and reloaded.
        reloaded: the reloaded model.
        reloaded_perplexity: its held-out perplexity, run as a plain module.
        seconds: wall times: ``"corpus"``, ``"train"``, ``"prune"`` (every call), ``"save"``.
    """

    config: Config
    corpus: Corpus
    model: transformers.LlamaForCausalLM
    losses: list[float]
    calibration: list[dict[str, Tensor]]
    heldout: Tensor
    rows: list[Row] = field(default_factory=list)
    params: dict[tuple[str, str], dict[str, Tensor]] = field(default_factory=dict)
    masks: dict[tuple[str, str], dict[str, Tensor]] = field(default_factory=dict)
    saved: tuple[str, str] = ("", "")
    reloaded: transformers.LlamaForCausalLM | None = None
    reloaded_perplexity: float = math.nan
    seconds: dict[str, float] = field(default_factory=dict)

    def perplexity(self, method: str, setting: str = "-") -> float:
        """The held-out perplexity of one row."""
        return next(r.perplexity for r in self.rows if (r.method, r.setting) == (method, setting))


def block_sparsities(masks: fp.Masks, layers: int) -> list[float]:
    """The fraction of each decoder block's pruned weights' entries that are zero, block by block."""
    out = []
    for i in range(layers):
        block = [mask for name, mask in masks.items() if name.startswith(f"model.layers.{i}.")]
        out.append(sum(int((~mask).sum()) for mask in block) / sum(mask.numel() for mask in block))
    return out


def save_and_reload(
    model: transformers.LlamaForCausalLM, params: fp.Params, masks: fp.Masks
) -> transformers.LlamaForCausalLM:
    """Bake the pruned model, ``save_pretrained`` it to a temporary directory and load it back."""
    pruned = copy.deepcopy(model)
    pruned.load_state_dict(params, strict=False)  # SparseGPT's updated weights
    pruned = fp.bake(pruned, masks)  # the pruned entries set to zero
    with no_progress_bars(), tempfile.TemporaryDirectory() as directory:
        pruned.save_pretrained(directory)
        reloaded: transformers.LlamaForCausalLM = transformers.LlamaForCausalLM.from_pretrained(directory)
    reloaded.train(False)
    return reloaded


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' progress bars (saving, loading) off, and back as they were after."""
    logging = transformers.utils.logging
    bars = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        if bars:
            logging.enable_progress_bar()  # type: ignore[no-untyped-call]


def run(
    config: Config, *, documents: dict[str, str] | None = None, log: Callable[[str], None] | None = None
) -> Result:
    """Build the corpus, train the model, prune it every way of the table, save one, measure all.

    Args:
        config: the sizes.
        documents: the corpus's documents (default: :func:`stdlib_documents`).
        log: called with a line of progress after training and each pruning (default: silent).
    """
    say = log or (lambda line: None)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    corpus = make_corpus(config, documents)
    seconds["corpus"] = time.perf_counter() - start
    model = make_model(config)
    start = time.perf_counter()
    losses = train_(model, corpus.train, config)
    seconds["train"] = time.perf_counter() - start
    say(f"trained {config.steps} steps in {seconds['train']:.0f} s, final loss {losses[-1]:.3f}")
    count = min(config.calibration, len(corpus.calibration) // config.context)
    sequences = corpus.calibration[: count * config.context].view(count, config.context)
    calibration = [{"input_ids": ids} for ids in torch.split(sequences, config.calibration_batch)]
    heldout = windows(corpus.heldout, config.context + 1, config.heldout)
    result = Result(config, corpus, model, losses, calibration, heldout, seconds=seconds)
    result.rows.append(Row("dense", "-", 0.0, perplexity(model, heldout), 0.0))
    for setting in settings(config):
        for method in METHODS:
            start = time.perf_counter()
            params, masks = fp.oneshot(
                model, calibration, method=method, spec=setting.spec, allocation=setting.allocation
            )
            elapsed = time.perf_counter() - start
            result.params[method, setting.label], result.masks[method, setting.label] = params, masks
            value = perplexity(model, heldout, params, masks)
            result.rows.append(Row(method, setting.label, fp.sparsity_report(masks).fraction, value, elapsed))
            say(f"{method} {setting.label}: perplexity {value:.3f} ({elapsed:.1f} s)")
    seconds["prune"] = sum(row.seconds for row in result.rows)
    start = time.perf_counter()
    result.saved = ("sparsegpt", "2:4")
    result.reloaded = save_and_reload(model, result.params[result.saved], result.masks[result.saved])
    result.reloaded_perplexity = perplexity(result.reloaded, heldout)
    seconds["save"] = time.perf_counter() - start
    return result


def report(result: Result) -> str:
    """The table :func:`main` prints, with what was trained on what."""
    config, corpus, model = result.config, result.corpus, result.model
    names = next(iter(result.masks.values()))
    params = dict(model.named_parameters())
    pruned = sum(params[n].numel() for n in names)
    calibration_tokens = sum(batch["input_ids"].numel() for batch in result.calibration)
    split = ", ".join(f"{key} {len(value)} documents" for key, value in corpus.names.items())
    lines = [
        (
            f"corpus: docstrings of {len(MODULES)} modules of Python {sys.version.split()[0]}'s standard "
            f"library, {len(corpus.documents)} documents, {corpus.characters} characters ({split})"
        ),
        (
            f"tokens (bytes): train {len(corpus.train)}, calibration {len(corpus.calibration)}, "
            f"held-out {len(corpus.heldout)}"
        ),
        (
            f"model: LlamaForCausalLM, {config.layers} layers, hidden {config.hidden}, {config.heads} heads "
            f"({config.kv_heads} key/value heads), MLP {config.intermediate}, context {config.context}; "
            f"{sum(p.numel() for p in model.parameters())} parameters, {pruned} of them in the "
            f"{len(names)} pruned weights"
        ),
        (
            f"trained {config.steps} steps of {config.batch}x{config.context} tokens in "
            f"{result.seconds['train']:.0f} s ({torch.get_num_threads()} threads); "
            f"training loss {result.losses[0]:.2f} -> {result.losses[-1]:.2f} nats"
        ),
        (
            f"calibration: {len(result.calibration)} batches, {calibration_tokens} tokens; "
            f"held-out: {result.heldout.shape[0]} sequences, {result.heldout[:, 1:].numel()} tokens predicted"
        ),
        "",
        f"{'method':<10} {'setting':<8} {'sparsity':>8} {'perplexity':>10} {'oneshot':>8}",
    ]
    for row in result.rows:
        time_ = f"{row.seconds:7.1f}s" if row.method != "dense" else f"{'-':>8}"
        sparsity = f"{100 * row.sparsity:7.1f}%"
        lines.append(f"{row.method:<10} {row.setting:<8} {sparsity} {row.perplexity:10.3f} {time_}")
    high = next(s.label for s in settings(config) if s.allocation == "owl")
    lines.append("")
    for m in METHODS:
        blocks = ", ".join(f"{100 * x:.1f}%" for x in block_sparsities(result.masks[m, high], config.layers))
        lines.append(f"{m} {high}: the blocks' sparsities {blocks}")
    method, setting = result.saved
    lines.append(
        f"{method} {setting}, baked, saved with save_pretrained and reloaded: perplexity "
        f"{result.reloaded_perplexity:.3f} (masked: {result.perplexity(method, setting):.3f}); "
        f"save and reload took {result.seconds['save']:.1f} s"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python examples/oneshot_llm.py [--quick] [--steps N] [--seed N] [--threads N]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a tiny model, trained a few seconds")
    parser.add_argument("--steps", type=int, help="training steps (default: 600, --quick 200)")
    parser.add_argument("--seed", type=int, default=0, help="seeds everything (default 0)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    config = Config.quick(args.seed) if args.quick else Config(seed=args.seed)
    if args.steps is not None:
        config = replace(config, steps=args.steps)
    # A small model's ops gain little from a second thread, and slow down many
    # times over when another process keeps the other core busy.
    torch.set_num_threads(args.threads)
    print(report(run(config, log=lambda line: print(line, file=sys.stderr, flush=True))))


if __name__ == "__main__":
    main()
