"""``weight * mask`` for ``torch.bool`` masks, keeping 1 byte an entry for backward.

:func:`masked_multiply` gives ``weight * mask.to(weight.dtype)`` and its
gradient bit for bit, natively on the CPU where the kernels load, under
every ``torch.func`` transform (``README.md``).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _native
from .._types import Tensor

__all__ = ["as_multiplier", "masked_multiply"]

#: Bytes of float multiplier made at a time, per torch thread (fits a core's L2).
_CHUNK_BYTES = 1 << 20


def as_multiplier(mask: Tensor, dtype: torch.dtype, *, copy: bool = False) -> Tensor:
    """``mask.to(dtype, copy=copy)``, the same values, through ``uint8`` for a bool mask.

    torch's CPU ``bool -> float`` copy is scalar code while ``uint8 -> float``
    is vectorized; ``view(torch.uint8)`` reinterprets the same bytes (no copy).
    A mask already in ``dtype`` is returned as it is unless ``copy``.
    """
    if mask.dtype == torch.bool and dtype != torch.bool:
        mask = mask.view(torch.uint8)
    return mask.to(dtype, copy=copy)


def _product(t: Tensor, mask: Tensor) -> Tensor:
    """``t * mask.to(t.dtype)`` for a bool ``mask`` of ``t``'s shape.

    Ordinary CPU tensors outside autograd take the native kernel where it
    applies and runs on as many threads as torch would, else the chunked
    path: each chunk of the result receives the converted mask (in cache)
    and is multiplied by ``t`` in place. Anything else (a transform's
    tensors, a recorded backward, other devices) takes the plain
    differentiable product.
    """
    if torch.is_grad_enabled() or t.shape != mask.shape or not (_native.plain(t) and _native.plain(mask)):
        if t.device.type != "cpu":  # the uint8 detour helps torch's CPU kernels only
            return t * mask.to(t.dtype)
        return t * as_multiplier(mask, t.dtype)
    if _native.as_many_threads_as_torch(t.numel()):
        native = _native.mask_multiply(t, mask)
        if native is not None:
            return native
    out = torch.empty_like(t)
    step = max(1, _CHUNK_BYTES * torch.get_num_threads() // t.element_size())
    chunks = zip(
        torch.split(out.view(-1), step),
        torch.split(mask.view(-1).view(torch.uint8), step),
        torch.split(t.view(-1), step),
    )
    for out_chunk, mask_chunk, t_chunk in chunks:
        out_chunk.copy_(mask_chunk).mul_(t_chunk)  # 0/1 * x is x * 0/1, bit for bit
    return out


class _BoolMaskMultiply(torch.autograd.Function):
    """``weight * mask`` for a ``torch.bool`` mask; saves only the mask."""

    generate_vmap_rule = True

    @staticmethod
    def forward(weight: Tensor, mask: Tensor) -> Tensor:
        return _product(weight, mask)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.save_for_backward(inputs[1])  # the bool mask: 1 byte an entry
        ctx.save_for_forward(inputs[1])

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> tuple[Tensor | None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None
        (mask,) = ctx.saved_tensors
        # what autograd's MulBackward0 computes for ``weight * float_mask``
        return _product(grad_outputs[0], mask), None

    @staticmethod
    def jvp(ctx: Any, *tangents: Any) -> Tensor:
        (mask,) = ctx.saved_tensors
        return _product(tangents[0], mask)


def masked_multiply(weight: Tensor, mask: Tensor) -> Tensor:
    """``weight * mask.to(weight.dtype)``: the same values and gradients.

    A ``torch.bool`` mask of a floating-point ``weight`` goes through
    :class:`_BoolMaskMultiply`, which keeps only the bool mask for backward
    (so writing into the mask between forward and backward raises autograd's
    "modified by an inplace operation" error, as in torch's hook mode).
    Other masks (0/1 numbers, :class:`~funcprune.Multipliers`) and other
    weights are multiplied as they are, after ``.to(weight.dtype)``.
    """
    if mask.dtype != torch.bool or not weight.is_floating_point():
        return weight * mask.to(weight.dtype)
    if torch.compiler.is_compiling():
        return weight * as_multiplier(mask, weight.dtype)
    if torch.is_grad_enabled() and mask.is_inference():
        mask = mask.clone()  # autograd may not keep an inference tensor: a 1-byte copy
    out: Tensor = _BoolMaskMultiply.apply(weight, mask)  # type: ignore[no-untyped-call]
    return out
