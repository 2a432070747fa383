"""Global structured groups: the channels of several tensors ranked together.

``torch.nn.utils.prune`` refuses global structured pruning (its
``global_unstructured`` takes unstructured methods only; pytorch#39765).
:func:`global_structured` does it: every selected tensor is scored per
channel (the L``n`` norm of each slice along ``dim``, optionally normalized
per tensor), the channel scores of all tensors are concatenated into one
vector, in listed order, and one exact unstructured selection runs on that
vector through :func:`~funcprune.compute_mask`, with the channels still
unpruned as its default mask. The kept channels are then expanded back to
each tensor's shape, so every mask prunes whole channels, as
:func:`~funcprune.shrink` expects.

DTensors (one mesh, ``Shard(d)`` or ``Replicate()`` on each mesh dim) are ranked
across processes, nothing gathered (:func:`_dtensor_masks`): channels
whole on each process are normed where they lie and ranked by the exact
selection over shards, bit for bit as one process; channels cut across
processes get the norms of :mod:`._dtensor_kernels` (one ``all_reduce``
per tensor and mesh dim they lie across; exact for ``n`` = ``inf``,
``-inf``, ``0``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, NamedTuple, Optional, Union, final

import torch
import torch.distributed as dist

from .._dtensor import (
    Channels,
    LocalBlock,
    agree_on_failures,
    all_reduced,
    channels,
    check_group,
    check_layout,
    layout_of,
    parameter_block,
    random_unstructured,
    shards_of,
    wrap,
)
from .._names import select_names
from .._specs import (
    L1Unstructured,
    LnStructured,
    RandomStructured,
    RandomUnstructured,
    Spec,
    check_matrix_norm,
    l1_unstructured_jointly,
    unpruned_units,
)
from .._types import Mask, Params, Scores, Tensor, is_dtensor
from .._validate import validate_dim_range, validate_structured
from ._compute import compute_mask
from ._plan import AbstractPlan, naming, scores_for

__all__ = ["GlobalStructuredPlan", "Normalize", "global_structured"]

#: How each tensor's channel norms are scaled before they compete (``None``: raw).
Normalize = Optional[Literal["mean", "max"]]
#: The specs whose channels can be ranked across tensors.
StructuredSpec = Union[LnStructured, RandomStructured]
_NORMALIZE = (None, "mean", "max")


class _Channels(NamedTuple):
    """One tensor of the group, seen channel by channel."""

    keys: Tensor  # one score per channel (zeros for RandomStructured)
    eligible: Mask  # the channels not entirely pruned earlier; None: all
    dim: int  # the channels' dim, non-negative
    shape: torch.Size  # the tensor's shape
    mask: Mask  # its earlier mask


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

    def __post_init__(self) -> None:
        if isinstance(self.names, list):
            object.__setattr__(self, "names", tuple(self.names))
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
        return f"global_structured({list(self.names)!r}, {self.spec!r}{extra})"

    def masks_for(
        self,
        params: Params,
        masks: dict[str, Tensor],
        scores: Scores,
        generator: torch.Generator | None,
    ) -> dict[str, Tensor]:
        selected = select_names(self._FN, self.names, tuple(params))
        if any(is_dtensor(params[name]) for name in selected):
            kept = _dtensor_masks(self, selected, params, masks, scores, generator)
            return {**masks, **dict(zip(selected, kept, strict=True))}
        parts = []
        for name in selected:
            with naming(self._FN, repr(name), self.spec):
                each = scores_for(params[name], masks.get(name), scores.get(name))
                parts.append(_channels(self.spec, each, masks.get(name), self.normalize))
        total = sum(part.keys.shape[0] for part in parts)
        what = f"the {total} channels of [" + ", ".join(map(repr, selected)) + "] jointly"
        with naming(self._FN, what, self.spec):
            kept = _select(self.spec, parts, generator)
        return {**masks, **dict(zip(selected, kept, strict=True))}


def _dtensor_masks(
    plan: GlobalStructuredPlan,
    selected: Sequence[str],
    params: Params,
    masks: dict[str, Tensor],
    scores: Scores,
    generator: torch.Generator | None,
) -> list[Tensor]:
    """The group's masks where its tensors are DTensors: ranked across processes, nothing gathered.

    Each tensor's channels are keyed where they lie (:func:`._dtensor_kernels.channels`),
    normalized with sums and maxima reduced across processes, and the
    group's channel vector is ranked by the exact selection over shards
    (``LnStructured``) or by random keys (``RandomStructured``).
    """
    fn, spec = plan._FN, plan.spec
    labels = [f"the parameter {name!r}" for name in selected]
    check_group(fn, labels, [params[name] for name in selected], spec)
    blocks = []
    for name, label in zip(selected, labels, strict=True):
        param = params[name]
        assert is_dtensor(param)  # checked by check_group
        layout = layout_of(fn, label, param)
        check_layout(fn, label, spec, layout)
        each = scores_for(param, masks.get(name), scores.get(name))
        blocks.append(parameter_block(fn, name, layout, each, masks.get(name)))
    for name, block in zip(selected, blocks, strict=True):  # one process's checks, before any communication
        with naming(fn, repr(name), spec):
            _check_channels(spec, block.whole())
    parts = [channels(spec, block, spec.dim % len(block.layout.shape)) for block in blocks]
    if isinstance(spec, LnStructured) and spec.n == "nuc" and any(p.layout.sharded for p in parts):
        agree_on_failures(spec, parts)  # an SVD may fail on one process only: then all raise
    for part in parts:
        if part.failure is not None:  # every process holds the same values: all fail alike
            raise part.failure
    keys = _normalized_across(parts, plan.normalize)
    total = sum(p.layout.shape[0] for p in parts)
    what = f"the {total} channels of [" + ", ".join(map(repr, selected)) + "] jointly"
    shards = shards_of([p.layout for p in parts])
    with naming(fn, what, spec):
        if isinstance(spec, RandomStructured):
            vectors = [LocalBlock(k, p.eligible, p.layout) for k, p in zip(keys, parts, strict=True)]
            kept = random_unstructured(spec.target, vectors, shards, generator)
        else:
            kept = l1_unstructured_jointly(spec.target, keys, [p.eligible for p in parts], shards=shards)
    out = []
    for flags, part, block in zip(kept, parts, blocks, strict=True):
        local = _expand(flags, _Channels(flags, None, part.dim, block.scores.shape, block.mask))
        out.append(wrap(local, block.layout))
    return out


def _normalized_across(parts: Sequence[Channels], normalize: Normalize) -> list[Tensor]:
    """Each tensor's channel keys scaled as :func:`_normalized` scales them, over all its processes.

    Channels whole on every process are normalized there, exactly as one
    process does. A tensor whose channels are cut across processes sums
    (``"mean"``: in float64, rounded once to the norms' dtype, so within an
    ulp of one process's float32 sum) or maximizes (``"max"``: exact) its
    part of each tensor's numbers: one ``all_reduce`` per mesh dim for the
    whole group. Where copies of a block of channels lie along some mesh
    dims, one of them adds its numbers (three copies would triple a sum,
    not always exactly).
    """
    if normalize is None:
        return [p.keys for p in parts]
    cut = [i for i, p in enumerate(parts) if p.layout.sharded]
    numbers: list[float] = []
    for i in cut:
        norms, eligible = parts[i].keys, parts[i].eligible
        if not parts[i].layout.counted:  # a copy of channels another process counts
            numbers += [0.0, 0.0] if normalize == "mean" else [0.0]
            continue
        counted = norms.isfinite() if eligible is None else norms.isfinite() & eligible
        values = torch.where(counted, norms, torch.zeros_like(norms))
        if normalize == "mean":
            numbers += [float(values.sum(dtype=torch.float64)), float(counted.sum())]
        else:
            numbers.append(float(values.amax()) if values.numel() else 0.0)
    reduced: list[float] = []
    if cut:
        op = dist.ReduceOp.SUM if normalize == "mean" else dist.ReduceOp.MAX
        reduced = all_reduced(numbers, parts[cut[0]].layout, op, parts[cut[0]].keys.device)
    out = []
    for i, part in enumerate(parts):
        norms = part.keys
        if i not in cut:
            out.append(_normalized(norms, part.eligible, normalize))
            continue
        j = cut.index(i)
        if normalize == "mean":
            total = torch.tensor(reduced[2 * j], dtype=torch.float64, device=norms.device).to(norms.dtype)
            scale = total / torch.tensor(max(reduced[2 * j + 1], 1.0), device=norms.device).to(norms.dtype)
        else:
            scale = torch.tensor(reduced[j], device=norms.device).to(norms.dtype)
        out.append(norms / torch.where(scale > 0, scale, torch.ones_like(scale)))
    return out


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


def _check_channels(spec: StructuredSpec, scores: Tensor) -> None:
    """One tensor's checks (torch's first): floating scores, 2 dims or more, ``dim`` in range, the norm."""
    if not scores.is_floating_point():
        raise TypeError(
            f"scores must be a floating-point tensor, got dtype {scores.dtype}; convert them with .float()"
        )
    validate_structured(scores)
    validate_dim_range(scores, spec.dim)
    if isinstance(spec, LnStructured):
        check_matrix_norm(spec.n, scores)


def _channels(spec: StructuredSpec, scores: Tensor, mask: Mask, normalize: Normalize) -> _Channels:
    """The channel scores of one tensor and its still-unpruned channels (torch's checks first)."""
    _check_channels(spec, scores)
    d = spec.dim % scores.dim()
    eligible = None if mask is None else unpruned_units("structured", mask, d)
    if isinstance(spec, RandomStructured):
        keys = torch.zeros(scores.shape[d], device=scores.device)
    else:
        others = [i for i in range(scores.dim()) if i != d]
        keys = _normalized(torch.norm(scores, p=spec.n, dim=others), eligible, normalize)
    return _Channels(keys, eligible, d, scores.shape, mask)


def _normalized(norms: Tensor, eligible: Mask, normalize: Normalize) -> Tensor:
    """``norms`` divided by the mean or max of the finite ones of unpruned channels.

    Where that is not positive (all zero, or no such channel) they stay as they are.
    """
    if normalize is None or norms.numel() == 0:
        return norms
    counted = norms.isfinite() if eligible is None else norms.isfinite() & eligible
    values = torch.where(counted, norms, torch.zeros_like(norms))
    if normalize == "mean":
        scale = values.sum() / counted.sum().clamp(min=1).to(norms.dtype)
    else:
        scale = values.amax()
    return norms / torch.where(scale > 0, scale, torch.ones_like(scale))


def _select(
    spec: StructuredSpec, parts: Sequence[_Channels], generator: torch.Generator | None
) -> list[Tensor]:
    """One exact selection over the group's channel vector, expanded back per tensor."""
    keys = torch.cat([part.keys for part in parts])
    eligible = None
    if any(part.eligible is not None for part in parts):
        eligible = torch.cat([
            torch.ones(part.keys.shape, dtype=torch.bool, device=part.keys.device)
            if part.eligible is None else part.eligible for part in parts
        ])  # fmt: skip
    # Channel norms are >= 0 (or NaN), so L1's ranking is theirs: exact count,
    # ties to the lower channel of the group, NaN pruned last.
    flat: Spec
    if isinstance(spec, RandomStructured):
        flat = RandomUnstructured(spec.amount, sparsity=spec.sparsity)
    else:
        flat = L1Unstructured(spec.amount, sparsity=spec.sparsity)
    kept = compute_mask(flat, keys, eligible, generator=generator)
    pieces = torch.split(kept, [part.keys.shape[0] for part in parts])
    return [_expand(piece, part) for piece, part in zip(pieces, parts, strict=True)]


def _expand(kept: Tensor, part: _Channels) -> Tensor:
    """Kept channels as a mask of the tensor's shape, on top of its earlier mask."""
    shape = [1] * len(part.shape)
    shape[part.dim] = part.shape[part.dim]
    full = kept.reshape(shape).expand(part.shape)
    return full.contiguous() if part.mask is None else full & part.mask


def global_structured(
    names: Sequence[str], spec: StructuredSpec, *, normalize: Normalize = None
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

    Returns:
        A plan; ``plan(params, masks=None, scores=None, generator=None)``
        returns the masks.

    Raises:
        TypeError: if ``names`` is not a non-empty list of strings, ``spec``
            is not ``LnStructured`` or ``RandomStructured`` or ``normalize``
            not a string or ``None``.
        ValueError: if ``normalize`` is not ``None``, ``"mean"`` or
            ``"max"``, or is given with ``RandomStructured``. When the plan
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
    return GlobalStructuredPlan(tuple(names), spec, normalize)
