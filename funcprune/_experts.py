"""Mixture-of-experts layers as transformers builds them: :func:`routers`, and :func:`never_routed`.

A transformers MoE block holds an *experts* module (its ``num_experts``
experts' weights stacked along a leading dim: Mixtral's ``gate_up_proj``
of shape ``(E, 2 * I, H)`` and ``down_proj`` of shape ``(E, H, I)``) and, beside
it, a *router*: a module whose ``(E, H)`` weight makes one logit per
expert, of which the ``top_k`` best are routed to. Expert ``e`` is one unit:
row ``e`` of the router's weight and index ``e`` of every expert weight.

A removed expert is never routed to. In a masked model, an expert whose
router row the masks prune entirely is *removed*: :func:`never_routed`
makes its logit ``-inf`` (where the shrunk model has no such expert at all),
so that softmax gives it probability 0 and top-k never picks it. So the
masked model computes what the shrunk one does. At least ``top_k`` experts
stay: where the masks prune more router rows, the first of them (lowest
index) stay routed, as ``shrink`` keeps them.

A router that routes by *expert groups* (DeepSeek's ``n_group`` runs of
consecutive experts, of which each token may use ``topk_group``) loses
experts evenly: as many from each group, so that the groups stay runs of
one size. Each group keeps two experts at least (DeepSeek scores a group by
its best two) and enough that ``topk_group`` groups hold ``top_k``
experts (:attr:`Router.least`); where masks prune more rows in one group
than in another, the first pruned rows of the fuller groups stay routed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, final

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ._families import EXPERT_COUNTS, EXPERT_GROUPS, TOP_K, TOPK_GROUPS
from ._types import Tensor

__all__ = ["Router", "never_routed", "removed_experts", "routers"]



@final
@dataclass(frozen=True, slots=True)
class Router:
    """One MoE layer: its router, its experts, and how many of them each token goes to.

    Attributes:
        module: the router module's path (``"model.layers.0.mlp.gate"``).
        weight: the router's ``(count, hidden)`` weight, by name.
        experts: the experts module's path.
        parameters: the experts' parameters (leading dim ``count``), by name.
        count: how many experts there are.
        top_k: how many experts each token is routed to.
        extras: the router's other tensors of one entry per expert (a bias, DeepSeek's
            ``e_score_correction_bias`` buffer), by name: they lose the removed experts' entries.
        groups: how many expert groups it routes by (1: none); they lose experts evenly.
        least: how many experts must stay: ``top_k``, or with expert groups
            ``groups`` times what each keeps (two, and enough for ``top_k`` in
            ``topk_group`` groups).
    """

    module: str
    weight: str
    experts: str
    parameters: tuple[str, ...]
    count: int
    top_k: int
    extras: tuple[str, ...] = ()
    groups: int = 1
    least: int = 0

    def __post_init__(self) -> None:
        if not self.least:
            object.__setattr__(self, "least", self.top_k)


def _int_attr(module: nn.Module, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(module, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def routers(model: nn.Module) -> tuple[Router, ...]:
    """The MoE layers of ``model``, in the order of its modules.

    An experts module counts its experts (``num_experts`` or
    ``num_local_experts``, at least 2) and holds parameters stacked along
    them (leading dim that count, at least 2-D); its router is the one
    sibling module with a 2-D ``weight`` of one row per expert, and
    ``top_k`` (or ``num_experts_per_tok``) on the router or on the block
    that holds both. Experts kept in a ``ModuleList`` (one module each)
    are not recognized: they stay as they are.
    """
    found: list[Router] = []
    for path, module in model.named_modules():
        count = _int_attr(module, EXPERT_COUNTS)
        if count is None or count < 2 or not path:
            continue
        stacked = [
            name for name, p in module.named_parameters(recurse=False) if p.dim() >= 2 and p.shape[0] == count
        ]
        if not stacked:
            continue
        parent_path, _, own = path.rpartition(".")
        parent = model.get_submodule(parent_path)
        candidates = [
            (name, child)
            for name, child in parent.named_children()
            if name != own and _router_weight(child, count) is not None
        ]
        if len(candidates) != 1:
            continue
        name, router = candidates[0]
        top_k = _int_attr(router, TOP_K) or _int_attr(parent, TOP_K)
        if top_k is None or not 1 <= top_k <= count:
            continue
        groups = _int_attr(router, EXPERT_GROUPS) or _int_attr(parent, EXPERT_GROUPS) or 1
        chosen = _int_attr(router, TOPK_GROUPS) or _int_attr(parent, TOPK_GROUPS) or groups
        least = top_k
        if groups > 1 and count % groups == 0 and 1 <= chosen <= groups:
            each = count // groups
            least = groups * min(each, max(2, -(-top_k // chosen)))
        elif groups > 1:  # not runs of one size: experts are left dense
            continue
        prefix = f"{parent_path}." if parent_path else ""
        extras = tuple(
            f"{prefix}{name}.{t}"
            for t, tensor in [*router.named_parameters(recurse=False), *router.named_buffers(recurse=False)]
            if t != "weight" and tensor.dim() == 1 and tensor.shape[0] == count
        )
        found.append(Router(
            f"{prefix}{name}", f"{prefix}{name}.weight", path, tuple(f"{path}.{p}" for p in stacked), count, top_k,
            extras, groups, least,
        ))  # fmt: skip
    return tuple(found)


def _router_weight(module: nn.Module, count: int) -> Tensor | None:
    weight = getattr(module, "weight", None)
    if isinstance(weight, nn.Parameter) and weight.dim() == 2 and weight.shape[0] == count:
        return weight
    return None


def removed_experts(mask: Tensor, least: int, groups: int = 1) -> Tensor:
    """The experts a router-weight mask removes (``(count,)`` bool): rows pruned entirely, ``least`` kept at least.

    Where fewer than ``least`` rows would stay, the first pruned rows stay
    (as ``shrink`` keeps them). With ``groups`` expert groups (runs of
    ``count // groups`` rows), each loses as many as the group that loses
    fewest, and keeps ``least // groups`` at least: in each, its first
    pruned rows beyond that stay. Tensor ops only: works under ``vmap``.
    """
    pruned = ~(mask != 0).any(dim=-1)
    runs = pruned.reshape(*pruned.shape[:-1], groups, pruned.shape[-1] // groups)
    each = runs.shape[-1]
    allowed = runs.sum(-1).amin(-1, keepdim=True).clamp(max=each - least // groups)  # removed per group
    rank = runs.cumsum(-1)  # 1, 2, ... along each group's pruned rows
    return (runs & (rank > runs.sum(-1, keepdim=True) - allowed)).flatten(-2)


#: The ops that add a tensor to the router's scores (where a per-expert extra meets them).
_ADDS = frozenset({torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__})


class _NeverRouted(TorchFunctionMode):
    """Within: a linear whose weight is the running router's gives ``-inf`` to the removed experts' logits.

    A per-expert tensor of the running router added to its scores (DeepSeek's
    score-correction bias, added after a sigmoid that would turn ``-inf``
    into 0) is ``-inf`` at the removed experts too, so that top-k never
    picks them.
    """

    def __init__(self) -> None:
        super().__init__()
        # the router's weight as bound now, its per-expert extras as bound now, and the removed experts
        self.running: list[tuple[Tensor, tuple[Tensor, ...], Tensor]] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.running and func in _ADDS:
            _, extras, removed = self.running[-1]
            args = tuple(a.masked_fill(removed, float("-inf")) if any(a is e for e in extras) else a for a in args)
        out = func(*args, **kwargs)
        if func is torch.nn.functional.linear and self.running:
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            bound, _, removed = self.running[-1]
            if weight is bound:
                out = out.masked_fill(removed, float("-inf"))
        return out


@contextlib.contextmanager
def never_routed(model: nn.Module, masks: Mapping[str, Tensor], layers: Sequence[Router] | None = None) -> Iterator[None]:
    """Within: ``model``'s experts that ``masks`` remove (router row pruned entirely) are never routed to.

    Their router logits are ``-inf``. Nothing happens for a model without
    MoE layers, or masks that prune no router row entirely. Works inside
    :func:`torch.func.functional_call` (the router's weight is read as it
    is bound when the router runs) and under ``vmap`` and ``grad``.
    ``layers``: the model's :func:`routers`, where the caller has them.
    """
    layers = [r for r in (routers(model) if layers is None else layers) if r.weight in masks]
    if not layers:
        yield
        return
    mode = _NeverRouted()
    handles = []
    for layer in layers:
        module = model.get_submodule(layer.module)
        removed = removed_experts(masks[layer.weight], layer.least, layer.groups)

        extras = tuple(name.rpartition(".")[2] for name in layer.extras)

        def enter(m: nn.Module, args: Any, removed: Tensor = removed, extras: tuple[str, ...] = extras) -> None:
            weight: Tensor = m.weight  # type: ignore[assignment]  # a router's weight is a tensor
            mode.running.append((weight, tuple(getattr(m, e) for e in extras), removed))

        def leave(m: nn.Module, args: Any, out: Any) -> None:
            mode.running.pop()

        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave))
    try:
        with mode:
            yield
    finally:
        for handle in handles:
            handle.remove()
