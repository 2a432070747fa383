"""Checkpoint directories: the one read (checked, then loaded) and the one written (staged, then renamed).

Reading: MODEL_DIR must be a directory with a ``config.json`` whose
``model_type`` the installed transformers knows (``AutoConfig``). A
checkpoint that ``fp.shrink`` wrote with its record (``funcprune_shrunk``
in the config: widths that differ by layer, heads the config cannot say)
loads through ``fp.load_shrunk``; any other through
``AutoModelForCausalLM.from_pretrained``. Nothing is downloaded
(``local_files_only``).

Writing: :func:`staged` makes ``OUT.tmp-XXXX`` beside OUT, yields it for the
run to fill, and renames it to OUT only when the run returned; on any
exception (KeyboardInterrupt included) it is removed and the exception goes
on. With ``overwrite``, an existing OUT is renamed away (``OUT.old-XXXX``)
just before, and removed just after, the rename into place.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

import funcprune as fp

from ._options import UsageError

__all__ = ["Loaded", "bars", "check_model_dir", "check_out", "load", "staged", "transformers"]

_CHECKPOINT = "a transformers checkpoint directory (config.json and its weights)"


def transformers() -> types.ModuleType:
    """transformers, imported (with the stub docs/development.md describes for a torchvision whose C ops fail).

    torchvision registers meta kernels for its C ops when imported, and a
    CUDA build of it beside a CPU torch fails there; transformers imports
    torchvision when it is installed. The commands use no torchvision op, so
    the module that registers them is stubbed unless torchvision was
    imported already.
    """
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    try:
        import transformers as module
    except ImportError:
        raise UsageError("transformers", "not installed", 'pip install "funcprune[hf]"') from None

    return module


@contextmanager
def bars(enabled: bool) -> Iterator[None]:
    """transformers' own progress bars (loading, saving) on or off while entered, as they were after."""
    logging = transformers().utils.logging
    before = logging.is_progress_bar_enabled()
    (logging.enable_progress_bar if enabled else logging.disable_progress_bar)()
    try:
        yield
    finally:
        (logging.enable_progress_bar if before else logging.disable_progress_bar)()


def check_model_dir(path: str) -> dict[str, Any]:
    """``path``'s config as a dict, if it is a checkpoint this transformers can build; else UsageError."""
    where = Path(path)
    if not where.exists():
        raise UsageError("MODEL_DIR", f"{path} does not exist", _CHECKPOINT)
    if not where.is_dir():
        raise UsageError("MODEL_DIR", f"{path} is not a directory", _CHECKPOINT)
    config = where / "config.json"
    if not config.is_file():
        raise UsageError("MODEL_DIR", f"{path} has no config.json", _CHECKPOINT)
    try:
        content = json.loads(config.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError("MODEL_DIR", f"{config} is not JSON ({error})", _CHECKPOINT) from None
    if not isinstance(content, dict):
        raise UsageError("MODEL_DIR", f"{config} holds no JSON object", _CHECKPOINT)
    kind = content.get("model_type")
    mapping = transformers().models.auto.configuration_auto.CONFIG_MAPPING
    if not isinstance(kind, str) or kind not in mapping:
        version = transformers().__version__
        raise UsageError("MODEL_DIR", f"{config} has model_type {kind!r}, unknown to transformers {version}",
                         _CHECKPOINT)  # fmt: skip
    return content


def check_out(path: str | None, overwrite: bool) -> Path:
    """OUT_DIR, checked: given, not existing (unless ``overwrite``: then a directory), its parent a directory."""
    if path is None:
        raise UsageError("--out", "missing", "the directory to write (--out OUT_DIR or out = ... in the recipe)")
    where = Path(path)
    if where.exists() and not overwrite:
        raise UsageError("--out", f"{path} exists", "a path that does not exist (or --overwrite to replace it)")
    if where.exists() and not where.is_dir():
        raise UsageError("--out", f"{path} exists and is not a directory", "a directory to replace, or a new path")
    if not where.resolve().parent.is_dir():
        raise UsageError("--out", f"the parent of {path} is not a directory", "a path in an existing directory")
    return where


class Loaded:
    """A checkpoint loaded: its model (a transformers ``PreTrainedModel``, in eval mode), its tokenizer, and
    how it was loaded (``"from_pretrained"`` or ``"fp.load_shrunk"``)."""

    def __init__(self, model: Any, tokenizer: Any, loader: str) -> None:
        self.model, self.tokenizer, self.loader = model, tokenizer, loader


def load(path: str, config: dict[str, Any], *, dtype: str, device: str | None, tokenizer: bool = True) -> Loaded:
    """The checkpoint at ``path`` (checked by :func:`check_model_dir`, whose config is ``config``)."""
    t = transformers()
    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype), "local_files_only": True}
    if "funcprune_shrunk" in config:
        model, loader = fp.load_shrunk(path, **kwargs), "fp.load_shrunk"
    else:
        model, loader = t.AutoModelForCausalLM.from_pretrained(path, **kwargs), "from_pretrained"
    if device is not None:
        model = model.to(device)
    words = t.AutoTokenizer.from_pretrained(path, local_files_only=True) if tokenizer else None
    return Loaded(model.eval(), words, loader)


@contextmanager
def staged(out: Path, *, overwrite: bool) -> Iterator[Path]:
    """A temporary sibling of ``out`` to write into, renamed to ``out`` at the end (see the module's docstring)."""
    parent = out.resolve().parent
    tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.tmp-", dir=parent))
    try:
        yield tmp
        _into_place(tmp, out, overwrite=overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _into_place(tmp: Path, out: Path, *, overwrite: bool) -> None:
    """``tmp`` renamed to ``out``; an existing ``out`` (with ``overwrite``) moved away first and removed after,
    or put back if the rename fails."""
    old = None
    try:
        if out.exists() and overwrite:
            old = Path(tempfile.mkdtemp(prefix=f"{out.name}.old-", dir=out.resolve().parent))
            out.rename(old / out.name)
        tmp.rename(out)
    except BaseException:
        if old is not None and (old / out.name).exists() and not out.exists():
            (old / out.name).rename(out)
            old.rmdir()
        raise
    if old is not None:
        shutil.rmtree(old)
