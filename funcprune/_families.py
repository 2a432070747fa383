"""What funcprune knows of model families it did not write: how their ``forward`` and configs say things.

Knowledge of one kind of model lives here, not in the rooms that use it,
so that a new family is one edit: :func:`takes_use_cache` (whether a
model's ``forward`` takes a ``use_cache`` flag, by name or through
``**kwargs`` as GraniteMoE's does).
"""

from __future__ import annotations

import inspect

from torch import nn

__all__ = ["takes_use_cache"]


def takes_use_cache(module: nn.Module) -> bool:
    """Whether ``module.forward`` takes ``use_cache``: by name, or in ``**kwargs`` where its config has one.

    A transformers model given ``use_cache=False`` builds no key-value cache;
    GraniteMoE's ``forward`` takes it through ``**kwargs`` and, without it,
    reads ``config.use_cache`` and returns a cache (which ``torch.export``
    cannot return).

    >>> import torch
    >>> takes_use_cache(torch.nn.Linear(2, 2))
    False
    """
    try:
        parameters = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False
    if "use_cache" in parameters:
        return True
    config = getattr(module, "config", None)
    many = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return many and isinstance(getattr(config, "use_cache", None), bool)
