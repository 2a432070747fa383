"""The private parts of torch that funcprune relies on, in one place.

Each is guarded where torch may lack it; a torch upgrade that moves one
touches this file only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch._C import _functorch

__all__ = ["is_batched", "is_functorch_wrapped", "plain_dispatch"]


def is_functorch_wrapped(t: torch.Tensor) -> bool:
    """Whether a ``torch.func`` transform (``vmap``, ``grad``, ...) wraps ``t``."""
    return bool(_functorch.is_functorch_wrapped_tensor(t))


def is_batched(t: torch.Tensor) -> bool:
    """Whether ``t`` is batched by ``vmap`` (at its innermost level)."""
    return bool(_functorch.is_batchedtensor(t))


#: Turns functorch's dispatch off within a block (a no-op where torch lacks it).
plain_dispatch: Callable[[], AbstractContextManager[object]] = getattr(
    torch._C, "_DisableFuncTorch", contextlib.nullcontext
)
