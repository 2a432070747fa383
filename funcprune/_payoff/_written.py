"""Zeros written into a model's own tensors for one run of a masked model, and the values put back after.

A trial's masked model zeroes a few indices of many tensors (one hidden
channel of every weight that spans the residual stream, the columns that
read one head): copying each tensor whole to zero them costs a copy of the
model, in memory a VM writes slowly (an embedding of 262 MB copied to zero
one column). :func:`written_for_the_run` writes ``+0.0`` at those indices
of the tensors themselves, through ``.data`` (no version counter moves, so
an analysis made of them stays valid), keeping the values it overwrites,
and puts them back, bit for bit, when the run ends, raising or not. The
values are restored before the run returns: nothing outside it sees them
but code running on the same tensors at the same time (another thread).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .._torch_private import tree_leaves
from .._types import Tensor

__all__ = ["aliases_written", "written_for_the_run"]

#: Indices zeroed, by parameter name and dim (as ``_smaller.Dropped``).
_Indices = Mapping[str, Mapping[int, Sequence[int]]]


@contextlib.contextmanager
def written_for_the_run(module: nn.Module, dropped: _Indices) -> Iterator[tuple[dict[str, Mapping[int, Sequence[int]]], set[int]]]:
    """``+0.0`` written at the indices ``dropped`` gives of ``module``'s parameters while it is held, the values
    put back after; yields the indices left to the caller (to copy) and the storages written (``data_ptr``).

    A parameter is written only where that costs less than a copy (what it
    keeps of the values is at most half of them), and where writing it
    changes no other tensor of ``module``: a plain strided tensor, no
    inference tensor, the only parameter or buffer of ``module`` on its
    storage (a tied parameter is one). Any other is left to the caller.
    """
    params = dict(module.named_parameters())
    holders: dict[int, int] = {}  # storage -> how many distinct tensors of module are on it
    for t in {id(t): t for t in [*module.parameters(), *module.buffers()]}.values():
        if t.layout == torch.strided and t.device.type != "meta":
            ptr = t.untyped_storage().data_ptr()
            holders[ptr] = holders.get(ptr, 0) + 1
    left: dict[str, Mapping[int, Sequence[int]]] = {}
    saved: list[tuple[Tensor, int, Tensor, Tensor]] = []
    written: set[int] = set()
    try:
        with torch.no_grad():
            for name, dims in dropped.items():
                param = params.get(name)
                if param is None or not _writable(param, dims, holders):
                    left[name] = dims
                    continue
                data = param.data  # (its own version counter: the parameter's does not move)
                for dim, indices in dims.items():
                    if indices:
                        at = torch.tensor(indices, dtype=torch.long, device=data.device)
                        saved.append((data, dim, at, data.index_select(dim, at)))
                        data.index_fill_(dim, at, 0.0)
                written.add(data.untyped_storage().data_ptr())
        yield left, written
    finally:
        with torch.no_grad():
            for data, dim, at, values in reversed(saved):  # (a second dim's values were saved over the first's zeros)
                data.index_copy_(dim, at, values)


def aliases_written(out: Any, written: set[int]) -> bool:
    """Whether a tensor of ``out`` lies on a storage :func:`written_for_the_run` wrote (a model that returns a
    view of a weight): its values would change when they are put back."""
    return bool(written) and any(
        isinstance(t, torch.Tensor) and t.layout == torch.strided and t.untyped_storage().data_ptr() in written
        for t in tree_leaves(out)
    )


def _writable(t: Tensor, dims: Mapping[int, Sequence[int]], holders: Mapping[int, int]) -> bool:
    if type(t) not in (torch.Tensor, nn.Parameter) or t.layout != torch.strided or t.is_inference():
        return False
    if t.device.type == "meta" or holders.get(t.untyped_storage().data_ptr(), 0) != 1 or t.numel() == 0:
        return False
    kept = sum(len(indices) * (t.numel() // t.shape[dim]) for dim, indices in dims.items() if t.shape[dim])
    return 2 * kept <= t.numel()
