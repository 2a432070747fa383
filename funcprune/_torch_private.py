"""The private parts of torch that funcprune relies on, in one place.

Each is guarded where torch may lack it; a torch upgrade that moves one
touches this file only. No other module of funcprune reaches into torch's
private names (``tests/test_torch_private.py`` checks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import torch
import torch.utils._pytree as _pytree
from torch._C import _functorch
from torch.nn.modules.batchnorm import _NormBase
from torch.nn.modules.conv import _ConvNd

if TYPE_CHECKING:
    from torch.distributed.tensor.placement_types import Placement

__all__ = [
    "ConvNd", "NormBase", "is_batched", "is_functorch_wrapped", "lazy_graph_modules", "plain_dispatch", "strided_shard",
    "strided_split_factor", "tree_leaves",
]  # fmt: skip

#: The base class of every convolution (``nn.Conv1d``/``2d``/``3d`` and the transposed ones).
ConvNd = _ConvNd
#: The base class of the batch and instance norms (their ``num_features`` and running statistics).
NormBase = _NormBase


def tree_leaves(tree: object) -> list[object]:
    """The leaves of a nested structure of tuples, lists and dicts (and what torch registers), in order."""
    leaves, _ = _pytree.tree_flatten(tree)
    return leaves



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


def strided_split_factor(placement: object) -> int | None:
    """The split factor of FSDP2's ``_StridedShard`` placement; ``None`` for any other placement.

    ``None`` too where torch has no ``_StridedShard`` (no DTensor can hold one there).
    """
    try:
        from torch.distributed.tensor.placement_types import _StridedShard
    except ImportError:
        return None
    return int(placement.split_factor) if isinstance(placement, _StridedShard) else None


def strided_shard(dim: int, split_factor: int) -> Placement:
    """FSDP2's placement ``_StridedShard(dim, split_factor=split_factor)``."""
    from torch.distributed.tensor.placement_types import _StridedShard

    return _StridedShard(dim, split_factor=split_factor)


def lazy_graph_modules() -> AbstractContextManager[object]:
    """Inside, a ``torch.fx.GraphModule`` made writes and compiles its Python code when first run or read, not when
    made (``torch.fx._lazy_graph_module``): ``torch.export`` makes several, and the analysis runs none (0.3 s of the
    1.5 s export of a 1B Llama). A no-op where torch lacks it."""
    try:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module
    except ImportError:
        return contextlib.nullcontext()
    return _use_lazy_graph_module(True)
