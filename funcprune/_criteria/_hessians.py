"""The Hessians of layer reconstruction: ``XᵀX`` over calibration tokens, per Linear weight.

Pruning a Linear ``y = x Wᵀ`` so that its outputs on calibration inputs
``X`` change least, ``min ||(W - W') Xᵀ||²``, is a quadratic problem per
output row whose Hessian is ``2 XᵀX``, the same for every row (Frantar and
Alistarh 2023, "SparseGPT"). :func:`hessians` collects ``XᵀX`` through the
same forward pre-hooks as :func:`~funcprune.input_norms`; it feeds
:func:`~funcprune.sparsegpt`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from .._types import Tensor
from ._calls import calls
from ._collect import collect
from ._hooks import Statistic

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["GRAMS", "hessians", "ieee"]


def _gram(x: Tensor) -> Tensor:
    with ieee(x.device):
        return x.T @ x


#: ``hessians``'s: the Gram matrix of the inputs' rows, ``XᵀX``.
GRAMS = Statistic(_gram, lambda f: (f, f), linear_only=True, narrow_in_float64=True)


@contextlib.contextmanager
def ieee(device: torch.device) -> Iterator[None]:
    """Float32 matrix products in IEEE float32 on CUDA (no TF32) while inside; CPU ones always are."""
    if device.type != "cuda":
        yield
        return
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9
        before = matmul.fp32_precision
        matmul.fp32_precision = "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = before
    else:
        allowed = matmul.allow_tf32
        matmul.allow_tf32 = False
        try:
            yield
        finally:
            matmul.allow_tf32 = allowed


def hessians(
    module: nn.Module, batches: Iterable[object], names: Iterable[str], *, across: ProcessGroup | None = None
) -> dict[str, Tensor]:
    """The ``(in, in)`` sum of ``x xᵀ`` over every calibration token reaching each named weight.

    Runs ``module`` on every batch, under :func:`torch.no_grad`, and for
    each weight in ``names``, the weight of an :class:`~torch.nn.Linear`
    or of transformers' ``Conv1D`` (GPT-2's layers, stored ``(in, out)``),
    sums ``XᵀX`` over the rows ``x`` (one per token: every dim of the input
    but the last counts tokens) of every input its module receives. That is
    half the Hessian of the layer's reconstruction error ``||(W - W')X||²``
    that :func:`~funcprune.sparsegpt` minimizes (its scale does not matter
    there). A module called several times per batch counts every call.

    Padding is left out as :func:`~funcprune.input_norms` leaves it out: a
    dict batch's ``attention_mask`` (``(batch, tokens)``, 1 at real tokens,
    0 at padding) selects the real tokens of every input that has them (see
    there for the other cases). Each module counts its input as it was when
    it received it, also where the forward changes that tensor in place
    between two layers (``x += fc1(x)`` before ``fc2(x)``).

    Sums are accumulated and returned in ``float64`` for inputs narrower
    than ``float32`` (``float16``, ``bfloat16``; SparseGPT's code sums them
    in ``float32``) or ``float64`` ones, in ``float32`` otherwise, on the
    inputs' device; on CUDA, ``float32`` products run in IEEE ``float32``
    whatever the TF32 settings.
    The memory is ``in * in`` such numbers per weight, ``XᵀX`` of each batch
    computed as one matrix product.

    The module runs as it is: call ``module.eval()`` first to calibrate
    without dropout. The hooks are removed before returning, also on error:
    the module is left with its hooks, mode and parameters as they were. A
    tied weight goes by the name ``named_parameters()`` gives it.

    Args:
        module: the model, as an :class:`torch.nn.Module`.
        batches: an iterable of batches; each is called as
            ``module(batch)`` for a tensor, ``module(*batch)`` for a tuple or
            list, ``module(**batch)`` for a dict. A generator is fine: it is
            consumed once.
        names: weight names as ``module.named_parameters()`` gives them. With
            none, nothing runs and the result is empty.
        across: a ``torch.distributed`` process group: every process of it
            calls this with its own batches (data parallel, FSDP2) and each
            gets the sums over all of them, added by one ``all_reduce`` (in
            ``float64``) of every weight's ``(in, in)`` sums together, before
            the root. ``None``: this process's batches only.

    Returns:
        A new dict ``{name: XᵀX}``, in the order of ``names``, each
        ``(in, in)``, symmetric, positive semi-definite.

    Raises:
        TypeError: if an argument or a batch has the wrong type, or an input
            is not floating-point.
        UnknownNameError: if a name is no parameter of ``module``.
        ValueError: if a name is not the weight of a Linear or ``Conv1D``
            (this and the errors above are raised before any batch runs), if
            there are no batches, if a module receives an input without its
            features or whose tokens the batch's ``attention_mask`` does not
            match, or if a weight's module was never called.

    >>> import torch, funcprune as fp
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    >>> batches = [torch.tensor([[3.0, 0.0]]), torch.tensor([[4.0, 1.0]])]
    >>> fp.hessians(model, batches, ["0.weight"])
    {'0.weight': tensor([[25.,  4.],
            [ 4.,  1.]])}
    """
    fn = "hessians"
    return collect(fn, module, calls(fn, batches), names, GRAMS, across=across)
