"""Bad input to ``funcprune``: one line on stderr, exit code 2, nothing written; a failed run leaves nothing.

The line is ``funcprune <cmd>: error: <argument>: <what was wrong>,
expected <what>``. Each case runs ``main`` in this process (fast); one
runs the script in a subprocess in the background (``tests/_background.py``):
a calibration file too short for ``--seq-len``, found once the output
directory was started. Every case runs in a subprocess under the ci profile.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import funcprune._cli._oneshot as oneshot_module
from _background import Job
from _checkpoints import ROOT, funcprune, left_behind, save_checkpoint, write_calibration
from funcprune._cli import main

#: One line: the command, the argument, what was wrong, and what was expected.
LINE = re.compile(r"funcprune (oneshot|structured|eval|report): error: (\S+): (.+), expected (.+)\n")

RUN = ["--out", "out", "--method", "wanda", "--sparsity", "0.5", "--calibration", "calib.txt", "--samples", "2",
       "--seq-len", "16"]  # fmt: skip

#: (id, argv after the command's name, the argument named, a piece of the message).
CASES = [
    ("missing-dir", ["oneshot", "missing", *RUN], "MODEL_DIR", "missing does not exist"),
    ("no-config", ["oneshot", "empty", *RUN], "MODEL_DIR", "empty has no config.json"),
    ("unknown-model-type", ["oneshot", "alien", *RUN], "MODEL_DIR", "model_type 'alien-lm', unknown to"),
    ("unknown-method", ["oneshot", "tiny", *RUN[:2], "--method", "obs", *RUN[4:]], "--method", "'obs' is not a method"),
    ("unknown-kind", ["structured", "tiny", "--out", "out", "--sparsity", "0.2", "--kinds", "heads,rows"], "--kinds",
     "'rows' is not a kind"),
    *[(f"sparsity-{s}", ["oneshot", "tiny", *RUN[:4], "--sparsity", s, *RUN[6:]], "--sparsity", f"'{s}' is {why}")
      for s, why in [("0", "out of range"), ("1", "out of range"), ("1.5", "out of range"), ("3:2", "out of range"),
                     ("a", "malformed")]],
    ("structured-sparsity", ["structured", "tiny", "--out", "out", "--sparsity", "1"], "--sparsity",
     "'1' is out of range"),
    ("empty-calibration", ["oneshot", "tiny", *RUN[:6], "--calibration", "blank.txt"], "--calibration",
     "blank.txt is empty"),
    ("out-exists", ["oneshot", "tiny", *RUN[:1], "taken", *RUN[2:]], "--out", "taken exists"),
    ("recipe-missing", ["oneshot", "tiny", *RUN, "--recipe", "none.toml"], "--recipe", "none.toml does not exist"),
    ("recipe-syntax", ["oneshot", "tiny", *RUN, "--recipe", "syntax.toml"], "--recipe", "syntax.toml is not valid TOML"),
    ("recipe-unknown-key", ["oneshot", "tiny", *RUN, "--recipe", "unknown.toml"], "--recipe",
     "unknown.toml [oneshot] has an unknown key 'sparsty'"),
    ("recipe-wrong-type", ["oneshot", "tiny", *RUN, "--recipe", "typed.toml"], "--recipe",
     "typed.toml [oneshot] samples is str '8'"),
    ("recipe-bad-value", ["oneshot", "tiny", *RUN, "--recipe", "value.toml"], "--recipe",
     "value.toml [oneshot] sparsity: '1.5' is out of range"),
    ("too-few-tokens", ["oneshot", "tiny", *RUN[:-1], "4096"], "--calibration", "tokenizes to"),
    ("unknown-flag", ["oneshot", "tiny", *RUN, "--bogus"], "--bogus", "unrecognized"),
    ("nproc-0", ["oneshot", "tiny", *RUN, "--nproc", "0"], "--nproc", "0 is out of range"),
    ("stream-nproc", ["oneshot", "tiny", *RUN, "--stream", "--nproc", "2"], "--stream", "given with --nproc 2"),
    ("stream-dtype", ["oneshot", "tiny", *RUN, "--stream", "--dtype", "float32"], "--stream",
     "given with --dtype float32"),
    ("stream-owl", ["oneshot", "tiny", *RUN, "--stream", "--allocation", "owl"], "--stream",
     "given with --allocation owl"),
    ("nproc-too-few-tokens", ["oneshot", "tiny", *RUN[:-1], "4096", "--nproc", "2"], "--calibration", "tokenizes to"),
]  # fmt: skip


def prepare(directory: Path) -> Path:
    """The checkpoint, the calibration files and every bad input of :data:`CASES`, in ``directory``."""
    save_checkpoint(directory / "tiny")
    write_calibration(directory)
    (directory / "empty").mkdir()
    (directory / "alien").mkdir()
    (directory / "alien" / "config.json").write_text('{"model_type": "alien-lm"}', encoding="utf-8")
    (directory / "blank.txt").write_text(" \n\n", encoding="utf-8")
    (directory / "taken").mkdir()
    (directory / "taken" / "keep").write_text("mine", encoding="utf-8")
    (directory / "syntax.toml").write_text("[oneshot\n", encoding="utf-8")
    (directory / "unknown.toml").write_text("[oneshot]\nsparsty = 0.5\n", encoding="utf-8")
    (directory / "typed.toml").write_text('[oneshot]\nsamples = "8"\n', encoding="utf-8")
    (directory / "value.toml").write_text("[oneshot]\nsparsity = 1.5\n", encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare(tmp_path_factory.mktemp("bad"))


def check_refused(stderr: str, argument: str, piece: str, directory: Path) -> None:
    """Exactly one line of the shape, naming ``argument``, saying ``piece``; no ``out`` or sibling left."""
    match = LINE.fullmatch(stderr)
    assert match is not None, stderr
    assert match.group(2) == argument and piece in match.group(3), stderr
    assert left_behind(directory) == []
    assert left_behind(directory, "taken") == ["taken"] and (directory / "taken" / "keep").read_text() == "mine"


@pytest.mark.parametrize(("argv", "argument", "piece"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_code_2(
    workdir: Path, argv: list[str], argument: str, piece: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(workdir)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    check_refused(captured.err, argument, piece, workdir)


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_a_run_that_fails_midway_leaves_nothing(
    workdir: Path, error: BaseException, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pruning raises once the staged directory exists (checked then); it is gone after, and an existing
    OUT (with --overwrite) is kept as it was."""
    monkeypatch.chdir(workdir)
    seen: list[list[str]] = []

    def fail(job: oneshot_module.Job, progress: object, group: object = None) -> None:
        seen.append([p.name for p in workdir.iterdir() if p.name.startswith("taken.tmp-")])
        raise error

    monkeypatch.setattr(oneshot_module, "prune", fail)
    argv = ["oneshot", "tiny", *RUN[:1], "taken", *RUN[2:], "--overwrite"]
    if isinstance(error, KeyboardInterrupt):
        assert main(argv) == 130
        assert capsys.readouterr().err == "funcprune oneshot: interrupted; nothing was written\n"
    else:
        with pytest.raises(RuntimeError, match="boom"):
            main(argv)
    assert len(seen) == 1 and len(seen[0]) == 1  # the staged directory existed while it ran
    assert left_behind(workdir, "taken") == ["taken"] and (workdir / "taken" / "keep").read_text() == "mine"


def test_overwrite_replaces_out_only_at_the_end(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    (workdir / "again").mkdir()
    (workdir / "again" / "old").write_text("old", encoding="utf-8")
    argv = ["oneshot", "tiny", "--out", "again", "--method", "magnitude", "--sparsity", "0.5", "--overwrite", "--quiet"]
    assert main(argv) == 0
    assert not (workdir / "again" / "old").exists() and (workdir / "again" / "report.json").is_file()
    assert left_behind(workdir, "again") == ["again"]


# --------------------------------------------------------------------------- subprocesses

_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1"}  # fmt: skip


def _job(argv: list[str]) -> Job:
    def command(directory: Path) -> list[str]:
        prepare(directory)
        return [sys.executable, "-m", "funcprune._cli", *argv]

    return Job(command, env=_ENV, timeout=300)


#: A failure found after the output directory was started (too few tokens for --seq-len), in the background;
#: a bad value (ci).
SPARSITY = _job(["oneshot", "tiny", *RUN[:4], "--sparsity", "1.5", *RUN[6:]])
SHORT = _job(["oneshot", "tiny", *RUN[:-1], "4096"])
BACKGROUND = {"too_short": SHORT}


@pytest.fixture
def bad_sparsity() -> subprocess.CompletedProcess[str]:
    return SPARSITY.result()


@pytest.fixture
def too_short() -> subprocess.CompletedProcess[str]:
    return SHORT.result()


@pytest.mark.ci
def test_the_script_refuses_a_bad_sparsity_in_one_line(bad_sparsity: subprocess.CompletedProcess[str]) -> None:
    assert bad_sparsity.returncode == 2 and bad_sparsity.stdout == ""
    assert bad_sparsity.stderr == ("funcprune oneshot: error: --sparsity: '1.5' is out of range, expected a fraction "
                                   "strictly between 0 and 1 (0.5) or N:M with 0 < N < M (2:4)\n")  # fmt: skip
    assert left_behind(SPARSITY.directory) == []


@pytest.mark.ci  # the default suite's 5 minutes: CI runs it
def test_the_script_leaves_nothing_when_calibration_is_too_short(too_short: subprocess.CompletedProcess[str]) -> None:
    assert too_short.returncode == 2 and "Traceback" not in too_short.stderr
    check_refused(too_short.stderr, "--calibration", "fewer than --seq-len 4096", SHORT.directory)


@pytest.mark.ci
@pytest.mark.parametrize(("argv", "argument", "piece"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_script_refuses_bad_input(tmp_path: Path, argv: list[str], argument: str, piece: str) -> None:
    prepare(tmp_path)
    done = funcprune(*argv, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    check_refused(done.stderr, argument, piece, tmp_path)
