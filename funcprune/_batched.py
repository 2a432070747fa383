"""Selection under ``vmap`` at eager speed: a custom op with a vmap rule.

Under ``vmap`` a traced selection would rank every row with a full
``kthvalue`` and an int64 ``cumsum``. Instead, :func:`make_keep_lowest`
registers ``funcprune::keep_lowest(keys, k)``, whose vmap rule hands the
batched tensor itself, one row per batch element, to an eager selection
(the bracket path row by row for long rows, one batched ``kthvalue`` for
short ones): one vmapped call costs what a loop of eager calls costs,
without the loop's Python. Flags are identical to the
traced path's (tested). Where ``torch.library`` lacks ``custom_op`` or
``register_vmap`` (torch < 2.4) nothing is registered and selection keeps
the traced path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._C._functorch import is_batchedtensor

from ._types import Tensor

__all__ = ["KeepLowest", "make_keep_lowest"]

#: Kept flags of ``keys`` once the ``k`` lowest of each row (last dim) are pruned.
KeepLowest = Callable[[Tensor, int], Tensor]


def make_keep_lowest(rows: KeepLowest) -> KeepLowest | None:
    """Register ``funcprune::keep_lowest`` for 1-D keys, selecting with ``rows``.

    ``rows`` takes eager 2-D keys. Returns the op, or ``None`` where torch
    cannot register it.
    """
    library = torch.library
    if not (hasattr(library, "custom_op") and hasattr(library, "register_vmap")):
        return None  # pragma: no cover (torch < 2.4)

    @library.custom_op("funcprune::keep_lowest", mutates_args=())
    def keep_lowest(keys: Tensor, k: int) -> Tensor:
        return rows(keys[None], k)[0]

    @keep_lowest.register_fake
    def _(keys: Tensor, k: int) -> Tensor:
        return torch.empty_like(keys, dtype=torch.bool)

    def batched(info: object, in_dims: tuple[int | None, ...], keys: Tensor, k: int) -> tuple[Tensor, int | None]:
        dim = in_dims[0]
        if dim is None:
            return keep_lowest(keys, k), None
        if is_batchedtensor(keys):  # an outer vmap level: its rule sees one row at a time
            return torch.stack([keep_lowest(row, k) for row in keys.unbind(dim)]), 0
        return rows(keys.movedim(dim, 0), k), 0

    library.register_vmap("funcprune::keep_lowest", batched)
    result: KeepLowest = keep_lowest
    return result
