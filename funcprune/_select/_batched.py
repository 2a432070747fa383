"""Selection under ``vmap`` at eager speed: the custom op ``funcprune::keep_lowest`` with a vmap rule.

:func:`make_keep_lowest` registers the op once, when ``_choose`` is
imported (a side effect on torch's op registry at ``import funcprune``);
its vmap rule hands the batched rows to the eager selection (``README.md``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._torch_private import is_batched, plain_dispatch
from .._types import Tensor

__all__ = ["KeepLowest", "make_keep_lowest"]


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
        if is_batched(values):  # an outer vmap level: its rule sees one row at a time
            return torch.stack([keep_lowest(row, k, magnitude) for row in values.unbind(dim)]), 0
        with plain_dispatch():  # plain tensors: skip functorch's dispatch on every op
            return rows(values.movedim(dim, 0), k, magnitude), 0

    library.register_vmap("funcprune::keep_lowest", batched)
    result: KeepLowest = keep_lowest
    return result
