"""Scores for the fast paths' properties: many scales, ties, specials, all equal."""

from __future__ import annotations

import torch

Tensor = torch.Tensor


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
