"""Which parameters to prune: the weights pruning conventionally targets.

:func:`prunable` reads a module's layer types and returns the names of its
prunable weights, keyed like ``named_parameters()``, ready to be the keys of
a :class:`~funcprune.Plan` or the names of
:func:`~funcprune.global_unstructured`. Biases and normalization layers are
never selected; embeddings only on request; your own layer types by type.
It reads module types only, never tensor values; with ``experts=True`` it
also runs each MoE layer's experts once on a few zero tokens, to see which
stacked parameters their linears read as weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from torch import nn

from .._expert_linears import expert_input_dims
from .._names import check_module_not_hook_mode
from ._layers import is_target, is_weight
from ._outputs import output_parameters

__all__ = ["prunable"]


def prunable(
    module: nn.Module,
    *,
    embeddings: bool = False,
    types: Iterable[type[nn.Module]] = (),
    outputs: bool = False,
    experts: bool = False,
) -> list[str]:
    """The names of the weights pruning conventionally targets, in parameter order.

    Selected, by the type of the module that owns them (subclasses included):

    - the ``weight`` of :class:`~torch.nn.Linear` (so of
      ``MultiheadAttention.out_proj`` too), :class:`~torch.nn.Bilinear`,
      ``Conv1d/2d/3d`` and ``ConvTranspose1d/2d/3d``; a lazy layer
      (``LazyLinear``, ``LazyConv2d``, ...) once materialized;
    - the ``weight`` of transformers' ``Conv1D`` (GPT-2's Linear layers,
      their weight stored ``(in, out)``: :func:`~funcprune.input_dims`
      says so to plans and :func:`~funcprune.wanda`), recognized without
      importing transformers by its class name, ``nf`` and weight shape;
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

    With ``experts=True``, also the stacked expert weights of each MoE
    layer (a transformers experts module: Mixtral's ``experts.gate_up_proj``
    ``(E, 2I, H)`` and ``experts.down_proj`` ``(E, H, I)``, found as
    :func:`~funcprune.oneshot` finds them): those whose slices ``W[e]`` the
    experts' eager forward reads as a Linear weight (``F.linear(x, W[e])``,
    or ``x @ W[e]`` for a layout stored ``(in, out)``, GPT-OSS's). To see
    which, each experts module runs once, without gradients, on a few zero
    tokens routed to every expert (the model is left as it was); a stacked
    parameter read otherwise (a bias), or an experts module that cannot run
    alone, is not selected. Each of these names one weight per expert: a
    plan's spec applies to the whole stack unless wrapped in
    ``fp.PerSlice(spec, dim=0)``; :func:`~funcprune.oneshot` prunes each
    expert's slice as its own Linear weight. Routers are not experts: a
    router that is an ``nn.Linear`` (PhiMoE's) is selected as a Linear,
    with or without ``experts``.

    Left out unless ``outputs=True``: the parameters of the output layers,
    where the model says which they are (nothing is guessed from names or
    positions):

    - in a transformers model (``transformers.PreTrainedModel``, recognized
      without importing transformers by its ``base_model_prefix`` and
      ``get_output_embeddings``; the model itself, or one inside your
      module): every module outside its base model
      (``getattr(model, model.base_model_prefix)``), that is the task heads
      (``lm_head``, ``classifier``, ``score``, ``qa_outputs``, ...); the
      base model's ``pooler`` (BERT's); and ``get_output_embeddings()``;
    - in any model, a weight tied to an input embedding: the weight of an
      ``Embedding`` or ``EmbeddingBag`` that another kind of module holds
      too (an LM head sharing the token embedding), also with
      ``embeddings=True``: pruning it would prune the head.

    In a model of your own, the last Linear is not taken for an output
    layer: leave it out by name (``fp.prunable(model)[:-1]``, say).

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
    removed), in its order: a weight shared by several layers appears once,
    under the first name ``named_parameters()`` gives it, if any layer that
    holds it is selected (with ``outputs=True``, a Linear head tied to an
    Embedding is listed with ``embeddings=False``, perhaps under the
    Embedding's name). The list works as :class:`~funcprune.Plan` keys and
    :func:`~funcprune.global_unstructured` names as it is.

    Args:
        module: the model, as an :class:`torch.nn.Module`.
        embeddings: whether to select the weights of embedding layers too.
        types: more module types (:class:`torch.nn.Module` subclasses) whose
            parameter named ``weight`` is selected, subclasses included.
        outputs: whether to select the output layers' weights too (and a
            weight tied to an input embedding); the default leaves them out.
        experts: whether to select the stacked expert weights of MoE
            layers too (above); the default leaves them out.

    Returns:
        A new list of parameter names.

    Raises:
        TypeError: if ``module`` is not an :class:`torch.nn.Module`,
            ``embeddings``, ``outputs`` or ``experts`` not a ``bool``, or ``types`` not an
            iterable of :class:`torch.nn.Module` subclasses.
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
    >>> lm = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.Linear(8, 10))
    >>> lm[2].weight = lm[0].weight  # the head tied to the token embedding
    >>> fp.prunable(lm), fp.prunable(lm, outputs=True)
    (['1.weight'], ['0.weight', '1.weight'])
    """
    extra = _check_arguments(module, embeddings, types, outputs)
    if not isinstance(experts, bool):
        raise TypeError(f"prunable: experts must be a bool, got {experts!r} of type {type(experts).__name__}")
    check_module_not_hook_mode("prunable", module)
    selected = {
        id(param)
        for _, owner in module.named_modules()
        for name, param in owner.named_parameters(recurse=False)
        if is_weight(param) and is_target(owner, name, embeddings=embeddings, types=extra)
    }
    if experts:
        params = dict(module.named_parameters())
        selected |= {id(params[name]) for name, dim in expert_input_dims(module).items() if dim is not None}
    if not outputs:
        selected -= output_parameters(module)
    return [name for name, param in module.named_parameters() if id(param) in selected]


def _check_arguments(
    module: object, embeddings: object, types: object, outputs: object
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
    for flag, value in (("embeddings", embeddings), ("outputs", outputs)):
        if not isinstance(value, bool):
            raise TypeError(
                f"prunable: {flag} must be a bool, got {value!r} of type {type(value).__name__}"
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
