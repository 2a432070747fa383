"""The options of the commands, their values checked, and recipe files merged under the flags.

Each option is declared once (:class:`Option`): its flag, the commands that
take it, how a value is read from the command line (a string) and from a
recipe (a TOML value of the types it lists), and its help. The parser and
the recipe reader both use these declarations, so a recipe holds exactly
the options the flags do, under the same names.
"""

from __future__ import annotations

import argparse
import importlib
import math
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, final

import funcprune as fp

__all__ = ["OPTIONS", "COMMANDS", "Option", "UsageError", "Sparsity", "merged", "option_named", "read_recipe"]

#: The commands that take options (``demo`` forwards to the demo's own parser).
COMMANDS = ("oneshot", "structured", "eval", "report")


@final
class UsageError(Exception):
    """Bad input: ``funcprune <cmd>: error: <argument>: <what>, expected <expected>`` and exit code 2."""

    def __init__(self, argument: str, what: str, expected: str) -> None:
        super().__init__(f"{argument}: {what}, expected {expected}")
        self.argument, self.what, self.expected = argument, what, expected


#: A ``--sparsity``: a fraction of each weight, or N:M (``fp.NM``).
Sparsity = float | tuple[int, int]

_SPARSITY_EXPECTED = "a fraction strictly between 0 and 1 (0.5) or N:M with 0 < N < M (2:4)"


def sparsity(text: str) -> Sparsity:
    """``"0.5"`` -> 0.5, ``"2:4"`` -> (2, 4); anything else raises :class:`argparse.ArgumentTypeError`."""
    if ":" in text:
        n, _, m = text.partition(":")
        if not (n.strip().isdigit() and m.strip().isdigit()):
            raise argparse.ArgumentTypeError(f"{text!r} is malformed, expected {_SPARSITY_EXPECTED}")
        pair = int(n), int(m)
        if not 0 < pair[0] < pair[1]:
            raise argparse.ArgumentTypeError(f"{text!r} is out of range, expected {_SPARSITY_EXPECTED}")
        return pair
    return _between_0_and_1(text, _SPARSITY_EXPECTED)


def fraction(text: str) -> float:
    """A fraction strictly between 0 and 1 (structured pruning's share of units)."""
    return _between_0_and_1(text, "a fraction strictly between 0 and 1 (0.3)")


def _between_0_and_1(text: str, expected: str) -> float:
    """``text`` as a float strictly between 0 and 1; otherwise an error saying ``expected``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is malformed, expected {expected}") from None
    if not (math.isfinite(value) and 0 < value < 1):
        raise argparse.ArgumentTypeError(f"{text!r} is out of range, expected {expected}")
    return value


def positive(text: str) -> int:
    """An integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer, expected a positive integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is out of range, expected a positive integer")
    return value


def integer(text: str) -> int:
    """Any integer (a seed)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer, expected an integer") from None


def one_of(name: str, choices: Sequence[str]) -> Callable[[str], str]:
    """A reader accepting one of ``choices`` (a ``name`` such as "method" in its message)."""

    def read(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {name}, expected one of {', '.join(choices)}")
        return text

    read.__name__ = name
    return read


def kinds(text: str) -> tuple[str, ...]:
    """A comma-separated list of unit kinds (``fp.KINDS``), at least one, none repeated."""
    given = tuple(k.strip() for k in text.split(","))
    expected = f"a comma-separated list of {', '.join(fp.KINDS)}"
    for kind in given:
        if kind not in fp.KINDS:
            raise argparse.ArgumentTypeError(f"{kind!r} is not a kind, expected {expected}")
    if len(set(given)) != len(given):
        raise argparse.ArgumentTypeError(f"{text!r} names a kind twice, expected {expected}")
    return given


def text(value: str) -> str:
    """A string as given (a path)."""
    return value


METHODS = ("magnitude", "wanda", "sparsegpt")
DTYPES = ("float32", "bfloat16", "float16", "float64")
SCORES = ("magnitude", "taylor", "fluctuation")


@final
@dataclass(frozen=True, slots=True)
class Option:
    """One option: ``flag`` (``"--seq-len"``, or ``"MODEL_DIR"`` for the positional), the commands taking it,
    its reader, the TOML types a recipe may give it (``bool`` for a switch), its help and metavar."""

    flag: str
    commands: tuple[str, ...]
    read: Callable[[str], Any]
    toml: tuple[type, ...]
    help: str
    metavar: str | None = None

    @property
    def key(self) -> str:
        """The option's name in a recipe: the flag without its dashes (``seq-len``); ``model`` for MODEL_DIR."""
        return "model" if self.flag == "MODEL_DIR" else self.flag.removeprefix("--")

    @property
    def dest(self) -> str:
        """The attribute of the parsed namespace: ``seq_len``."""
        return self.key.replace("-", "_")

    @property
    def switch(self) -> bool:
        """Whether it is a flag without a value (``--overwrite``)."""
        return self.toml == (bool,)


_ONESHOT, _STRUCTURED, _EVAL, _REPORT = ("oneshot",), ("structured",), ("eval",), ("report",)
_PRUNE = ("oneshot", "structured")
_ALL = COMMANDS

#: Every option of every command; a command's own are those naming it.
OPTIONS: tuple[Option, ...] = (
    Option("MODEL_DIR", _ALL, text, (str,), "a local transformers checkpoint directory (config.json, weights; "
           "its tokenizer beside them)"),
    Option("--out", _PRUNE, text, (str,), "the directory to write (must not exist, unless --overwrite)", "OUT_DIR"),
    Option("--method", _ONESHOT, one_of("method", METHODS), (str,),
           "the one-shot method: magnitude (|W|), wanda (|W| times input norms) or sparsegpt (also updates the "
           "weights it keeps)", "{" + ",".join(METHODS) + "}"),
    Option("--sparsity", _ONESHOT, sparsity, (str, float),
           "a fraction of each weight (0.5) or N:M (2:4: 2 of every 4 consecutive inputs kept)", "S"),
    Option("--sparsity", _STRUCTURED, fraction, (float,), "the fraction of units to prune (0.3)", "F"),
    Option("--per-row", _ONESHOT, text, (bool,),
           "prune the fraction within each output row of each weight (Wanda's paper default) instead of within "
           "each whole weight (the default here)"),
    Option("--allocation", _ONESHOT, one_of("allocation", ("uniform", "owl")), (str,),
           "uniform (default: the same sparsity in every block) or owl (per-block sparsities from outliers, "
           "averaging S; needs a fraction)", "{uniform,owl}"),
    Option("--calibration", _PRUNE, text, (str,),
           "calibration text: a text file or a .jsonl of {\"text\": ...} records (needed by wanda, sparsegpt, "
           "--allocation owl and the taylor and fluctuation scores)", "FILE"),
    Option("--data", _EVAL, text, (str,), "the text to measure: a text file or a .jsonl of {\"text\": ...} "
           "records", "FILE"),
    Option("--samples", _PRUNE + _EVAL, positive, (int,),
           "calibration windows (default 128); for eval, the most windows measured (default: all)", "N"),
    Option("--seq-len", _PRUNE + _EVAL, positive, (int,), "tokens per window (default 2048)", "L"),
    Option("--seed", _PRUNE, integer, (int,), "the seed that draws the calibration windows (default 0)", "S"),
    Option("--batch-size", _EVAL, positive, (int,), "windows per forward (default 1)", "B"),
    Option("--dtype", _PRUNE + _EVAL, one_of("dtype", DTYPES), (str,),
           "the dtype the model is loaded (and saved) in (default float32)", "{" + ",".join(DTYPES) + "}"),
    Option("--device", _PRUNE + _EVAL, text, (str,), "where the model runs: cpu (default), cuda, cuda:1...",
           "DEVICE"),
    Option("--kinds", _STRUCTURED, kinds, (str, list),
           f"the unit kinds to prune, comma-separated, among {', '.join(fp.KINDS)} (default: the widths inside "
           "the blocks: channels, heads, kv_groups, experts)", "K1,K2"),
    Option("--scope", _STRUCTURED, one_of("scope", ("global", "group")), (str,),
           "global (default: units of every layer ranked together) or group (the fraction in each layer)",
           "{global,group}"),
    Option("--normalize", _STRUCTURED, one_of("normalize", ("none", "mean", "max")), (str,),
           "how each group's unit scores are scaled before they compete globally (default none)",
           "{none,mean,max}"),
    Option("--scores", _STRUCTURED, one_of("score", SCORES), (str,),
           "magnitude (default: L2 norm of each unit's weights), taylor ((w * grad)^2 of the LM loss on the "
           "calibration text) or fluctuation (FLAP's, from the input variance on the calibration text)",
           "{" + ",".join(SCORES) + "}"),
    Option("--stream", _ONESHOT, text, (bool,),
           "read, prune and write the checkpoint one block at a time (fp.oneshot_checkpoint): memory that "
           "grows with a block's size and the embeddings, not with the depth; not with --nproc or --allocation "
           "owl"),
    Option("--nproc", _ONESHOT, positive, (int,),
           "processes that calibrate together (default 1): each reads its share of the calibration windows and "
           "holds its own copy of the model; the statistics are summed across them once per block "
           "(torch.distributed.run, gloo), and every process computes the same masks", "N"),
    Option("--overwrite", _PRUNE, text, (bool,), "replace OUT_DIR if it exists (only once the run succeeded)"),
    Option("--json", _EVAL + _REPORT, text, (bool,), "print one JSON object instead of text"),
    Option("--quiet", _ALL, text, (bool,), "no progress bars and no summary on stderr"),
    Option("--recipe", _PRUNE + _EVAL, text, (), "a TOML file holding these options (see the docs); flags given "
           "here win over it", "FILE.toml"),
)  # fmt: skip

#: Each command's defaults, applied under the recipe and the flags (``None``: no value, checked where needed).
DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    "oneshot": {"allocation": "uniform", "nproc": 1, "stream": False, "samples": 128, "seq_len": 2048, "seed": 0, "dtype": None,
                "per_row": False, "overwrite": False, "quiet": False},
    "structured": {"scope": "global", "normalize": "none", "scores": "magnitude", "samples": 128,
                   "seq_len": 2048, "seed": 0, "dtype": "float32", "overwrite": False, "quiet": False},
    "eval": {"seq_len": 2048, "batch_size": 1, "dtype": "float32", "json": False, "quiet": False},
    "report": {"json": False, "quiet": False},
}  # fmt: skip


def options_of(command: str) -> list[Option]:
    """The options ``command`` takes, in declaration order."""
    return [o for o in OPTIONS if command in o.commands]


def option_named(command: str, key: str) -> Option | None:
    """``command``'s option whose recipe key is ``key``."""
    return next((o for o in options_of(command) if o.key == key), None)


def read_recipe(command: str, path: str) -> dict[str, Any]:
    """The options a recipe file gives ``command``, read by the flags' readers, by ``dest``.

    A recipe is a TOML file of one table per command (``[oneshot]``,
    ``[structured]``, ``[eval]``), each holding that command's option names
    as keys (``method = "sparsegpt"``, ``seq-len = 2048``,
    ``per-row = true``, ``model = "..."`` for MODEL_DIR). Tables of other
    commands are allowed (one file may hold a whole pipeline); any other
    key is an error naming it.
    """
    where = Path(path)
    if not where.is_file():
        raise UsageError("--recipe", f"{path} does not exist" if not where.exists() else f"{path} is not a file",
                         "a TOML recipe file")  # fmt: skip
    toml = _toml()
    try:
        data = toml.loads(where.read_text(encoding="utf-8"))
    except (toml.TOMLDecodeError, UnicodeDecodeError) as error:
        raise UsageError("--recipe", f"{path} is not valid TOML ({error})", "a TOML recipe file") from None
    for table, content in data.items():
        if table not in COMMANDS or table == "report":
            raise UsageError("--recipe", f"{path} has an unknown key {table!r}",
                             "tables named oneshot, structured or eval")  # fmt: skip
        if not isinstance(content, dict):
            raise UsageError("--recipe", f"{path}: {table!r} is a {type(content).__name__}",
                             f"a table [{table}] of options")  # fmt: skip
    if command not in data:
        raise UsageError("--recipe", f"{path} has no [{command}] table", f"a table [{command}] of its options")
    values: dict[str, Any] = {}
    for key, value in data[command].items():
        option = option_named(command, key)
        if option is None or option.flag == "--recipe":
            known = ", ".join(o.key for o in options_of(command) if o.flag != "--recipe")
            raise UsageError("--recipe", f"{path} [{command}] has an unknown key {key!r}", f"one of {known}")
        values[option.dest] = _recipe_value(path, command, option, value)
    return values


def _toml() -> types.ModuleType:
    """``tomllib`` (Python 3.11), or ``tomli`` (its backport) on Python 3.10."""
    for name in ("tomllib", "tomli"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise UsageError("--recipe", "needs Python 3.11's tomllib, absent here", "Python 3.11 or pip install tomli")


def _recipe_value(path: str, command: str, option: Option, value: object) -> Any:
    where = f"{path} [{command}] {option.key}"
    types = " or ".join({bool: "a boolean", str: "a string", int: "an integer", float: "a number",
                         list: "a list of strings"}[t] for t in option.toml)  # fmt: skip
    fits = any(isinstance(value, t) and not (t is not bool and isinstance(value, bool)) for t in option.toml)
    if isinstance(value, int) and not isinstance(value, bool) and float in option.toml:
        fits = True
    if not fits:
        raise UsageError("--recipe", f"{where} is {type(value).__name__} {value!r}", types)
    if option.switch:
        return value
    if isinstance(value, list):
        if not all(isinstance(v, str) for v in value):
            raise UsageError("--recipe", f"{where} is {value!r}", types)
        value = ",".join(value)
    try:
        return option.read(str(value))
    except argparse.ArgumentTypeError as error:
        raise UsageError("--recipe", f"{where}: {error}".rsplit(", expected ", 1)[0],
                         str(error).rsplit(", expected ", 1)[-1]) from None


def merged(command: str, given: argparse.Namespace) -> dict[str, Any]:
    """The options of a run: the command's defaults, under the recipe (if any), under the flags given.

    Every option's argparse default is ``None``, so a value here was typed
    on the command line, and it wins over the recipe's.
    """
    values: dict[str, Any] = {o.dest: None for o in options_of(command)} | dict(DEFAULTS[command])
    recipe = getattr(given, "recipe", None)
    if recipe is not None:
        values.update(read_recipe(command, recipe))
    for option in options_of(command):
        if option.flag == "--recipe":
            continue
        value = getattr(given, option.dest, None)
        if value is not None:
            values[option.dest] = value
    values["recipe"] = recipe
    return values
