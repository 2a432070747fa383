"""Building a smaller copy of a model: what each tensor keeps once groups go, the masked model's outputs, the copy.

:func:`probing` and :func:`checking` say what the masked model of a probe
and of shrink's check zero (the masks, and the indices that go on top of
them: no closure of a 1B model's size made); :func:`masked_outputs` is what
the masked model computes on the example inputs (pruned entries ``+0.0``,
removed experts never routed to), its tensors made as each block of a stack
runs (:func:`masked_run`); :func:`built` makes the copy, the tensors cut
and the masks' zeros that stay written, and says which size attributes
changed (:func:`cut_in_place` makes the model itself so, for shrink's
``inplace=True``). A probe's copy (run once and thrown away) shares the
model's tensors instead of copying them.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping, Sequence, Set
from typing import Any

import torch
from torch import nn

from .._experts import Router, never_routed
from .._graph import Analysis, Inputs, closure, copy_module, dropped_indices, kept_indices
from .._torch_private import tree_leaves
from .._types import Masks, Tensor
from ._config import Record
from ._resize import resize_modules
from ._stacks import block_names, stacks_of
from ._verify import evaluating
from ._written import aliases_written, written_for_the_run

__all__ = [
    "Dropped", "built", "checking", "cut", "cut_in_place", "keeps_all", "masked_in_place", "masked_outputs", "masked_run",
    "masked_tensors", "probing", "tensor_shapes", "zeroed", "zeroed_",
]  # fmt: skip


def tensor_shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    tensors = [*module.named_parameters(), *module.named_buffers()]
    return {name: tuple(t.shape) for name, t in tensors}


def masked_outputs(analysis: Analysis, masks: Masks, dropped: Dropped | None = None) -> Any:
    """What the masked model (``masks``, ``dropped`` on top, as :func:`masked_run` reads them) computes on the
    example inputs, removed experts never routed to."""
    routers = [layer.router for layer in analysis.experts]
    return masked_run(analysis.model, masks, analysis.inputs, routers, dropped=dropped)


#: Indices zeroed on top of the masks: by parameter name, for each dim, the indices whose every entry is pruned.
Dropped = Mapping[str, Mapping[int, Sequence[int]]]


def probing(
    analysis: Analysis, masks: Mapping[str, Tensor], removed: Sequence[int], sizes: Mapping[str, tuple[int, ...]]
) -> tuple[dict[str, dict[int, list[int]]], Masks, dict[str, dict[int, list[int]]]]:
    """For a probe: what each tensor keeps once ``removed`` go, the closure of ``masks`` made only for the tensors
    they name (and the routers', whose masks say which experts are never routed to), and the indices each other
    parameter loses (:data:`Dropped`), whose closure would be exactly that: no mask of a 1B model's size made."""
    keep = kept_indices(analysis, removed, sizes)
    return (keep, *_closed_and_dropped(analysis, masks, keep, set(masks)))


def checking(
    analysis: Analysis, masks: Mapping[str, Tensor], keep: Mapping[str, Mapping[int, list[int]]]
) -> tuple[Masks, dict[str, dict[int, list[int]]]]:
    """For shrink's check, the masked model of the closure of ``masks`` as :func:`masked_run` makes it without the
    closure: ``masks`` (the routers' closed) and the indices each parameter loses on top of them (:data:`Dropped`):
    the same bits (``+0.0`` written over the mask's zeros), and no mask the size of the model made."""
    return _closed_and_dropped(analysis, masks, keep, set())


def _closed_and_dropped(
    analysis: Analysis, masks: Mapping[str, Tensor], keep: Mapping[str, Mapping[int, list[int]]], closing: Set[str]
) -> tuple[Masks, dict[str, dict[int, list[int]]]]:
    """``masks`` with those of ``closing`` and the routers' closed, and the indices every other parameter loses."""
    params = dict(analysis.model.named_parameters())
    closing = set(closing) | {layer.router.weight for layer in analysis.experts}
    closed = closure(masks, {name: dims for name, dims in keep.items() if name in closing}, params)
    dropped = {
        name: {dim: dropped_indices(kept, params[name].shape[dim]).tolist() for dim, kept in dims.items()}
        for name, dims in keep.items()
        if name in params and name not in closing
    }
    return closed, dropped


def masked_run(
    module: nn.Module, masks: Mapping[str, Tensor], inputs: Inputs, routers: Sequence[Router] = (),
    *, dropped: Dropped | None = None, write: bool = True,
) -> Any:  # fmt: skip
    """What ``module`` masked by ``masks`` computes on ``inputs``, in eval mode (its modes restored after).

    Pruned entries are ``+0.0``, as the shrunk model holds them, bound through
    :func:`torch.func.functional_call` (nothing copied but the masked
    tensors); the experts of ``routers`` that the masks remove are never
    routed to. ``dropped``: indices of parameters zeroed on top of the masks
    (a probe's or shrink's check, which would otherwise make a mask of every
    weight it cuts): ``+0.0`` written there over the masked copy, the same
    bits as the mask that prunes them would give. The masked tensors of a
    block of a stack are made as the block runs (:func:`_blockwise`), in
    memory the blocks before it held: the masked model of a 1B model holds
    one block's copies, not the whole model's; the others' (an embedding, a
    head) are made up front. The indices ``dropped`` gives of a parameter
    the masks prune nothing of are written into the parameter itself for
    the run, where that costs less than a copy, and put back after, bit for
    bit (:func:`~._written.written_for_the_run`: one hidden channel of a 1B
    model's trial, not a copy of its embedding and head); ``write=False``
    (or a model whose output is a view of one of them): never.
    """
    dropped = dropped or {}
    writable = {n: d for n, d in dropped.items() if write and (masks.get(n) is None or keeps_all(masks[n]))}
    with written_for_the_run(module, writable) as (left, written):
        rest = {**{n: d for n, d in dropped.items() if n not in writable}, **left}
        out = _masked_run(module, masks, inputs, routers, rest)
        if not aliases_written(out, written):
            return out
    return masked_run(module, masks, inputs, routers, dropped=dropped, write=False)  # (put back: what it returned too)


def _masked_run(module: nn.Module, masks: Mapping[str, Tensor], inputs: Inputs, routers: Sequence[Router],
                dropped: Dropped) -> Any:  # fmt: skip
    """:func:`masked_run` with ``dropped`` as given: every tensor zeroed is a copy."""
    streamed = _in_blocks(module, masks, dropped)
    inside = {name for names in streamed.values() for name in names}
    baked = masked_tensors(module, {n: m for n, m in masks.items() if n not in inside},
                           {n: d for n, d in dropped.items() if n not in inside})  # fmt: skip
    with evaluating(module), torch.no_grad(), never_routed(module, masks, list(routers)), _blockwise(module, streamed):
        return torch.func.functional_call(module, baked, tuple(inputs.args), dict(inputs.kwargs))


#: A parameter's masked copy, as a block makes it: every name of the parameter, its mask (``None``: none) and the
#: indices zeroed on top.
_Zeroed = tuple[list[str], Tensor | None, Mapping[int, Sequence[int]]]


def _in_blocks(module: nn.Module, masks: Mapping[str, Tensor], dropped: Dropped) -> dict[str, dict[str, _Zeroed]]:
    """The parameters that ``masks`` or ``dropped`` zero entries of and that lie in one block of a stack, every name
    of them, by block."""
    params = dict(module.named_parameters())
    names = _names(module)
    blocks = [block for path in stacks_of(module) for block in block_names(module, path)]
    out: dict[str, dict[str, _Zeroed]] = {}
    for name in dict.fromkeys([*masks, *dropped]):
        mask, dims = masks.get(name), dropped.get(name, {})
        if name not in params or not _zeroes(mask, dims):
            continue  # a buffer (the masked model keeps it), or nothing zeroed
        block = next((b for b in blocks if name.startswith(f"{b}.")), None)
        aliases = names[id(params[name])]
        if block is not None and all(alias.startswith(f"{block}.") for alias in aliases):
            out.setdefault(block, {})[name] = (aliases, mask, dims)
    return out


def _names(module: nn.Module) -> dict[int, list[str]]:
    """Every name of each parameter of ``module`` (a tied one has several), by the parameter's ``id``."""
    names: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return names


def _zeroes(mask: Tensor | None, dims: Mapping[int, Sequence[int]]) -> bool:
    """Whether ``mask`` or the indices ``dims`` gives zero any entry."""
    return (mask is not None and not keeps_all(mask)) or any(dims.values())


def _masked_copy(tensor: Tensor, mask: Tensor | None, dims: Mapping[int, Sequence[int]], out: Tensor | None = None) -> Tensor:
    """A copy of ``tensor`` (into ``out``, if given: ``tensor`` itself too) with ``+0.0`` where ``mask`` prunes and at
    the indices ``dims`` gives along each dim: the bits of the mask that prunes them all."""
    if mask is not None and not keeps_all(mask):
        out = zeroed(tensor, mask, out=out)
    elif out is None or out is not tensor:
        out = tensor.detach().clone() if out is None else out.copy_(tensor)
    for dim, indices in dims.items():
        if indices:
            out.index_fill_(dim, torch.tensor(indices, dtype=torch.long, device=out.device), 0.0)
    return out


@contextlib.contextmanager
def _blockwise(module: nn.Module, streamed: Mapping[str, Mapping[str, _Zeroed]]) -> Iterator[None]:
    """While it is held, each block of ``streamed`` runs with its parameters masked: on entering the block, each gets
    a copy (``+0.0`` where its mask prunes and at the indices given, as :func:`masked_tensors` makes it) bound in its
    place, as :func:`torch.func.functional_call` binds tensors; on leaving, the parameters are put back and the
    copies kept for the next block's tensors of the same shape (none that the block's output shares memory with).
    A 1B model's masked model writes one block's copies into memory already touched, 21 times, instead of a whole
    model's into new memory (about 2 s per GB on a VM)."""
    free: dict[tuple[Any, ...], list[Tensor]] = {}
    held: dict[str, list[tuple[dict[str, Any], str, Tensor, Tensor]]] = {}  # per block: (table, attr, original, copy)

    def slots(aliases: list[str]) -> list[tuple[dict[str, Any], str]]:
        """Where each name of a parameter is held: its module's table of parameters, and the attribute."""
        return [(module.get_submodule(a.rpartition(".")[0])._parameters, a.rpartition(".")[2]) for a in aliases]

    tables = {path: [(slots(aliases), mask, dims) for aliases, mask, dims in entries.values()]
              for path, entries in streamed.items()}  # fmt: skip

    def key(t: Tensor, device: torch.device) -> tuple[Any, ...]:
        return tuple(t.shape), t.stride(), t.dtype, device

    def enter(path: str) -> Any:
        def hook(block: nn.Module, args: Any) -> None:
            if path in held:  # a block run inside itself: its tensors are masked already
                return
            held[path] = swapped = []
            for where, mask, dims in tables[path]:
                original = where[0][0][where[0][1]]
                assert original is not None
                spare = free.get(key(torch.empty_like(original, device="meta"), original.device))  # its layout
                new = _masked_copy(original, mask, dims, spare.pop() if spare else torch.empty_like(original))
                for table, attr in where:
                    swapped.append((table, attr, table[attr], new))
                    table[attr] = new

        return hook

    def put_back(path: str, out: Any = None) -> None:
        swapped = held.pop(path, [])
        escaped = {t.untyped_storage().data_ptr() for t in tree_leaves(out) if isinstance(t, Tensor)}
        for table, attr, original, new in reversed(swapped):
            table[attr] = original
            if new.untyped_storage().data_ptr() not in escaped:  # (the output holds none of it)
                bucket = free.setdefault(key(new, new.device), [])
                if all(c is not new for c in bucket):
                    bucket.append(new)

    def leave(path: str) -> Any:
        return lambda block, args, out: put_back(path, out)

    handles = []
    try:
        for path in streamed:
            block = module.get_submodule(path)
            handles.append(block.register_forward_pre_hook(enter(path), prepend=True))
            handles.append(block.register_forward_hook(leave(path), always_call=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
        for path in list(held):
            put_back(path)


@torch.no_grad()
def masked_tensors(module: nn.Module, masks: Mapping[str, Tensor], dropped: Dropped | None = None) -> dict[str, Tensor]:
    """New tensors of ``module``'s parameters that ``masks`` (and ``dropped``, as :func:`masked_run` reads it)
    prune entries of, ``+0.0`` there, by first name; the parameters they prune nothing of are left out."""
    params = dict(module.named_parameters())
    dropped = dropped or {}
    baked: dict[str, Tensor] = {}
    for name in dict.fromkeys([*masks, *dropped]):
        mask, dims = masks.get(name), dropped.get(name, {})
        if name in params and _zeroes(mask, dims):  # (a buffer: the masked model keeps it)
            baked[name] = _masked_copy(params[name], mask, dims)
    return baked


def built(
    module: nn.Module, analysis: Analysis, keep: Mapping[str, Mapping[int, list[int]]], masks: Masks,
    removed: Sequence[int], *, probe: bool = False, masked: Set[str] | None = None, views: bool = False,
) -> tuple[nn.Module, Record]:  # fmt: skip
    """A copy of ``module`` without ``removed`` (``keep``), the zeros of ``masks`` applied; and the size attributes
    that changed.

    The copy is made sharing ``module``'s parameters and buffers, the tensors
    are cut into new ones, and the zeros of ``masks`` that stay (its masks
    cut alike: the closure's or the masks it is made of, which prune the same
    entries of what stays) written after: a tensor is copied whole only
    where they prune an entry it keeps. What the copy still shares is then
    copied (``copy.deepcopy``): no tensor of the whole model's size is made
    only to be cut.

    A ``probe`` (a copy only run and thrown away, and checked) keeps sharing
    what it does not cut, and gets new tensors where the masks zero entries
    that stay: only the tensors ``masked`` names (those of the masks the
    closure was made from; all of ``masks`` if ``None``), since the closure
    adds zeros only at the indices that go, which the copy cuts. A 1B
    model's trial costs what it changes. With ``views`` (a probe's), a
    tensor that keeps one run of indices along each dim it loses is cut to
    a view (``narrow``), not a copy.
    """
    sharing = [*module.parameters(), *module.buffers()]
    result = copy_module("shrink", module, sharing=sharing)
    if not probe:
        record = resize_modules(result, keep, analysis, set(removed))
        zeroed_(result, {name: cut(mask, keep.get(name, {})) for name, mask in masks.items()
                         if not _keeps_what_stays(mask, keep.get(name, {}))})  # fmt: skip
        _owned_(result, sharing)
        return result, record
    zeroed_(result, masks if masked is None else {n: m for n, m in masks.items() if n in masked})
    return result, resize_modules(result, keep, analysis, set(removed), views=views)


@torch.no_grad()
def masked_in_place(analysis: Analysis, masks: Masks, keep: Mapping[str, Mapping[int, list[int]]]) -> Any:
    """For shrink's ``inplace=True``: the zeros of the check's masked model (:func:`checking`'s) written into the
    model's own tensors (those ``analysis.model`` holds), and what it computes then, as :func:`masked_outputs` would
    (the same bits): no copy made. Where a mask prunes only indices that go, those indices are zeroed alone."""
    closed, dropped = checking(analysis, masks, keep)
    params = dict(analysis.model.named_parameters())
    for name in dict.fromkeys([*closed, *dropped]):
        mask, dims = closed.get(name), dropped.get(name, {})
        if name in params and _zeroes(mask, dims):  # (a buffer: the masked model keeps it)
            tensor = params[name].data
            covered = mask is None or _keeps_what_stays(mask, keep.get(name, {}))  # its zeros: indices that go
            _masked_copy(tensor, None if covered else mask, dims, out=tensor)
    routers = [layer.router for layer in analysis.experts]
    router_masks = {name: closed[name] for name in {r.weight for r in routers} if name in closed}
    return masked_run(analysis.model, router_masks, analysis.inputs, routers)


@torch.no_grad()
def cut_in_place(module: nn.Module, analysis: Analysis, keep: Mapping[str, Mapping[int, list[int]]], masks: Masks,
                 removed: Sequence[int], *, zeroed_already: bool) -> Record:  # fmt: skip
    """``module`` itself made the smaller model :func:`built` copies: each tensor that loses indices cut into its
    own object (``.data``, so that its old values are freed as it goes: the memory above the model is one tensor's),
    and the zeros of ``masks`` that stay written into its tensors (unless ``zeroed_already``: by
    :func:`masked_in_place`); the size attributes that changed."""
    record = resize_modules(module, keep, analysis, set(removed), inplace=True)
    params = dict(module.named_parameters(remove_duplicate=False))
    for name, mask in {} if zeroed_already else masks.items():
        dims = keep.get(name, {})
        if not _keeps_what_stays(mask, dims) and not keeps_all(small := cut(mask, dims)):
            zeroed(params[name].data, small, out=params[name].data)
    return record


def _keeps_what_stays(mask: Tensor, dims: Mapping[int, list[int]]) -> bool:
    """Whether ``mask`` keeps every entry that stays once the indices ``dims`` leaves out go, read without cutting
    it where it loses indices along one dim at most (a channel mask: its zeros are the rows that go): the least
    byte of each index along that dim, over the others (one read of the mask, no copy of it). Otherwise ``False``
    (the caller cuts it, and :func:`zeroed_` passes over a cut mask that keeps all)."""
    if mask.dtype != torch.bool or len(dims) > 1 or mask.numel() == 0:
        return False
    if not dims:
        return keeps_all(mask)
    ((dim, kept),) = dims.items()
    others = [d for d in range(mask.dim()) if d != dim]
    least = mask.view(torch.uint8).amin(dim=others) if others else mask.view(torch.uint8)
    return bool(least[torch.tensor(kept, dtype=torch.long, device=mask.device)].min() == 1) if kept else True


def cut(tensor: Tensor, dims: Mapping[int, list[int]]) -> Tensor:
    """``tensor`` (a mask) cut to the indices ``dims`` keeps along each of its dims (itself where it keeps all)."""
    for dim, kept in sorted(dims.items()):
        tensor = tensor.index_select(dim, torch.tensor(kept, dtype=torch.long, device=tensor.device))
    return tensor


def _owned_(module: nn.Module, shared: Sequence[Tensor]) -> None:
    """Each parameter and buffer of ``module`` that is one of ``shared`` replaced by a copy of its own, as a
    copy of the whole module makes it: ``copy.deepcopy`` with one memo, so that every name of a tied one gets
    the same copy, and tensors that share a storage (views of one fused weight) share its one copy."""
    ids = {id(t) for t in shared}
    memo: dict[int, Any] = {}
    for layer in module.modules():
        for table in (layer._parameters, layer._buffers):
            for attr, tensor in list(table.items()):
                if tensor is not None and id(tensor) in ids:
                    copied: Any = copy.deepcopy(tensor, memo)
                    table[attr] = copied


@torch.no_grad()
def zeroed_(module: nn.Module, masks: Masks) -> None:
    """``+0.0`` at the entries ``masks`` prune (as :func:`~funcprune.bake` writes them, even where a weight is
    ``nan``), written into no tensor: each masked parameter of ``module`` (every name of a tied one) is
    replaced by a new one, so that tensors ``module`` shares with another are left as they are."""
    params = dict(module.named_parameters(remove_duplicate=False))
    aliases = _names(module)
    for name, mask in masks.items():
        if keeps_all(mask):
            continue  # nothing pruned: the tensor as it is (no copy of a 1B model's weights for nothing)
        old = params[name]
        new = nn.Parameter(zeroed(old, mask), old.requires_grad)
        for alias in aliases[id(old)]:
            owner, _, attr = alias.rpartition(".")
            setattr(module.get_submodule(owner), attr, new)


def keeps_all(mask: Tensor) -> bool:
    """Whether ``mask`` keeps every entry. A bool tensor's bytes are 0 or 1: its least byte, read once, tells,
    about 15x as fast as ``mask.all()`` here (on a 5632 x 2048 mask, 1 thread)."""
    if mask.dtype != torch.bool or mask.numel() == 0:
        return bool(mask.all())
    return int(mask.reshape(-1).view(torch.uint8).min()) == 1


def zeroed(tensor: Tensor, mask: Tensor, *, out: Tensor | None = None) -> Tensor:
    """A new ``tensor`` (or ``out``, written: ``tensor`` itself too) with ``+0.0`` where ``mask`` prunes (also where
    it holds ``nan``), as ``torch.where(mask, tensor, 0.0)`` gives it, without the inverted mask of ``masked_fill``.

    A contiguous float tensor on the CPU takes the entries' bits ANDed with
    the mask's bytes made ``0`` or ``-1`` (all bits set), a chunk at a time
    (in cache): the same bits, about 5x as fast as ``torch.where`` on a bool
    mask here (whose CPU kernel does not vectorize; 46 MB: 5.3 against 27 ms,
    1 thread).
    """
    out = torch.empty_like(tensor) if out is None else out
    bits = _BITS.get(tensor.element_size())
    if (bits is None or not tensor.is_floating_point() or tensor.device.type != "cpu" or mask.dtype != torch.bool
            or mask.shape != tensor.shape or not (tensor.is_contiguous() and mask.is_contiguous() and out.is_contiguous())):  # fmt: skip
        return torch.where(mask, tensor, torch.zeros((), dtype=tensor.dtype, device=tensor.device), out=out)
    pieces = zip(
        torch.split(out.view(-1).view(bits), _CHUNK_ENTRIES),
        torch.split(mask.view(-1).view(torch.uint8), _CHUNK_ENTRIES),
        torch.split(tensor.detach().view(-1).view(bits), _CHUNK_ENTRIES),
    )
    spread = torch.empty(min(tensor.numel(), _CHUNK_ENTRIES), dtype=bits)  # (in cache; out may be tensor itself)
    for o, m, t in pieces:
        part = spread[: m.numel()].copy_(m).neg_()  # 1 -> all bits set (the entry's bits), 0 -> none (+0.0)
        torch.bitwise_and(part, t, out=o)
    return out


#: The integer type of each float size, whose bits :func:`zeroed` ANDs; and how many entries it makes at a time.
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}
_CHUNK_ENTRIES = 1 << 18
