"""The hypothesis profiles and torch's thread count for the test suite.

Two profiles, both derandomized (the same examples every run):

- ``dev`` (the default): 60 examples per property, so that the whole suite
  runs in a few minutes or less on 2 cores;
- ``ci``: 300 examples per property, selected when the environment variable
  ``CI`` is set (CI runs with ``CI=true``) or ``FUNCPRUNE_PROFILE=ci``; the
  tests marked ``@pytest.mark.ci`` (slow ones: every architecture through
  every plan, the vision models) and those that use a world of 4
  processes (``world4``) run under it only.

``FUNCPRUNE_EXAMPLES=N`` overrides the number of examples of either.

Once the tests are collected, the long subprocesses that the selected tests
wait for (a module's ``BACKGROUND`` jobs, ``tests/_background.py``) start
running one after another beside the tests; the session's end stops any
still running.

The distributed tests' fixtures, one of each per test module that asks:
``mesh`` (a 1-D device mesh of this process alone, a gloo group of 1) and
``world2`` / ``world4`` (2 and 4 gloo processes, ``tests/_distributed.py``);
``portable``, the native kernels built without ``-march=native``; and
``avx2``, those built for AVX2 without AVX-512 (``None`` but beside
AVX-512); ``kernels``, each build in turn, in use (the native kernels'
tests), and ``pieces``, their kernels in one piece, then in three.
"""

from __future__ import annotations

import ctypes
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from hypothesis import HealthCheck, settings

import _background
from _distributed import World, one_process_group

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

_EXAMPLES = {"dev": 60, "ci": 300}

for _name, _examples in _EXAMPLES.items():
    settings.register_profile(
        _name,
        max_examples=int(os.environ.get("FUNCPRUNE_EXAMPLES", _examples)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        derandomize=True,
    )
_default = "ci" if os.environ.get("CI") else "dev"
PROFILE = os.environ.get("FUNCPRUNE_PROFILE", _default)
settings.load_profile(PROFILE)
torch.set_num_threads(min(2, torch.get_num_threads()))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ci: a slow test that runs under the ci profile only (CI runs it)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests marked ``ci`` unless the ci profile is selected."""
    if PROFILE == "ci":
        return
    skip = pytest.mark.skip(reason="slow: runs under the ci profile (CI=true or FUNCPRUNE_PROFILE=ci)")
    for item in items:  # and the worlds of 4 processes: the default run keeps those of 2
        if item.get_closest_marker("ci") is not None or "world4" in getattr(item, "fixturenames", ()):
            item.add_marker(skip)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Run the background jobs whose fixtures the collected tests use, in the order collected."""
    if session.config.option.collectonly:
        return
    needed: dict[_background.Job, None] = {}
    for item in session.items:
        jobs: dict[str, _background.Job] = getattr(getattr(item, "module", None), "BACKGROUND", {})
        needed.update((job, None) for fixture, job in jobs.items() if fixture in getattr(item, "fixturenames", ()))
    _background.run_in_order(list(needed))


def pytest_sessionfinish(session: pytest.Session) -> None:
    _background.stop_all()


@pytest.fixture(scope="module")
def mesh() -> Iterator[DeviceMesh]:
    """A 1-D device mesh of this process alone: the sharded paths run for real, over one process."""
    from torch.distributed.device_mesh import init_device_mesh

    with one_process_group():
        yield init_device_mesh("cpu", (1,))


@pytest.fixture(scope="module")
def world2() -> Iterator[World]:
    w = World(2)
    yield w
    w.close()


@pytest.fixture(scope="module")
def world4() -> Iterator[World]:
    w = World(4)
    yield w
    w.close()


#: Whether this machine has a C compiler to build the native kernels with.
_HAVE_COMPILER = any(shutil.which(c) for c in ("cc", "gcc", "clang"))


def _test_builds() -> Path:
    """Where the tests' other builds are cached, beside the build in use: each file is named by the hash of the
    source, the compiler, the flags and the CPU (as the build in use is), so a changed kernel is compiled again, and
    checked against its recorded SHA-256 when loaded. ``test_native_cache.py`` and ``test_native.py`` test the
    compiling itself in fresh folders."""
    from funcprune._native import _build

    return _build._cache_dir() / "test-builds"


@pytest.fixture(scope="session")
def portable() -> ctypes.CDLL:
    """The native kernels built for any CPU of the architecture (no ``-march=native``: no vector pass)."""
    from funcprune import _native

    if not _HAVE_COMPILER:
        pytest.skip("no C compiler on this machine")
    library, status = _native.open_library(_test_builds(), portable=True)
    assert library is not None, status.detail
    return library


@pytest.fixture(scope="session")
def avx2() -> ctypes.CDLL | None:
    """The native kernels built for AVX2 without AVX-512 (``x86-64-v3``), where this CPU has AVX-512 (else ``None``:
    the build in use is the AVX2 one already, or the CPU has no AVX2)."""
    from funcprune import _native
    from funcprune._native import _build

    flags = set(_build._cpu_flags().split())  # (the line that keys the build cache)
    if not {"avx2", "avx512f"} <= flags or not _HAVE_COMPILER:
        return None
    library, status = _native.open_library(_test_builds(), portable=False, march="x86-64-v3")
    assert library is not None, status.detail
    return library


@pytest.fixture(scope="module", params=["native", "portable", "x86-64-v3"])
def kernels(request: pytest.FixtureRequest) -> Iterator[ctypes.CDLL]:
    """The build for this CPU (the one in use), then the session's portable and AVX2 builds (the fixtures above; the
    AVX2 one beside AVX-512 only)."""
    from funcprune import _native
    from funcprune._native import _build

    if not _HAVE_COMPILER:
        pytest.skip("no C compiler on this machine")
    if request.param == "native":
        built, status = _build._cached()
        assert built is not None, status.detail
        library: ctypes.CDLL = built
    elif request.param == "portable":
        library = request.getfixturevalue("portable")
    else:
        avx2: ctypes.CDLL | None = request.getfixturevalue("avx2")
        if avx2 is None:
            pytest.skip("the AVX2 build is this CPU's own build here (or the CPU has no AVX2)")
        library = avx2
    with _native.using(library):
        yield library


@pytest.fixture(scope="module", params=[1, 3])
def pieces(request: pytest.FixtureRequest) -> Iterator[int]:
    """Run each kernel in one piece, then in three threads' pieces whatever the size."""
    from funcprune._native import _calls

    count: int = request.param
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_calls, "_threads", lambda n: count)
        yield count
