"""Reloading a shrunk transformers model saved with ``save_pretrained``: :func:`load_shrunk`.

A model whose config describes it (the same widths in every layer, see
``_config.py``) reloads with plain ``from_pretrained``. One that carries a
record (``funcprune_shrunk`` in its config: widths that differ from layer
to layer, or heads the config cannot count) is rebuilt by a subclass of its
class whose ``__init__`` builds the model as the config says and then
resizes it as the record says; transformers' own ``from_pretrained`` then
loads the weights into it (its checkpoint conversions, tied weights, dtype
and device handling included), and the result is given back its own class.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ._config import RECORD

__all__ = ["load_shrunk", "resize_to_record_"]


def load_shrunk(path: str | os.PathLike[str], **kwargs: Any) -> nn.Module:
    """Load a model that :func:`~funcprune.shrink` made smaller and ``save_pretrained`` saved.

    ``shrink`` writes the new widths into a transformers model's config
    when every layer has the same ones (``intermediate_size``,
    ``num_attention_heads``, ``num_key_value_heads``...): such a model
    reloads with plain ``from_pretrained`` as well. Otherwise (widths that
    differ from layer to layer, or heads removed from a model that derives
    its head size from the hidden size, as GPT-2, BERT, ViT and OPT do) the
    config keeps its values and gets a record, ``funcprune_shrunk``: each
    resized tensor's shape and each changed module attribute. Plain
    ``from_pretrained`` cannot read that record (transformers re-initializes
    tensors whose size does not match, and prints a load report saying so);
    ``load_shrunk`` builds the model the record describes and loads the
    weights into it with transformers' own ``from_pretrained``.

    Args:
        path: the directory ``save_pretrained`` wrote (no hub names: the
            record is read from ``path``'s ``config.json``).
        **kwargs: passed to ``from_pretrained`` (``dtype=``, ``device_map=``...).

    Returns:
        The model, of the class named first in the config's ``architectures``,
        in eval mode as ``from_pretrained`` returns it.

    Raises:
        ImportError: if transformers is not installed (``pip install funcprune[hf]``).
        ValueError: if ``path`` is not a directory, its config names no
            transformers class, or its record is malformed.

    >>> import tempfile, torch, transformers, funcprune as fp
    >>> config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24,
    ...     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
    >>> model = transformers.LlamaForCausalLM(config).eval()
    >>> ids = torch.randint(0, 32, (1, 6))
    >>> keep = (torch.arange(24) % 3 > 0).unsqueeze(1).expand(24, 16)
    >>> masks = {f"model.layers.0.mlp.{p}.weight": keep for p in ("gate_proj", "up_proj")}
    >>> small = fp.shrink(model, masks, ids)  # layer 0 keeps 16 channels, layer 1 all 24
    >>> with tempfile.TemporaryDirectory() as d:
    ...     small.save_pretrained(d)
    ...     again = fp.load_shrunk(d)
    >>> again.model.layers[0].mlp.up_proj.out_features, again.model.layers[1].mlp.up_proj.out_features
    (16, 24)
    >>> torch.allclose(again(ids).logits, small(ids).logits)
    True
    """
    transformers = _transformers()
    where = os.fspath(path)
    if not os.path.isdir(where):
        raise ValueError(f"load_shrunk: path must be a directory that save_pretrained wrote, got {where!r}")
    config = transformers.AutoConfig.from_pretrained(where)
    architectures = getattr(config, "architectures", None) or []
    cls: Any = getattr(transformers, architectures[0], None) if architectures else None
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise ValueError(
            f"load_shrunk: the config in {where!r} names no transformers model class in 'architectures' "
            f"(got {architectures!r})"
        )
    record = getattr(config, RECORD, None)
    if record is None:
        plain: nn.Module = getattr(cls, "from_pretrained")(where, config=config, **kwargs)
        return plain
    shapes, attributes = _checked(record, where)

    def __init__(self: nn.Module, *args: Any, **init_kwargs: Any) -> None:
        cls.__init__(self, *args, **init_kwargs)
        resize_to_record_(self, shapes, attributes)

    resized: Any = type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__, "__qualname__": cls.__qualname__})
    model: nn.Module = resized.from_pretrained(where, config=config, **kwargs)
    model.__class__ = cls  # the subclass only built it
    return model


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - the hf extra installs it
        raise ImportError("load_shrunk needs transformers: pip install 'funcprune[hf]'") from e
    return transformers


def _checked(record: object, where: str) -> tuple[dict[str, tuple[int, ...]], dict[str, dict[str, Any]]]:
    bad = ValueError(
        f"load_shrunk: the {RECORD!r} record in {where!r} must hold 'shapes' (tensor name -> list of "
        f"ints) and 'attributes' (module path -> attribute -> value); got {record!r:.200}"
    )
    if not isinstance(record, Mapping) or not isinstance(record.get("shapes"), Mapping):
        raise bad
    attributes = record.get("attributes", {})
    if not isinstance(attributes, Mapping) or not all(isinstance(v, Mapping) for v in attributes.values()):
        raise bad
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in record["shapes"].items():
        if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise bad
        shapes[str(name)] = tuple(shape)
    return shapes, {str(path): dict(attrs) for path, attrs in attributes.items()}


@torch.no_grad()
def resize_to_record_(model: nn.Module, shapes: Mapping[str, tuple[int, ...]], attributes: Mapping[str, Mapping[str, Any]]) -> None:
    """Give ``model``'s tensors the recorded shapes (empty, to be loaded) and set the recorded attributes.

    A tied parameter gets one new Parameter under all its names.
    """
    aliases: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    state = model.state_dict(keep_vars=True)
    for name, shape in shapes.items():
        old = state.get(name)
        if old is None:
            raise ValueError(f"load_shrunk: the record resizes {name!r}, which the model built from the config lacks")
        new = torch.empty(shape, dtype=old.dtype, device=old.device)
        if isinstance(old, nn.Parameter):
            param = nn.Parameter(new, requires_grad=old.requires_grad)
            for alias in aliases.get(id(old), [name]):
                owner, _, attr = alias.rpartition(".")
                setattr(model.get_submodule(owner), attr, param)
        else:
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, new)
    for path, attrs in attributes.items():
        module = model.get_submodule(path)
        for attr, value in attrs.items():
            current = getattr(module, attr, None)
            setattr(module, attr, tuple(value) if isinstance(current, tuple) and isinstance(value, list) else value)
