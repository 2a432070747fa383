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

import json
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


def save_checkpoint(directory: Path, *, seed: int = 0, family: str = "llama") -> Path:
    """A tiny model of ``family`` (``tests/_hf.py``'s config; a Llama by default) and its tokenizer saved to
    ``directory``; returns it."""
    words = tokenizer()
    config = _config(family, 2)
    config.vocab_size = len(words)
    config.eos_token_id = words.eos_token_id
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
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


def write_calibration(directory: Path) -> tuple[Path, Path]:
    """``calib.txt`` (:data:`TEXT` 8 times) and ``calib.jsonl`` (its lines as records) in ``directory``."""
    text = directory / "calib.txt"
    text.write_text(TEXT * 8, encoding="utf-8")
    jsonl = directory / "calib.jsonl"
    jsonl.write_text("".join(json.dumps({"text": line}) + "\n" for line in (TEXT * 4).splitlines()), encoding="utf-8")
    return text, jsonl


def windows(path: Path, words: Any, *, samples: int, seq_len: int, seed: int) -> list[torch.Tensor]:
    """The calibration batches the command draws, transcribed from the docs: the documents (the text file whole,
    or each .jsonl record) tokenized without special tokens, joined by the end-of-sequence token, and
    ``samples`` windows of ``seq_len`` tokens at ``torch.randint(0, n - seq_len + 1, (samples,))`` starts."""
    content = path.read_text(encoding="utf-8")
    texts = [json.loads(line)["text"] for line in content.splitlines()] if path.suffix == ".jsonl" else [content]
    ids: list[int] = []
    for i, text in enumerate(texts):
        ids += ([words.eos_token_id] if i else []) + words(text, add_special_tokens=False)["input_ids"]
    starts = torch.randint(0, len(ids) - seq_len + 1, (samples,), generator=torch.Generator().manual_seed(seed))
    return [torch.tensor(ids[s : s + seq_len]).unsqueeze(0) for s in starts.tolist()]


def left_behind(directory: Path, out: str = "out") -> list[str]:
    """What a run left in ``directory`` under ``out``'s name: OUT itself, ``OUT.tmp-*``, ``OUT.old-*``."""
    return sorted(p.name for p in directory.iterdir() if p.name == out or p.name.startswith(f"{out}."))
