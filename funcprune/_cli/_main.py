"""The ``funcprune`` command: argparse subcommands, recipes merged under flags, bad input in one line.

``main(argv)`` returns the exit code: 0 on success; 2 on bad input, with one
line on stderr, ``funcprune <cmd>: error: <argument>: <what was wrong>,
expected <what>`` (argparse's own complaints reshaped to it), and nothing
written; 1 when a run fails after its input was checked (the traceback on
stderr) and 130 when it is interrupted, both with no output directory left
behind (``_checkpoint.staged``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .._demo import run as run_demo
from ._checkpoint import bars
from ._inspect import evaluate, printed, report, show_eval, show_report
from ._oneshot import run as run_oneshot
from ._oneshot import run_worker
from ._options import COMMANDS, UsageError, merged, options_of
from ._progress import Progress
from ._structured import run as run_structured
from ._world import worker_job

__all__ = ["main", "parser"]

PROG = "funcprune"

_SUMMARIES = {
    "oneshot": "prune a checkpoint once on calibration text (magnitude, wanda, sparsegpt)",
    "structured": "prune whole heads, KV groups, channels... and shrink the checkpoint",
    "eval": "the perplexity of a checkpoint on a text file",
    "report": "the sparsity of a checkpoint's Linear weights (and its masks)",
}
_DESCRIPTIONS = {
    "oneshot": "Prune a local transformers checkpoint once, block by block, on calibration text (fp.oneshot: "
    "magnitude, Wanda or SparseGPT), and write the baked checkpoint (plain from_pretrained loads it), its "
    "tokenizer, the masks (masks.safetensors, fp.load_masks) and report.json.",
    "structured": "Prune whole units of a local transformers checkpoint (MLP channels, heads, KV groups...: "
    "fp.structure, fp.structured) and remove them (fp.shrink); write the smaller checkpoint (plain "
    "from_pretrained, or fp.load_shrunk where report.json's loader says so), its tokenizer, the masks and "
    "report.json.",
    "eval": "Print the perplexity of a checkpoint (dense, pruned or shrunk) on a text file (fp.perplexity).",
    "report": "Print the sparsity of a checkpoint: the zeros of each Linear weight, their total, and its "
    "masks.safetensors if there is one.",
}
_EPILOG = "Recipes: --recipe FILE.toml reads a table [oneshot], [structured] or [eval] holding these options by " \
    "name (seq-len = 512, per-row = true, model = \"dir\"); flags given on the command line win."


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise :class:`UsageError`, for the one-line message."""

    def error(self, message: str) -> NoReturn:
        raise _reshaped(message)


def _reshaped(message: str) -> UsageError:
    """argparse's message as ``argument: what, expected ...``."""
    if m := re.fullmatch(r"argument (\S+?)(?:/\S+)?: (.*)", message, re.S):
        argument, rest = m.groups()
        what, _, expected = rest.partition(", expected ")
        if m2 := re.fullmatch(r"invalid choice: (.*) \(choose from (.*)\)", rest):
            what, expected = f"{m2.group(1)} is not a command", f"one of {m2.group(2)}"
        elif not expected:
            expected = "see --help"
        return UsageError(argument, what, expected)
    if m := re.fullmatch(r"the following arguments are required: (.*)", message):
        return UsageError(m.group(1), "missing", "a value (see --help)")
    if m := re.fullmatch(r"unrecognized arguments: (.*)", message):
        return UsageError(m.group(1), "unrecognized", "one of the options of --help")
    return UsageError("arguments", message, "see --help")


def parser() -> argparse.ArgumentParser:
    """The parser of ``funcprune``: one subcommand per command, every option's default ``None``."""
    top = _Parser(prog=PROG, description="funcprune from the command line: prune, shrink, evaluate and report "
                  "on local transformers checkpoints.", epilog="'funcprune COMMAND --help' for each command; "
                  "'python -m funcprune' is the demo.")  # fmt: skip
    sub = top.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.add_parser("demo", help="the demo on scikit-learn's digits (python -m funcprune; 'funcprune demo --help')",
                   add_help=False)  # fmt: skip
    for command in COMMANDS:
        p = sub.add_parser(command, help=_SUMMARIES[command],
                           description=_DESCRIPTIONS[command], epilog=_EPILOG if command != "report" else None,
                           prog=f"{PROG} {command}")  # fmt: skip
        for option in options_of(command):
            if option.flag == "MODEL_DIR":
                p.add_argument("model", nargs="?", metavar="MODEL_DIR", help=option.help)
            elif option.switch:
                p.add_argument(option.flag, dest=option.dest, action="store_true", default=None, help=option.help)
            else:
                p.add_argument(option.flag, dest=option.dest, type=option.read, default=None,
                               metavar=option.metavar, help=option.help)  # fmt: skip
    return top


_RUNS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "oneshot": run_oneshot, "structured": run_structured, "eval": evaluate, "report": report,
}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``funcprune`` on ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    job = worker_job()
    if job is not None:  # a process of ``funcprune oneshot --nproc N`` (_world.py): its input was checked
        run_worker(*job)
        return 0
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["demo"]:
        run_demo(args[1:], prog=f"{PROG} demo")
        return 0
    command = args[0] if args[:1] and args[0] in COMMANDS else None
    try:
        given = parser().parse_args(args)
        if given.command is None:
            parser().print_help(sys.stderr)
            return 2
        command = given.command
        options = merged(command, given)
        with bars(Progress.wanted(options["quiet"])):
            result = _RUNS[command](options)
    except UsageError as error:
        print(f"{PROG}{' ' + command if command else ''}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG} {command}: interrupted; nothing was written", file=sys.stderr)
        return 130
    try:
        _print(command, options, result)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (funcprune report ... | head): what it read was enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
    return 0


def _print(command: str, options: dict[str, Any], result: dict[str, Any]) -> None:
    if command == "eval":
        print(printed(result, options["json"], show_eval(result)))
    elif command == "report":
        print(printed(result, options["json"], show_report(result)))
    elif not options["quiet"]:
        total = result["sparsity"]["total"]
        print(f"{PROG} {command}: wrote {options['out']} ({total['sparsity']:.2%} of {total['numel']} entries "
              f"pruned in {sum(result['stages'].values()):.1f}s; report.json)", file=sys.stderr)  # fmt: skip

