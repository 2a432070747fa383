"""Global structured groups: the channels of several tensors ranked together (``global_structured``).

``torch.nn.utils.prune`` refuses global structured pruning
(pytorch#39765). This plan is the plans over units (``_rank_units.py``)
with one unit group per tensor: each channel of a selected tensor is a
unit of one member, one index wide (a :class:`~funcprune.UnitGroup` of
kind ``"channels"``), and no group keeps a channel it would otherwise lose.
It selects the names, runs torch's checks on each tensor (and, for
DTensors, those of a group ranked jointly) and ranks the channels as units
are ranked: keyed by float64 norms added up order-free, so the masks are
the same bit for bit on one process and over any shards.
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
    StructuredSpec,
    check_channels,
    check_normalize,
)
from .._types import Params, Scores, Tensor, is_dtensor
from .._units import Member, UnitGroup
from ._input_dims import Swapped, as_seen, as_stored, check_input_dims, check_swappable, input_dims_repr
from ._plan import AbstractPlan, naming
from ._rank_units import rank_units

__all__ = ["GlobalStructuredPlan", "Normalize", "global_structured"]


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
        check_normalize(self._FN, self.normalize, self.spec, "channels")

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
        seen = masks
        if turned:  # the specs see (out, in); the masks go back as stored
            params = {**params, **{n: as_seen(params[n], True) for n in turned}}
            seen = {**masks, **{n: as_seen(masks[n], True) for n in turned if n in masks}}
            scores = {**scores, **{n: as_seen(scores[n], True) for n in turned if n in scores}}
        kept = self._kept(selected, params, seen, scores, generator)
        return {**masks, **{name: as_stored(kept[name], name in turned) for name in selected}}

    def _kept(
        self,
        selected: Sequence[str],
        params: Params,
        masks: dict[str, Tensor],
        scores: Scores,
        generator: torch.Generator | None,
    ) -> dict[str, Tensor]:
        """The masks of the ``selected`` tensors: their channels ranked together, as one-member unit groups."""
        fn, spec = self._FN, self.spec
        if any(is_dtensor(params[name]) for name in selected):  # a group ranked jointly: one mesh, all DTensors
            labels = [f"the parameter {name!r}" for name in selected]
            dtensor.check_group(fn, labels, [params[name] for name in selected], spec)
        groups: dict[str, UnitGroup] = {}
        none: dict[str, Tensor] = {}
        for name in selected:
            given = scores.get(name, params[name])
            ranked = torch.empty(given.shape, dtype=given.dtype, device="meta")  # one process's checks, on the shape
            with naming(fn, repr(name), spec):
                check_channels(spec, ranked)
            d = spec.dim % ranked.dim()
            if ranked.shape[d]:
                groups[name] = UnitGroup("channels", ranked.shape[d], (Member(name, d, 1),))
            else:  # no channel to rank: its mask is the earlier one
                none[name] = masks[name] if name in masks else torch.ones_like(params[name], dtype=torch.bool)
        total = sum(group.size for group in groups.values())
        what = f"the {total} channels of [" + ", ".join(map(repr, selected)) + "] jointly"
        kept = rank_units(
            fn, spec, groups, params, masks, scores, generator,
            scope="global", normalize=self.normalize, floors=False, units="channels", what=what,
        )  # fmt: skip
        return kept | none


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
      norms the lower global channel index (tensors in listed order, then
      channels in order) is pruned first; NaN norms are pruned last, as
      in every funcprune selection.
    - It is :func:`~funcprune.structured` over one unit group per tensor,
      each channel a unit (``UnitGroup("channels", channels, (Member(name,
      dim, 1),))``), minus the floor (a tensor may lose every channel). So
      channels are ranked by float64 norms added up order-free, the same
      bit for bit however the entries are split. With one tensor and
      ``normalize=None`` the mask is ``LnStructured``'s, which ranks
      torch's norms in the scores' dtype, except where channels' norms lie
      within that dtype's rounding of one another (a few float32 ulps; in
      float16 or bfloat16 their own coarser rounding), where float16 norms
      or their sum for ``normalize="mean"`` overflow to ``inf``, or where
      exactly equal norms are rounded apart (channels of different sizes).
      ``n="nuc"`` takes each channel's nuclear norm where it lies whole.
    - ``RandomStructured``: the channels are drawn uniformly over the group
      (as ``RandomUnstructured`` draws over the vector of the group's
      channels): reproducible for a seed or ``generator=``, following
      ``vmap``'s ``randomness=``, though no torch function draws the same.
    - DTensors (an FSDP2 model's parameters; all of the group on one
      mesh, in any layout :func:`~funcprune.compute_mask` takes) are ranked
      as the units of :func:`~funcprune.structured` are: each process adds
      up its blocks' parts of every channel's norm, two ``all_reduce`` calls
      of a few float64 numbers per channel combine them (nothing gathered),
      and every process ranks the same keys: the masks equal one process's
      bit for bit, ``normalize`` included, whatever the layout and ``n``
      (``'nuc'`` where each process holds whole channels: sharded along
      ``dim`` or replicated; refused elsewhere). ``RandomStructured``
      keeps the channels the mesh's first process draws from its
      generator, as one process draws them (one more ``all_reduce``).

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
            processes that is not supported). A ``RuntimeError`` where a
            nuclear norm's SVD fails (non-finite entries), on every process.

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
