"""A cached library cut short, altered or foreign neither crashes a process nor breaks a call.

Each scenario copies one build of the kernels (made here, with the
compiler and flags every process uses, so under the name each looks for)
into a cache of its own, spoils it, and lets a fresh process mask a tensor
through it: that process must exit normally with the pure-torch results,
having rebuilt the library or run the pure-torch path. A library cut short
killed the process (SIGBUS) before its hash was checked, so the scenarios
run in a subprocess (``_cache_probe.py``: torch imported once, a forked
child per scenario), in the background from the end of collection
(``tests/_background.py``): beside ``test_native.py``, collected first.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from _background import Job
from funcprune import _native
from funcprune._native import _build

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("_cache_probe.py")
HAVE_COMPILER = any(shutil.which(c) for c in ("cc", "gcc", "clang"))
pytestmark = pytest.mark.skipif(
    not HAVE_COMPILER or not hasattr(os, "fork"), reason="needs a C compiler, and fork for the probe"
)
#: The scenarios, each a cache in the probe's directory.
SCENARIOS = ("truncated", "flipped", "foreign", "foreign_recorded", "empty_cache_dir")


def _library(cache: Path) -> Path:
    (path,) = cache.glob("native-*.so")
    return path


def _record(library: Path) -> Path:
    """Where the build recorded the library's SHA-256 (``README.md``)."""
    return library.with_name(library.name + ".sha256")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _foreign_library(directory: Path) -> Path:
    """A valid shared library without the kernels, from the compiler the package uses."""
    source = directory / "foreign.c"
    source.write_text("int not_a_kernel(void) { return 0; }\n")
    out = directory / "foreign.so"
    subprocess.run([_build._compiler(), "-shared", "-fPIC", "-o", str(out), str(source)], check=True, timeout=60)
    return out


def _scenario(directory: Path, name: str, build: Path, cache: str = "cache", **env: str) -> Path:
    """The library of a copy of ``build`` in ``name``'s folder (at ``cache``), and its process's settings.

    The process runs in the folder's empty ``work`` directory, with
    ``FUNCPRUNE_CACHE_DIR`` set to the copy unless ``env`` says otherwise.
    """
    folder = directory / name
    shutil.copytree(build, folder / cache)
    (folder / "work").mkdir()
    env = {"FUNCPRUNE_CACHE_DIR": str(folder / cache), "FUNCPRUNE_NATIVE": "1", **env}
    (folder / "scenario.json").write_text(json.dumps({"env": env, "cwd": str(folder / "work")}))
    return _library(folder / cache)


def prepare(directory: Path) -> list[str]:
    """Build the kernels once, spoil a copy per scenario, and return the probe's command line."""
    build = directory / "build"
    library, status = _native.open_library(build, portable=False)
    assert library is not None, status.detail
    size = _library(build).stat().st_size
    foreign = _foreign_library(directory)

    os.truncate(_scenario(directory, "truncated", build), size // 2)  # as an interrupted copy leaves it

    flipped = _scenario(directory, "flipped", build)
    data = bytearray(flipped.read_bytes())
    for i in range(size // 4, size, 61):  # code and tables, past the headers
        data[i] ^= 0xFF
    flipped.write_bytes(data)

    shutil.copyfile(foreign, _scenario(directory, "foreign", build))

    recorded = _scenario(directory, "foreign_recorded", build)
    shutil.copyfile(foreign, recorded)
    _record(recorded).write_text(_sha256(foreign) + "\n")  # it passes the check, and lacks the kernels

    # an empty FUNCPRUNE_CACHE_DIR is unset: the cache is $XDG_CACHE_HOME/funcprune, holding the build
    xdg = directory / "empty_cache_dir" / "xdg"
    _scenario(directory, "empty_cache_dir", build, "xdg/funcprune", FUNCPRUNE_CACHE_DIR="", XDG_CACHE_HOME=str(xdg))
    return [sys.executable, str(PROBE), str(directory), *SCENARIOS]


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


PROBE_JOB = Job(prepare, cwd=ROOT, env=_environment(), timeout=240)
BACKGROUND = {"probed": PROBE_JOB}


@pytest.fixture(scope="module")
def probed() -> dict[str, Any]:
    """What each scenario's process did: its exit code and report (``_cache_probe.py``)."""
    done = PROBE_JOB.result()
    assert done.returncode == 0, done.stderr
    results: dict[str, Any] = json.loads(done.stdout)
    results["stderr"] = done.stderr
    return results


def _check_ran(probed: dict[str, Any], name: str) -> dict[str, Any]:
    """``name``'s process exited normally, with the pure-torch results: its report."""
    result = probed[name]
    assert result["exitcode"] == 0, (result, probed["stderr"])
    report: dict[str, Any] = result["report"]
    assert report["equal"], report
    return report


def _check_rebuilt(probed: dict[str, Any], name: str) -> None:
    """``name``'s spoiled library was not loaded but rebuilt, matches its record, and is in use."""
    report = _check_ran(probed, name)
    assert report["available"] and report["native"], report
    assert "rebuilt" in report["detail"] and "did not match the SHA-256" in report["detail"], report
    library = _library(PROBE_JOB.directory / name / "cache")
    assert _record(library).read_text().strip() == _sha256(library)


def test_a_library_cut_short_is_rebuilt_not_loaded(probed: dict[str, Any]) -> None:
    _check_rebuilt(probed, "truncated")


def test_an_altered_library_is_rebuilt_not_loaded(probed: dict[str, Any]) -> None:
    _check_rebuilt(probed, "flipped")


def test_a_foreign_library_under_the_cached_name_is_rebuilt(probed: dict[str, Any]) -> None:
    _check_rebuilt(probed, "foreign")


def test_a_recorded_library_without_the_kernels_leaves_the_torch_path_and_is_removed(
    probed: dict[str, Any],
) -> None:
    report = _check_ran(probed, "foreign_recorded")
    assert not report["available"] and not report["native"], report
    assert "lacks the kernels" in report["detail"] and "fp_" in report["detail"], report
    assert not list((PROBE_JOB.directory / "foreign_recorded" / "cache").iterdir())  # the next process rebuilds


def test_an_empty_cache_dir_is_unset(probed: dict[str, Any]) -> None:
    report = _check_ran(probed, "empty_cache_dir")
    folder = PROBE_JOB.directory / "empty_cache_dir"
    assert report["available"] and report["native"], report
    assert f"native kernels from {folder / 'xdg' / 'funcprune'}" in report["detail"], report
    assert "rebuilt" not in report["detail"]  # the build there, as it was
    assert not list((folder / "work").iterdir())  # nothing written in the working directory


def test_an_empty_cache_dir_reads_as_the_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("FUNCPRUNE_CACHE_DIR", "")
    assert _build._cache_dir() == tmp_path / "funcprune"
