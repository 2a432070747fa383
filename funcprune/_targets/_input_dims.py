"""Where each weight's input features run: the layout plans and Wanda read.

A Linear stores its weight ``(out, in)``; transformers' ``Conv1D``
(GPT-2's layers) stores it ``(in, out)``. The shapes cannot tell them apart
(a square weight fits both), the module types can: :func:`input_dims`
reads them once, and plans and :func:`~funcprune.wanda` take the dict.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from .._names import check_module_not_hook_mode
from ._layers import input_dim, is_weight

__all__ = ["input_dims"]


def input_dims(module: nn.Module) -> dict[str, int]:
    """For each weight of a Linear-like layer, the dim along which its input features run.

    - ``1`` for the weights of :class:`~torch.nn.Linear`, ``Conv1d/2d/3d``
      (``(out, in / groups, *kernel)``), :class:`~torch.nn.MultiheadAttention`'s
      input projections and the recurrent layers' and cells' weights (all
      multiply their input as ``x @ W.T``);
    - ``0`` for transformers' ``Conv1D`` (GPT-2's layers, ``x @ W`` with
      ``W`` stored ``(in, out)``; recognized without importing transformers,
      by its class name, ``nf`` and weight shape) and for
      ``ConvTranspose1d/2d/3d`` (stored ``(in, out / groups, *kernel)``).

    Left out: the weights that have no single input dim (embeddings, whose
    input is an index; :class:`~torch.nn.Bilinear`, which has two inputs),
    biases, norm layers, layer types not listed, lazy parameters not yet
    materialized. Output layers are included: this is the layout, not a
    selection (:func:`~funcprune.prunable` selects).

    Pass the dict to a plan (``fp.Plan(rules, input_dims=...)``,
    ``fp.global_structured(..., input_dims=...)``), which then shows the
    specs every weight as ``(out, in, ...)``, and to
    :func:`~funcprune.wanda`, which scales each weight along its input dim.
    Names that a plan or ``wanda`` does not touch are ignored there, so one
    dict serves the whole model.

    Args:
        module: the model, as an :class:`torch.nn.Module`.

    Returns:
        A new dict ``{name: dim}``, keyed and ordered like
        ``module.named_parameters()`` (a shared weight once, under its first
        name).

    Raises:
        TypeError: if ``module`` is not an :class:`torch.nn.Module`.
        ValueError: if the module is pruned in hook mode, or one weight is
            held by two layers that read their inputs along different dims.

    >>> import torch, funcprune as fp
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.LazyLinear(10))
    >>> fp.input_dims(model)  # the lazy Linear is not materialized yet
    {'0.weight': 1}
    >>> fp.input_dims(nn.Sequential(nn.Linear(4, 4), nn.ConvTranspose1d(4, 2, 3), nn.Bilinear(2, 2, 1)))
    {'0.weight': 1, '1.weight': 0}
    """
    fn = "input_dims"
    if not isinstance(module, nn.Module):
        hint = "; pass the model itself: its layer types say the layout" if isinstance(module, Mapping) else ""
        raise TypeError(f"{fn}: module must be a torch.nn.Module, got {type(module).__name__}{hint}")
    check_module_not_hook_mode(fn, module)
    dims: dict[int, tuple[int, str]] = {}  # by parameter: its input dim, and who said so
    for path, owner in module.named_modules():
        for name, param in owner.named_parameters(recurse=False):
            dim = input_dim(owner, name) if is_weight(param) else None
            if dim is None:
                continue
            where = f"{path}.{name}" if path else name
            seen = dims.setdefault(id(param), (dim, where))
            if seen[0] != dim:
                raise ValueError(
                    f"{fn}: one parameter is {seen[1]!r}, whose input features run along dim "
                    f"{seen[0]}, and {where!r} ({type(owner).__name__}), along dim {dim}: its layout "
                    "is ambiguous; tie weights of layers that store them alike"
                )
    return {name: dims[id(p)][0] for name, p in module.named_parameters() if id(p) in dims}
