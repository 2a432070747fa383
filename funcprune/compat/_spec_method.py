"""``SpecMethod``: any funcprune spec, built-in or your own, as a compat method.

A :class:`~funcprune.Spec` computes a ``torch.bool`` mask; hook mode wants a
``BasePruningMethod`` with a ``PRUNING_TYPE`` and masks in torch's dtypes.
:class:`SpecMethod` adapts one to the other, so a user-defined spec works
with ``apply``, iterative pruning and ``global_unstructured`` exactly as
the built-in methods do, and its masks are those of the functional API.
"""

from __future__ import annotations

import torch
from torch import nn

from .._plans import compute_mask as fold_mask
from .._specs import Spec
from ._base import BasePruningMethod
from ._state import TorchBase

__all__ = ["SpecMethod"]

Tensor = torch.Tensor


class SpecMethod(BasePruningMethod):
    """A pruning method that computes its masks with a funcprune spec.

    ``PRUNING_TYPE`` is the spec's ``pruning_type``, so the method goes
    wherever torch's methods go: ``SpecMethod.apply(module, name,
    spec=...)`` (``importance_scores=`` too), iterative pruning (the
    :class:`~funcprune.compat.PruningContainer` folds the spec's own
    ``compute_mask`` over the part still unpruned), and
    ``global_unstructured(pairs, SpecMethod, spec=...)`` with an
    unstructured spec. Random specs draw from torch's global RNG.

    Unlike a built-in method, :meth:`compute_mask` called directly acts on
    the part of ``t`` that ``default_mask`` left unpruned (a float amount is
    a fraction of that part), as :func:`funcprune.compute_mask` does.

    Args:
        spec: any funcprune spec (an instance of a :class:`funcprune.Spec`
            subclass), such as ``funcprune.L1Unstructured(0.5)``.

    Raises:
        TypeError: if ``spec`` is not a funcprune spec.

    >>> import torch, funcprune as fp, funcprune.compat as prune
    >>> fc = torch.nn.Linear(3, 2)
    >>> fc.bias.data = torch.tensor([0.5, -2.0])
    >>> hook = prune.SpecMethod.apply(fc, "bias", spec=fp.L1Unstructured(1))
    >>> fc.bias_mask, hook.PRUNING_TYPE
    (tensor([0., 1.]), 'unstructured')
    """

    __module__ = "funcprune.compat"  # its public home: stable pickles and reprs

    def __init__(self, spec: Spec) -> None:
        if not isinstance(spec, Spec):
            raise TypeError(
                f"SpecMethod: spec must be a funcprune spec (an instance of a funcprune.Spec "
                f"subclass, e.g. funcprune.L1Unstructured(0.5)), got {spec!r} of type "
                f"{type(spec).__name__}"
            )
        self.spec = spec
        self.PRUNING_TYPE = spec.pruning_type

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """The spec's mask of ``t`` on top of ``default_mask``, in its dtype.

        Args:
            t: floating-point importance scores.
            default_mask: the earlier mask (ones at first), of ``t``'s shape.

        Returns:
            ``funcprune.compute_mask(spec, t, default_mask)`` in
            ``default_mask``'s dtype (torch's float masks).

        Raises:
            TypeError, ValueError: as :func:`funcprune.compute_mask`.
        """
        kept = fold_mask(self.spec, t, default_mask)
        return kept.to(dtype=default_mask.dtype)

    _kernel_compute_mask = compute_mask

    def _kernel_spec(self, t: Tensor) -> Spec | None:
        return self.spec

    @classmethod
    def apply(  # type: ignore[override]  # narrowed as torch's methods narrow it
        cls,
        module: nn.Module,
        name: str,
        spec: Spec,
        importance_scores: Tensor | None = None,
    ) -> TorchBase:
        """Prune ``module.<name>`` with ``spec`` and hook it (see :class:`SpecMethod`)."""
        return super().apply(module, name, spec=spec, importance_scores=importance_scores)
