"""Which parameters to prune: the weights pruning conventionally targets.

:func:`prunable` reads a module's layer types and returns the names of its
prunable weights, keyed like ``named_parameters()``, ready to be the keys of
a :class:`~funcprune.Plan` or the names of
:func:`~funcprune.global_unstructured`. Biases and normalization layers are
never selected; embeddings only on request; your own layer types by type.
It reads module types only, never tensor values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from .._names import check_not_hook_mode

__all__ = ["prunable"]

#: Layers whose parameter named ``weight`` is selected (subclasses included:
#: ``NonDynamicallyQuantizableLinear``, the lazy layers once materialized).
_WEIGHTED: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Bilinear,
    nn.Conv1d, nn.Conv2d, nn.Conv3d,
    nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
)  # fmt: skip
#: Layers whose ``weight`` is selected only with ``embeddings=True``.
_EMBEDDINGS: tuple[type[nn.Module], ...] = (nn.Embedding, nn.EmbeddingBag)
#: The input projections of :class:`torch.nn.MultiheadAttention` (its output
#: projection is a Linear of its own, ``out_proj``).
_ATTENTION_WEIGHTS = frozenset(
    {"in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"}
)
#: The weights of :class:`torch.nn.RNNBase` layer by layer (``hr``: LSTM's
#: ``proj_size`` projection), reverse directions included; never the biases.
_RECURRENT_WEIGHT = re.compile(r"weight_(ih|hh|hr)_l[0-9]+(_reverse)?")
#: The weights of the single-step cells (:class:`torch.nn.RNNCellBase`).
_CELL_WEIGHTS = frozenset({"weight_ih", "weight_hh"})


def prunable(
    module: nn.Module,
    *,
    embeddings: bool = False,
    types: Iterable[type[nn.Module]] = (),
) -> list[str]:
    """The names of the weights pruning conventionally targets, in parameter order.

    Selected, by the type of the module that owns them (subclasses included):

    - the ``weight`` of :class:`~torch.nn.Linear` (so of
      ``MultiheadAttention.out_proj`` too), :class:`~torch.nn.Bilinear`,
      ``Conv1d/2d/3d`` and ``ConvTranspose1d/2d/3d``; a lazy layer
      (``LazyLinear``, ``LazyConv2d``, ...) once materialized;
    - :class:`~torch.nn.MultiheadAttention`'s ``in_proj_weight``, or its
      ``q_proj_weight``, ``k_proj_weight`` and ``v_proj_weight`` when
      ``kdim`` or ``vdim`` differ from ``embed_dim``;
    - every ``weight_ih_l*``, ``weight_hh_l*`` and (LSTM with ``proj_size``)
      ``weight_hr_l*`` of :class:`~torch.nn.RNN`, :class:`~torch.nn.LSTM`
      and :class:`~torch.nn.GRU`, ``_reverse`` directions included, and the
      ``weight_ih`` and ``weight_hh`` of the ``RNNCell``, ``LSTMCell`` and
      ``GRUCell``;
    - the ``weight`` of :class:`~torch.nn.Embedding` and
      :class:`~torch.nn.EmbeddingBag` with ``embeddings=True`` only;
    - the ``weight`` of every module whose type is in ``types``: this is how
      your own layer types are selected.

    Never selected: biases, normalization layers (``BatchNorm*``,
    ``LayerNorm``, ``GroupNorm``, ``InstanceNorm*``, ``RMSNorm``), any other
    layer, a lazy parameter not yet materialized, and anything that is not a
    leaf :class:`~torch.nn.Parameter` registered on its module (a weight
    computed by :mod:`torch.nn.utils.parametrize` is a property: its
    ``parametrizations.weight.original`` is not selected; inside
    :func:`torch.func.functional_call` a module holds the tensors passed in,
    which are not parameters: call ``prunable`` outside it). Frozen parameters
    (``requires_grad=False``) are selected: pruning is about the weights, not
    about which of them train.

    The names are those of ``module.named_parameters()`` (duplicates
    removed), in its order: a weight tied to several layers appears once,
    under the first name ``named_parameters()`` gives it, if any layer that
    holds it is selected (a Linear tied to an Embedding is listed with
    ``embeddings=False``, perhaps under the Embedding's name). The list works
    as :class:`~funcprune.Plan` keys and
    :func:`~funcprune.global_unstructured` names as it is.

    Args:
        module: the model, as an :class:`torch.nn.Module`.
        embeddings: whether to select the weights of embedding layers too.
        types: more module types (:class:`torch.nn.Module` subclasses) whose
            parameter named ``weight`` is selected, subclasses included.

    Returns:
        A new list of parameter names.

    Raises:
        TypeError: if ``module`` is not an :class:`torch.nn.Module`,
            ``embeddings`` not a ``bool``, or ``types`` not an iterable of
            :class:`torch.nn.Module` subclasses.
        ValueError: if the module is pruned in hook mode
            (``torch.nn.utils.prune`` or ``funcprune.compat``): its pruned
            weights are ``weight_orig`` parameters, which no plan names.

    >>> import torch, funcprune as fp
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Embedding(10, 8), nn.LayerNorm(8), nn.Linear(8, 4))
    >>> fp.prunable(model)
    ['2.weight']
    >>> fp.prunable(model, embeddings=True)
    ['0.weight', '2.weight']
    >>> fp.prunable(model, types=(nn.LayerNorm,))
    ['1.weight', '2.weight']
    """
    extra = _check_arguments(module, embeddings, types)
    check_not_hook_mode("prunable", dict(module.named_parameters()))
    selected = {
        id(param)
        for _, owner in module.named_modules()
        for name, param in owner.named_parameters(recurse=False)
        if _is_weight(param) and _is_target(owner, name, embeddings=embeddings, types=extra)
    }
    return [name for name, param in module.named_parameters() if id(param) in selected]


def _is_target(
    owner: nn.Module, name: str, *, embeddings: bool, types: tuple[type[nn.Module], ...]
) -> bool:
    """Whether ``owner``'s own parameter ``name`` is one pruning targets."""
    if isinstance(owner, nn.MultiheadAttention) and name in _ATTENTION_WEIGHTS:
        return True
    if isinstance(owner, nn.RNNBase) and _RECURRENT_WEIGHT.fullmatch(name):
        return True
    if isinstance(owner, nn.RNNCellBase) and name in _CELL_WEIGHTS:
        return True
    if name != "weight":
        return False
    return isinstance(owner, _WEIGHTED + types) or (
        embeddings and isinstance(owner, _EMBEDDINGS)
    )


def _is_weight(param: torch.Tensor) -> bool:
    """A materialized leaf :class:`~torch.nn.Parameter` (not a swapped-in tensor)."""
    lazy = isinstance(param, nn.parameter.UninitializedParameter)
    return isinstance(param, nn.Parameter) and param.is_leaf and not lazy


def _check_arguments(
    module: object, embeddings: object, types: object
) -> tuple[type[nn.Module], ...]:
    """Refuse bad arguments; return ``types`` as a tuple."""
    if not isinstance(module, nn.Module):
        hint = (
            "; pass the model itself: prunable reads its layer types, which a dict of "
            "parameters does not hold"
            if isinstance(module, Mapping)
            else ""
        )
        raise TypeError(
            f"prunable: module must be a torch.nn.Module, got {type(module).__name__}{hint}"
        )
    if not isinstance(embeddings, bool):
        raise TypeError(
            f"prunable: embeddings must be a bool, got {embeddings!r} of type "
            f"{type(embeddings).__name__}"
        )
    return _check_types(types)


def _check_types(types: object) -> tuple[type[nn.Module], ...]:
    """``types`` as a tuple of :class:`torch.nn.Module` subclasses, or a TypeError."""
    expected = "prunable: types must be a tuple of torch.nn.Module subclasses"
    if isinstance(types, type):
        name = types.__name__
        raise TypeError(f"{expected}, got the class {name} itself; write types=({name},)")
    if isinstance(types, str) or not isinstance(types, Iterable):
        raise TypeError(f"{expected}, got {types!r} of type {type(types).__name__}")
    checked = tuple(types)
    for i, kind in enumerate(checked):
        if not (isinstance(kind, type) and issubclass(kind, nn.Module)):
            got = (
                f"the class {kind.__name__}"
                if isinstance(kind, type)
                else f"{kind!r} of type {type(kind).__name__}"
            )
            raise TypeError(f"prunable: types[{i}] must be a torch.nn.Module subclass, got {got}")
    return checked
