"""A shrunk transformers model's config: the widths it now has, or a record of them.

A model that ``shrink`` made smaller by the same amount in every layer is
described by its config: :func:`describe_` finds, for each width attribute
of the config (``intermediate_size``, ``num_attention_heads``,
``num_key_value_heads``, GPT-2's ``n_inner``, OPT's ``ffn_dim``...), how
the model's tensor shapes depend on it, by building the model on the meta
device with that attribute doubled, solves for the values the shrunk shapes
need, and keeps them only if the model built from the new config has
exactly the shrunk model's shapes. ``save_pretrained`` then writes a config
that plain ``from_pretrained`` rebuilds.

Widths that differ from layer to layer, and heads where the model derives
the head size from the hidden size (GPT-2, BERT, ViT, OPT), are beyond what
the config can say: the config keeps its values and gets a record,
``funcprune_shrunk`` (each tensor's shape that differs from what the config
builds, and each size attribute the resizes changed), that
:func:`~funcprune.load_shrunk` reads. A model shrunk again keeps one
record of the whole model (:func:`record_`).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .._families import CONFIG_DEFAULTS, CONFIG_WIDTHS

__all__ = ["RECORD", "Record", "ShrunkConfigWarning", "describe_", "is_transformers_model", "record_", "shapes_of"]

#: The config attribute that holds a shrunk model's record.
RECORD = "funcprune_shrunk"
#: What the record says: tensor shapes by name, and module attributes by module path.
Record = dict[str, dict[str, Any]]


def is_transformers_model(model: nn.Module) -> bool:
    """Whether ``model`` looks like a transformers ``PreTrainedModel`` with a config it saves."""
    config = getattr(model, "config", None)
    return hasattr(model, "save_pretrained") and hasattr(config, "to_dict") and hasattr(config, "architectures")


def shapes_of(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Every parameter's and persistent buffer's shape, by first name (as the state dict has them)."""
    return {name: tuple(t.shape) for name, t in model.state_dict(keep_vars=True).items()}


def _built_shapes(cls: type[nn.Module], config: Any) -> dict[str, tuple[int, ...]] | None:
    """The shapes of ``cls(config)`` built on the meta device, or ``None`` if it cannot be built."""
    try:
        with torch.device("meta"):
            model = cls(config)
    except Exception:  # a value the class refuses (heads that do not divide the hidden size...)
        return None
    return shapes_of(model)


def _pinned(config: Any) -> Any:
    """``config`` with a derived head size spelled out (``head_dim: None`` means ``hidden_size // num_attention_heads``).

    Where a class reads ``config.head_dim`` before deriving it (Mixtral), the
    head count can then change without changing the head size.
    """
    hidden, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    if getattr(config, "head_dim", None) is not None or not isinstance(hidden, int) or not isinstance(heads, int):
        return config
    if not _is_count(hidden) or not _is_count(heads):
        return config
    pinned = copy.deepcopy(config)
    pinned.head_dim = hidden // heads  # read where the class reads it (Phi-3: getattr(config, "head_dim", ...))
    return pinned


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _value(config: Any, attr: str) -> int | None:
    value = getattr(config, attr, None)
    if value is None and attr in CONFIG_DEFAULTS:
        other, times = CONFIG_DEFAULTS[attr]
        base = getattr(config, other, None)
        value = base * times if isinstance(base, int) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _solved(
    cls: type[nn.Module], config: Any, before: Mapping[str, tuple[int, ...]], target: Mapping[str, tuple[int, ...]]
) -> dict[str, int]:
    """The values of the width attributes that give the shrunk shapes ``target``, solved together.

    Each attribute is doubled in turn to tell how every tensor dim grows
    with it (``size = offset + sum of slope * attribute``; Phi-3's fused
    ``qkv_proj`` grows with the query heads and the KV heads both); the new
    values solve these equations in whole numbers of at least 1.
    Attributes no shape depends on keep their values; ``{}`` where no
    solution fits (the caller checks the shapes the result builds anyway).
    """
    values = {attr: value for attr in CONFIG_WIDTHS if (value := _value(config, attr)) is not None}
    slopes: dict[str, dict[tuple[str, int], float]] = {}
    for attr, value in values.items():
        trial = copy.deepcopy(config)
        setattr(trial, attr, 2 * value)
        doubled = _built_shapes(cls, trial)
        if doubled is None or doubled.keys() != before.keys():
            continue
        grows = {
            (name, d): (b - a) / value
            for name, shape in before.items()
            if len(doubled[name]) == len(shape)
            for d, (a, b) in enumerate(zip(shape, doubled[name], strict=True))
            if a != b
        }
        if grows and grows not in slopes.values():  # an alias grows the same (Mixtral's num_experts)
            slopes[attr] = grows
    dims = sorted({key for grows in slopes.values() for key in grows})
    if not slopes or any(name not in target or len(target[name]) <= d for name, d in dims):
        return {}
    attrs = list(slopes)
    a = torch.tensor([[slopes[attr].get(key, 0.0) for attr in attrs] for key in dims], dtype=torch.float64)
    b = torch.tensor(
        [target[name][d] - before[name][d] + sum(slopes[x].get((name, d), 0.0) * values[x] for x in attrs)
         for name, d in dims], dtype=torch.float64,
    )  # fmt: skip
    solution = torch.linalg.lstsq(a, b.unsqueeze(1)).solution.squeeze(1)
    rounded = solution.round()
    if not torch.allclose(a @ rounded, b, atol=1e-6) or bool((rounded < 1).any()):
        return {}
    return {attr: int(v) for attr, v in zip(attrs, rounded.tolist(), strict=True)}


def describe_(model: nn.Module, original: Mapping[str, tuple[int, ...]], attributes: Record) -> None:
    """Make ``model.config`` describe the shrunk ``model`` (in place): new widths, or a record.

    ``original``: the shapes before shrinking; ``attributes``: the module
    attributes the resize changed, by module path.
    """
    config: Any = getattr(model, "config", None)
    target = shapes_of(model)
    if config is None or target == dict(original):
        return
    if getattr(config, RECORD, None) is not None:  # shrunk before, beyond what the config says: a record still
        record_(model, original, attributes)
        return
    cls = type(model)
    pinned = _pinned(config)
    before = _built_shapes(cls, pinned)
    if before is not None and before == dict(original):
        updated = copy.deepcopy(pinned)
        for attr, value in _solved(cls, pinned, before, target).items():
            if value != _value(pinned, attr):
                setattr(updated, attr, value)
        refused = _refused_by_class(updated)
        if refused is None and _built_shapes(cls, updated) == target:
            for attr in ("head_dim", *CONFIG_WIDTHS):
                if getattr(updated, attr, None) != getattr(config, attr, None):
                    setattr(config, attr, getattr(updated, attr))
            return
        if refused is not None and any(getattr(updated, a, None) != getattr(pinned, a, None) for a in CONFIG_WIDTHS):
            warnings.warn(
                f"shrink: the shrunk model's widths are the same in every layer, but its config class refuses them "
                f"({refused}); the config keeps its values and gets a record ({RECORD!r}): reload the saved model "
                "with funcprune.load_shrunk",
                ShrunkConfigWarning,
                stacklevel=4,
            )
    record_(model, original, attributes)


class ShrunkConfigWarning(UserWarning):
    """A shrunk transformers model whose widths its config class refuses (heads that do not divide the hidden size).

    The model is right and runs; its config keeps the old values and gets a
    record that :func:`~funcprune.load_shrunk` reads, since plain
    ``from_pretrained`` would refuse the new values.
    """

    __module__ = "funcprune"


def _refused_by_class(config: Any) -> str | None:
    """Why ``config``'s class refuses it, as ``from_pretrained`` rebuilds it from its dict, or ``None``."""
    try:
        again = type(config).from_dict(config.to_dict())
        validate = getattr(again, "validate", None)
        if callable(validate):
            validate()
    except Exception as e:  # transformers' strict dataclass validation, or a check in __init__
        lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
        return lines[-1] if lines else type(e).__name__
    return None


def record_(model: nn.Module, original: Mapping[str, tuple[int, ...]], attributes: Record) -> None:
    """Write the record of the shrunk ``model`` into its config (in place): each tensor's shape that differs
    from the model the config builds, and the size attributes the resizes changed.

    The shapes are compared with the model's class built from its config on
    the meta device (what ``load_shrunk`` builds before resizing), so a
    model shrunk again keeps what its first shrink removed; where the class
    cannot be built so, with ``original`` (the shapes before this shrink)
    and the record of an earlier shrink. The attributes (``attributes``,
    this resize's) are merged into an earlier record's.
    """
    config: Any = getattr(model, "config")
    target = shapes_of(model)
    earlier = getattr(config, RECORD, None)
    earlier = earlier if isinstance(earlier, Mapping) else {}
    built = _built_shapes(type(model), copy.deepcopy(config))
    if built is not None and built.keys() == target.keys():
        changed = {name: list(shape) for name, shape in target.items() if built[name] != shape}
    else:
        changed = {name: list(shape) for name, shape in dict(earlier.get("shapes", {})).items() if name in target}
        changed.update({name: list(shape) for name, shape in target.items() if original.get(name) != shape})
    merged: Record = {path: dict(attrs) for path, attrs in dict(earlier.get("attributes", {})).items()}
    for path, attrs in attributes.items():
        merged.setdefault(path, {}).update(attrs)
    setattr(config, RECORD, {"shapes": changed, "attributes": merged})
