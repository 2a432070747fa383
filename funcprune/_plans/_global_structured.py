"""Global structured groups: the channels of several tensors ranked together (``global_structured``).

``torch.nn.utils.prune`` refuses global structured pruning
(pytorch#39765). This plan selects the names, checks ``normalize`` and
scores each tensor as the plans do; the channels are ranked by the kernel
``funcprune._specs.keep_channels`` on one process, or across processes by
``funcprune._dtensor.keep_channels_across`` for DTensors (nothing gathered).
:func:`global_structured` documents the semantics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, final

import torch

from .. import _dtensor as dtensor
from .._names import select_names
from .._specs import (
    LnStructured,
    Normalize,
    RandomStructured,
    Spec,
    StructuredSpec,
    channel_keys,
    keep_channels,
)
from .._types import Params, Scores, Tensor, is_dtensor
from ._input_dims import Swapped, as_seen, as_stored, check_input_dims, check_swappable, input_dims_repr
from ._plan import AbstractPlan, naming, scores_for

__all__ = ["GlobalStructuredPlan", "Normalize", "global_structured"]

_NORMALIZE = (None, "mean", "max")


@final
@dataclass(frozen=True, slots=True)
class GlobalStructuredPlan(AbstractPlan):
    """One structured spec applied to the channels of several tensors jointly.

    Build it with :func:`global_structured`, which documents the semantics.
    """

    _FN: ClassVar[str] = "global_structured"
    names: tuple[str, ...]
    spec: StructuredSpec
    normalize: Normalize = None
    #: The names of the weights whose input dim is 0 (seen with dims 0 and 1
    #: swapped), sorted; :func:`global_structured` reads them from its
    #: ``input_dims``.
    swapped: Swapped = ()

    def __post_init__(self) -> None:
        if isinstance(self.names, list):
            object.__setattr__(self, "names", tuple(self.names))
        if not (isinstance(self.swapped, tuple) and all(isinstance(n, str) and n for n in self.swapped)):
            raise TypeError(
                f"GlobalStructuredPlan.swapped must be a tuple of parameter names, got {self.swapped!r}; "
                "build the plan with funcprune.global_structured(..., input_dims=...)"
            )
        object.__setattr__(self, "swapped", tuple(sorted(set(self.swapped))))
        if not self.names or not all(isinstance(n, str) and n for n in self.names):
            raise TypeError(
                f"global_structured: names must be a non-empty list of parameter names or "
                f"patterns, got {self.names!r}"
            )
        if not isinstance(self.spec, (LnStructured, RandomStructured)):
            raise TypeError(
                f"global_structured: spec must be an LnStructured or RandomStructured spec "
                f"(whole channels ranked across tensors), got {self.spec!r}; use "
                "global_unstructured for unstructured specs"
            )
        _check_normalize(self.normalize, self.spec)

    def __repr__(self) -> str:
        extra = "" if self.normalize is None else f", normalize={self.normalize!r}"
        return f"global_structured({list(self.names)!r}, {self.spec!r}{extra}{input_dims_repr(self.swapped)})"

    @property
    def input_dims(self) -> dict[str, int]:
        """The weights whose input dim is 0, as a new dict (the only ``input_dims`` that matter)."""
        return dict.fromkeys(self.swapped, 0)

    def masks_for(
        self,
        params: Params,
        masks: dict[str, Tensor],
        scores: Scores,
        generator: torch.Generator | None,
    ) -> dict[str, Tensor]:
        selected = select_names(self._FN, self.names, tuple(params))
        turned = [name for name in selected if name in self.swapped]
        for name in turned:
            check_swappable(self._FN, name, params[name])
        if turned:  # the specs see (out, in); the masks go back as stored
            params = {**params, **{n: as_seen(params[n], True) for n in turned}}
            seen = {**masks, **{n: as_seen(masks[n], True) for n in turned if n in masks}}
            scores = {**scores, **{n: as_seen(scores[n], True) for n in turned if n in scores}}
            kept = self._kept(selected, params, seen, scores, generator)
            return {**masks, **{n: as_stored(m, n in turned) for n, m in zip(selected, kept, strict=True)}}
        return {**masks, **dict(zip(selected, self._kept(selected, params, masks, scores, generator), strict=True))}

    def _kept(
        self,
        selected: Sequence[str],
        params: Params,
        masks: dict[str, Tensor],
        scores: Scores,
        generator: torch.Generator | None,
    ) -> list[Tensor]:
        """The masks of the ``selected`` tensors, their channels ranked together."""
        fn, spec = self._FN, self.spec

        def scores_of(name: str) -> Tensor:
            return scores_for(params[name], masks.get(name), scores.get(name))

        if any(is_dtensor(params[name]) for name in selected):
            return dtensor.keep_channels_across(
                fn, spec, selected, params, masks, scores_of, self.normalize, generator,
                lambda what, step: naming(fn, what, step),
            )  # fmt: skip
        parts = []
        for name in selected:
            with naming(fn, repr(name), spec):
                parts.append(channel_keys(spec, scores_of(name), masks.get(name), self.normalize))
        total = sum(part.keys.shape[0] for part in parts)
        what = f"the {total} channels of [" + ", ".join(map(repr, selected)) + "] jointly"
        with naming(fn, what, spec):
            return keep_channels(spec, parts, generator)


def _check_normalize(normalize: object, spec: Spec) -> None:
    if normalize is not None and not isinstance(normalize, str):
        raise TypeError(
            f"global_structured: normalize must be None, 'mean' or 'max', got {normalize!r} "
            f"of type {type(normalize).__name__}"
        )
    if normalize not in _NORMALIZE:
        raise ValueError(f"global_structured: normalize must be None, 'mean' or 'max', got {normalize!r}")
    if normalize is not None and isinstance(spec, RandomStructured):
        raise ValueError(
            f"global_structured: normalize={normalize!r} scales channel norms, but {spec!r} "
            "draws channels at random without norms; leave normalize=None"
        )


def global_structured(
    names: Sequence[str],
    spec: StructuredSpec,
    *,
    normalize: Normalize = None,
    input_dims: Mapping[str, int] | None = None,
) -> GlobalStructuredPlan:
    """A plan that prunes whole channels of the listed tensors, ranked together.

    What torch refuses (pytorch#39765): with ``LnStructured(0.25, n=2,
    dim=0)`` the 25% of all output channels of the listed tensors with the
    smallest L2 norms are pruned, so each tensor keeps its own share. Every
    mask prunes whole channels (all entries of a pruned channel are
    ``False``), the shape :func:`~funcprune.shrink` removes.

    - ``spec.dim`` names the channels' dim of every tensor (negative as in
      torch), so tensors of different ranks (Linear and Conv weights, with
      ``dim=0``) can share a group. Each tensor needs at least 2 dims.
    - With ``input_dims`` (from :func:`~funcprune.input_dims`), a weight
      whose input dim is 0 (transformers' ``Conv1D``, stored ``(in, out)``)
      is seen as a Linear weight ``(out, in)``, as in
      :class:`~funcprune.Plan`: ``dim=0`` then ranks the output channels of
      Linear and ``Conv1D`` weights alike, and the masks come back in the
      layout stored. Without it, every weight is read as stored.
    - The amount counts channels of the whole group: an ``int`` is a number
      of channels, a ``float`` a fraction of the channels not yet entirely
      pruned (earlier masks, as torch's fold for structured methods), and
      ``sparsity=`` the fraction of all the group's channels pruned after
      the call, earlier ones included (nothing is pruned when that many
      already are). Nothing pruned earlier is revived, entries included:
      a kept channel keeps its earlier mask.
    - Scores are the plan call's ``scores``, else each tensor as currently
      pruned (``param * mask``), as torch scores a pruned tensor.
    - ``LnStructured``: exactly the count asked for goes; among equal
      scores the lower global channel index (tensors in listed order, then
      channels in order) is pruned first; NaN scores are pruned last, as
      in every funcprune selection. With one tensor and ``normalize=None``
      the mask equals ``LnStructured``'s own.
    - ``RandomStructured``: the channels are drawn uniformly over the group
      (as ``RandomUnstructured`` draws over the vector of the group's
      channels): reproducible for a seed or ``generator=``, following
      ``vmap``'s ``randomness=``, though no torch function draws the same.
    - DTensors (an FSDP2 model's parameters; all of the group on one
      mesh, ``Shard(d)`` or ``Replicate()`` on each mesh dim) are ranked across
      processes with a few ``all_reduce`` calls of fixed size, nothing
      gathered. Where each process holds whole channels (sharded along
      ``dim``, or replicated) the masks equal one process's bit for bit
      (``normalize="mean"`` of cut channels: the mean's sum is rounded
      once from float64, so it may differ from one process's float32 sum
      in the last bit). A tensor sharded along another dim gets its norms
      reduced across processes (exact for ``n`` = ``inf``, ``-inf``,
      ``0``; else within float32 rounding; ``'nuc'`` refused there).
      ``RandomStructured`` then draws as ``RandomStructured`` on DTensors
      does (see :func:`~funcprune.compute_mask`): the same masks for any
      world size and placement, not torch's draws.

    Args:
        names: parameter names or glob patterns (see :class:`Plan`); each
            selected tensor joins the group once, in listed order.
        spec: an ``LnStructured`` or ``RandomStructured`` spec.
        normalize: how each tensor's channel norms are scaled before they
            compete, so that layers of different fan-in or scale compete
            fairly. ``None``: raw norms. ``"mean"``: divided by the mean
            norm of the tensor's unpruned channels (its typical channel
            scores 1). ``"max"``: divided by the largest such norm (its
            best channel scores 1). NaN and infinite norms are left out of
            that mean or max; a tensor whose mean or max is 0 keeps its raw
            norms (all 0).
        input_dims: the dim along which each weight's input features run,
            by exact parameter name (0 or 1), such as
            ``fp.input_dims(model)``; as for :class:`~funcprune.Plan`
            (names outside the group are ignored; the plan keeps those of
            input dim 0, and its repr and equality show them).

    Returns:
        A plan; ``plan(params, masks=None, scores=None, generator=None)``
        returns the masks.

    Raises:
        TypeError: if ``names`` is not a non-empty list of strings, ``spec``
            is not ``LnStructured`` or ``RandomStructured``, ``normalize``
            not a string or ``None``, or ``input_dims`` not a mapping of
            names to ints.
        ValueError: if ``normalize`` is not ``None``, ``"mean"`` or
            ``"max"``, or is given with ``RandomStructured``, or an input
            dim is not 0 or 1. When the plan
            is called: as a :class:`Plan` (an ``IndexError`` for a ``dim``
            that does not index a tensor; a ``ValueError`` for an ``int``
            amount larger than the group's unpruned channels; for DTensors,
            a ``TypeError`` if the group mixes them with plain tensors, a
            ``ValueError`` if they are on different meshes and a
            ``NotImplementedError`` for a layout or ``n='nuc'`` across
            processes that is not supported).

    >>> import torch, funcprune as fp
    >>> params = {"fc1.weight": torch.tensor([[3.0, 4.0], [0.1, 0.0], [1.0, 1.0]]),
    ...           "fc2.weight": torch.tensor([[2.0, 0.0, 0.0], [6.0, 8.0, 0.0]])}
    >>> plan = fp.global_structured(["fc*.weight"], fp.LnStructured(2, n=2, dim=0))
    >>> {name: mask.all(1).tolist() for name, mask in plan(params).items()}
    {'fc1.weight': [True, False, False], 'fc2.weight': [True, True]}
    >>> plan = fp.global_structured(["fc*.weight"], fp.LnStructured(2, n=2, dim=0), normalize="max")
    >>> {name: mask.all(1).tolist() for name, mask in plan(params).items()}
    {'fc1.weight': [True, False, True], 'fc2.weight': [False, True]}
    >>> fp.global_structured(["w"], fp.L1Unstructured(0.5))
    Traceback (most recent call last):
    ...
    TypeError: global_structured: spec must be an LnStructured or RandomStructured spec (whole
    channels ranked across tensors), got L1Unstructured(amount=0.5); use global_unstructured for
    unstructured specs
    """
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise TypeError(
            f"global_structured: names must be a list of parameter names or patterns, "
            f"got {names!r}; wrap a single name in a list"
        )
    return GlobalStructuredPlan(tuple(names), spec, normalize, check_input_dims("global_structured", input_dims))
