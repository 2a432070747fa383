"""``BasePruningMethod`` and ``PruningContainer``: hooks and reparametrization.

Torch's contract (``name_orig`` parameter, ``name_mask`` buffer, the method
as a forward pre-hook; re-pruning folds into a container), with fixes: a
failing ``apply`` leaves the module as it was, deep copies work, tied
weights are refused (``README.md`` lists them all). Both subclass torch's
namesakes, so torch's own checks accept funcprune's hooks.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, overload

import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

from .._specs import Spec
from ._combine import fold_latest, foldable
from ._parents import reading_parents
from ._pruned import set_pruned
from ._reparam import reparametrize, unreparametrize
from ._state import TorchBase, in_batch, pruning_hooks, rollback
from ._tying import check_untied, forget_removal

__all__ = ["BasePruningMethod", "PruningContainer", "parents_to_sync"]

Tensor = torch.Tensor


class BasePruningMethod(torch_prune.BasePruningMethod):
    """Abstract base class of pruning methods (a subclass of torch's).

    Subclasses set ``PRUNING_TYPE`` (``"unstructured"``, ``"structured"`` or
    ``"global"``) and implement :meth:`compute_mask`; the rest (the hook, the
    reparametrization, iterative pruning, removal) is provided here, exactly
    as in ``torch.nn.utils.prune``.

    Examples:
        The tutorial's method, unchanged:

        >>> import torch
        >>> import funcprune.compat as prune
        >>> class FooBarPruningMethod(prune.BasePruningMethod):
        ...     PRUNING_TYPE = "unstructured"
        ...     def compute_mask(self, t, default_mask):
        ...         mask = default_mask.clone()
        ...         mask.view(-1)[::2] = 0
        ...         return mask
        >>> fc = torch.nn.Linear(3, 4)
        >>> _ = FooBarPruningMethod.apply(fc, "bias")
        >>> fc.bias_mask
        tensor([0., 1., 0., 1.])
    """

    __module__ = "funcprune.compat"  # its public home: stable pickles and reprs

    _tensor_name: str
    PRUNING_TYPE: str

    def __call__(self, module: nn.Module, inputs: Any) -> None:
        """The forward pre-hook: store ``mask * orig`` as ``module.<name>``."""
        set_pruned(module, self, self.apply_mask(module))

    @abstractmethod
    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """Compute the mask of ``t`` on top of ``default_mask``.

        Args:
            t: the importance scores of the parameter to prune.
            default_mask: the mask of earlier pruning (ones at first), of
                ``t``'s shape; the new mask must respect it.

        Returns:
            The new mask, of ``t``'s shape.
        """

    def apply_mask(self, module: nn.Module) -> Tensor:
        """Return ``module.<name>_mask * module.<name>_orig`` (the pruned tensor).

        Raises:
            AssertionError: if the method has no tensor name (never applied).
        """
        if self._tensor_name is None:
            raise AssertionError(f"Module {module} has to be pruned")
        mask = getattr(module, self._tensor_name + "_mask")
        orig = getattr(module, self._tensor_name + "_orig")
        pruned: Tensor = mask.to(dtype=orig.dtype) * orig
        return pruned

    @classmethod
    def apply(
        cls,
        module: nn.Module,
        name: str,
        *args: Any,
        importance_scores: Tensor | None = None,
        **kwargs: Any,
    ) -> TorchBase:
        """Prune ``module.<name>`` with ``cls(*args, **kwargs)`` and hook it.

        The first pruning of ``name`` reparametrizes it (``name_orig``,
        ``name_mask``, a forward pre-hook); a later one folds the new method
        on top, in a :class:`PruningContainer` kept at the hook's place.

        Args:
            module: the module holding the tensor.
            name: the parameter's name in ``module``.
            args: positional arguments of ``cls``.
            importance_scores: scores of the parameter's shape used instead of
                the parameter (the currently pruned tensor when re-pruning).
            kwargs: keyword arguments of ``cls``.

        Returns:
            The hook: the new method, or the container holding the history.

        Raises:
            AssertionError: if ``importance_scores`` has another shape, or the
                module already has several pruning hooks for ``name``.
            AttributeError: if ``module`` has nothing called ``name``.
            ValueError: if the parameter is tied (another module holds it
                too): pruning one user would untie it. Use
                :func:`~funcprune.compat.install_masks_` or the functional API.

        Whatever fails, the module is left exactly as it was. On
        ``MultiheadAttention.out_proj`` it also makes the attention refresh
        the pruned tensor before each forward (see :mod:`._parents`).
        """
        found = pruning_hooks(module, name)
        if len(found) > 1:
            raise AssertionError(
                f"Avoid adding multiple pruning hooks to the "
                f"same tensor {name} of module {module}. Use a PruningContainer."
            )
        method = cls(*args, **kwargs)
        method._tensor_name = name
        if not in_batch():  # else the caller does both for all its tensors
            check_untied(f"{cls.__name__}.apply", [(module, name)])
        with rollback([(module, name)], parents_to_sync):
            old = found[0] if found else None
            hook = reparametrize(module, name, method, old, importance_scores, PruningContainer)
        forget_removal([(module, name)])  # pruned again: an earlier removal with a tie no longer counts
        return hook

    def prune(
        self,
        t: Tensor,
        default_mask: Tensor | None = None,
        importance_scores: Tensor | None = None,
    ) -> Tensor:
        """Return ``t`` pruned: ``t * compute_mask(scores, default_mask)``.

        Args:
            t: the tensor to prune.
            default_mask: an earlier mask (ones by default).
            importance_scores: scores of ``t``'s shape (``t`` by default).

        Raises:
            AssertionError: if ``importance_scores`` has another shape than ``t``.
        """
        if importance_scores is not None:
            if importance_scores.shape != t.shape:
                raise AssertionError(
                    f"importance_scores should have the same shape as tensor t, "
                    f"got {importance_scores.shape} vs {t.shape}"
                )
        else:
            importance_scores = t
        default_mask = default_mask if default_mask is not None else torch.ones_like(t)
        return t * self.compute_mask(importance_scores, default_mask=default_mask)

    def remove(self, module: nn.Module) -> None:
        """Make the pruning permanent and drop the reparametrization.

        The same :class:`~torch.nn.Parameter` that was ``name_orig`` becomes
        ``name`` again, holding the pruned values; ``name_mask`` is removed.
        The hook itself is removed by :func:`funcprune.compat.remove`.
        """
        if self._tensor_name is None:
            raise AssertionError(
                f"Module {module} has to be pruned before pruning can be removed"
            )
        unreparametrize(module, self._tensor_name, self.apply_mask(module))

    # --- funcprune's kernels ------------------------------------------------

    #: The ``compute_mask`` that :meth:`_kernel_spec` describes; a subclass or a
    #: mock that replaces ``compute_mask`` makes the container call it instead.
    _kernel_compute_mask: ClassVar[object] = None

    def _kernel_spec(self, t: Tensor) -> Spec | None:
        """The funcprune spec equivalent to this method on ``t``, if any.

        ``None`` (the default, e.g. for user-defined methods) makes
        :class:`PruningContainer` use torch's slicing logic and call
        :meth:`compute_mask`; built-in methods return a spec whenever the
        kernels reproduce torch exactly for ``t``.
        """
        return None

    def _fold_spec(self, t: Tensor, default_mask: Tensor) -> Spec | None:
        """The spec a :class:`PruningContainer` folds this method with, if any.

        Only where funcprune's fold gives exactly this method's mask: its
        ``compute_mask`` is the one :meth:`_kernel_spec` describes (not
        replaced on a subclass or an instance), the inputs are
        :func:`~._combine.foldable`, and the spec acts on the part that
        ``PRUNING_TYPE`` names.
        """
        cls = type(self)
        if (
            "compute_mask" in vars(self)
            or cls._kernel_compute_mask is None
            or cls.compute_mask is not cls._kernel_compute_mask
            or not foldable(t, default_mask)
        ):
            return None
        spec = self._kernel_spec(t)
        if spec is None or getattr(self, "PRUNING_TYPE", None) != spec.pruning_type:
            return None
        return spec


def parents_to_sync(
    module: nn.Module, within: Sequence[nn.Module] = ()
) -> list[tuple[nn.Module, str]]:
    """The parents' refreshers that pruning ``module`` may have to add.

    ``[]`` within :func:`~._state.batch` (the caller syncs them) or where
    compat pruned ``module`` before (its parents have a refresher already: no
    look-up, as in iterative pruning); else the parents that read it,
    looked for among the trees of ``within`` (the call's modules) first
    (:func:`~._parents.reading_parents`).
    """
    if in_batch() or any(
        isinstance(hook, BasePruningMethod) for hook in module._forward_pre_hooks.values()
    ):
        return []
    return reading_parents(module, within)


class PruningContainer(BasePruningMethod, torch_prune.PruningContainer):
    """The history of the methods applied to one tensor (iterative pruning).

    Built from one method (taking its tensor name) or from none (then set
    ``_tensor_name`` before adding methods). Supports ``len``, indexing and
    iteration over the methods, oldest first. :meth:`compute_mask` applies
    the latest method to the part of the tensor still unpruned.

    Examples:
        >>> import torch, funcprune.compat as prune
        >>> fc = torch.nn.Linear(4, 3)
        >>> _ = prune.l1_unstructured(fc, "weight", amount=2)
        >>> _ = prune.ln_structured(fc, "weight", amount=1, n=2, dim=0)
        >>> hook = next(iter(fc._forward_pre_hooks.values()))
        >>> type(hook).__name__, len(hook), [type(m).__name__ for m in hook]
        ('PruningContainer', 2, ['L1Unstructured', 'LnStructured'])
    """

    __module__ = "funcprune.compat"  # its public home: stable pickles and reprs

    def __init__(self, *args: Any) -> None:
        self._pruning_methods: tuple[Any, ...] = ()
        if len(args) == 1:
            self._tensor_name = args[0]._tensor_name
            self.add_pruning_method(args[0])
        else:
            for method in args:
                self.add_pruning_method(method)

    def add_pruning_method(self, method: Any) -> None:
        """Append ``method`` to the history.

        Raises:
            TypeError: if ``method`` is not a pruning method (nor ``None``).
            ValueError: if it acts on another tensor than the container.
        """
        if not isinstance(method, TorchBase) and method is not None:
            raise TypeError(f"{type(method)} is not a BasePruningMethod subclass")
        elif method is not None and self._tensor_name != method._tensor_name:
            raise ValueError(
                "Can only add pruning methods acting on "
                f"the parameter named '{self._tensor_name}' to PruningContainer {self}."
                + f" Found '{method._tensor_name}'"
            )
        self._pruning_methods += (method,)

    def __len__(self) -> int:
        return len(self._pruning_methods)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._pruning_methods)

    @overload
    def __getitem__(self, idx: int) -> Any: ...

    @overload
    def __getitem__(self, idx: slice) -> tuple[Any, ...]: ...

    def __getitem__(self, idx: int | slice) -> Any:
        return self._pruning_methods[idx]

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """Apply the latest method to the unpruned part of ``t``.

        That part is the entries where ``default_mask`` is 1 for an
        ``"unstructured"`` method, the channels along its ``dim`` not
        entirely pruned for a ``"structured"`` one, and everything for a
        ``"global"`` one; a float amount is a fraction of that part. Built-in
        methods run funcprune's fold; other methods are called on the slice,
        as in torch.

        Returns:
            The combined mask, in ``t``'s dtype.
        """
        method = self._pruning_methods[-1]
        spec = method._fold_spec(t, default_mask) if isinstance(method, BasePruningMethod) else None
        return fold_latest(method, spec, t, default_mask)
