"""Output layers: the parameters :func:`~funcprune.prunable` leaves alone unless asked.

A model's output layers turn its features into its answer (logits, a
class): pruning them costs much and saves little, and an LM head tied to
the token embedding prunes the embedding too. They are recognized where
the model says which they are, never guessed from names:

- a transformers model (``PreTrainedModel``, recognized without importing
  transformers, by its ``base_model_prefix`` and ``get_output_embeddings``;
  the model itself or any module inside yours): every module outside its
  base model (the task heads: ``lm_head``, ``classifier``, ``score``,
  ``qa_outputs``, ...), its base model's ``pooler``, and its
  ``get_output_embeddings()``;
- in any model, a weight tied to an input embedding: the ``weight`` of an
  :class:`~torch.nn.Embedding` or :class:`~torch.nn.EmbeddingBag` that
  another kind of module holds too (an output head sharing it).

Nothing else is an output layer: the last Linear of your own model is not
guessed to be one.
"""

from __future__ import annotations

from torch import nn

from ._layers import EMBEDDINGS

__all__ = ["output_parameters"]


def output_parameters(module: nn.Module) -> set[int]:
    """The ``id`` of every parameter of ``module`` that an output layer holds (see the module docstring)."""
    found: set[int] = set()
    for owner in module.modules():
        if _is_transformers_model(owner):
            for layer in _output_layers(owner):
                found.update(id(p) for p in layer.parameters(recurse=False))
    return found | _tied_to_embeddings(module)


def _is_transformers_model(module: nn.Module) -> bool:
    """A ``transformers.PreTrainedModel``, recognized by its attributes (transformers is not imported)."""
    prefix = getattr(type(module), "base_model_prefix", None)
    return isinstance(prefix, str) and callable(getattr(module, "get_output_embeddings", None))


def _output_layers(model: nn.Module) -> list[nn.Module]:
    """The modules of the transformers ``model`` that are output layers, their submodules included."""
    prefix: str = getattr(type(model), "base_model_prefix")
    base = getattr(model, prefix, None) if prefix else None
    layers: list[nn.Module] = []
    if isinstance(base, nn.Module) and base is not model:
        inside = {id(m) for m in base.modules()}
        layers += [m for m in model.modules() if id(m) not in inside]  # the model itself: its own parameters
    else:
        base = model  # a base model itself (GPT2Model, BertModel)
    for head in (getattr(base, "pooler", None), _output_embeddings(model)):
        if isinstance(head, nn.Module):
            layers += list(head.modules())
    return layers


def _output_embeddings(model: nn.Module) -> object:
    """``model.get_output_embeddings()``, or ``None`` where the model has none (as transformers reads it)."""
    try:
        return model.get_output_embeddings()  # type: ignore[operator]
    except NotImplementedError:  # speech and vision backbones say so this way
        return None


def _tied_to_embeddings(module: nn.Module) -> set[int]:
    """The parameters held by an embedding layer and by a module that is not one."""
    embedded: set[int] = set()
    elsewhere: set[int] = set()
    for owner in module.modules():
        held = {id(p) for p in owner.parameters(recurse=False)}
        if isinstance(owner, EMBEDDINGS):
            embedded |= held
        else:
            elsewhere |= held
    return embedded & elsewhere
