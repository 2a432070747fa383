"""Importance scores: criteria that rank weights by more than their magnitude.

:func:`saliency` (SNIP), :func:`taylor` and :func:`wanda` are pure functions
returning new scores keyed like the parameters, ready for a plan's
``scores=``; they are data (detached), in float32 at least (``README.md``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from .._dtensor import layout_of, wrap
from .._names import check_params, unknown_name
from .._types import Params, Tensor, is_dtensor
from .._validate import check_fits

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = ["saliency", "taylor", "wanda"]


def saliency(params: Params, grads: Mapping[str, Tensor | None]) -> dict[str, Tensor]:
    """``|w * g|`` for every parameter: SNIP's connection sensitivity.

    Taken at initialization, with the gradients of a loss on one batch, this
    is SNIP (Lee et al. 2019, "Single-shot Network Pruning based on
    Connection Sensitivity"); pruning the smallest scores keeps the
    connections whose removal changes the loss most, to first order. (SNIP
    divides the scores by their sum over all weights, which ranks the same.)

    Args:
        params: the tensors to score, keyed like ``named_parameters()``.
        grads: a gradient for every name in ``params``, of its shape and on
            its device (``torch.func.grad(loss)(params)`` gives them). Extra
            names are ignored, so the gradients of a whole model may score a
            few of its weights.

    Returns:
        A new dict ``{name: |w * g|}`` in the order of ``params``, in the
        promoted dtype of ``w`` and ``g``, at least ``float32``.

    Raises:
        TypeError: if ``params`` or ``grads`` is not a mapping of names to
            tensors, or a tensor is not floating-point.
        ValueError: if a gradient is missing or ``None``, or its shape or
            device differs from its parameter's.

    >>> import torch, funcprune as fp
    >>> fp.saliency({"w": torch.tensor([2.0, -3.0])}, {"w": torch.tensor([0.5, 1.0])})
    {'w': tensor([1., 3.])}
    """
    return {name: product.abs() for name, product in _products("saliency", params, grads).items()}


def taylor(params: Params, grads: Mapping[str, Tensor | None]) -> dict[str, Tensor]:
    """``(w * g) ** 2`` for every parameter: the first-order Taylor criterion.

    Molchanov et al. 2019, "Importance Estimation for Neural Network
    Pruning": the squared first-order estimate of the change in loss when a
    weight is removed. Entry by entry it ranks as :func:`saliency` does; the
    square matters when scores are summed over a group (a channel, a block).
    Sum the scores of several batches yourself to accumulate them, as the
    paper does.

    Args:
        params: the tensors to score, keyed like ``named_parameters()``.
        grads: a gradient for every name in ``params``, of its shape and on
            its device; extra names are ignored.

    Returns:
        A new dict ``{name: (w * g) ** 2}`` in the order of ``params``, in
        the promoted dtype of ``w`` and ``g``, at least ``float32``.

    Raises:
        TypeError: if ``params`` or ``grads`` is not a mapping of names to
            tensors, or a tensor is not floating-point.
        ValueError: if a gradient is missing or ``None``, or its shape or
            device differs from its parameter's.

    >>> import torch, funcprune as fp
    >>> fp.taylor({"w": torch.tensor([2.0, -3.0])}, {"w": torch.tensor([0.5, 1.0])})
    {'w': tensor([1., 9.])}
    """
    return {name: product.square() for name, product in _products("taylor", params, grads).items()}


def wanda(params: Params, input_norms: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``|W[i, j, ...]| * norm[j]``: Wanda's weights-and-activations score.

    Sun et al. 2023, "A Simple and Effective Pruning Approach for Large
    Language Models": a weight matters as much as its magnitude times the
    L2 norm of the input feature it multiplies, over calibration tokens.
    The paper compares scores within each output row: prune with
    ``fp.PerSlice(spec, dim=0)`` for that, or with a plain spec to compare
    across the whole tensor.

    Args:
        params: the parameters, keyed like ``named_parameters()``; each
            scored weight has the shape ``(out, in, *kernel)`` of a Linear or
            Conv weight (dim 1 is the input feature).
        input_norms: for some names of ``params``, the 1-D tensor of the
            ``in`` norms of its input features, on the weight's device:
            what :func:`input_norms` returns.

    Returns:
        A new dict with a score for each name in ``input_norms``, in its
        order, of the weight's shape, in the promoted dtype of the weight and
        the norms, at least ``float32``. Under ``torch.func.vmap`` the norms
        may be batched with the weights or shared by all of them. A DTensor
        weight (FSDP2) gets a DTensor score of its layout, each process
        scaling its block by the norms of the input features it holds
        (nothing communicated; the norms whole on every process, as
        :func:`input_norms` gives them).

    Raises:
        TypeError: if an argument is not a mapping of names to tensors, or a
            tensor is not floating-point.
        UnknownNameError: if a name of ``input_norms`` is no parameter's.
        ValueError: if a weight has fewer than 2 dims, a norm vector is not
            1-D, its length is not the weight's ``shape[1]``, or it is on
            another device.

    >>> import torch, funcprune as fp
    >>> params = {"fc.weight": torch.tensor([[1.0, -1.0, 2.0], [-4.0, 0.5, 1.0]])}
    >>> fp.wanda(params, {"fc.weight": torch.tensor([1.0, 10.0, 0.0])})["fc.weight"]
    tensor([[ 1., 10.,  0.],
            [ 4.,  5.,  0.]])
    """
    fn = "wanda"
    check_params(fn, params)
    if not isinstance(input_norms, Mapping):
        raise TypeError(
            f"{fn}: input_norms must be a mapping of names to 1-D tensors, got "
            f"{type(input_norms).__name__}; fp.input_norms(module, batches, names) makes one"
        )
    scores: dict[str, Tensor] = {}
    for name, norms in input_norms.items():
        weight = _weight_for_norms(fn, name, norms, params)
        dtype = _score_dtype(weight, norms)
        if is_dtensor(weight):  # each process its block, with the norms of its block's input features
            scores[name] = _wanda_block(fn, name, weight, norms, dtype)
            continue
        per_feature = norms.detach().to(dtype).reshape(-1, *(1,) * (weight.dim() - 2))
        scores[name] = weight.detach().abs().to(dtype) * per_feature
    return scores


def _wanda_block(fn: str, name: str, weight: DTensor, norms: Tensor, dtype: torch.dtype) -> Tensor:
    """Wanda's score of a DTensor weight: a DTensor of its layout, computed block by block, nothing sent.

    ``norms`` is the whole vector (every process holds it, as
    :func:`input_norms` gives it on each) or a replicated DTensor; each
    process scales its block by the norms of the input features it holds.
    """
    if is_dtensor(norms):
        if any(not p.is_replicate() for p in norms.placements):
            raise ValueError(
                f"{fn}: input_norms[{name!r}] is a DTensor laid out as {list(norms.placements)}; give "
                "the whole vector on every process (what fp.input_norms returns) or a replicated DTensor"
            )
        norms = norms.to_local()
    layout = layout_of(fn, f"the parameter {name!r}", weight)
    start, count = layout.offsets[1], layout.size[1]
    per_feature = norms.detach()[start : start + count].to(dtype).reshape(-1, *(1,) * (weight.dim() - 2))
    return wrap(weight.to_local().detach().abs().to(dtype) * per_feature, layout)


def _products(fn: str, params: Params, grads: object) -> dict[str, Tensor]:
    """``w * g`` per name, detached, in the score dtype, after every check."""
    check_params(fn, params)
    if not isinstance(grads, Mapping):
        raise TypeError(
            f"{fn}: grads must be a mapping of names to tensors, got {type(grads).__name__}"
        )
    products: dict[str, Tensor] = {}
    for name, weight in params.items():
        grad = _grad_for(fn, name, grads)
        _check_float(fn, f"the parameter {name!r}", weight)
        _check_float(fn, f"the gradient for {name!r}", grad)
        check_fits(fn, f"the gradient for {name!r}", grad, "the parameter", weight)
        dtype = _score_dtype(weight, grad)
        products[name] = weight.detach().to(dtype) * grad.detach().to(dtype)
    return products


def _grad_for(fn: str, name: str, grads: Mapping[Any, object]) -> Tensor:
    """``grads[name]``, or an error saying why there is none."""
    if name not in grads:
        close = difflib.get_close_matches(name, [str(k) for k in grads], n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(
            f"{fn}: no gradient for parameter {name!r}: grads has no key {name!r}; {hint}pass "
            "a gradient for every name in params, or leave the parameter out of params"
        )
    grad = grads[name]
    if grad is None:
        raise ValueError(
            f"{fn}: no gradient for parameter {name!r}: grads[{name!r}] is None (it took no "
            "part in the loss, or does not require grad); leave it out of params"
        )
    if not isinstance(grad, torch.Tensor):
        raise TypeError(f"{fn}: grads[{name!r}] must be a tensor, got {type(grad).__name__}")
    return grad


def _check_float(fn: str, what: str, t: Tensor) -> None:
    if not t.is_floating_point():
        raise TypeError(f"{fn}: {what} has dtype {t.dtype}; scores need floating-point tensors")


def _score_dtype(a: Tensor, b: Tensor) -> torch.dtype:
    """The dtype torch promotes ``a`` and ``b`` to, at least ``float32``."""
    return torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)


def _weight_for_norms(fn: str, name: str, norms: object, params: Params) -> Tensor:
    """The weight ``norms`` scores, after checking that they fit each other."""
    if name not in params:
        problem = f"input_norms names {name!r}, not a parameter name"
        raise unknown_name(fn, problem, name, tuple(params))
    if not isinstance(norms, torch.Tensor):
        raise TypeError(f"{fn}: input_norms[{name!r}] must be a tensor, got {type(norms).__name__}")
    weight = params[name]
    _check_float(fn, f"the parameter {name!r}", weight)
    _check_float(fn, f"input_norms[{name!r}]", norms)
    if weight.dim() < 2:
        raise ValueError(
            f"{fn}: the parameter {name!r} has shape {tuple(weight.shape)}; wanda scores weights "
            "of shape (out, in, *kernel), whose dim 1 is the input feature"
        )
    if norms.dim() != 1 or norms.shape[0] != weight.shape[1]:
        raise ValueError(
            f"{fn}: input_norms[{name!r}] has shape {tuple(norms.shape)} but the parameter has "
            f"{weight.shape[1]} input features (shape {tuple(weight.shape)}, dim 1); expected "
            f"a 1-D tensor of {weight.shape[1]} norms"
        )
    if norms.device != weight.device:
        raise ValueError(
            f"{fn}: input_norms[{name!r}] is on {norms.device} but the parameter is on "
            f"{weight.device}; move it with .to({str(weight.device)!r})"
        )
    return weight


# --- collecting input norms --------------------------------------------------
