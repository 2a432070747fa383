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

import json
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ._config import RECORD
from ._resize import SIZE_ATTRIBUTES, get_size, set_size_

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
    tensor's shape that differs from the model the config builds, and each
    size attribute the resize changed. Plain ``from_pretrained`` cannot read
    that record (transformers re-initializes tensors whose size does not
    match, and prints a load report saying so); ``load_shrunk`` builds the
    model the record describes and loads the weights into it with
    transformers' own ``from_pretrained``.

    The record is checked before anything is built at its sizes: its
    shapes against the checkpoint's safetensors headers (``model.safetensors``,
    or the shards ``model.safetensors.index.json`` lists; no tensor is read),
    and against the model the config builds (a tensor it has, as many dims,
    no size larger); its attributes must be size attributes that shrink
    changes (a Linear's ``in_features``, an attention's ``num_heads``...:
    ``SIZE_ATTRIBUTES`` in ``_resize.py``), of modules the model has, set
    to ints no larger than the model built from the config has.

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
            transformers class, or its record is malformed or does not fit
            (a shape the checkpoint does not hold, a tensor or module the
            model lacks, a size larger than the config builds, an attribute
            that is not a size shrink changes); the message names the file.

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
    source = os.path.join(where, "config.json")
    shapes, attributes = _checked(record, source)
    _check_checkpoint(where, source, shapes)

    def __init__(self: nn.Module, *args: Any, **init_kwargs: Any) -> None:
        cls.__init__(self, *args, **init_kwargs)
        _check_fits(self, source, shapes, attributes)  # before resizing anything
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


#: What a record holds, for the messages.
_FORM = (
    "'shapes' (tensor name -> list of ints >= 0) and 'attributes' (module path -> size attribute -> int >= 0, "
    "or list of them)"
)


def _is_size(value: object) -> bool:
    return type(value) is int and value >= 0


def _size_value(value: object) -> bool:
    """Whether ``value`` is what a record sets a size attribute to: an int >= 0, or a list of them."""
    return _is_size(value) or isinstance(value, list) and all(map(_is_size, value))


def _checked(record: object, source: str) -> tuple[dict[str, tuple[int, ...]], dict[str, dict[str, Any]]]:
    """The record's shapes and attributes, each of the form shrink writes (nothing read from the model yet)."""
    where = f"load_shrunk: the {RECORD!r} record in {source!r}"
    bad = ValueError(f"{where} must hold {_FORM}; got {record!r:.200}")
    if not isinstance(record, Mapping) or not isinstance(record.get("shapes"), Mapping) or set(record) - {
        "shapes", "attributes"
    }:
        raise bad
    attributes = record.get("attributes", {})
    if not isinstance(attributes, Mapping) or not all(isinstance(v, Mapping) for v in attributes.values()):
        raise bad
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in record["shapes"].items():
        if not isinstance(shape, list) or not all(map(_is_size, shape)):
            raise ValueError(f"{where} gives {name!r} the shape {shape!r:.200}; expected a list of ints >= 0")
        shapes[str(name)] = tuple(shape)
    for path, attrs in attributes.items():
        for attr, value in attrs.items():
            if attr not in SIZE_ATTRIBUTES:
                raise ValueError(
                    f"{where} sets {attr!r} of the module {path!r}; a record sets only the size attributes "
                    f"that shrink changes: {', '.join(sorted(SIZE_ATTRIBUTES))}"
                )
            if not _size_value(value):
                raise ValueError(
                    f"{where} sets {attr!r} of the module {path!r} to {value!r:.200}; expected an int >= 0 (or a "
                    "list of them, for a shape)"
                )
    return shapes, {str(path): dict(attrs) for path, attrs in attributes.items()}


def _check_checkpoint(where: str, source: str, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Refuse a record whose shapes the checkpoint's safetensors files do not hold, reading their headers only.

    The tensors a checkpoint names otherwise (transformers converts some,
    MoE experts among them, as it saves) are checked against the model
    built from the config instead (:func:`_check_fits`).
    """
    held = _checkpoint_shapes(where)
    for name, shape in shapes.items():
        if name in held and held[name][1] != shape:
            file, found = held[name]
            raise ValueError(
                f"load_shrunk: the {RECORD!r} record in {source!r} gives {name!r} the shape {list(shape)}, but "
                f"{file!r} holds it with the shape {list(found)}; save the shrunk model again with save_pretrained"
            )


def _checkpoint_shapes(where: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor of the checkpoint in ``where`` (``model.safetensors``, or the shards its index lists): the
    file that holds it and its shape, from the files' headers; ``{}`` if it has no safetensors files."""
    index = os.path.join(where, "model.safetensors.index.json")
    single = os.path.join(where, "model.safetensors")
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
            files = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
            raise ValueError(
                f"load_shrunk: {index!r} is not a safetensors index (a JSON object with a 'weight_map' of tensor "
                f"names to file names): {err!r:.200}"
            ) from None
    elif os.path.isfile(single):
        files = ["model.safetensors"]
    else:
        return {}
    held: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name in files:
        if not isinstance(name, str) or os.path.basename(name) != name:
            raise ValueError(f"load_shrunk: {index!r} lists {name!r:.200}, not a file name in {where!r}")
        file = os.path.join(where, name)
        held.update((key, (file, shape)) for key, shape in _header_shapes(file).items())
    return held


def _header_shapes(file: str) -> dict[str, tuple[int, ...]]:
    """The shape of each tensor of the safetensors ``file``, from its header (no tensor is read)."""
    import safetensors

    try:
        with safetensors.safe_open(file, framework="pt") as f:
            return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    except safetensors.SafetensorError as err:
        raise ValueError(f"load_shrunk: {file!r} is not a valid safetensors file: {err}") from None


def _check_fits(model: nn.Module, source: str, shapes: Mapping[str, tuple[int, ...]],
                attributes: Mapping[str, Mapping[str, Any]]) -> None:  # fmt: skip
    """Refuse a record that does not fit ``model`` as the config builds it: a tensor or module it lacks, a size
    attribute it does not have, or a size larger than it (shrink only makes them smaller). Nothing is changed."""
    where = f"load_shrunk: the {RECORD!r} record in {source!r}"
    state = model.state_dict(keep_vars=True)
    for name, shape in shapes.items():
        built = state.get(name)
        if built is None:
            raise ValueError(f"{where} resizes {name!r}, which the model built from the config lacks")
        if len(shape) != built.dim() or any(n > b for n, b in zip(shape, built.shape, strict=True)):
            raise ValueError(
                f"{where} gives {name!r} the shape {list(shape)}, but the model built from the config has "
                f"{list(built.shape)}; shrink only makes a tensor smaller, keeping its dims"
            )
    for path, attrs in attributes.items():
        try:
            module = model.get_submodule(path)
        except AttributeError:
            raise ValueError(f"{where} names the module {path!r}, which the model built from the config lacks") from None
        for attr, value in attrs.items():
            current = get_size(module, attr)
            fits = _is_size(value) and _is_size(current) and value <= current or isinstance(value, list) and (
                isinstance(current, (tuple, list)) and len(value) == len(current)
                and all(_is_size(c) and v <= c for v, c in zip(value, current, strict=True))
            )  # fmt: skip
            if not fits:
                raise ValueError(
                    f"{where} sets {attr!r} of the module {path!r} ({type(module).__name__}) to {value!r}, but the "
                    f"model built from the config has {current!r:.100} there; shrink only makes a size smaller"
                )


@torch.no_grad()
def resize_to_record_(model: nn.Module, shapes: Mapping[str, tuple[int, ...]], attributes: Mapping[str, Mapping[str, Any]]) -> None:
    """Give ``model``'s tensors the recorded shapes (empty, to be loaded) and set the recorded attributes.

    A tied parameter gets one new Parameter under all its names. The record
    is assumed checked (``_checked`` and ``_check_fits``).
    """
    aliases: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    state = model.state_dict(keep_vars=True)
    for name, shape in shapes.items():
        old = state[name]
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
            set_size_(module, attr, value)
