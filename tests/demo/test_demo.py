"""The demo: ``python -m funcprune --quick`` tells the story on the digits with plausible figures.

The demo runs once, in a subprocess, with ``--quick`` (fewer training steps,
about 15 seconds of one core), in the background from the end of collection
(``tests/_background.py``), beside the tests before these; the fallbacks
without scikit-learn or matplotlib are checked in-process by hiding the
import.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from _background import Job

from funcprune._demo._digits import load_data
from funcprune._demo._run import Curves, save_png

ROOT = Path(__file__).resolve().parents[1]
NUMPY_WARNING = "ignore:Failed to initialize NumPy:UserWarning"
HAS_SKLEARN = importlib.util.find_spec("sklearn") is not None
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _demo(directory: Path) -> list[str]:
    """``python -m funcprune --quick --png PNG``, PNG in ``directory``.

    Warnings are errors, except the one torch itself gives at import on a
    machine without NumPy (as in pyproject's filterwarnings).
    """
    png = directory / "curves.png"
    return [sys.executable, "-W", "error", "-W", NUMPY_WARNING, "-m", "funcprune", "--quick", "--png", str(png)]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


#: The demo, run in the background from the end of collection (tests/_background.py).
DEMO = Job(_demo, cwd=ROOT, env=_env(), timeout=300)
BACKGROUND = {"output": DEMO}


@pytest.fixture(scope="module")
def png() -> Path:
    return DEMO.directory / "curves.png"


@pytest.fixture(scope="module")
def output() -> str:
    """What the demo prints."""
    done = DEMO.result()
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def section(output: str, start: str, end: str) -> str:
    """The text from the line starting with ``start`` up to the one starting with ``end``."""
    begin = output.index(f"\n{start}")
    return output[begin : output.index(f"\n{end}", begin + 1)]


def table_row(output: str, name: str, after: str) -> list[str]:
    """The first table row for ``name`` after the line containing ``after``."""
    rest = output[output.index(after) :]
    match = re.search(rf"^\s+{re.escape(name)}\s+(.*)$", rest, re.MULTILINE)
    assert match, f"no row {name!r} after {after!r}"
    return match.group(1).split()


def percent(cell: str) -> float:
    return float(cell.rstrip("%"))


def test_the_data_are_named_and_the_dense_model_is_far_above_chance(output: str) -> None:
    data = re.search(r"^data: (.*); 1348 train / 449 held-out test images$", output, re.MULTILINE)
    assert data, "no data line"
    assert re.search(r"^done in [\d.]+ s$", output, re.MULTILINE)
    if HAS_SKLEARN:
        assert data.group(1).startswith("scikit-learn's handwritten digits")
        dense = re.search(r"dense test accuracy: ([\d.]+)%", output)
        assert dense and float(dense.group(1)) > 85.0  # chance is 10%
    else:
        assert "scikit-learn is not installed" in data.group(1)


def test_gradual_pruning_reaches_95_percent_while_training(output: str) -> None:
    part = section(output, "   then gradual pruning", "2. ")
    assert "Polynomial(final=0.95" in part and "time (cumulative)" in part
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)%\s+([\d.]+)%\s+[\d.]+ s$", part, re.MULTILINE)
    assert len(rows) >= 5
    sparsity = [float(r[1]) for r in rows]
    assert sparsity == sorted(sparsity) and sparsity[-1] == 95.0
    if HAS_SKLEARN:
        assert float(rows[-1][2]) > 85.0


def test_rewinding_beats_or_matches_random_masks_in_the_accuracy_table(output: str) -> None:
    assert "time (cumulative)" in section(output, "2. Iterative magnitude pruning", "3. ")
    table = section(output, "3. Test accuracy against weight sparsity", "4. ")
    labels = ["dense", "round 1/3", "round 2/3", "round final", "gradual final"]
    rows = {label: table_row(table, label, "3. Test accuracy") for label in labels}
    sparsity = [percent(rows[label][0]) for label in labels[:4]]
    assert sparsity[0] == 0.0 and sparsity == sorted(sparsity) and sparsity[-1] >= 90.0
    assert percent(rows["gradual final"][0]) >= 90.0
    for label in labels[:4]:
        assert all(0.0 <= percent(cell) <= 100.0 for cell in rows[label][1:3])
    if HAS_SKLEARN:
        assert percent(rows["round final"][1]) > 85.0
        assert percent(rows["round final"][1]) >= percent(rows["round final"][2]) - 5.0


def test_erk_and_uniform_reach_the_same_total_sparsity(output: str) -> None:
    part = section(output, "4. ERK against uniform", "5. ")
    conv1 = table_row(part, "conv1.weight", "4. ERK")
    assert conv1[0] == "144" and percent(conv1[1]) < percent(conv1[2]) == 95.0  # ERK keeps conv1 denser
    for label in ("ERK", "uniform"):
        line = rf"^\s+{label}\s+test accuracy\s+([\d.]+)% at 95.0% weight sparsity$"
        found = re.search(line, part, re.MULTILINE)
        assert found and 0.0 <= float(found.group(1)) <= 100.0


def test_the_ensemble_trains_its_own_masks_in_one_vmapped_call(output: str) -> None:
    part = section(output, "5. vmap", "6. ")
    rows = re.findall(r"^\s+(\d)\s+([\d.]+)%\s+([\d.]+)%\s+([\d.]+)%$", part, re.MULTILINE)
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3]
    assert len({r[1] for r in rows}) > 1  # each model its own random mask
    assert {r[2] for r in rows} == {"80.0"}  # exact counts everywhere
    if HAS_SKLEARN:
        assert all(float(r[3]) > 30.0 for r in rows)  # trained: well above chance


def test_the_tutorial_steps_match_torch(output: str) -> None:
    assert "same masks as torch.nn.utils.prune: True" in output
    assert "same masks as torch.nn.utils.prune.global_unstructured: True" in output
    assert table_row(output, "conv1.weight", "6.1 Pruning conv1")[-1] == "29.63%"  # round(0.3 * 54) = 16
    assert table_row(output, "conv1.bias", "6.1 Pruning conv1")[1:] == ["3", "6", "50.00%"]
    assert "channels kept" in output and output.count("True", output.index("channels kept")) >= 3
    assert table_row(output, "conv2.weight", "6.2 Pruning many")[-1] == "20.02%"  # round(0.2 * 864)
    assert table_row(output, "global", "6.3 Global pruning")[-1] == "20.00%"
    assert "fc3.bias kept: [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]" in output
    assert "compat hook-mode masks equal torch.nn.utils.prune's: True" in output


def test_the_png_is_written(output: str, png: Path) -> None:
    if not HAS_MATPLOTLIB:
        assert "PNG skipped: matplotlib is not installed" in output
        return
    assert f"saved the curves and per-layer sparsities to {png}" in output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_sklearn_the_demo_falls_back_to_synthetic_digits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    name, train, test = load_data()
    assert name.startswith("synthetic 8x8 digits: scikit-learn is not installed")
    assert train[0].shape == (1348, 1, 8, 8) and test[0].shape == (449, 1, 8, 8)
    assert train[1].dtype == torch.long and set(train[1].tolist()) == set(range(10))


def test_without_matplotlib_the_png_is_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = tmp_path / "skipped.png"
    assert save_png(str(path), Curves(), "digits").startswith("PNG skipped: matplotlib is not installed")
    assert not path.exists()


def test_the_pruned_cnn_is_shrunk_with_its_accuracy_unchanged(output: str) -> None:
    part = output[output.index("\n7. Payoff: global_structured(") :]
    kept = re.search(r"output channels kept: conv1 (\d+), conv2 (\d+), fc1 (\d+) \(of 16, 32, 64\)", part)
    assert kept, "no channel counts"
    assert sum(int(k) for k in kept.groups()) == 56  # half of the 112 channels, ranked jointly
    dense = table_row(part, "masked dense", "7. Payoff")
    shrunk = table_row(part, "shrunk", "7. Payoff")
    assert int(shrunk[0].replace(",", "")) < int(dense[0].replace(",", "")) / 3
    assert shrunk[1] == dense[1]  # the same accuracy: the shrunk model computes the closure's outputs
    assert re.search(r"shrunk: [\d.]+x fewer parameters, [\d.]+x faster forward", part)
    if HAS_SKLEARN:
        assert percent(shrunk[1]) > 85.0
