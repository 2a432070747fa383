"""A tiny Llama checkpoint with an offline tokenizer, and ``funcprune`` run in a subprocess on it.

The tokenizer is a byte-level BPE trained here on :data:`TEXT` (``tokenizers``,
wrapped in ``PreTrainedTokenizerFast``, ``<eos>`` its end-of-sequence token);
the model a ``LlamaForCausalLM`` from ``tests/_hf.py``'s tiny Llama config
(2 layers, hidden 32, 4 heads in 2 KV groups, MLP 48) with that vocabulary,
seeded. Both are saved to a directory, as the docs' page does.

The command runs as ``python -m funcprune._cli`` with this working tree
first on ``PYTHONPATH``: the same ``main`` the installed ``funcprune``
script calls (``[project.scripts]``), on the package under test whether or
not an install of it (editable, elsewhere, or none) put a script on PATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from _hf import _config, transformers

ROOT = Path(__file__).resolve().parents[2]

#: The text the tokenizer is trained on and the calibration and evaluation files are made of.
TEXT = (
    "the quick brown fox jumps over the lazy dog while the cat sleeps in the sun\n"
    "pruning removes weights from a network and a sparse model can be smaller and faster\n"
    "one shot pruning calibrates each block on a few windows of text and keeps the weights that matter\n"
    "structured pruning removes whole heads and channels so that the model shrinks for real\n"
)


def tokenizer() -> Any:
    """A byte-level BPE tokenizer trained on :data:`TEXT` (about 300 tokens), offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<eos>"], show_progress=False)  # fmt: skip
    bpe.train_from_iterator(TEXT.splitlines(), trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>")


def save_checkpoint(directory: Path, *, seed: int = 0) -> Path:
    """A tiny Llama and its tokenizer saved to ``directory``; returns it."""
    words = tokenizer()
    config = _config("llama", 2)
    config.vocab_size = len(words)
    config.eos_token_id = words.eos_token_id
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    words.save_pretrained(directory)
    return directory


def funcprune(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``funcprune *args`` (``python -m funcprune._cli``) on this working tree, in ``cwd``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["HF_HUB_OFFLINE"] = "1"
    command = [sys.executable, "-m", "funcprune._cli", *map(str, args)]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)
