"""Selection under ``vmap`` at eager speed: a custom op with a vmap rule.

Under ``vmap`` a traced selection would rank every row with a full
``kthvalue`` and an int64 ``cumsum``. Instead, :func:`make_keep_lowest`
registers ``funcprune::keep_lowest(keys, k)``, whose vmap rule hands the
batched tensor itself, one row per batch element, to the eager selection
(row by row: a batched ``kthvalue`` is slower than one per row on CPU): one
vmapped call costs what a loop of eager calls costs, without the loop's
Python. Flags are identical to the
traced path's (tested). Where ``torch.library`` lacks ``custom_op`` or
``register_vmap`` (torch < 2.4) nothing is registered and selection keeps
the traced path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch._C._functorch import is_batchedtensor

from ._types import Tensor

__all__ = ["KeepLowest", "make_keep_lowest"]

#: Turns functorch's dispatch off (private in torch; a no-op where it is missing).
_plain_dispatch: Callable[[], AbstractContextManager[object]] = getattr(
    torch._C, "_DisableFuncTorch", contextlib.nullcontext
)

#: Kept flags of ``values`` once the ``k`` lowest keys of each row (last
#: dim) are pruned; the keys are ``|values|`` if the flag says so, else the
#: values themselves.
KeepLowest = Callable[[Tensor, int, bool], Tensor]


def make_keep_lowest(rows: KeepLowest) -> KeepLowest | None:
    """Register ``funcprune::keep_lowest`` for 1-D values, selecting with ``rows``.

    ``rows`` takes eager 2-D values. Returns the op, or ``None`` where torch
    cannot register it.
    """
    library = torch.library
    if not (hasattr(library, "custom_op") and hasattr(library, "register_vmap")):
        return None  # pragma: no cover (torch < 2.4)

    @library.custom_op("funcprune::keep_lowest", mutates_args=())
    def keep_lowest(values: Tensor, k: int, magnitude: bool) -> Tensor:
        return rows(values[None], k, magnitude)[0]

    @keep_lowest.register_fake
    def _(values: Tensor, k: int, magnitude: bool) -> Tensor:
        return torch.empty_like(values, dtype=torch.bool)

    def batched(
        info: object, in_dims: tuple[int | None, ...], values: Tensor, k: int, magnitude: bool
    ) -> tuple[Tensor, int | None]:
        dim = in_dims[0]
        if dim is None:
            return keep_lowest(values, k, magnitude), None
        if is_batchedtensor(values):  # an outer vmap level: its rule sees one row at a time
            return torch.stack([keep_lowest(row, k, magnitude) for row in values.unbind(dim)]), 0
        with _plain_dispatch():  # plain tensors: skip functorch's dispatch on every op
            return rows(values.movedim(dim, 0), k, magnitude), 0

    library.register_vmap("funcprune::keep_lowest", batched)
    result: KeepLowest = keep_lowest
    return result
