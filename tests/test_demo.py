"""The demo: ``python -m funcprune`` runs the tutorial's story and prints plausible figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NUMPY_WARNING = "ignore:Failed to initialize NumPy:UserWarning"


@pytest.fixture(scope="module")
def output() -> str:
    """What ``python -m funcprune`` prints (run once, as the README says).

    Warnings are errors, except the one torch itself gives at import on a
    machine without NumPy (as in pyproject's filterwarnings).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-W", "error", "-W", NUMPY_WARNING, "-m", "funcprune"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def table_row(output: str, name: str, after: str) -> list[str]:
    """The first table row for ``name`` after the line containing ``after``."""
    rest = output[output.index(after) :]
    match = re.search(rf"^\s+{re.escape(name)}\s+(.*)$", rest, re.MULTILINE)
    assert match, f"no row {name!r} after {after!r}"
    return match.group(1).split()


def test_the_tutorial_steps_match_torch(output: str) -> None:
    assert "same masks as torch.nn.utils.prune: True" in output
    assert "same masks as torch.nn.utils.prune.global_unstructured: True" in output
    assert (
        table_row(output, "conv1.weight", "1. Pruning conv1")[-1] == "29.63%"
    )  # round(0.3 * 54) = 16
    assert table_row(output, "conv1.bias", "1. Pruning conv1")[1:] == ["3", "6", "50.00%"]
    assert "channels kept" in output and output.count("True", output.index("channels kept")) >= 3


def test_per_layer_and_global_figures(output: str) -> None:
    step2 = "2. Pruning many parameters"
    assert table_row(output, "fc1.weight", step2)[-1] == "40.00%"
    assert table_row(output, "conv2.weight", step2)[-1] == "20.02%"  # round(0.2 * 864) = 173
    step3 = "3. Global pruning"
    assert table_row(output, "global", step3)[-1] == "20.00%"
    per_layer = [
        float(table_row(output, n, step3)[-1].rstrip("%")) for n in ("conv1.weight", "fc1.weight")
    ]
    assert per_layer[0] < 20.0 < per_layer[1]  # global pruning spreads unevenly, as in the tutorial
    assert "fc3.bias kept: [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]" in output


def test_training_reaches_about_90_percent_sparsity_and_keeps_accuracy(output: str) -> None:
    rows = re.findall(
        r"^\s+(\d)/5\s+([\d.]+)%\s+(\S+)\s+([\d.]+)\s+([\d.]+)%\s+[\d.]+ s$", output, re.MULTILINE
    )
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3, 4, 5]
    sparsity = [float(r[1]) for r in rows]
    assert sparsity[0] == 0.0 and sparsity == sorted(sparsity) and 89.0 <= sparsity[-1] <= 91.0
    accuracy = [float(r[4]) for r in rows]
    assert accuracy[-1] > 85.0 and all(0.0 <= a <= 100.0 for a in accuracy)


def test_the_ensemble_is_pruned_in_one_vmapped_call(output: str) -> None:
    step6 = "6. vmap: pruning an ensemble of 8 LeNets"
    conv1 = table_row(output, "conv1.weight", step6)
    assert len(conv1) == 8 and len(set(conv1)) > 1  # each model its own random mask
    assert len(set(table_row(output, "all weights", step6))) == 1  # exact counts everywhere
    assert "(8, 16, 10)" in output
    assert re.search(r"^done in [\d.]+ s$", output, re.MULTILINE)
