"""Text files into token windows: calibration batches for the pruning commands, evaluation batches for ``eval``.

A file is a plain text file (one document, read whole) or, when its name
ends in ``.jsonl``, one JSON object per line with a ``"text"`` string (one
document each; blank lines are skipped). The documents are tokenized by the
checkpoint's own tokenizer without special tokens and concatenated into one
stream, with the tokenizer's end-of-sequence token between two documents
where it has one. From that stream:

- :func:`random_windows`: ``samples`` windows of ``seq_len`` tokens starting
  at ``torch.randint(0, len(stream) - seq_len + 1, (samples,),
  generator=torch.Generator().manual_seed(seed))``, the way SparseGPT's and
  Wanda's C4 loaders draw calibration samples (random windows, here of the
  concatenated stream);
- :func:`consecutive_windows`: the stream cut into consecutive windows of
  ``seq_len`` tokens, the remainder dropped (the WikiText-2 evaluation of
  the same scripts), the first ``samples`` of them if given.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ._options import UsageError

__all__ = ["check_text_file", "consecutive_windows", "documents", "random_windows", "tokens"]

_EXPECTED = 'a text file or a .jsonl of {"text": ...} records'


def check_text_file(argument: str, path: str) -> None:
    """Refuse a missing, unreadable or empty file before anything runs (its documents are read later)."""
    documents(argument, path)


def documents(argument: str, path: str) -> list[str]:
    """The documents of ``path`` (see the module's docstring); an empty or malformed file raises UsageError."""
    where = Path(path)
    if not where.is_file():
        raise UsageError(argument, f"{path} does not exist" if not where.exists() else f"{path} is not a file",
                         _EXPECTED)  # fmt: skip
    try:
        content = where.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(argument, f"{path} is not UTF-8 text ({error.reason} at byte {error.start})",
                         _EXPECTED) from None  # fmt: skip
    found = _jsonl(argument, path, content) if where.suffix == ".jsonl" else [content]
    if not any(d.strip() for d in found):
        raise UsageError(argument, f"{path} is empty", _EXPECTED)
    return found


def _jsonl(argument: str, path: str, content: str) -> list[str]:
    found = []
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record: Any = json.loads(line)
        except json.JSONDecodeError as error:
            raise UsageError(argument, f"{path} line {number} is not JSON ({error.msg})", _EXPECTED) from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise UsageError(argument, f"{path} line {number} has no \"text\" string", _EXPECTED)
        found.append(record["text"])
    return found


def tokens(
    argument: str,
    path: str,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    step: Callable[[], None] = lambda: None,
) -> torch.Tensor:
    """The 1-D stream of token ids of ``texts``, ``path``'s documents (``step()`` after each, for a bar)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    ids: list[int] = []
    for i, document in enumerate(texts):
        if i and eos is not None:
            ids.append(int(eos))
        ids.extend(tokenizer(document, add_special_tokens=False)["input_ids"])
        step()
    if not ids:
        raise UsageError(argument, f"{path} tokenizes to no tokens", _EXPECTED)
    return torch.tensor(ids, dtype=torch.long)


def _enough(argument: str, path: str, stream: torch.Tensor, seq_len: int) -> None:
    if len(stream) < seq_len:
        raise UsageError(argument, f"{path} tokenizes to {len(stream)} tokens, fewer than --seq-len {seq_len}",
                         f"at least {seq_len} tokens of text (or a smaller --seq-len)")  # fmt: skip


def random_windows(
    argument: str, path: str, stream: torch.Tensor, *, samples: int, seq_len: int, seed: int
) -> list[torch.Tensor]:
    """``samples`` windows of ``seq_len`` tokens at seeded random starts, each a ``(1, seq_len)`` batch."""
    _enough(argument, path, stream, seq_len)
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - seq_len + 1, (samples,), generator=generator)
    return [stream[s : s + seq_len].unsqueeze(0) for s in starts.tolist()]


def consecutive_windows(
    argument: str, path: str, stream: torch.Tensor, *, seq_len: int, samples: int | None, batch_size: int
) -> list[torch.Tensor]:
    """The stream cut into windows of ``seq_len`` tokens (the first ``samples``), stacked ``batch_size`` at a time."""
    _enough(argument, path, stream, seq_len)
    count = len(stream) // seq_len if samples is None else min(samples, len(stream) // seq_len)
    windows = stream[: count * seq_len].view(count, seq_len)
    return list(torch.split(windows, batch_size))


def batch_count(batches: Sequence[torch.Tensor]) -> int:
    """The windows in ``batches``."""
    return sum(len(b) for b in batches)
