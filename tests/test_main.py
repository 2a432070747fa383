"""``python -m funcprune``: usage without running the demo, and bad flags refused.

Each subprocess pays for importing torch (seconds on 2 cores), so only the two
exits a user sees run one: ``--help`` and a bad flag. ``-h``, the same argparse
action, is checked in-process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from funcprune.__main__ import _parse

ROOT = Path(__file__).resolve().parents[1]
USAGE = "usage: python -m funcprune"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m funcprune *args`` on this working tree's package."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "funcprune", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def check_usage(text: str) -> None:
    assert text.startswith(USAGE)
    assert "demo" in text and "README.md" in text
    assert "conv1" not in text  # the demo's first section did not run


def test_help_prints_usage_and_does_not_run_the_demo(capsys: pytest.CaptureFixture[str]) -> None:
    done = run("--help")
    assert done.returncode == 0
    check_usage(done.stdout)
    with pytest.raises(SystemExit) as exited:
        _parse(["-h"])
    assert exited.value.code == 0
    check_usage(capsys.readouterr().out)


def test_an_unknown_flag_is_refused_with_usage() -> None:
    done = run("--bogus")
    assert done.returncode == 2
    assert USAGE in done.stderr and "unrecognized arguments: --bogus" in done.stderr
