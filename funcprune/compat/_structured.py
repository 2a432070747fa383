"""The structured methods: ``RandomStructured`` and ``LnStructured``.

Both prune whole channels (slices along ``dim``) and return torch's mask:
ones on the kept channels, in ``t``'s dtype, times ``default_mask``; the
conventions are those of :mod:`._methods`. Called directly, torch's checks
run first, in torch's order. ``RandomStructured`` draws through its spec's
kernel. ``LnStructured`` computes the channels' norms as torch does
(:func:`~._torch_helpers._compute_norm`, so every order :func:`torch.norm`
takes works, and fails, as in torch) and lets the kernel
:func:`funcprune._specs.structured_by_keys` choose the channels. In a
:class:`~funcprune.compat.PruningContainer` both fold through their specs
wherever the spec accepts the method's attributes.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

from .. import _specs as specs
from .._specs import Spec
from .._types import Amount, NormOrder
from ._base import BasePruningMethod
from ._methods import as_count, kernel_mask, shape_only
from ._state import TorchBase
from ._torch_helpers import (
    _compute_norm,
    _compute_nparams_toprune,
    _validate_pruning_amount,
    _validate_pruning_amount_init,
    _validate_pruning_dim,
    _validate_structured_pruning,
)

__all__ = ["LnStructured", "RandomStructured"]

Tensor = torch.Tensor


def _structured_mask(t: Tensor, kept: Tensor, default_mask: Tensor) -> Tensor:
    """torch's structured result: ones on kept channels, in ``t``'s dtype, times
    ``default_mask``."""
    mask = torch.zeros_like(t)
    mask.masked_fill_(kept, 1)
    mask *= default_mask.to(dtype=mask.dtype)
    return mask


def _structured_count(method: RandomStructured | LnStructured, t: Tensor) -> int:
    """torch's checks and count for structured methods, in torch's order."""
    _validate_structured_pruning(t)
    _validate_pruning_dim(t, method.dim)
    tensor_size = t.shape[method.dim]
    nparams_toprune = _compute_nparams_toprune(method.amount, tensor_size)
    _validate_pruning_amount(nparams_toprune, tensor_size)
    return nparams_toprune


def _structured_dim(t: Tensor, dim: object) -> int | None:
    """``dim`` as an int indexing ``t`` (which has 2+ dims), else ``None``."""
    try:
        d = operator.index(dim)  # type: ignore[arg-type]
    except TypeError:
        return None
    return d if t.dim() >= 2 and -t.dim() <= d < t.dim() else None


class RandomStructured(BasePruningMethod, torch_prune.RandomStructured):
    """Prunes ``amount`` (currently unpruned) channels along ``dim`` at random.

    Draws from torch's global RNG exactly what torch's method draws.

    Args:
        amount: an ``int`` count or a ``float`` fraction in [0, 1] of channels.
        dim: the dimension indexing the channels (default ``-1``).

    Raises:
        TypeError: if ``amount`` is not a real number.
        ValueError: if it is a negative int or a float outside [0, 1].

    >>> import torch, funcprune.compat as prune
    >>> m = prune.RandomStructured(amount=1, dim=0).compute_mask(torch.rand(3, 2), torch.ones(3, 2))
    >>> int(m.sum())
    4
    """

    __module__ = "funcprune.compat"  # its public home: stable pickles and reprs

    PRUNING_TYPE = "structured"

    def __init__(self, amount: Amount, dim: int = -1) -> None:
        _validate_pruning_amount_init(amount)
        self.amount = amount
        self.dim = dim

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        nparams_toprune = _structured_count(self, t)
        if nparams_toprune == 0:
            return default_mask
        scores = t if t.is_floating_point() else shape_only(t.shape, t.device)
        count = as_count(nparams_toprune, torch.kthvalue)
        spec = specs.RandomStructured(count, operator.index(self.dim))
        return _structured_mask(t, kernel_mask(spec, scores), default_mask)

    _kernel_compute_mask = compute_mask

    def _kernel_spec(self, t: Tensor) -> Spec | None:
        dim = _structured_dim(t, self.dim)
        if dim is None:
            return None
        return specs.RandomStructured(as_count(self.amount, torch.kthvalue), dim)

    @classmethod
    def apply(  # type: ignore[override]  # torch narrows it alike
        cls, module: nn.Module, name: str, amount: Amount, dim: int = -1
    ) -> TorchBase:
        """Prune ``amount`` random channels of ``module.<name>`` along ``dim``."""
        return super().apply(module, name, amount=amount, dim=dim)


class LnStructured(BasePruningMethod, torch_prune.LnStructured):
    """Prunes the ``amount`` (currently unpruned) channels of smallest L``n`` norm.

    Args:
        amount: an ``int`` count or a ``float`` fraction in [0, 1] of channels.
        n: the norm order, as ``p`` of :func:`torch.norm` (checked when used).
        dim: the dimension indexing the channels (default ``-1``).

    Raises:
        TypeError: if ``amount`` is not a real number.
        ValueError: if it is a negative int or a float outside [0, 1].

    >>> import torch, funcprune.compat as prune
    >>> prune.LnStructured(amount=1, n=1, dim=0).compute_mask(
    ...     torch.tensor([[1.0, 1.0], [0.1, 0.2]]), torch.ones(2, 2))
    tensor([[1., 1.],
            [0., 0.]])
    """

    __module__ = "funcprune.compat"  # its public home: stable pickles and reprs

    PRUNING_TYPE = "structured"

    def __init__(self, amount: Amount, n: NormOrder, dim: int = -1) -> None:
        _validate_pruning_amount_init(amount)
        self.amount = amount
        self.n = n
        self.dim = dim

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        nparams_toprune = _structured_count(self, t)
        norm = _compute_norm(t.detach(), self.n, self.dim)  # torch's norm decides (or fails)
        if nparams_toprune == 0:
            return default_mask
        count, dim = as_count(nparams_toprune), operator.index(self.dim)
        kept = specs.structured_by_keys(count, dim, norm, t, None)
        return _structured_mask(t, kept, default_mask)

    _kernel_compute_mask = compute_mask

    def _kernel_spec(self, t: Tensor) -> Spec | None:
        """The spec, where the kernel's norm is torch's (floats, orders it knows)."""
        n, dim = self.n, _structured_dim(t, self.dim)
        if dim is None or n == "nuc" and t.dim() != 3 or n == "fro" and t.dim() > 3:
            return None
        if not t.is_floating_point() or t.numel() == 0:  # torch's norm may fail there
            return None
        if n in ("nuc", "fro") and t.dtype in (torch.float16, torch.bfloat16):
            return None  # torch's matrix norm refuses low precision, even at amount 0
        try:
            return specs.LnStructured(as_count(self.amount), n, dim)
        except (TypeError, ValueError):  # orders torch.norm takes but specs refuse
            return None

    @classmethod
    def apply(  # type: ignore[override]  # torch narrows it alike
        cls,
        module: nn.Module,
        name: str,
        amount: Amount,
        n: NormOrder,
        dim: int,
        importance_scores: Tensor | None = None,
    ) -> TorchBase:
        """Prune the ``amount`` channels of ``module.<name>`` of smallest norm."""
        return super().apply(
            module, name, amount=amount, n=n, dim=dim, importance_scores=importance_scores
        )
