"""Scores for the fast paths' properties: many scales, ties, specials, all equal."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from funcprune import _native
from funcprune._native import _calls

Tensor = torch.Tensor
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@contextlib.contextmanager
def mode(native: bool, threads: int, *, every_size: bool = True) -> Iterator[None]:
    """The native kernels on or off and torch's thread count, restored after.

    With ``every_size``, the kernels run on that many threads even for a few entries.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with pytest.MonkeyPatch.context() as mp:
            if every_size:
                mp.setattr(_calls, "_threads", lambda n: threads)
            with contextlib.nullcontext() if native else _native.using(None):
                yield
    finally:
        torch.set_num_threads(before)


def values(shape: tuple[int, ...], seed: int, kind: int, dtype: torch.dtype) -> Tensor:
    """Normal values over many scales (0), small ints: ties (1), specials among ties (2), all equal (3)."""
    g = torch.Generator().manual_seed(seed)
    if kind == 0:
        scale = torch.exp(torch.randn(shape, generator=g, dtype=torch.float64) * 3)
        return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    if kind == 3:
        return torch.full(shape, -0.5, dtype=dtype)
    x = torch.randint(-3, 4, shape, generator=g).to(dtype)
    if kind == 2:
        tiny = torch.finfo(dtype).smallest_normal / 4  # a subnormal
        special = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), -0.0, 0.0, tiny, -tiny], dtype=torch.float64)
        picks = special.to(dtype)[torch.randint(0, len(special), shape, generator=g)]
        x = torch.where(torch.rand(shape, generator=g) < 0.4, picks, x)
    return x
