"""DTensor masks: the one registry of what funcprune computes on DTensors, block by block.

:data:`ON_BLOCKS` maps each spec type funcprune runs on DTensors to its
kernel over a group's blocks and the refusals its layout may force; chains
go through the one fold (:func:`funcprune._specs.fold`) step by step.
:func:`compute_mask` and :func:`compute_joint_masks` check a DTensor's
layout, run the kernel on each process's blocks and wrap the masks back as
DTensors. Anything the registry does not hold is refused by
:func:`check_supported` before any work, naming what it holds
(:func:`supported`: the docs' list is generated from it too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar, cast, final

import torch

from .._specs import (
    NM,
    Block,
    Chain,
    CustomFromMask,
    Identity,
    L1Unstructured,
    LnStructured,
    PerSlice,
    RandomStructured,
    RandomUnstructured,
    Spec,
    as_bool,
    custom_from_mask,
    fold,
    keep_all,
    l1_unstructured_jointly,
)
from .._types import Mask, Tensor, is_dtensor
from .._validate import check_same_shape
from ._layout import Layout, LocalBlock, block_of, layout_of, shards_of, wrap
from ._random import random_unstructured
from ._shapes import (
    blocks,
    check_blocks_cut,
    check_n_m_cut,
    check_slices_whole,
    n_m,
    per_slice,
)
from ._structured import check_layout, structured

__all__ = [
    "ON_BLOCKS", "OnBlocks", "check_group", "check_supported", "compute_joint_masks", "compute_mask", "described",
    "masks_on_blocks", "supported",
]  # fmt: skip

_S = TypeVar("_S", bound=Spec)
#: A spec's masks over a group of blocks: one block, but for unstructured specs ranked jointly.
BlockMasks = Callable[[Any, Sequence[LocalBlock], "torch.Generator | None"], list[Tensor]]
#: What a layout cannot give a spec, refused before any work (``fn``, ``what``, the spec, the layout).
LayoutCheck = Callable[[str, str, Any, Layout], None]


@final
@dataclass(frozen=True, slots=True)
class OnBlocks:
    """How funcprune computes one spec type on DTensor blocks.

    Attributes:
        masks: the spec's masks over a group's blocks on this process.
        check: what a layout cannot give the spec, refused before any work
            on every process alike (``None``: any supported layout works).
        draws: whether the spec draws random numbers; on DTensors it then
            draws from one agreed seed, so ``PerSlice``, whose slices each
            process computes on its own, cannot run it.
    """

    masks: BlockMasks
    check: LayoutCheck | None = None
    draws: bool = False


def _on(
    kind: type[_S],
    masks: Callable[[_S, Sequence[LocalBlock], torch.Generator | None], list[Tensor]],
    check: Callable[[str, str, _S, Layout], None] | None = None,
    *,
    draws: bool = False,
) -> tuple[type[Spec], OnBlocks]:
    """A registry entry: ``masks`` and ``check`` take the spec ``kind`` they are registered for."""
    return kind, OnBlocks(cast(BlockMasks, masks), cast("LayoutCheck | None", check), draws)


# --- each spec's kernel over a group's blocks ---------------------------------------------------


def _l1_unstructured(spec: L1Unstructured, parts: Sequence[LocalBlock], generator: torch.Generator | None) -> list[Tensor]:
    scores, masks = [p.scores for p in parts], [p.mask for p in parts]
    return l1_unstructured_jointly(spec.target, scores, masks, shards=shards_of([p.layout for p in parts]))


def _random_unstructured(
    spec: RandomUnstructured, parts: Sequence[LocalBlock], generator: torch.Generator | None
) -> list[Tensor]:
    return random_unstructured(spec.target, parts, shards_of([p.layout for p in parts]), generator)


def _structured(
    spec: LnStructured | RandomStructured, parts: Sequence[LocalBlock], generator: torch.Generator | None
) -> list[Tensor]:
    return [structured(spec, p, generator) for p in parts]


def _n_m(spec: NM, parts: Sequence[LocalBlock], generator: torch.Generator | None) -> list[Tensor]:
    return [n_m(spec, p) for p in parts]


def _blocks(spec: Block, parts: Sequence[LocalBlock], generator: torch.Generator | None) -> list[Tensor]:
    return [blocks(spec, p) for p in parts]


def _per_slice(spec: PerSlice, parts: Sequence[LocalBlock], generator: torch.Generator | None) -> list[Tensor]:
    return [per_slice(spec, p, generator) for p in parts]


def _identity(spec: Identity, parts: Sequence[LocalBlock], generator: torch.Generator | None) -> list[Tensor]:
    return [keep_all(p.scores, p.mask) for p in parts]


def _custom_from_mask(
    spec: CustomFromMask, parts: Sequence[LocalBlock], generator: torch.Generator | None
) -> list[Tensor]:
    return [custom_from_mask(_custom_block(spec.mask, p.layout), p.scores, p.mask) for p in parts]


def _custom_block(mask: Tensor, layout: Layout) -> Tensor:
    """This process's block of a :class:`CustomFromMask`'s mask (whole, or a DTensor of the scores' layout)."""
    if is_dtensor(mask):
        return block_of("CustomFromMask", "the spec's mask", mask, "the scores", layout)
    whole = torch.Size(layout.shape)
    check_same_shape("CustomFromMask", "the spec's mask", mask.shape, "the scores", whole, plural=True)
    box = tuple(slice(o, o + s) for o, s in zip(layout.offsets, layout.size, strict=True))
    return mask[box]



def _check_per_slice(fn: str, what: str, spec: PerSlice, layout: Layout) -> None:
    """Refuse a ``PerSlice`` whose slices the layout cuts (its inner spec was checked without one)."""
    check_slices_whole(fn, what, spec, layout)


#: The one registry: every spec type funcprune computes on DTensors, in the order messages and docs
#: list them. A spec not here is refused on DTensors; a new one is added here, and only here.
ON_BLOCKS: Mapping[type[Spec], OnBlocks] = MappingProxyType(dict([
    _on(L1Unstructured, _l1_unstructured),
    _on(RandomUnstructured, _random_unstructured, draws=True),
    _on(LnStructured, _structured, check_layout),
    _on(RandomStructured, _structured, draws=True),
    _on(Identity, _identity),
    _on(CustomFromMask, _custom_from_mask),
    _on(NM, _n_m, check_n_m_cut),
    _on(Block, _blocks, check_blocks_cut),
    _on(PerSlice, _per_slice, _check_per_slice),
]))  # fmt: skip


def supported(*, draws: bool = True) -> list[str]:
    """The names of the spec types funcprune computes on DTensors (``draws=False``: those that draw no random numbers)."""
    return [kind.__name__ for kind, on in ON_BLOCKS.items() if draws or not on.draws]


def described() -> str:
    """What the registry holds, in a sentence for docstrings and docs (read from :data:`ON_BLOCKS`)."""
    quoted = [f"``{name}``" for name in supported()]
    checked = [f"``{kind.__name__}``" for kind, on in ON_BLOCKS.items() if on.check is not None]
    drawing = [f"``{kind.__name__}``" for kind, on in ON_BLOCKS.items() if on.draws]
    return (
        f"{_listed(quoted)}. Where a layout cuts what {_joined(checked)} need whole (a group, a "
        "slice, a channel's nuclear norm), they are refused before any work, on every process "
        f"alike; {_joined(drawing)} draw from one seed the processes agree on (reproducible for "
        "a seed and the same for any placement, not one process's draws)"
    )


def _joined(names: Sequence[str]) -> str:
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def _listed(names: Sequence[str]) -> str:
    return ", ".join(names) + " and chains of them"


# --- checks before any work --------------------------------------------------------------------


def check_supported(fn: str, what: str, spec: Spec, layout: Layout | None = None) -> None:
    """Refuse a spec (or a chain's step) that cannot prune DTensors block by block.

    A ``PerSlice`` must run a spec in its slices that draws no random
    numbers (:func:`check_slice_spec`). With ``layout`` (``what``'s), also
    what that layout cannot give the spec (its :attr:`OnBlocks.check`).

    Raises:
        NotImplementedError: naming the spec and what is supported.
    """
    for step in spec.specs if isinstance(spec, Chain) else (spec,):
        on = ON_BLOCKS.get(type(step))
        if on is None:
            raise NotImplementedError(
                f"{fn}: {what} is a DTensor, and {step!r} cannot prune DTensors yet; on DTensors "
                f"funcprune runs {_listed(supported())} (block by block, nothing gathered). To use "
                "another spec on one process, gather the tensor yourself with .full_tensor()"
            )
        if isinstance(step, PerSlice):
            check_slice_spec(fn, what, step)
        if layout is not None and on.check is not None:
            on.check(fn, what, step, layout)


def check_slice_spec(fn: str, what: str, spec: PerSlice) -> None:
    """Refuse a :class:`PerSlice` whose inner spec may draw random numbers (any layout).

    Each process runs the inner spec on its own slices: a spec that draws
    would draw its own numbers, not what one process draws, and a spec the
    registry does not hold (a user's) may draw.

    Raises:
        NotImplementedError: naming the inner spec and what PerSlice runs on DTensors.
    """
    for step in spec.spec.specs if isinstance(spec.spec, Chain) else (spec.spec,):
        on = ON_BLOCKS.get(type(step))
        if isinstance(step, PerSlice):
            check_slice_spec(fn, what, step)
        elif on is not None and on.draws:
            raise NotImplementedError(
                f"{fn}: {what} is a DTensor, and {spec!r} draws random numbers in each slice "
                f"({step!r}): each process would draw its own, not what one process draws; on "
                f"DTensors PerSlice runs {_listed(supported(draws=False))}. To draw per slice on one "
                "process, gather the tensor yourself with .full_tensor()"
            )
        elif on is None:
            raise NotImplementedError(
                f"{fn}: {what} is a DTensor, and {spec!r} runs {step!r} in each slice, which "
                f"funcprune cannot run on DTensors (it may draw random numbers); on DTensors "
                f"PerSlice runs {_listed(supported(draws=False))}. To use it on one process, gather "
                "the tensor yourself with .full_tensor()"
            )


def check_group(fn: str, names: Sequence[str], tensors: Sequence[Tensor], spec: Spec) -> None:
    """Refuse a group ranked jointly unless all are DTensors of supported layouts on one mesh,
    and ``spec`` is supported, on each tensor's layout too (a nuclear norm of channels cut
    across processes, say).

    Raises:
        TypeError: if the group mixes DTensors and plain tensors.
        ValueError: if the DTensors are on different meshes (or see :func:`layout_of`).
        NotImplementedError: if a layout or ``spec`` is not supported.
    """
    first = next(i for i, t in enumerate(tensors) if is_dtensor(t))
    head = tensors[first]
    assert is_dtensor(head)
    mesh = head.device_mesh
    layouts = []
    for name, t in zip(names, tensors, strict=True):
        if not is_dtensor(t):
            raise TypeError(
                f"{fn}: {name} is a plain torch.Tensor but {names[first]} is a DTensor; a group "
                "ranked jointly must be all DTensors on one device mesh, or none"
            )
        if t.device_mesh != mesh:
            raise ValueError(
                f"{fn}: {name} is on {t.device_mesh} but {names[first]} on {mesh}; a group ranked "
                "jointly must share one device mesh"
            )
        layouts.append(layout_of(fn, name, t))
    check_supported(fn, names[first], spec)
    for name, layout in zip(names, layouts, strict=True):
        check_supported(fn, name, spec, layout)



# --- the masks -------------------------------------------------------------------------------


def masks_on_blocks(spec: Spec, parts: Sequence[LocalBlock], generator: torch.Generator | None = None) -> list[Tensor]:
    """This process's blocks of the masks ``spec`` gives for the group ``parts`` (a checked spec).

    Structured specs and mask shapes come with one part (a group ranked
    jointly is unstructured). A chain runs the one fold, step ``i > 0``
    scoring the blocks as pruned so far, as :class:`~funcprune.Chain` does.
    """
    if not isinstance(spec, Chain):
        return ON_BLOCKS[type(spec)].masks(spec, parts, generator)

    def scores_of(i: int, kept: list[Tensor] | None) -> list[LocalBlock]:
        if kept is None:
            return list(parts)
        return [LocalBlock(p.scores * m.to(p.scores.dtype), m, p.layout) for p, m in zip(parts, kept, strict=True)]

    def step(
        each: Spec, blocks: list[LocalBlock], kept: list[Tensor] | None, generator: torch.Generator | None
    ) -> list[Tensor]:
        return ON_BLOCKS[type(each)].masks(each, blocks, generator)

    return fold(spec.specs, scores_of, None, generator, step=step)


def compute_mask(
    fn: str,
    spec: Spec,
    scores: Tensor,
    default_mask: Mask,
    names: tuple[str, str] = ("scores", "default_mask"),
    *,
    generator: torch.Generator | None = None,
) -> Tensor:
    """:func:`funcprune.compute_mask` where ``scores`` or ``default_mask`` is a DTensor.

    ``names`` name the two in messages; ``generator`` seeds the random specs
    (torch's default CPU generator if ``None``). Returns a DTensor of the
    scores' layout.
    """
    if not is_dtensor(scores):
        raise TypeError(
            f"{fn}: {names[1]} is a DTensor but {names[0]} is a plain torch.Tensor; give both as "
            "DTensors with the same mesh and placements, or neither"
        )
    check_supported(fn, names[0], spec)
    layout = layout_of(fn, names[0], scores)
    check_supported(fn, names[0], spec, layout)
    mask = None if default_mask is None else as_bool(block_of(fn, names[1], default_mask, names[0], layout))
    (kept,) = masks_on_blocks(spec, [LocalBlock(scores.to_local(), mask, layout)], generator)
    return wrap(kept, layout)


def compute_joint_masks(
    fn: str,
    spec: Spec,
    scores: Sequence[Tensor],
    default_masks: Sequence[Mask],
    *,
    generator: torch.Generator | None = None,
) -> list[Tensor]:
    """:func:`funcprune.compute_joint_masks` where any tensor is a DTensor; DTensor masks back.

    ``generator`` seeds the random specs (torch's default CPU generator if ``None``).
    """
    for i, (s, d) in enumerate(zip(scores, default_masks, strict=True)):
        if is_dtensor(d) and not is_dtensor(s):
            raise TypeError(
                f"{fn}: default_masks[{i}] is a DTensor but scores[{i}] is a plain torch.Tensor; "
                "give both as DTensors with the same mesh and placements, or neither"
            )
    names = [f"scores[{i}]" for i in range(len(scores))]
    check_group(fn, names, scores, spec)
    parts = []
    for i, (s, d) in enumerate(zip(scores, default_masks, strict=True)):
        assert is_dtensor(s)  # checked by check_group
        layout = layout_of(fn, names[i], s)
        mask = None if d is None else as_bool(block_of(fn, f"default_masks[{i}]", d, names[i], layout))
        parts.append(LocalBlock(s.to_local(), mask, layout))
    return [wrap(kept, p.layout) for kept, p in zip(masks_on_blocks(spec, parts, generator), parts, strict=True)]
