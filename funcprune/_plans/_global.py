"""Global groups: one unstructured spec over several tensors jointly.

The functional :func:`torch.nn.utils.prune.global_unstructured`: the selected
tensors are ranked together by :func:`~funcprune.compute_joint_masks`, which
gives the masks of their scores flattened into one vector (as torch's
``parameters_to_vector`` does, earlier masks likewise) split back per tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, final

import torch

from .. import _dtensor as dtensor
from .._names import select_names
from .._specs import Spec
from .._types import Params, Scores, Tensor, is_dtensor
from ._compute import compute_joint_masks
from ._plan import AbstractPlan, as_spec, naming, scores_for, spec_repr

__all__ = ["GlobalPlan", "global_unstructured"]


@final
@dataclass(frozen=True, slots=True)
class GlobalPlan(AbstractPlan):
    """One unstructured spec applied to several tensors jointly.

    Build it with :func:`global_unstructured`, which checks its arguments.
    The scores of the selected tensors are flattened into one vector (in
    listed order, each pattern's matches in parameter order, duplicates
    dropped), their earlier masks likewise; the spec is folded on that vector
    once and the mask is split back per tensor, as
    :func:`torch.nn.utils.prune.global_unstructured` does.
    """

    _FN: ClassVar[str] = "global_unstructured"
    names: tuple[str, ...]
    spec: Spec

    def __post_init__(self) -> None:
        if isinstance(self.names, list):
            object.__setattr__(self, "names", tuple(self.names))
        if not self.names or not all(isinstance(n, str) and n for n in self.names):
            raise TypeError(
                f"global_unstructured: names must be a non-empty list of parameter names or "
                f"patterns, got {self.names!r}"
            )
        if not isinstance(self.spec, Spec):
            raise TypeError(
                f"global_unstructured: spec must be a funcprune spec, got {self.spec!r}"
            )
        if self.spec.pruning_type != "unstructured":
            raise TypeError(
                f"global_unstructured: spec must have pruning_type 'unstructured' (global "
                f"pruning ranks single entries), got {self.spec!r} of pruning_type "
                f"{self.spec.pruning_type!r}; prune channels per tensor with a Plan instead"
            )

    def __repr__(self) -> str:
        return f"global_unstructured({list(self.names)!r}, {spec_repr(self.spec)})"

    def masks_for(
        self,
        params: Params,
        masks: dict[str, Tensor],
        scores: Scores,
        generator: torch.Generator | None,
    ) -> dict[str, Tensor]:
        selected = select_names(self._FN, self.names, tuple(params))
        if any(is_dtensor(params[n]) for n in selected):
            names = [f"the parameter {n!r}" for n in selected]
            dtensor.check_group(self._FN, names, [params[n] for n in selected], self.spec)
        each = [scores_for(params[n], masks.get(n), scores.get(n)) for n in selected]
        what = "[" + ", ".join(map(repr, selected)) + "] jointly"
        with naming(self._FN, what, self.spec):
            kept = compute_joint_masks(self.spec, each, [masks.get(n) for n in selected], generator=generator)
        return {**masks, **dict(zip(selected, kept, strict=True))}


def global_unstructured(names: Sequence[str], spec: Spec | Sequence[Spec]) -> GlobalPlan:
    """A plan that prunes the listed tensors jointly with one unstructured spec.

    The functional :func:`torch.nn.utils.prune.global_unstructured`: with
    ``L1Unstructured(0.2)`` the 20% smallest entries of all listed tensors
    together are pruned, so each tensor ends up with its own sparsity.
    Earlier masks are respected (a float amount is a fraction of what is
    still unpruned overall) and importance scores are taken from the plan
    call's ``scores``. The tensors may be DTensors on one device mesh
    (an FSDP2 or HSDP model's parameters), each with its own ``Shard(dim)``
    or ``Replicate()`` placements: they are ranked jointly across processes,
    nothing gathered (see :func:`~funcprune.compute_joint_masks`).

    Args:
        names: parameter names or glob patterns (see :class:`Plan`).
        spec: an unstructured spec (or a list of them, a chain), such as
            ``L1Unstructured`` or ``RandomUnstructured``.

    Raises:
        TypeError: if ``spec``'s ``pruning_type`` is not ``"unstructured"``
            (as torch refuses it), or ``names`` is not a non-empty list of
            strings.

    >>> import torch, funcprune as fp
    >>> plan = fp.global_unstructured(["a", "b"], fp.L1Unstructured(0.5))
    >>> plan({"a": torch.tensor([1.0, 6.0]), "b": torch.tensor([3.0, 0.5, 4.0, 5.0])})
    {'a': tensor([False,  True]), 'b': tensor([False, False,  True,  True])}
    >>> fp.global_unstructured(["a"], fp.LnStructured(0.5, n=2))
    Traceback (most recent call last):
    ...
    TypeError: global_unstructured: spec must have pruning_type 'unstructured' (global pruning
    ranks single entries), got LnStructured(amount=0.5, n=2, dim=-1) of pruning_type
    'structured'; prune channels per tensor with a Plan instead
    """
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise TypeError(
            f"global_unstructured: names must be a list of parameter names or patterns, "
            f"got {names!r}; wrap a single name in a list"
        )
    if isinstance(spec, Sequence):
        spec = as_spec("global_unstructured", spec)
    return GlobalPlan(tuple(names), spec)
