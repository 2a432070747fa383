"""The built-in pruning methods, computing their masks with funcprune's kernels.

Torch's constructors, attributes and ``apply`` signatures, subclassing
torch's namesakes; the spec is built from the attributes when a mask is
computed. The unstructured methods, ``CustomFromMask`` and the conventions
shared with ``_structured.py`` (``README.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

from .. import _specs as specs
from .._plans import compute_mask as fold_mask
from .._specs import Spec
from .._types import Amount
from ._base import BasePruningMethod
from ._state import TorchBase
from ._torch_helpers import (
    _compute_nparams_toprune,
    _validate_pruning_amount,
    _validate_pruning_amount_init,
)

__all__ = [
    "CustomFromMask",
    "Identity",
    "L1Unstructured",
    "RandomUnstructured",
    "as_count",
    "kernel_mask",
    "shape_only",
]

Tensor = torch.Tensor


def kernel_mask(spec: Spec, scores: Tensor) -> Tensor:
    """The kept flags that ``spec`` gives all of ``scores`` (detached), by its kernel."""
    return fold_mask(spec, scores.detach())


def _zero_pruned(mask: Tensor, kept: Tensor) -> Tensor:
    """Zero in ``mask`` (flat) the entries that ``kept`` prunes, as torch does.

    torch writes at the pruned flat indices; where the shapes agree a masked
    fill writes the same values without listing them (a ``meta`` tensor
    cannot), otherwise the indices follow torch's flat view (and its errors).
    """
    if mask.shape == kept.shape:
        return mask.masked_fill_(kept.logical_not(), 0)
    mask.view(-1)[(~kept).reshape(-1).nonzero().squeeze(1)] = 0
    return mask


def as_count(value: Amount, refuses_bool: Callable[..., object] | None = None) -> Amount:
    """An amount or count as torch treats a ``bool`` one (funcprune's specs refuse it).

    torch takes ``True`` as 1 where it only does arithmetic with it (Ln
    structured), and fails inside ``torch.topk``/``torch.kthvalue`` where it
    passes it on as ``k``; ``refuses_bool`` is that op, called to fail alike.
    """
    if not isinstance(value, bool):
        return value
    if value and refuses_bool is not None:
        refuses_bool(torch.zeros(1), k=value)
    return int(value)


def shape_only(shape: torch.Size, device: torch.device) -> Tensor:
    """Floating scores of ``shape`` for kernels that only read the shape."""
    return torch.zeros((), device=device).expand(shape)


def _unstructured_count(amount: Amount, t: Tensor, default_mask: Tensor) -> tuple[int, Tensor]:
    """torch's checks and count for unstructured methods, and the mask to zero."""
    tensor_size = t.nelement()
    nparams_toprune = _compute_nparams_toprune(amount, tensor_size)
    _validate_pruning_amount(nparams_toprune, tensor_size)
    return nparams_toprune, default_mask.clone(memory_format=torch.contiguous_format)


class Identity(BasePruningMethod, torch_prune.Identity):
    """Prunes nothing: the mask is ``default_mask`` (ones at first).

    >>> import torch, funcprune.compat as prune
    >>> prune.identity(torch.nn.Linear(2, 3), "bias").bias_mask
    tensor([1., 1., 1.])
    """

    __module__ = "funcprune.compat"  # its public home: stable pickles and reprs

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        return default_mask

    _kernel_compute_mask = compute_mask

    def _kernel_spec(self, t: Tensor) -> Spec | None:
        return specs.Identity()

    @classmethod
    def apply(  # type: ignore[override]  # torch narrows it alike
        cls, module: nn.Module, name: str
    ) -> TorchBase:
        """Reparametrize ``module.<name>`` with a mask of ones."""
        return super().apply(module, name)


class RandomUnstructured(BasePruningMethod, torch_prune.RandomUnstructured):
    """Prunes ``amount`` (currently unpruned) entries chosen at random.

    Draws from torch's global RNG exactly what torch's method draws, so the
    same seed gives the same mask.

    Args:
        amount: an ``int`` count or a ``float`` fraction in [0, 1].

    Raises:
        TypeError: if ``amount`` is not a real number.
        ValueError: if it is a negative int or a float outside [0, 1].

    >>> import torch, funcprune.compat as prune
    >>> _ = torch.manual_seed(0)
    >>> m = prune.RandomUnstructured(amount=2).compute_mask(torch.rand(5), torch.ones(5))
    >>> int((m == 0).sum())
    2
    """

    __module__ = "funcprune.compat"  # its public home: stable pickles and reprs

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: Amount) -> None:
        _validate_pruning_amount_init(amount)
        self.amount = amount

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        nparams_toprune, mask = _unstructured_count(self.amount, t, default_mask)
        if nparams_toprune != 0:
            if not t.is_floating_point():  # torch fails on these dtypes; fail alike
                torch.topk(torch.rand_like(t).view(-1), k=nparams_toprune)
            elif not t.is_contiguous():  # torch views rand_like(t) flat; fail alike
                try:
                    torch.empty_like(t).view(-1)
                except RuntimeError:
                    torch.rand_like(t)  # torch draws before it fails
                    raise
            spec = specs.RandomUnstructured(as_count(nparams_toprune, torch.topk))
            _zero_pruned(mask, kernel_mask(spec, t))
        return mask

    _kernel_compute_mask = compute_mask

    def _kernel_spec(self, t: Tensor) -> Spec | None:
        return specs.RandomUnstructured(as_count(self.amount, torch.topk))

    @classmethod
    def apply(  # type: ignore[override]  # torch narrows it alike
        cls, module: nn.Module, name: str, amount: Amount
    ) -> TorchBase:
        """Prune ``amount`` random entries of ``module.<name>``."""
        return super().apply(module, name, amount=amount)


class L1Unstructured(BasePruningMethod, torch_prune.L1Unstructured):
    """Prunes the ``amount`` (currently unpruned) entries of smallest magnitude.

    Args:
        amount: an ``int`` count or a ``float`` fraction in [0, 1].

    Raises:
        TypeError: if ``amount`` is not a real number.
        ValueError: if it is a negative int or a float outside [0, 1].

    >>> import torch, funcprune.compat as prune
    >>> prune.L1Unstructured(amount=2).compute_mask(
    ...     torch.tensor([3.0, -1.0, 0.5, 2.0]), torch.ones(4))
    tensor([1., 0., 0., 1.])
    """

    __module__ = "funcprune.compat"  # its public home: stable pickles and reprs

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: Amount) -> None:
        _validate_pruning_amount_init(amount)
        self.amount = amount

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        nparams_toprune, mask = _unstructured_count(self.amount, t, default_mask)
        if nparams_toprune != 0:
            scores = t
            if not t.is_floating_point():  # integer/complex scores: rank |t| (bool fails)
                scores = torch.abs(t).to(torch.float64)
            if not t.is_contiguous():  # torch views |t| flat; fail alike
                torch.abs(t).view(-1)
            spec = specs.L1Unstructured(as_count(nparams_toprune, torch.topk))
            _zero_pruned(mask, kernel_mask(spec, scores))
        return mask

    _kernel_compute_mask = compute_mask

    def _kernel_spec(self, t: Tensor) -> Spec | None:
        return specs.L1Unstructured(as_count(self.amount, torch.topk))

    @classmethod
    def apply(  # type: ignore[override]  # torch narrows it alike
        cls,
        module: nn.Module,
        name: str,
        amount: Amount,
        importance_scores: Tensor | None = None,
    ) -> TorchBase:
        """Prune the ``amount`` smallest-magnitude entries of ``module.<name>``."""
        return super().apply(module, name, amount=amount, importance_scores=importance_scores)


class CustomFromMask(BasePruningMethod, torch_prune.CustomFromMask):
    """Prunes where a given ``mask`` is 0, on top of earlier masks.

    Args:
        mask: a tensor of the shape of the tensor it prunes.

    >>> import torch, funcprune.compat as prune
    >>> prune.custom_from_mask(torch.nn.Linear(5, 3), "bias", torch.tensor([0, 1, 0])).bias_mask
    tensor([0., 1., 0.])
    """

    __module__ = "funcprune.compat"  # its public home: stable pickles and reprs

    PRUNING_TYPE = "global"

    def __init__(self, mask: Tensor) -> None:
        self.mask = mask

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        if default_mask.shape != self.mask.shape:
            raise AssertionError(
                f"default_mask shape {default_mask.shape} must match "
                f"self.mask shape {self.mask.shape}"
            )
        kept = self._kept()
        if kept is None:  # not a 0/1 mask: torch multiplies by its values
            product: Tensor = default_mask * self.mask.to(dtype=default_mask.dtype)
            return product
        return default_mask * kept.to(dtype=default_mask.dtype)

    _kernel_compute_mask = compute_mask

    def _spec(self) -> Spec | None:
        try:
            return specs.CustomFromMask(self.mask)
        except (TypeError, ValueError):
            return None

    def _kept(self) -> Tensor | None:
        spec = self._spec()
        if spec is None:
            return None
        return kernel_mask(spec, shape_only(self.mask.shape, self.mask.device))

    def _kernel_spec(self, t: Tensor) -> Spec | None:
        mask: Any = self.mask
        if not isinstance(mask, Tensor) or mask.shape != t.shape or mask.device != t.device:
            return None
        return self._spec()

    @classmethod
    def apply(  # type: ignore[override]  # torch narrows it alike
        cls, module: nn.Module, name: str, mask: Tensor
    ) -> TorchBase:
        """Prune ``module.<name>`` where ``mask`` is 0."""
        return super().apply(module, name, mask=mask)
