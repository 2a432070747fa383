"""``python -m funcprune``: usage without running the demo, and bad flags refused.

Each subprocess pays for importing torch (seconds on 2 cores), so only the two
exits a user sees run one: ``--help`` and a bad flag, both in the background
from the end of collection (``tests/_background.py``), beside the tests
before these. ``-h``, the same argparse action, is checked in-process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from _background import Job
from funcprune.__main__ import _parse

ROOT = Path(__file__).resolve().parents[1]
USAGE = "usage: python -m funcprune"


def run(*args: str) -> Job:
    """``python -m funcprune *args`` on this working tree's package."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return Job(lambda _: [sys.executable, "-m", "funcprune", *args], cwd=ROOT, env=env, timeout=120)


#: Both run in the background from the end of collection (tests/_background.py).
HELP, BOGUS = run("--help"), run("--bogus")
BACKGROUND = {"helped": HELP, "refused": BOGUS}


@pytest.fixture
def helped() -> subprocess.CompletedProcess[str]:
    return HELP.result()


@pytest.fixture
def refused() -> subprocess.CompletedProcess[str]:
    return BOGUS.result()


def check_usage(text: str) -> None:
    assert text.startswith(USAGE)
    assert "demo" in text and "README.md" in text
    assert "conv1" not in text  # the demo's first section did not run


def test_help_prints_usage_and_does_not_run_the_demo(
    helped: subprocess.CompletedProcess[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert helped.returncode == 0
    check_usage(helped.stdout)
    with pytest.raises(SystemExit) as exited:
        _parse(["-h"])
    assert exited.value.code == 0
    check_usage(capsys.readouterr().out)


def test_an_unknown_flag_is_refused_with_usage(refused: subprocess.CompletedProcess[str]) -> None:
    assert refused.returncode == 2
    assert USAGE in refused.stderr and "unrecognized arguments: --bogus" in refused.stderr
