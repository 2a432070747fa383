"""SparseGPT: prune a Linear weight and update the weights it keeps to reconstruct its outputs.

Frantar and Alistarh 2023, "SparseGPT: Massive Language Models Can Be
Accurately Pruned in One-Shot". For a weight ``W`` (out, in) and the Gram
matrix ``H = XᵀX`` of its calibration inputs (:func:`~funcprune.hessians`),
the columns are visited left to right. Pruning an entry ``w`` of column
``j`` changes the layer's outputs least when the columns right of ``j``
absorb it: the optimal brain surgeon update ``W[:, j:] -= (w / d) *
U[j, j:]``, with ``U`` the upper Cholesky factor of ``H⁻¹`` and ``d =
U[j, j]``. Which entries to prune is decided once per block of
``blocksize`` columns for unstructured specs, by the score ``w² / d²``
on the weights as already updated, and once per group of ``m`` columns for
N:M, when the group's first column is reached; the updates of columns
right of a block are applied lazily, as one matrix product per block.

The reference is IST-DASLab/sparsegpt's ``sparsegpt.py`` (``fasterprune``).
Where this differs, on purpose:

- it prunes exactly the count asked for, ``round(fraction * entries)`` of
  each block (Python's ``round``, half to even, as every funcprune amount),
  ties to the lower row-major index, where the reference's ``<=`` threshold
  prunes one more entry per block than ``int(fraction * entries)`` when
  scores are distinct, and more on ties; N:M ties go to the lower column
  where the reference's ``topk`` leaves them unspecified;
- it does not depend on global settings: its CUDA matrix products run in
  IEEE float32 (no TF32) for the duration of the call, where the reference
  switches TF32 off for the whole process at import.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, final

import torch

from .. import _native
from .._names import check_params, unknown_name
from .._specs import NM, L1Unstructured, PerSlice, Spec
from .._types import Params, Tensor, is_dtensor
from . import _inverse
from ._hessians import ieee
from ._inverse import Factor as _Factor

__all__ = ["same_hessians", "sparsegpt", "sparsegpt_consuming"]

_SPECS = "fp.L1Unstructured(fraction), fp.PerSlice(fp.L1Unstructured(fraction), dim=0) or fp.NM(n, m)"


@final
@dataclass(frozen=True, slots=True)
class _Rule:
    """What one layer's pass selects: a fraction of each block (or of each row of it), or n of every m columns."""

    kind: Literal["block", "row", "nm"]
    fraction: float = 0.0
    n: int = 0
    m: int = 1


def sparsegpt(
    params: Params,
    hessians: Mapping[str, Tensor],
    spec: object,
    *,
    blocksize: int = 128,
    percdamp: float = 0.01,
    input_dims: Mapping[str, int] | None = None,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Prune each weight that has a Hessian with SparseGPT; return the new weights and their masks.

    For each name of ``hessians``, the weight ``params[name]``, seen as
    ``(out, in)``, is pruned column block by column block, and the kept
    entries right of each pruned one are updated to reconstruct the
    layer's outputs on the calibration inputs (see the module's docstring
    for the algorithm and where it departs from the reference). Before,
    input features that never carried a nonzero value (a zero diagonal of
    ``H``) get their weights zeroed and ``H[j, j] = 1``; then ``H`` is
    dampened by ``percdamp`` times the mean of its diagonal. Where every
    input feature carried a nonzero value, the scale of ``H`` does not
    matter (``XᵀX`` and SparseGPT's ``2/N XᵀX`` give the same result, to
    rounding); a dead feature's diagonal of 1 enters the mean whatever the
    scale, as in the reference.

    Specs, on the ``(out, in)`` view of each weight:

    - ``fp.L1Unstructured(f)`` (or ``sparsity=f``): prune exactly
      ``round(f * entries)`` of every block of ``blocksize`` columns (all
      rows), those of smallest score ``w² / U[j, j]²``;
    - ``fp.PerSlice(fp.L1Unstructured(f), dim=0)``: ``round(f * columns)``
      of every row of every block (per output, as Wanda compares);
    - ``fp.NM(n, m)`` (along the input dim: ``dim=-1`` or ``1``): keep the
      ``n`` of largest score in every ``m`` consecutive input columns,
      scored when the group is reached, on the weights as updated so far;
      ``m`` must divide ``blocksize`` and ``in``.

    Ties go to the lower index. Weights are computed in ``float32``
    (``float64`` for ``float64`` weights), on the weight's device, with
    IEEE ``float32`` products on CUDA whatever the TF32 settings, and
    returned in the weight's dtype and layout; pruned entries are exactly
    ``0``. At fraction 0 (or ``NM(m, m)``) nothing is pruned and no weight
    changes but those of dead input features (zeroed, still kept by the
    mask). Weights and Hessians must be finite. A weight with a
    leading batch dim (``(layers, out, in)`` stacked, with ``(layers, in,
    in)`` Hessians) is pruned layer by layer under :func:`torch.func.vmap`.

    Args:
        params: tensors by name, like ``dict(model.named_parameters())``;
            those without a Hessian are returned as they are. Not modified.
        hessians: ``{name: H}``, ``H`` of shape ``(in, in)``, as
            :func:`~funcprune.hessians` returns.
        spec: one of the specs above, for every weight.
        blocksize: columns per block (default 128, the reference's).
        percdamp: the dampening, a fraction of the mean diagonal of ``H``
            (default 0.01, the reference's).
        input_dims: the input dim of some weights, like
            ``fp.input_dims(model)``: ``0`` for a weight stored ``(in,
            out)`` (transformers' ``Conv1D``); the others are read as
            ``(out, in)``. A weight whose layout its Hessian contradicts is
            refused; a square ``Conv1D`` weight needs its entry.

    Returns:
        ``(new_params, masks)``: a new dict with every name of ``params``,
        the pruned weights replaced by new tensors; and ``{name: mask}`` for
        each weight pruned (``torch.bool``, ``True`` = kept).

    Raises:
        TypeError: if an argument has the wrong type.
        UnknownNameError: if a name of ``hessians`` is not in ``params``.
        ValueError: if a spec, blocksize, percdamp, shape or dim is not one
            this supports, or ``H`` is not positive definite after
            dampening (raise ``percdamp``).

    >>> import torch, funcprune as fp
    >>> w = torch.tensor([[1.0, 0.1], [0.2, 2.0]])
    >>> h = torch.tensor([[2.0, 1.0], [1.0, 2.0]])
    >>> new, masks = fp.sparsegpt({"w": w}, {"w": h}, fp.L1Unstructured(0.5))
    >>> masks["w"]
    tensor([[ True, False],
            [False,  True]])
    >>> new["w"]  # w[1, 1] absorbs the pruned w[1, 0]; w[0, 1], the last column, has no column right of it
    tensor([[1.0000, 0.0000],
            [0.0000, 2.0990]])
    """
    return _pruned(params, hessians, spec, blocksize, percdamp, input_dims, consume=False)


def sparsegpt_consuming(
    params: Params,
    hessians: Mapping[str, Tensor],
    spec: Spec,
    *,
    blocksize: int = 128,
    percdamp: float = 0.01,
    input_dims: Mapping[str, int] | None = None,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """:func:`sparsegpt`, whose Hessians the caller gives up (the runner's own sums): each may be overwritten
    by its factor, which then needs no ``(in, in)`` copy of its own. Weights share a factor where their Hessians
    are one tensor (an overwritten Hessian equals no other)."""
    return _pruned(params, hessians, spec, blocksize, percdamp, input_dims, consume=True)


def _pruned(
    params: Params,
    hessians: Mapping[str, Tensor],
    spec: object,
    blocksize: int,
    percdamp: float,
    input_dims: Mapping[str, int] | None,
    *,
    consume: bool,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The arguments checked, the weights of ``hessians`` pruned: ``(new params, masks)`` (see :func:`sparsegpt`)."""
    fn = "sparsegpt"
    check_params(fn, params)
    if not isinstance(hessians, Mapping):
        raise TypeError(f"{fn}: hessians must be a mapping of names to (in, in) tensors, got {type(hessians).__name__}")
    rule = _rule(fn, spec)
    if isinstance(blocksize, bool) or not isinstance(blocksize, int) or blocksize < 1:
        raise ValueError(f"{fn}: blocksize must be a positive int, got {blocksize!r}")
    if rule.kind == "nm" and blocksize % rule.m:
        raise ValueError(f"{fn}: blocksize={blocksize} must be a multiple of the spec's m={rule.m}, so that "
                         "no group of m columns straddles two blocks")  # fmt: skip
    if isinstance(percdamp, bool) or not isinstance(percdamp, (int, float)) or not 0 <= percdamp < math.inf:
        raise ValueError(f"{fn}: percdamp must be a finite real number >= 0, got {percdamp!r}")
    dims = _check_input_dims(fn, input_dims)
    percdamp = float(percdamp)
    plan = {name: _oriented(fn, name, params, hessians[name], dims.get(name, -1), rule) for name in hessians}
    new, masks = dict(params), {}
    factored: tuple[Tensor, _Factor] | None = None  # the last Hessian's factor: the next may be equal (q, k, v)
    for name, (weight, transposed) in plan.items():
        h = hessians[name]
        if factored is None or not (factored[0] is h if consume else same_hessians(factored[0], h)):
            factored = (h, _factored(fn, name, h, weight, percdamp, consume))
        kept, mask = _prune(fn, name, weight, factored[1], rule, blocksize)
        if transposed:
            kept, mask = kept.transpose(-1, -2), mask.transpose(-1, -2)
        new[name] = kept.to(params[name].dtype).contiguous()
        masks[name] = mask.contiguous()
    return new, masks


def _rule(fn: str, spec: object) -> _Rule:
    if isinstance(spec, NM):
        if spec.dim not in (-1, 1):
            raise ValueError(f"{fn}: spec {spec!r} groups along dim {spec.dim}; SparseGPT's N:M groups run along "
                             "the input dim of the (out, in) view: dim=-1 (Conv1D weights included)")  # fmt: skip
        return _Rule("nm", n=spec.n, m=spec.m)
    inner = spec.spec if isinstance(spec, PerSlice) else spec
    kind: Literal["row", "block"] = "row" if isinstance(spec, PerSlice) else "block"
    if isinstance(spec, PerSlice) and spec.dim != 0:
        raise ValueError(f"{fn}: spec {spec!r} selects per slice along dim {spec.dim}; SparseGPT selects per "
                         "output row: PerSlice(L1Unstructured(fraction), dim=0)")  # fmt: skip
    if not isinstance(inner, L1Unstructured):
        raise ValueError(f"{fn}: spec must be {_SPECS}, got {spec!r}")
    fraction = inner.sparsity if inner.sparsity is not None else inner.amount
    if not isinstance(fraction, float):
        raise ValueError(f"{fn}: spec {spec!r} must give a float fraction (of each column block), "
                         f"not an int count; write e.g. L1Unstructured(0.5)")  # fmt: skip
    return _Rule(kind, fraction=fraction)


def _check_input_dims(fn: str, input_dims: object) -> Mapping[str, int]:
    if input_dims is None:
        return {}
    if not isinstance(input_dims, Mapping) or not all(isinstance(d, int) for d in input_dims.values()):
        raise TypeError(f"{fn}: input_dims must be a mapping of names to ints, like fp.input_dims(model), "
                        f"got {input_dims!r}")  # fmt: skip
    return input_dims


def _oriented(fn: str, name: str, params: Params, h: object, dim: int, rule: _Rule) -> tuple[Tensor, bool]:
    """``params[name]`` seen as ``(..., out, in)``, and whether that is its transpose; checked against ``h``."""
    if name not in params:
        raise unknown_name(fn, f"hessians has {name!r}, which is not in params", name, tuple(params))
    w = params[name]
    if is_dtensor(w) or is_dtensor(h):
        which = "weight" if is_dtensor(w) else "Hessian"
        raise ValueError(f"{fn}: the {which} of {name!r} is a DTensor; SparseGPT runs on whole layers: pass the "
                         "full weight and Hessian (full_tensor()) on one process")  # fmt: skip
    if not isinstance(h, torch.Tensor):
        raise TypeError(f"{fn}: hessians[{name!r}] must be a tensor, got {type(h).__name__}")
    if w.dim() < 2 or not w.is_floating_point() or not h.is_floating_point():
        raise ValueError(f"{fn}: {name!r} must be a floating-point weight of at least 2 dims with a floating-point "
                         f"Hessian, got shape {tuple(w.shape)} ({w.dtype}) and {h.dtype}")  # fmt: skip
    if dim not in (-1, w.dim() - 1, -2, w.dim() - 2):
        raise ValueError(f"{fn}: input_dims[{name!r}] = {dim} is not one of the last two dims of its weight "
                         f"of shape {tuple(w.shape)}")  # fmt: skip
    transposed = dim in (-2, w.dim() - 2)
    view = w.transpose(-1, -2) if transposed else w
    lead, cols = tuple(view.shape[:-2]), view.shape[-1]
    if tuple(h.shape) != (*lead, cols, cols):
        layout = "(in, out)" if transposed else "(out, in)"
        hint = "" if transposed or w.shape[-2] != h.shape[-1] else (
            "; its dim 0 matches: a weight stored (in, out), like transformers' Conv1D, needs "
            f"input_dims={{{name!r}: 0}} (fp.input_dims(model) gives it)")  # fmt: skip
        raise ValueError(f"{fn}: hessians[{name!r}] has shape {tuple(h.shape)}, but its weight of shape "
                         f"{tuple(w.shape)}, read as {layout}, has {cols} inputs: expected "
                         f"{(*lead, cols, cols)}{hint}")  # fmt: skip
    if rule.kind == "nm" and cols % rule.m:
        raise ValueError(f"{fn}: {name!r} has {cols} inputs, not a multiple of the spec's m={rule.m}")
    if h.device != w.device:
        raise ValueError(f"{fn}: hessians[{name!r}] is on {h.device}, its weight on {w.device}")
    return view, transposed


def same_hessians(a: Tensor, b: Tensor) -> bool:
    """Whether two Hessians are equal (then one factor serves both): the same tensor, or the same values."""
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b))


def _factored(fn: str, name: str, h: Tensor, w: Tensor, percdamp: float, consume: bool = False) -> _Factor:
    """``h`` (of the weight ``name``, or a stack of them) checked and factored (under vmap for a stack), in the
    dtype ``w`` is pruned in; ``consume``: ``h`` may be overwritten (see :func:`~._inverse.factor`)."""
    _check_finite(fn, name, h, "Hessian")
    dtype = torch.float64 if w.dtype == torch.float64 else torch.float32  # as the reference, float32 for narrower
    with ieee(h.device):
        factor = _inverse.factor(percdamp, consume)
        for _ in range(h.dim() - 2):
            factor = torch.func.vmap(factor)
        u, dead, info = factor(h.detach().to(dtype))
    if bool((info != 0).any()):
        raise ValueError(f"{fn}: the Hessian of {name!r} is not positive definite after dampening by "
                         f"percdamp={percdamp}: raise percdamp")  # fmt: skip
    return u, dead, info


def _prune(fn: str, name: str, w: Tensor, factored: _Factor, rule: _Rule, blocksize: int) -> tuple[Tensor, Tensor]:
    """One weight (or a stack of them, under vmap): ``(new weight, kept mask)``, both ``(..., out, in)``.

    ``factored``: its Hessian's, by :func:`_factored` (maybe made for another weight with an equal Hessian).
    """
    _check_finite(fn, name, w, "weight")
    u, dead, _ = factored
    dtype = u.dtype
    with ieee(w.device):
        solve = _solve(rule, blocksize)
        for _ in range(w.dim() - 2):
            solve = torch.func.vmap(solve)
        return solve(w.detach().to(dtype), u, dead)


def _check_finite(fn: str, name: str, t: Tensor, which: str) -> None:
    if not _finite(t):
        raise ValueError(f"{fn}: the {which} of {name!r} holds NaN or inf (an activation that overflowed its "
                         "dtype?); SparseGPT needs finite ones")  # fmt: skip


def _finite(t: Tensor) -> bool:
    """Whether every entry of ``t`` is finite: its sum is (a NaN or an inf carries into it), else entry by entry
    (a sum of finite entries may overflow)."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def _solve(rule: _Rule, blocksize: int) -> Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]:
    def solve(w: Tensor, u: Tensor, dead: Tensor) -> tuple[Tensor, Tensor]:
        rows, cols = w.shape
        w = torch.where(dead, torch.zeros_like(w), w)
        mask = torch.ones_like(w, dtype=torch.bool)
        for i1 in range(0, cols, blocksize):
            i2 = min(i1 + blocksize, cols)
            d = torch.diagonal(u[i1:i2, i1:i2])
            pruned = torch.zeros_like(w[:, i1:i2], dtype=torch.bool)
            if rule.kind != "nm":
                pruned = _smallest(w[:, i1:i2].square() / d.square(), rule)
            err1 = _native.sparsegpt_block(w, i1, i2, u, pruned, rule.n, rule.m if rule.kind == "nm" else 0)
            if err1 is None:
                err1 = _columns(w, u, i1, i2, pruned, rule)
            mask[:, i1:i2] = ~pruned
            w[:, i2:] -= err1 @ u[i1:i2, i2:]
        return w, mask

    return solve


def _columns(w: Tensor, u: Tensor, i1: int, i2: int, pruned: Tensor, rule: _Rule) -> Tensor:
    """The column loop of the block ``[i1, i2)`` in torch: ``w``'s block set to its kept values; the errors.

    What ``funcprune._native.sparsegpt_block`` does natively (the same bits),
    and what runs under ``vmap``, on CUDA and without the kernels. For N:M,
    ``pruned`` is written group by group.
    """
    w1, u1 = w[:, i1:i2].clone(), u[i1:i2, i1:i2]
    d = torch.diagonal(u1)
    q1, err1 = torch.zeros_like(w1), torch.zeros_like(w1)
    for i in range(i2 - i1):
        if rule.kind == "nm" and i % rule.m == 0:
            group = w1[:, i : i + rule.m].square() / d[i : i + rule.m].square()
            pruned[:, i : i + rule.m] = _lowest(group, rule.m - rule.n)
        col = w1[:, i]
        q = torch.where(pruned[:, i], torch.zeros_like(col), col)
        q1[:, i] = q
        err = (col - q) / d[i]
        w1[:, i:] -= err.unsqueeze(1) @ u1[i, i:].unsqueeze(0)
        err1[:, i] = err
    w[:, i1:i2] = q1
    return err1


def _smallest(scores: Tensor, rule: _Rule) -> Tensor:
    """The entries pruned in a block: the ``round(fraction * n)`` smallest of it (``"block"``) or of each row.

    Chosen by the specs' own exact selection (ties to the lower index), as every funcprune mask is.
    """
    spec: Spec = L1Unstructured(round(rule.fraction * scores.numel()))
    if rule.kind == "row":
        spec = PerSlice(L1Unstructured(round(rule.fraction * scores.shape[1])), dim=0)
    return ~spec.compute_mask(scores)


def _lowest(group: Tensor, k: int) -> Tensor:
    """Per row of an N:M group, the ``k`` smallest scores as a bool mask (ties to the lower column).

    The rule of :func:`~funcprune._specs.n_m`; a stable sort of ``m`` columns
    here, because the kernel, built for whole tensors, costs a fifth more of
    the whole layer when called once per group of 4 columns.
    """
    order = torch.sort(group, dim=1, stable=True).indices[:, :k]
    return torch.zeros_like(group, dtype=torch.bool).scatter(1, order, True)
