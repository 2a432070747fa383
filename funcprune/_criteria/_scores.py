"""Importance scores: criteria that rank weights by more than their magnitude.

:func:`saliency` (SNIP), :func:`taylor` and :func:`wanda` are pure functions
returning new scores keyed like the parameters, ready for a plan's
``scores=``; they are data (detached). ``saliency`` and ``taylor`` score
in float64, which holds ``w * g`` of narrower inputs exactly, so that they
rank as the exact products do; ``wanda`` in float32 at least
(``README.md``).
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
        A new dict ``{name: |w * g|}`` in the order of ``params``, in
        ``float64``: exact for finite inputs narrower than ``float64``, so
        they order as the exact ``|w * g|``, ties included, across every
        tensor; the product of ``float64`` inputs is rounded (see
        :func:`taylor`).

    Raises:
        TypeError: if ``params`` or ``grads`` is not a mapping of names to
            tensors, or a tensor is not floating-point.
        ValueError: if a gradient is missing or ``None``, or its shape or
            device differs from its parameter's.

    >>> import torch, funcprune as fp
    >>> fp.saliency({"w": torch.tensor([2.0, -3.0])}, {"w": torch.tensor([0.5, 1.0])})
    {'w': tensor([1., 3.], dtype=torch.float64)}
    """
    return {name: product.abs() for name, product in _products("saliency", params, grads).items()}


def taylor(params: Params, grads: Mapping[str, Tensor | None]) -> dict[str, Tensor]:
    """``(w * g) ** 2`` for every parameter: the first-order Taylor criterion.

    Molchanov et al. 2019, "Importance Estimation for Neural Network
    Pruning": the squared first-order estimate of the change in loss when a
    weight is removed. Entry by entry it ranks exactly as :func:`saliency`
    does (below), so an unstructured plan prunes the same entries on
    either's scores; the square matters when scores are summed over a group
    (a channel, a block). Sum the scores of several batches yourself to
    accumulate them, as the paper does: each addition of ``float64`` scores
    is then rounded once, to ``2**-53`` relative, so near-equal sums may
    order otherwise than the exact sums.

    The scores are computed in ``float64``, whatever the inputs' dtype.
    The product of two finite floats narrower than ``float64`` (``float16``,
    ``bfloat16``, ``float32``, mixed) is exact there: at most 48
    significant bits, between ``2**-298`` and ``2**256`` in magnitude
    (``bfloat16`` has float32's exponent range, so its products and squares
    leave float32's). Its square, at least ``2**-596`` and below
    ``2**512``, is a normal ``float64``, rounded once; squaring doubles
    relative gaps, so distinct products keep distinct squares. Hence for
    such inputs the scores order exactly as the exact ``(w * g) ** 2`` (and
    ``|w * g|``, :func:`saliency`'s scores) do, ties included, tiny and
    huge products alike, within a tensor and across tensors (a global
    plan). The product of ``float64`` inputs is rounded to ``float64`` (as
    :func:`saliency`'s is), and its square keeps its order where ``|w * g|``
    is in ``[2**-511, 2**512)`` (about ``1.5e-154`` to ``1.3e154``); below,
    squares are subnormal or zero and may tie; above, they are ``inf``.

    Args:
        params: the tensors to score, keyed like ``named_parameters()``.
        grads: a gradient for every name in ``params``, of its shape and on
            its device; extra names are ignored.

    Returns:
        A new dict ``{name: (w * g) ** 2}`` in the order of ``params``, in
        ``float64`` (above).

    Raises:
        TypeError: if ``params`` or ``grads`` is not a mapping of names to
            tensors, or a tensor is not floating-point.
        ValueError: if a gradient is missing or ``None``, or its shape or
            device differs from its parameter's.

    >>> import torch, funcprune as fp
    >>> fp.taylor({"w": torch.tensor([2.0, -3.0])}, {"w": torch.tensor([0.5, 1.0])})
    {'w': tensor([1., 9.], dtype=torch.float64)}
    >>> w = torch.tensor([1e-30, 2e-30], dtype=torch.bfloat16)
    >>> scores = fp.taylor({"w": w}, {"w": w})["w"]  # about 1e-120 and 1.6e-119: 0 in float32
    >>> scores.dtype, bool(0 < scores[0] < scores[1])
    (torch.float64, True)
    """
    return {name: product.square() for name, product in _products("taylor", params, grads).items()}


def wanda(
    params: Params, input_norms: Mapping[str, Tensor], *, input_dims: Mapping[str, int] | None = None
) -> dict[str, Tensor]:
    """``|W[i, j, ...]| * norm[j]``: Wanda's weights-and-activations score.

    Sun et al. 2023, "A Simple and Effective Pruning Approach for Large
    Language Models": a weight matters as much as its magnitude times the
    L2 norm of the input feature it multiplies, over calibration tokens.
    The paper compares scores within each output row: prune with
    ``fp.PerSlice(spec, dim=0)`` for that, or with a plain spec to compare
    across the whole tensor.

    Each weight is scaled along its input dim, the dim along which its input
    features run, found from the first that applies:

    1. ``input_dims[name]``, where given (:func:`input_dims` gives them all:
       0 for transformers' ``Conv1D``, stored ``(in, out)``);
    2. norms shaped to broadcast against the weight as stored (as many dims
       as the weight, all of size 1 but one): the dim they run along. This
       is how :func:`input_norms` returns a ``Conv1D`` weight's norms,
       ``(in, 1)``, so they need no more argument;
    3. 1-D norms: dim 1, the input dim of Linear and Conv weights
       (``(out, in, *kernel)``), as :func:`input_norms` gives them.

    Rule 3 is a convention: the shapes of a square weight cannot say how it
    is stored, so 1-D norms of a square ``(in, out)`` weight would scale its
    outputs. :func:`input_norms` never gives 1-D norms for such a weight;
    norms you build yourself for one need ``input_dims`` or the ``(in, 1)``
    shape. Where the norms do not fit the dim found, the error says so
    (1-D norms for a non-square ``Conv1D`` weight are refused, never
    applied to the wrong dim).

    Args:
        params: the parameters, keyed like ``named_parameters()``; each
            scored weight has at least 2 dims.
        input_norms: for some names of ``params``, the norms of the
            weight's input features, on the weight's device, 1-D or shaped
            to broadcast against the weight (above): what
            :func:`input_norms` returns.
        input_dims: the input dim of some weights by name (ints), such as
            ``fp.input_dims(model)``; names not scored here are ignored.
            ``None``: as the norms say (rules 2 and 3).

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
        TypeError: if an argument is not a mapping of names to tensors (or
            of names to ints, for ``input_dims``), or a tensor is not
            floating-point.
        UnknownNameError: if a name of ``input_norms`` is no parameter's.
        ValueError: if a weight has fewer than 2 dims, its input dim is not
            one of its dims, its norms do not fit that dim (their length is
            not the weight's size there, or they vary along another dim), or
            they are on another device.

    >>> import torch, funcprune as fp
    >>> params = {"fc.weight": torch.tensor([[1.0, -1.0, 2.0], [-4.0, 0.5, 1.0]])}
    >>> fp.wanda(params, {"fc.weight": torch.tensor([1.0, 10.0, 0.0])})["fc.weight"]
    tensor([[ 1., 10.,  0.],
            [ 4.,  5.,  0.]])
    >>> stored = {"c_fc.weight": params["fc.weight"].T}  # the same layer as a Conv1D: (in, out)
    >>> fp.wanda(stored, {"c_fc.weight": torch.tensor([[1.0], [10.0], [0.0]])})["c_fc.weight"].T
    tensor([[ 1., 10.,  0.],
            [ 4.,  5.,  0.]])
    >>> fp.wanda(stored, {"c_fc.weight": torch.tensor([1.0, 10.0, 0.0])}, input_dims={"c_fc.weight": 0})["c_fc.weight"].T
    tensor([[ 1., 10.,  0.],
            [ 4.,  5.,  0.]])
    """
    fn = "wanda"
    check_params(fn, params)
    if not isinstance(input_norms, Mapping):
        raise TypeError(
            f"{fn}: input_norms must be a mapping of names to tensors, got "
            f"{type(input_norms).__name__}; fp.input_norms(module, batches, names) makes one"
        )
    dims = _check_input_dims(fn, input_dims)
    scores: dict[str, Tensor] = {}
    for name, norms in input_norms.items():
        weight = _weight_for_norms(fn, name, norms, params)
        dim = _input_dim(fn, name, weight, norms, dims.get(name))
        dtype = _score_dtype(weight, norms)
        if is_dtensor(weight):  # each process its block, with the norms of its block's input features
            scores[name] = _wanda_block(fn, name, weight, norms, dim, dtype)
            continue
        scores[name] = weight.detach().abs().to(dtype) * _along(norms.detach().to(dtype), dim, weight.dim())
    return scores


def _along(norms: Tensor, dim: int, rank: int) -> Tensor:
    """``norms`` shaped to broadcast against a weight of ``rank`` dims along ``dim``."""
    return norms.reshape(*(1,) * dim, -1, *(1,) * (rank - dim - 1))


def _wanda_block(fn: str, name: str, weight: DTensor, norms: Tensor, dim: int, dtype: torch.dtype) -> Tensor:
    """Wanda's score of a DTensor weight: a DTensor of its layout, computed block by block, nothing sent.

    ``norms`` is the whole vector (every process holds it, as
    :func:`input_norms` gives it on each) or a replicated DTensor; each
    process scales its block by the norms of the input features it holds,
    along the input dim ``dim``.
    """
    if is_dtensor(norms):
        if any(not p.is_replicate() for p in norms.placements):
            raise ValueError(
                f"{fn}: input_norms[{name!r}] is a DTensor laid out as {list(norms.placements)}; give "
                "the whole vector on every process (what fp.input_norms returns) or a replicated DTensor"
            )
        norms = norms.to_local()
    layout = layout_of(fn, f"the parameter {name!r}", weight)
    start, count = layout.offsets[dim], layout.size[dim]
    mine = norms.detach().flatten()[start : start + count].to(dtype)
    return wrap(weight.to_local().detach().abs().to(dtype) * _along(mine, dim, weight.dim()), layout)


def _products(fn: str, params: Params, grads: object) -> dict[str, Tensor]:
    """``w * g`` per name, detached, in ``float64``, after every check (:func:`taylor` says why)."""
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
        # float64 holds the product of any two narrower floats exactly, its square as a normal float
        products[name] = weight.detach().to(torch.float64) * grad.detach().to(torch.float64)
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
            "of shape (out, in, *kernel), whose dim 1 is the input feature, or of 2 dims or more "
            "with their input dim given"
        )
    if norms.device != weight.device:
        raise ValueError(
            f"{fn}: input_norms[{name!r}] is on {norms.device} but the parameter is on "
            f"{weight.device}; move it with .to({str(weight.device)!r})"
        )
    return weight


def _check_input_dims(fn: str, input_dims: object) -> Mapping[str, int]:
    """``input_dims`` as a mapping of names to ints (empty for ``None``), or a TypeError."""
    if input_dims is None:
        return {}
    if not isinstance(input_dims, Mapping):
        raise TypeError(
            f"{fn}: input_dims must be a mapping of parameter names to ints or None, got "
            f"{type(input_dims).__name__}; fp.input_dims(model) makes one"
        )
    for name, dim in input_dims.items():
        if not isinstance(name, str) or isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(
                f"{fn}: input_dims must map parameter names (str) to ints, got {name!r}: {dim!r}"
            )
    return input_dims


def _input_dim(fn: str, name: str, weight: Tensor, norms: Tensor, given: int | None) -> int:
    """The dim of ``weight`` that ``norms`` scale: ``given``, else as the norms' shape says (see :func:`wanda`)."""
    rank, shape = weight.dim(), tuple(weight.shape)
    if given is not None and not 0 <= given < rank:
        raise ValueError(
            f"{fn}: input_dims[{name!r}] is {given} but the parameter has shape {shape}; expected "
            f"a dim in [0, {rank})"
        )
    if norms.dim() == 1:
        dim = 1 if given is None else given
        if norms.shape[0] == weight.shape[dim]:
            return dim
        why = (
            f"input_dims[{name!r}]"
            if given is not None
            else "1-D norms scale dim 1, the input dim of a Linear or Conv weight; a weight stored "
            "(in, out), as transformers' Conv1D stores it, reads its inputs along dim 0: pass "
            "input_dims=fp.input_dims(model), or its norms shaped (in, 1) as fp.input_norms returns them"
        )
        raise ValueError(
            f"{fn}: input_norms[{name!r}] has shape {tuple(norms.shape)} but the parameter has "
            f"{weight.shape[dim]} input features (shape {shape}, dim {dim}); expected a 1-D "
            f"tensor of {weight.shape[dim]} norms ({why})"
        )
    candidates = range(rank) if given is None else (given,)
    fits = [
        d for d in candidates
        if norms.dim() == rank and all(norms.shape[e] == (shape[e] if e == d else 1) for e in range(rank))
    ]  # fmt: skip
    if fits:  # several only where the norms are one number: any scales alike
        return fits[0]
    along = "of any dim" if given is None else f"of dim {given} (input_dims)"
    raise ValueError(
        f"{fn}: input_norms[{name!r}] has shape {tuple(norms.shape)}, which does not fit the "
        f"parameter's shape {shape}: expected 1-D norms, or norms of {rank} dims all of size 1 but "
        f"the input features {along}, such as {_along_shape(shape, 0 if given is None else given)}"
    )


def _along_shape(shape: tuple[int, ...], dim: int) -> tuple[int, ...]:
    """The shape of norms along ``dim`` of a weight of ``shape``."""
    return tuple(size if d == dim else 1 for d, size in enumerate(shape))
