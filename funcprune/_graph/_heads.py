"""Attention: each op that multiplies two activations over positions holding different heads, and what it does.

A head is a batch position of such an op whose atoms differ from the
others' (``q @ k^T``, ``probs @ v``, BLOOM's ``baddbmm``,
``scaled_dot_product_attention``, in any layout): its atoms go together,
and heads that read one key/value head form a KV group (:func:`_per_head`).
An atom every head reads (multi-query attention's key and value, MLA's
rotary key) couples no heads and stays. The mask added to the scores meets
the heads as an elementwise operand does.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from .._types import Tensor
from ._atoms import broadcast
from ._pointwise import _meet, _shape
from ._walk import Walk, describe

__all__: list[str] = []


def _contracted(walk: Walk, node: fx.Node, a: object, b: object) -> Tensor:
    """Two activations multiplied as matrices (``a @ b`` over their last two dims, the others batched).

    Where the atoms differ from one batch position to another (the heads of an attention: ``q @ k^T``,
    ``probs @ v``, in any layout), each batch position is a *head*: its atoms go together
    (:func:`_per_head`). Otherwise each output entry couples its row of ``a`` and its column of ``b``.
    """
    ia, ib = walk.ids_or_none(a), walk.ids_or_none(b)
    out_shape = _shape(walk, node)
    if ia.dim() == 1:
        ia = ia[None]
    if ib.dim() == 1:
        ib = ib[:, None]
    batch = out_shape[:-2] if len(out_shape) == max(ia.dim(), ib.dim()) > 2 else ()  # no vector operand
    heads = _per_head(walk, node, batch, [ia, ib]) if batch else None
    if heads is not None:
        return heads.reshape(*batch, 1, 1).expand(out_shape) if len(out_shape) >= 2 else heads.reshape(out_shape)
    why = f"{describe(node)} multiplies them as matrices"
    walk.atoms.couple_along(ia, [-1], why)
    walk.atoms.couple_along(ib, [-2], why)
    rows = ia.amax(-1, keepdim=True)  # (..., n, 1): each row's group
    cols = ib.amax(-2, keepdim=True)  # (..., 1, p): each column's group
    rows, cols = broadcast(rows, cols)
    walk.atoms.couple(rows, cols)
    out = torch.where(rows >= 0, rows, cols)
    return out.reshape(out_shape) if out.numel() == math.prod(out_shape) else torch.full(out_shape, -1, dtype=torch.long)


def _per_head(walk: Walk, node: fx.Node, batch: Sequence[int], operands: Sequence[Tensor]) -> Tensor | None:
    """The atom of each batch position of an attention-like op, or ``None`` if its atoms are the same at every one.

    ``operands``: atom ids whose last two dims are one batch position's matrix (broadcast over
    ``batch``). At each position (a head), its atoms go together: a head goes whole, and heads that
    read one key/value head (grouped-query attention) go together. An atom found at *every* position
    (the key and value of multi-query attention, MLA's rotary key shared by all heads) couples no
    heads: it stays, since every head reads it. The walk records the head atoms of the op
    (``walk.heads``).
    """
    positions = math.prod(batch)
    if positions < 2:
        return None
    slabs = [ids.expand(*batch, *ids.shape[-2:]).reshape(positions, -1) for ids in operands]
    slab = torch.cat(slabs, 1)
    present = slab >= 0
    if not bool(present.any()):
        return None
    atoms = torch.unique(slab[present])
    where = torch.zeros(positions, atoms.numel(), dtype=torch.bool)
    rows = torch.arange(positions).unsqueeze(1).expand_as(slab)[present]
    where[rows, torch.searchsorted(atoms, slab[present])] = True
    shared = where.all(0)
    if bool(shared.all()):
        return None  # the same atoms at every position: no heads
    walk.atoms.block(atoms[shared], f"{describe(node)} reads them in every head (shared by all heads)")
    own = where & ~shared
    group = torch.full((positions,), -1, dtype=torch.long)  # each position's smallest atom of its own
    for position in range(positions):
        found = atoms[own[position]].tolist()
        if found:
            walk.atoms.union_pairs(zip(itertools.repeat(found[0]), found[1:]))
            group[position] = found[0]
    walk.heads[node] = group.reshape(tuple(batch))  # where the heads lie (their groups: the roots, in the end)
    return group.reshape(tuple(batch))


def _baddbmm(walk: Walk, node: fx.Node) -> Any:
    """``baddbmm(base, a, b)``: ``base + a @ b`` (BLOOM's scores, ALiBi as the base)."""
    inner = _contracted(walk, node, node.args[1], node.args[2])
    base = node.args[0]
    if isinstance(base, fx.Node) and isinstance(walk.ids.get(base), Tensor):
        ids = walk.ids[base].expand(inner.shape)
        walk.atoms.couple(inner, ids)
        return torch.where(inner >= 0, inner, ids)
    _meet(walk, node, inner, base)
    return inner


def _attention(walk: Walk, node: fx.Node) -> Any:
    """``scaled_dot_product_attention(q, k, v, attn_mask, ...)``: a head goes whole (:func:`_per_head`).

    Under ``enable_gqa`` each key/value head serves ``heads // kv_heads`` query heads. The mask meets
    the scores: one that carries atoms (T5's position bias, an embedding's columns per head) goes with
    its heads; a computed one with values of its own per head (ALiBi) makes the heads all-or-nothing.
    """
    q, k, v = (walk.ids_or_none(a) for a in node.args[:3])
    value = walk.peek(node)  # (its shape)
    heads = q.shape[-3] if q.dim() >= 3 else 1
    if k.dim() >= 3 and k.shape[-3] not in (heads, 1):  # enable_gqa: each KV head serves heads // kv_heads query heads
        k = k.repeat_interleave(heads // k.shape[-3], dim=-3)
        v = v.repeat_interleave(heads // v.shape[-3], dim=-3)
    batch = tuple(value.shape[:-2])
    group = _per_head(walk, node, batch, [q, k, v])
    if group is None:  # one head, or the same atoms in every one: all of them go together
        stacked = torch.cat([t.expand(*batch, *t.shape[-2:]).reshape(-1) for t in (q, k, v)])
        walk.atoms.couple_along(stacked, [0], f"{describe(node)} attends with whole heads")
        group = stacked.amax().reshape(1).expand(math.prod(batch)).reshape(batch)
    scores = group.reshape(*batch, 1, 1).expand(*batch, q.shape[-2], k.shape[-2])
    mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
    if isinstance(mask, fx.Node):
        if isinstance(walk.ids.get(mask), Tensor):
            walk.atoms.couple(scores, walk.ids[mask].expand(scores.shape))
        else:
            _meet(walk, node, scores, mask)
    return group.reshape(*batch, 1, 1).expand(value.shape)
