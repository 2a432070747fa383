"""Sparse weights: masked Linear weights as CSR, BSR or 2:4 tensors that ``F.linear`` runs.

:func:`to_sparse` returns new parameters with every masked weight sparse,
warning (or raising) below the measured break-even sparsity; what torch
runs on them, case by case: ``README.md``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Literal, NamedTuple

import torch
from torch import nn
from torch.sparse import SparseSemiStructuredTensor

from .._names import check_masks, check_params, not_a_parameter
from .._specs import kept_blocks
from .._types import Masks, Params, Tensor, is_conv1d
from .._validate import refuse_in
from ._break_even import check_break_even
from ._checks import check_mask_dtypes

__all__ = ["to_sparse"]

#: A sparse layout that :func:`to_sparse` makes.
SparseLayout = Literal["csr", "bsr", "semi_structured"]
#: What :func:`to_sparse` does with a weight below its layout's break-even sparsity.
BelowBreakEven = Literal["warn", "raise", "allow"]

_LAYOUTS: tuple[SparseLayout, ...] = ("csr", "bsr", "semi_structured")
_ACTIONS: tuple[BelowBreakEven, ...] = ("warn", "raise", "allow")
_SEMI_DTYPES = (torch.float16, torch.bfloat16)


def to_sparse(
    params: Params,
    masks: Mapping[str, Tensor],
    *,
    layout: SparseLayout,
    blocksize: tuple[int, int] | None = None,
    below_break_even: BelowBreakEven = "warn",
    module: nn.Module | None = None,
) -> dict[str, Tensor]:
    """Return a new dict of ``params`` whose masked weights are sparse tensors.

    ``torch.func.functional_call(module, to_sparse(params, masks, layout=...,
    module=module), x)`` runs the module with the sparse weights and
    computes, to float rounding, what it computes on ``apply_masks(params,
    masks)``. Only weights that ``F.linear`` reads can be sparse: the weight
    of an ``nn.Linear``, and with ``layout="csr"`` that of transformers'
    ``Conv1D`` (``torch.addmm``). Pass ``module`` to have each masked weight
    checked against every layer holding it before anything is converted
    (an ``nn.Embedding``'s weight, read by ``F.embedding``, is refused, also
    where it is tied to an LM head); without it, ``to_sparse`` sees tensors
    only and cannot tell an embedding from a Linear weight of the same
    shape, so the model would fail only when it runs.

    Sparse pays off only at high sparsity. Below its layout's break-even
    (:data:`CSR_BREAK_EVEN`, :data:`BSR_BREAK_EVEN`: measured on a CPU,
    about 65% for a single input row and 93% for 64 rows) ``F.linear`` was
    slower with the sparse weight than with the dense masked one; by default
    such a weight is converted with a :class:`SlowSparseWarning`, which says
    which weights and how sparse they are.

    Args:
        params: tensors keyed like ``named_parameters()``.
        masks: masks of 2-D floating-point weights of ``params``:
            ``torch.bool`` (``True`` = kept) or floating-point 0/1, meaning
            the same.
        layout: ``"csr"`` (compressed rows: any mask); ``"bsr"`` (blocks of
            ``blocksize``: for block masks as ``fp.Block(amount,
            shape=blocksize)`` makes them); ``"semi_structured"`` (2:4
            masks as ``fp.NM(2, 4)`` makes them, float16 or bfloat16 CUDA
            weights, through :func:`torch.sparse.to_sparse_semi_structured`).
        blocksize: for ``"bsr"``, and only for it: the ``(rows, cols)`` of a
            block, which must tile every masked weight, square for CPU
            weights (torch's CPU BSR matmul takes no other). A block with
            any kept entry is stored whole. Blocks smaller than 16x16 (from
            which the break-even was measured) always count as below it.
        below_break_even: what to do with a weight whose sparsity (the
            fraction of entries pruned; for ``"bsr"``, of whole blocks) is
            below the layout's break-even: ``"warn"`` converts it with a
            :class:`SlowSparseWarning`, ``"raise"`` raises a ``ValueError``
            before anything is converted, ``"allow"`` converts it silently
            (when you have measured your own case). 2:4 is always 50%
            sparse and is not checked (torch reports its speedups for large
            batches; pytorch#111339 found none for one input row).
        module: the module that ``params`` are the parameters of (keyed
            like its ``named_parameters()``), or ``None``. With it, every
            layer holding a masked weight must read it the way a sparse
            weight runs (see above); a weight tied between such a layer and
            another (an LM head tied to the input embeddings) is refused too,
            since one tensor cannot be sparse for one holder and dense for
            the other.

    Returns:
        A new dict in the order of ``params``: each masked weight a new
        sparse tensor of its dtype and device whose structure is the mask's
        (a kept zero is stored), the other tensors the very same objects.
        The sparse tensors carry no autograd history and cannot require
        grad. With autograd on, under ``no_grad`` and under
        ``inference_mode`` alike, ``F.linear`` runs them, and
        ``to_dense()``, ``repr`` and ``torch.save`` work on them: each is
        an inference tensor (an ordinary sparse weight fails under
        ``inference_mode`` in torch 2.13, pytorch#98004) that holds
        ordinary tensors (its values and indices, views of which
        ``to_dense()`` reshapes in place). ``torch.load`` gives back
        ordinary sparse tensors: they run with autograd on and under
        ``no_grad``, not under ``inference_mode``. ``"semi_structured"`` ones are a tensor
        subclass: ``torch.load(..., weights_only=True)`` needs their class
        allowed (``torch.serialization.safe_globals``).

    Raises:
        UnknownNameError: if a mask names no parameter; close names are suggested.
        ValueError: if ``layout`` or ``below_break_even`` is not one of
            their values (the message lists them), ``blocksize`` is missing,
            misplaced or does not tile a weight, a masked weight is not 2-D,
            a mask does not fit its weight or is not 2:4 for
            ``"semi_structured"``, ``"semi_structured"`` is asked for
            weights that are not on CUDA, or, with ``"raise"``, a weight is
            below break-even.
        TypeError: if an argument is not a mapping of tensors, a mask is
            neither ``torch.bool`` nor floating-point, or a weight's dtype
            cannot be run sparse (on the CPU: float32 and float64 only).

    >>> import torch, funcprune as fp
    >>> params = {"w": torch.tensor([[0.0, 2.0, 0.0, 0.0], [3.0, 0.0, 0.0, 0.0]])}
    >>> masks = {"w": params["w"] != 0}
    >>> fp.to_sparse(params, masks, layout="csr", below_break_even="raise")
    Traceback (most recent call last):
    ...
    ValueError: to_sparse: 'w' (75% pruned): below the break-even sparsity of layout='csr', ...
    >>> fp.to_sparse(params, masks, layout="csr", below_break_even="allow")["w"].col_indices()
    tensor([1, 0], dtype=torch.int32)
    """
    fn = "to_sparse"
    check_params(fn, params)
    refuse_in(fn, params)
    _check_options(fn, layout, blocksize, below_break_even)
    checked = check_masks(fn, params, check_mask_dtypes(fn, masks))
    block = blocksize or (1, 1)  # CSR: blocks of one entry
    for name, mask in checked.items():
        _check_weight(fn, name, params[name], mask, layout, block)
    if module is not None:
        _check_readers(fn, module, checked, layout)
    check_break_even(fn, checked, layout, block, below_break_even)
    sparse = {n: _convert(fn, n, params[n], mask, layout, block) for n, mask in checked.items()}
    return {name: sparse.get(name, p) for name, p in params.items()}


def _check_options(fn: str, layout: object, blocksize: object, below_break_even: object) -> None:
    """Refuse an unknown layout or action, and a blocksize that does not go with the layout."""
    if layout not in _LAYOUTS:
        raise ValueError(
            f"{fn}: layout must be one of {', '.join(map(repr, _LAYOUTS))}, got {layout!r}"
        )
    if below_break_even not in _ACTIONS:
        raise ValueError(
            f"{fn}: below_break_even must be one of {', '.join(map(repr, _ACTIONS))}, "
            f"got {below_break_even!r}"
        )
    if layout != "bsr":
        if blocksize is not None:
            raise ValueError(f"{fn}: blocksize is for layout='bsr' only, got it with {layout=!r}")
        return
    if blocksize is None:
        raise ValueError(
            f"{fn}: layout='bsr' needs blocksize=(rows, cols), the shape of the blocks of the "
            "masks (the shape of fp.Block(amount, shape=...))"
        )
    if not (
        isinstance(blocksize, tuple)
        and len(blocksize) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in blocksize)
    ):
        raise ValueError(f"{fn}: blocksize must be a tuple of two positive ints, got {blocksize!r}")


def _check_weight(
    fn: str, name: str, weight: Tensor, mask: Tensor, layout: SparseLayout, block: tuple[int, int]
) -> None:
    """Refuse a weight that ``layout`` cannot hold or ``F.linear`` cannot run."""
    if weight.dim() != 2:
        raise ValueError(
            f"{fn}: the parameter {name!r} has shape {tuple(weight.shape)}; only Linear-like "
            "2-D weights can be sparse (F.linear takes a sparse weight, convolutions do not); "
            "leave it out of masks, e.g. {k: m for k, m in masks.items() if params[k].dim() == 2}"
        )
    if not weight.is_floating_point():
        raise TypeError(f"{fn}: the parameter {name!r} has dtype {weight.dtype}; expected floats")
    if layout == "semi_structured":
        _check_semi_structured(fn, name, weight, mask)
    elif weight.device.type == "cpu" and weight.dtype not in (torch.float32, torch.float64):
        raise TypeError(
            f"{fn}: the parameter {name!r} has dtype {weight.dtype}, which torch's CPU sparse "
            "matmul does not run; expected torch.float32 or torch.float64"
        )
    rows, cols = weight.shape
    if layout == "bsr" and weight.device.type == "cpu" and block[0] != block[1]:
        raise ValueError(
            f"{fn}: blocksize={block} is not square, and torch's CPU BSR matmul (MKL) takes "
            f"square blocks only; the parameter {name!r} is on the CPU; use blocksize="
            f"({min(block)}, {min(block)}) or ({max(block)}, {max(block)})"
        )
    if rows % block[0] or cols % block[1]:
        raise ValueError(
            f"{fn}: blocksize={block} does not tile the parameter {name!r} of shape "
            f"{(rows, cols)}; each dim must be a multiple of the block's"
        )


#: Which weights can be sparse, for the messages.
_ONLY = "only the weights of nn.Linear layers (and, with layout='csr', of transformers' Conv1D) can be sparse"


def _check_readers(fn: str, module: object, masks: Masks, layout: SparseLayout) -> None:
    """Refuse a masked weight that a layer holding it in ``module`` does not run sparse in ``layout``.

    Every holder counts: a weight tied between a Linear and an Embedding (an
    LM head and the input embeddings) is one tensor, which cannot be sparse
    for the head and dense for the embedding.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"{fn}: module must be a torch.nn.Module or None, got {type(module).__name__}")
    every = dict(module.named_parameters(remove_duplicate=False))
    holders: dict[int, list[tuple[str, nn.Module]]] = {}  # by id of the Parameter: (its name there, the layer)
    for path, layer in module.named_modules(remove_duplicate=False):
        for attr, param in layer._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((f"{path}.{attr}" if path else attr, layer))
    for name in masks:
        if name not in every:
            raise not_a_parameter(fn, module, name, dict(module.named_parameters()))
        held = holders[id(every[name])]
        refused = [(where, layer) for where, layer in held if not _runs_sparse(where, layer, layout)]
        if refused:
            runs = [(where, layer) for where, layer in held if _runs_sparse(where, layer, layout)]
            raise ValueError(_refusal(fn, name, refused[0], runs, layout))


def _runs_sparse(where: str, layer: nn.Module, layout: SparseLayout) -> bool:
    """Whether ``layer`` runs its parameter ``where`` (a full name) sparse in ``layout``."""
    if where.rpartition(".")[2] != "weight":
        return False
    return isinstance(layer, nn.Linear) or (is_conv1d(layer) and layout == "csr")


def _refusal(
    fn: str, name: str, refused: tuple[str, nn.Module], runs: list[tuple[str, nn.Module]], layout: SparseLayout
) -> str:
    """Why ``name`` cannot be sparse: the layer ``refused`` holds it; ``runs``: the holders that would run it."""
    where, layer = refused
    path, _, attr = where.rpartition(".")
    if isinstance(layer, nn.Embedding):
        reads = f"reads it with F.embedding, and torch cannot index a sparse tensor; {_ONLY}"
    elif attr == "weight" and is_conv1d(layer):
        reads = f"multiplies by it with torch.addmm, which takes a sparse weight with layout='csr' only, not {layout!r}"
    else:
        reads = f"does not read it through F.linear; {_ONLY}"
    kind = type(layer).__name__
    if not runs:
        holder = repr(path) if path else "the module itself"
        return (
            f"{fn}: the parameter {name!r} is the {attr} of {holder}, of type {kind}, which {reads}; "
            "leave it out of masks"
        )
    head, linear = runs[0]
    return (
        f"{fn}: the parameter {name!r} is tied: one Parameter, held as {head!r} (of type {type(linear).__name__}) "
        f"and as {where!r} (of type {kind}), which {reads}. One tensor cannot be sparse for one holder and dense "
        f"for another: leave {name!r} out of masks, or untie it first, giving {head!r} a Parameter of its own "
        f"(model.{head} = nn.Parameter(model.{head}.detach().clone()); in transformers, tie_word_embeddings=False "
        "in the config), and mask that name"
    )


def _check_semi_structured(fn: str, name: str, weight: Tensor, mask: Tensor) -> None:
    """Refuse what ``torch.sparse.to_sparse_semi_structured`` cannot hold: CUDA, half, 2:4."""
    if weight.device.type != "cuda":
        raise ValueError(
            f"{fn}: layout='semi_structured' needs CUDA weights (torch's 2:4 kernels are "
            f"CUDA only); the parameter {name!r} is on {weight.device}; use layout='csr' "
            "or 'bsr' there"
        )
    if weight.dtype not in _SEMI_DTYPES:
        raise TypeError(
            f"{fn}: layout='semi_structured' needs torch.float16 or torch.bfloat16 weights; "
            f"the parameter {name!r} has dtype {weight.dtype}; convert the module first"
        )
    cols = mask.shape[1]
    if cols % 4 or bool((mask.reshape(mask.shape[0], cols // 4, 4).sum(-1) > 2).any()):
        raise ValueError(
            f"{fn}: layout='semi_structured' needs a 2:4 mask (at most 2 kept in every 4 "
            f"consecutive entries of a row); the mask for {name!r} is not; make it with "
            "fp.NM(2, 4)"
        )


def _convert(
    fn: str, name: str, weight: Tensor, mask: Tensor, layout: SparseLayout, block: tuple[int, int]
) -> Tensor:
    """``weight`` masked, in ``layout``: a new sparse tensor with no autograd history.

    Its parts (values and indices; 2:4: the packed values and metadata) are
    ordinary tensors, made under ``no_grad`` and outside ``inference_mode``
    even when this is called in it; the sparse tensor around them is made
    under ``inference_mode``. Torch 2.13 needs both, to run and read the
    tensor in and out of ``inference_mode``:

    - an ordinary sparse tensor fails under ``inference_mode``: ``F.linear``
      transposes it, and torch cannot record the transpose as a view of it
      ("Cannot set version_counter for inference tensor", pytorch#98004);
    - ``to_dense()`` reshapes views of the parts in place (``unsqueeze_``),
      which fails outside ``inference_mode`` on parts that are inference
      tensors ("Inplace update to inference tensor outside InferenceMode").
    """
    with warnings.catch_warnings():
        # torch warns once a process that these layouts are beta or prototype
        warnings.filterwarnings("ignore", message="Sparse (CSR|BSR) tensor support", category=UserWarning)
        warnings.filterwarnings("ignore", message="The PyTorch API of SparseSemiStructuredTensor")
        with torch.inference_mode(False), torch.no_grad():
            values = torch.where(mask, weight.detach(), 0.0)
            if layout == "semi_structured":
                try:
                    semi = torch.sparse.to_sparse_semi_structured(values.contiguous())
                except RuntimeError as err:  # a shape its kernels do not take
                    raise ValueError(f"{fn}: torch cannot make {name!r} semi-structured: {err}") from err
            else:
                parts = _compressed_parts(values, mask, block, bsr=layout == "bsr")
        with torch.inference_mode():
            if layout == "semi_structured":
                return _rewrapped(semi)
            return _compressed(parts, values.shape, bsr=layout == "bsr")


def _rewrapped(semi: SparseSemiStructuredTensor) -> Tensor:
    """A new tensor of ``semi``'s subclass around the very same inner tensors.

    Made under ``inference_mode``, the wrapper is an inference tensor and
    its inner tensors stay ordinary ones, as :func:`_convert` needs; it goes
    through the subclass's own ``__tensor_flatten__`` and
    ``__tensor_unflatten__``, whichever 2:4 backend (CUTLASS, cuSPARSELt) made it.
    """
    names, meta = semi.__tensor_flatten__()
    inner = {n: getattr(semi, n) for n in names}
    return type(semi).__tensor_unflatten__(inner, meta, semi.shape, semi.stride())


class _Parts(NamedTuple):
    """The parts of a CSR or BSR tensor: compressed row indices, column indices, values."""

    crow: Tensor
    col: Tensor
    values: Tensor


def _compressed_parts(values: Tensor, mask: Tensor, block: tuple[int, int], *, bsr: bool) -> _Parts:
    """The parts of a BSR tensor of the blocks that ``mask`` keeps, or of a CSR one (``block`` ``(1, 1)``).

    Its structure comes from the mask, not from the values: a kept zero is
    stored. Indices are ``int32`` where they fit, as MKL takes them: with
    ``int64`` ones (``Tensor.to_sparse_csr()``), CSR at batch 1 ran at half
    the speed at 50% sparsity, and broke even at 80% instead of 60%.
    """
    (rows, cols), (br, bc) = values.shape, block
    kept = kept_blocks(mask, block)
    index = torch.int32 if values.numel() < 2**31 else torch.int64
    counts = kept.sum(dim=1)
    crow = torch.cat([counts.new_zeros(1), counts.cumsum(dim=0)]).to(index)
    col = kept.nonzero()[:, 1].to(index)
    blocks = values.reshape(rows // br, br, cols // bc, bc).transpose(1, 2)[kept]
    return _Parts(crow, col, blocks.contiguous() if bsr else blocks.reshape(-1))


def _compressed(parts: _Parts, shape: torch.Size, *, bsr: bool) -> Tensor:
    """The BSR tensor of ``parts``, or the CSR one, holding them as they are (no copy)."""
    make = torch.sparse_bsr_tensor if bsr else torch.sparse_csr_tensor
    return make(parts.crow, parts.col, parts.values, shape, check_invariants=False)
