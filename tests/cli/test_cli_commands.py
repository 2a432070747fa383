"""``funcprune oneshot``, ``structured``, ``eval`` and ``report`` give what the Python API gives.

Most tests call the command's ``main`` in this process (the parsing, the
recipe, the staging and the writing are all the script's; only the
interpreter is shared): a subprocess pays seconds to import torch and
transformers. One run in a subprocess (``python -m funcprune._cli``, see
``_checkpoints.py``) starts in the background at the end of collection
(``tests/_background.py``); the rest of the end-to-end matrix runs in
subprocesses under the ci profile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

import funcprune as fp
from _background import Job
from _checkpoints import ROOT, funcprune, save_checkpoint, tokenizer, windows, write_calibration
from _hf import transformers
from funcprune._cli import main
from funcprune._cli._oneshot import Job as PruneJob
from funcprune._cli._oneshot import prune
from funcprune._cli._options import _toml
from funcprune._cli._progress import Progress

SAMPLES, SEQ_LEN = 4, 16


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the tiny checkpoint (``tiny``) and the calibration files."""
    directory = tmp_path_factory.mktemp("cli")
    save_checkpoint(directory / "tiny")
    write_calibration(directory)
    return directory


def oneshot_args(directory: Path, out: str, method: str, sparsity: str, calibration: str = "calib.txt",
                 seed: int = 0) -> list[str]:  # fmt: skip
    return ["oneshot", str(directory / "tiny"), "--out", str(directory / out), "--method", method, "--sparsity",
            sparsity, "--calibration", str(directory / calibration), "--samples", str(SAMPLES), "--seq-len",
            str(SEQ_LEN), "--seed", str(seed)]  # fmt: skip


def reference(directory: Path, method: str, sparsity: str, calibration: str = "calib.txt", seed: int = 0) -> Any:
    """``fp.oneshot`` on the checkpoint and the documented calibration windows, baked: (model, masks)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(directory / "tiny").eval()
    words = transformers.AutoTokenizer.from_pretrained(directory / "tiny")
    batches = windows(directory / calibration, words, samples=SAMPLES, seq_len=SEQ_LEN, seed=seed)
    spec = fp.NM(2, 4) if sparsity == "2:4" else fp.L1Unstructured(float(sparsity))
    params, masks = fp.oneshot(model, batches, method=method, spec=spec)
    model.load_state_dict(params)
    return fp.bake(model, masks), masks


def assert_same_checkpoint(out: Path, expected: Any, masks: fp.Masks) -> None:
    """``out`` reloads with plain ``from_pretrained`` to ``expected``'s weights, and holds ``masks``."""
    again = transformers.AutoModelForCausalLM.from_pretrained(out)
    got, want = again.state_dict(), expected.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    saved = fp.load_masks(out / "masks.safetensors")
    assert saved.keys() == masks.keys() and all(torch.equal(saved[k], masks[k]) for k in masks)
    assert transformers.AutoTokenizer.from_pretrained(out)("the fox").input_ids == tokenizer()("the fox").input_ids


def test_oneshot_sparsegpt_2_4_equals_the_api(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(oneshot_args(workdir, "sgpt", "sparsegpt", "2:4")) == 0
    expected, masks = reference(workdir, "sparsegpt", "2:4")
    assert_same_checkpoint(workdir / "sgpt", expected, masks)
    report = json.loads((workdir / "sgpt" / "report.json").read_text())
    assert report["sparsity"]["total"] == {"numel": 15360, "pruned": 7680, "sparsity": 0.5}
    assert set(report["sparsity"]["layers"]) == set(masks)
    assert list(report["stages"]) == ["load", "calibration", "prune", "save"]
    assert report["peak_memory"]["max_rss_bytes"] > 10**7 and report["peak_memory"]["cuda_max_allocated_bytes"] is None
    assert report["arguments"]["sparsity"] == "2:4" and report["arguments"]["samples"] == SAMPLES
    assert set(report["versions"]) == {"funcprune", "torch", "transformers", "python"}
    assert report["calibration"] == {"windows": SAMPLES, "tokens": SAMPLES * SEQ_LEN}
    assert "sgpt" in capsys.readouterr().err


def test_oneshot_stream_equals_the_api(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--stream`` (fp.oneshot_checkpoint, one block in memory) writes what the in-memory run writes."""
    assert main([*oneshot_args(workdir, "streamed", "sparsegpt", "2:4"), "--stream", "--quiet"]) == 0
    expected, masks = reference(workdir, "sparsegpt", "2:4")
    assert_same_checkpoint(workdir / "streamed", expected, masks)
    report = json.loads((workdir / "streamed" / "report.json").read_text())
    total = sum(m.numel() for m in masks.values())
    assert report["sparsity"]["total"] == {"numel": total, "pruned": total // 2, "sparsity": 0.5}
    assert report["sparsity"]["layers"].keys() == masks.keys()


def test_oneshot_stream_reports_a_mixture_of_experts_by_its_stacked_weights(tmp_path: Path) -> None:
    """``--stream`` on a Mixtral checkpoint (its experts stored one by one): the report names the model's stacked
    expert weights, with their entries, as the masks do."""
    save_checkpoint(tmp_path / "moe", family="mixtral")
    argv = ["oneshot", str(tmp_path / "moe"), "--out", str(tmp_path / "out"), "--method", "magnitude", "--sparsity",
            "0.5", "--stream", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    masks = fp.load_masks(tmp_path / "out" / "masks.safetensors")
    assert any(".experts." in n for n in masks)
    assert {n: r["numel"] for n, r in report["sparsity"]["layers"].items()} == {n: m.numel() for n, m in masks.items()}
    assert all(r["pruned"] == int((~masks[n]).sum()) for n, r in report["sparsity"]["layers"].items())


def test_eval_equals_fp_perplexity_on_consecutive_windows(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not (workdir / "sgpt").exists():
        assert main(oneshot_args(workdir, "sgpt", "sparsegpt", "2:4")) == 0
    capsys.readouterr()
    args = ["eval", str(workdir / "sgpt"), "--data", str(workdir / "calib.txt"), "--seq-len", "16", "--samples", "5",
            "--batch-size", "2", "--json"]  # fmt: skip
    assert main(args) == 0
    got = json.loads(capsys.readouterr().out)
    words = transformers.AutoTokenizer.from_pretrained(workdir / "sgpt")
    ids = torch.tensor(words((workdir / "calib.txt").read_text(), add_special_tokens=False)["input_ids"])
    rows = ids[: 5 * 16].view(5, 16)
    model = transformers.AutoModelForCausalLM.from_pretrained(workdir / "sgpt").eval()
    want = fp.perplexity(model, [rows[:2], rows[2:4], rows[4:]])
    assert got["nll"] == want.nll and got["tokens"] == want.tokens == 5 * 15
    assert got["perplexity"] == want.perplexity and got["loader"] == "from_pretrained"
    assert main(args[:-1]) == 0
    assert capsys.readouterr().out.startswith(f"perplexity {want.perplexity:.4f} ")


def test_report_counts_the_zeros_and_reads_the_masks(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not (workdir / "sgpt").exists():
        assert main(oneshot_args(workdir, "sgpt", "sparsegpt", "2:4")) == 0
    capsys.readouterr()
    assert main(["report", str(workdir / "sgpt"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    model = transformers.AutoModelForCausalLM.from_pretrained(workdir / "sgpt")
    linear = {n: m.weight for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(got["weights"]["layers"]) == {f"{n}.weight" for n in linear}
    for name, weight in linear.items():
        row = got["weights"]["layers"][f"{name}.weight"]
        assert row["pruned"] == int((weight == 0).sum()) and row["numel"] == weight.numel()
    assert got["weights"]["total"]["pruned"] == sum(int((w == 0).sum()) for w in linear.values()) == 7680
    assert got["masks"]["total"]["pruned"] == 7680 and got["masks"]["weights_zero_where_pruned"] is True
    assert main(["report", str(workdir / "tiny")]) == 0
    assert "no masks.safetensors" in capsys.readouterr().out


def test_a_recipe_fills_in_what_the_flags_do_not_give(workdir: Path) -> None:
    recipe = workdir / "recipe.toml"
    recipe.write_text(f'[oneshot]\nmethod = "magnitude"\nsparsity = 0.5\nsamples = 3\nseed = 5\nout = "unused"\n'
                      f'seq-len = {SEQ_LEN}\ncalibration = "{workdir / "calib.txt"}"\n'
                      '[structured]\nsparsity = 0.2\n', encoding="utf-8")  # fmt: skip
    out = workdir / "recipe-out"
    assert main(["oneshot", str(workdir / "tiny"), "--recipe", str(recipe), "--sparsity", "2:4", "--seed", "7",
                 "--out", str(out), "--quiet"]) == 0  # fmt: skip
    arguments = json.loads((out / "report.json").read_text())["arguments"]
    assert arguments["sparsity"] == "2:4" and arguments["seed"] == 7 and arguments["out"] == str(out)  # flags win
    assert arguments["method"] == "magnitude" and arguments["samples"] == 3  # the recipe's
    assert arguments["allocation"] == "uniform" and arguments["recipe"] == str(recipe)  # defaults under both
    masks = fp.load_masks(out / "masks.safetensors")
    model = transformers.AutoModelForCausalLM.from_pretrained(workdir / "tiny").eval()
    _, want = fp.oneshot(model, [], method="magnitude", spec=fp.NM(2, 4))
    assert masks.keys() == want.keys() and all(torch.equal(masks[k], want[k]) for k in want)


def test_progress_counts_the_batches_and_the_blocks(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bars advance once per calibration batch drawn and to every block, in order, and the hooks go."""
    updates: dict[str, list[int]] = {}

    class Bar:
        def __init__(self, desc: str) -> None:
            self.desc = desc
            updates[desc] = []

        def update(self, n: int) -> None:
            updates[self.desc].append(n)

        def close(self) -> None:
            pass

    monkeypatch.setattr(Progress, "bar", lambda self, desc, total, unit: Bar(desc))
    model = transformers.AutoModelForCausalLM.from_pretrained(workdir / "tiny").eval()
    batches = windows(workdir / "calib.txt", tokenizer(), samples=3, seq_len=SEQ_LEN, seed=0)
    model.model.layers.append(type(model.model.layers[0])(model.config, 2))  # 3 blocks
    model.config.num_hidden_layers = 3
    prune(PruneJob("tiny", model, batches, "wanda", fp.L1Unstructured(0.5), "uniform", None), Progress(True))
    assert updates["calibration"] == [1, 1, 1]
    assert sum(updates["blocks"]) == 3 and all(n >= 1 for n in updates["blocks"]) and len(updates["blocks"]) >= 2
    assert all(not layer._forward_pre_hooks for layer in model.model.layers)


def test_the_console_script_is_main() -> None:
    scripts = _toml().loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts == {"funcprune": "funcprune._cli:main"}


# --------------------------------------------------------------------------- subprocesses


def _wanda_job(directory: Path) -> list[str]:
    save_checkpoint(directory / "tiny")
    write_calibration(directory)
    args = oneshot_args(directory, "out", "wanda", "0.5", calibration="calib.jsonl", seed=3)
    return [sys.executable, "-m", "funcprune._cli", *args]


_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1"}  # fmt: skip
WANDA = Job(_wanda_job, env=_ENV, timeout=300)
BACKGROUND = {"wanda_run": WANDA}


@pytest.fixture
def wanda_run() -> subprocess.CompletedProcess[str]:
    return WANDA.result()


@pytest.mark.ci  # the default suite's 5 minutes: CI runs it
def test_oneshot_in_a_subprocess_equals_the_api(wanda_run: subprocess.CompletedProcess[str]) -> None:
    assert wanda_run.returncode == 0, wanda_run.stderr
    expected, masks = reference(WANDA.directory, "wanda", "0.5", calibration="calib.jsonl", seed=3)
    assert_same_checkpoint(WANDA.directory / "out", expected, masks)


@pytest.mark.ci
@pytest.mark.parametrize(("method", "sparsity"), [("magnitude", "0.5"), ("magnitude", "2:4"), ("wanda", "2:4"),
                                                  ("sparsegpt", "0.5"), ("sparsegpt", "2:4")])  # fmt: skip
def test_oneshot_script_equals_the_api(tmp_path: Path, method: str, sparsity: str) -> None:
    save_checkpoint(tmp_path / "tiny")
    write_calibration(tmp_path)
    done = funcprune(*oneshot_args(tmp_path, "out", method, sparsity, seed=1), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    expected, masks = reference(tmp_path, method, sparsity, seed=1)
    assert_same_checkpoint(tmp_path / "out", expected, masks)


@pytest.mark.ci
@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_oneshot_over_two_processes_equals_one(tmp_path: Path, method: str) -> None:
    """``--nproc 2`` (torch.distributed.run, gloo): each process calibrates on half the windows, the statistics
    summed once per block; the masks equal one process's over all of them, the weights within float32's
    rounding of sums taken in another order (bitwise for Wanda, which changes none)."""
    save_checkpoint(tmp_path / "tiny")
    write_calibration(tmp_path)
    done = funcprune(*oneshot_args(tmp_path, "out", method, "2:4", seed=2), "--nproc", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    expected, masks = reference(tmp_path, method, "2:4", seed=2)
    saved = fp.load_masks(tmp_path / "out" / "masks.safetensors")
    assert saved.keys() == masks.keys() and all(torch.equal(saved[k], masks[k]) for k in masks)
    got = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    for name, want in expected.state_dict().items():
        if method == "wanda":
            assert torch.equal(got[name], want), name
        else:
            torch.testing.assert_close(got[name], want, rtol=1e-4, atol=1e-5)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["processes"] == 2 and report["calibration"]["windows"] == SAMPLES
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("out.")]  # nothing staged left


def structured_reference(directory: Path, scores: str, scope: Literal["global", "group"]) -> tuple[Any, dict[str, Any]]:
    """``fp.structure``, ``fp.structured`` and ``fp.shrink`` on the checkpoint, and the example input."""
    model = transformers.AutoModelForCausalLM.from_pretrained(directory / "tiny").eval()
    batches = windows(directory / "calib.txt", tokenizer(), samples=SAMPLES, seq_len=SEQ_LEN, seed=0)
    example = {"input_ids": batches[0] if scores != "magnitude" else torch.arange(16)[None], "use_cache": False}
    structure = fp.structure(model, example)
    params = dict(model.named_parameters())
    score = None
    if scores == "fluctuation":
        dims = fp.input_dims(model)
        inputs = sorted({m.name for g in structure.values() for m in g.members if dims.get(m.name) == m.dim})
        moments = fp.input_moments(model, batches, inputs)
        score = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()} | fp.fluctuation(params,
                                                                                                          moments)
    masks = fp.structured(structure, fp.LnStructured(0.25, n=2), scope=scope)(params, scores=score)
    return fp.shrink(model, masks, example), example


@pytest.mark.ci
@pytest.mark.parametrize(("scores", "scope"), [("magnitude", "global"), ("fluctuation", "group")])
def test_structured_script_reloads_to_the_api_shrunk_model(
    tmp_path: Path, scores: str, scope: Literal["global", "group"]
) -> None:
    save_checkpoint(tmp_path / "tiny")
    write_calibration(tmp_path)
    done = funcprune("structured", "tiny", "--out", "out", "--sparsity", "0.25", "--scores", scores, "--scope", scope,
                     "--calibration", "calib.txt", "--samples", str(SAMPLES), "--seq-len", str(SEQ_LEN), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    small, example = structured_reference(tmp_path, scores, scope)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    if report["loader"] == "fp.load_shrunk":
        again = fp.load_shrunk(tmp_path / "out")
    else:
        again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert report["parameters"]["after"] == sum(p.numel() for p in small.parameters()) < report["parameters"]["before"]
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(**example).logits, small(**example).logits, rtol=0, atol=0)
    done = funcprune("eval", "out", "--data", "calib.txt", "--seq-len", "16", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    words = tokenizer()
    ids = torch.tensor(words((tmp_path / "calib.txt").read_text(), add_special_tokens=False)["input_ids"])
    rows = ids[: len(ids) // 16 * 16].view(-1, 16)
    assert json.loads(done.stdout)["nll"] == fp.perplexity(small, list(torch.split(rows, 1))).nll


@pytest.mark.ci
def test_the_installed_script_runs_main() -> None:
    """The script on PATH (CI installs the package) prints main's usage; skipped where none is installed."""
    import shutil

    script = shutil.which("funcprune")
    if script is None:
        pytest.skip("no funcprune script on PATH (the package is not installed with its scripts)")
    done = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.startswith("usage: funcprune [-h] COMMAND")


@pytest.mark.ci
def test_a_reader_that_goes_away_is_no_error(tmp_path: Path) -> None:
    """``funcprune report DIR | head -1``: the pipe closes before the report is printed; no traceback, exit 0."""
    save_checkpoint(tmp_path / "tiny")
    child = subprocess.Popen([sys.executable, "-m", "funcprune._cli", "report", str(tmp_path / "tiny")], env=_ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)  # fmt: skip
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # before the child has imported torch, let alone printed
    with child.stderr:
        err = child.stderr.read().decode()
    assert child.wait(timeout=300) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
