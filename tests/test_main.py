"""``python -m funcprune``: usage without running the demo, and bad flags refused."""

from __future__ import annotations

import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "funcprune", *args], capture_output=True, text=True, timeout=120)


def test_help_prints_usage_and_does_not_run_the_demo() -> None:
    for flag in ("--help", "-h"):
        done = run(flag)
        assert done.returncode == 0
        assert done.stdout.startswith("usage: python -m funcprune")
        assert "demo" in done.stdout and "README.md" in done.stdout
        assert "conv1" not in done.stdout  # the demo's first section did not run


def test_an_unknown_flag_is_refused_with_usage() -> None:
    done = run("--bogus")
    assert done.returncode == 2
    assert "usage: python -m funcprune" in done.stderr and "unrecognized arguments: --bogus" in done.stderr
