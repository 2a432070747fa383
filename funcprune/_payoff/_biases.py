"""A copy of a model holding new parameters, with the biases they add (FLAP's compensation) made real.

:func:`~funcprune.compensate` returns biases for layers that had none;
:func:`with_biases` gives them a home: a copy of the model whose Linears
hold them, and whose transformers config says so (``attention_bias``,
``mlp_bias``), so that the copy runs the compensated masked model, shrinks
with :func:`~funcprune.shrink`, and reloads with plain ``from_pretrained``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .._names import check_params, unknown_name
from .._types import Params, is_conv1d
from ._config import is_transformers_model, shapes_of

__all__ = ["BIAS_FLAGS", "with_biases"]

#: The config flags that give a transformers model's projections biases (Llama, Mistral, Qwen3, ...).
BIAS_FLAGS = ("attention_bias", "mlp_bias")


def with_biases(model: nn.Module, params: Params) -> nn.Module:
    """A copy of ``model`` holding ``params``, with every bias ``params`` adds made a parameter of its layer.

    ``params`` is keyed like ``model.named_parameters()``, and may name
    biases the model lacks (``"...o_proj.bias"`` from
    :func:`~funcprune.compensate`): each must belong to an
    :class:`~torch.nn.Linear` without a bias, which gets one. In a
    transformers model, the config flags that build such biases
    (``attention_bias``, ``mlp_bias``) are turned on where a new bias needs
    them, and every other projection they cover gets a zero bias, so that
    the copy has exactly the parameters its class builds from its config:
    ``save_pretrained`` (after :func:`~funcprune.shrink`, or not) writes a
    checkpoint that plain ``from_pretrained`` reloads. The model itself is
    left as it was.

    Args:
        model: the model.
        params: parameters by name, as ``named_parameters()`` names them
            (any subset), with the new biases.

    Returns:
        The copy, in ``model``'s mode, holding ``params``' values.

    Raises:
        TypeError: if ``model`` is not a module or ``params`` not a mapping of tensors.
        UnknownNameError: if a name is neither a parameter nor the bias of a Linear without one.
        ValueError: if a value's shape differs from its parameter's, or a
            transformers model's config has no flag that builds a new bias
            (the bias is named; ``from_pretrained`` could not reload it).

    >>> import torch, funcprune as fp
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False))
    >>> params = {**dict(net.named_parameters()), "0.bias": torch.tensor([1.0, 2.0])}
    >>> fp.with_biases(net, params)[0].bias
    Parameter containing:
    tensor([1., 2.], requires_grad=True)
    """
    fn = "with_biases"
    if not isinstance(model, nn.Module):
        raise TypeError(f"{fn}: model must be a torch.nn.Module, got {type(model).__name__}")
    check_params(fn, params)
    current = dict(model.named_parameters())
    new = [name for name in params if name not in current]
    for name in new:
        _check_new_bias(fn, model, name, current)
    out = copy.deepcopy(model)
    flags = _flags_for(fn, out, set(new)) if new and is_transformers_model(out) else {}
    for flag in flags:
        setattr(out.config, flag, True)
    for name in list(new) + [n for names in flags.values() for n in names if n not in new]:
        owner = out.get_submodule(name.rpartition(".")[0])
        assert isinstance(owner, nn.Linear)  # checked
        weight = owner.weight
        owner.bias = nn.Parameter(torch.zeros(owner.out_features, dtype=weight.dtype, device=weight.device))
    if flags:
        _check_built(fn, out)
    held = dict(out.named_parameters())
    with torch.no_grad():
        for name, value in params.items():
            if tuple(value.shape) != tuple(held[name].shape):
                raise ValueError(f"{fn}: params[{name!r}] has shape {tuple(value.shape)}, the model's "
                                 f"{tuple(held[name].shape)}")  # fmt: skip
            held[name].copy_(value)
    return out


def _check_new_bias(fn: str, model: nn.Module, name: str, current: Mapping[str, Any]) -> None:
    """Refuse a new name that is not the bias of a Linear without one."""
    path, _, attr = name.rpartition(".")
    try:
        owner = model.get_submodule(path)
    except AttributeError:
        owner = None
    if attr != "bias" or not isinstance(owner, nn.Linear) or is_conv1d(owner) or owner.bias is not None:
        raise unknown_name(fn, f"params name {name!r}, which is neither a parameter of the model nor the "
                           "bias of an nn.Linear without one", name, list(current))  # fmt: skip


def _check_built(fn: str, model: nn.Module) -> None:
    """Refuse a copy whose shapes differ from what its class builds from its config (flags that build more)."""
    with torch.device("meta"):
        built = shapes_of(type(model)(model.config))
    mine = shapes_of(model)
    if built != mine:
        odd = sorted(set(built) ^ set(mine)) or sorted(n for n in built if built[n] != mine[n])
        raise ValueError(f"{fn}: with {type(model.config).__name__}'s bias flags turned on, its class builds other "
                         f"parameters than the copy holds ({odd[0]!r}), so from_pretrained could not reload it")  # fmt: skip


def _flags_for(fn: str, model: nn.Module, needed: set[str]) -> dict[str, list[str]]:
    """The config flags to turn on for the biases ``needed``, each with the biases it builds."""
    config = model.config
    cls = type(model)
    names = set(shapes_of(model))
    flags: dict[str, list[str]] = {}
    left = set(needed)
    for flag in BIAS_FLAGS:
        if getattr(config, flag, None) is not False:
            continue
        trial = copy.deepcopy(config)
        setattr(trial, flag, True)
        with torch.device("meta"):
            built = set(shapes_of(cls(trial)))
        added = sorted(built - names)
        if left & set(added):
            flags[flag] = added
            left -= set(added)
    if left:
        have = [f for f in BIAS_FLAGS if hasattr(config, f)]
        raise ValueError(
            f"{fn}: {min(left)!r} is a new bias that {type(config).__name__} has no flag to build (it has "
            f"{have or 'none of ' + str(list(BIAS_FLAGS))} off or absent for that layer), so from_pretrained could "
            "not reload it; leave that layer's compensation out (drop its moments)"
        )
    return flags
