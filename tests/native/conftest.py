"""The native kernels' fixtures: each build in turn, and the kernels in one piece or in several."""

from __future__ import annotations

import ctypes
import shutil
from collections.abc import Iterator

import pytest

from funcprune import _native
from funcprune._native import _build, _calls

HAVE_COMPILER = any(shutil.which(c) for c in ("cc", "gcc", "clang"))


@pytest.fixture(scope="module", params=["native", "portable", "x86-64-v3"])
def kernels(request: pytest.FixtureRequest) -> Iterator[ctypes.CDLL]:
    """The build for this CPU (the one in use), then the session's portable and AVX2 builds (``tests/conftest.py``;
    the AVX2 one beside AVX-512 only)."""
    if not HAVE_COMPILER:
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
    count: int = request.param
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_calls, "_threads", lambda n: count)
        yield count
