"""One block of the one-shot runner: its statistics collected, its weights pruned, the held states advanced.

``step`` is what :func:`~funcprune.oneshot` and the streamed
:func:`~funcprune.oneshot_checkpoint` do for each block: the method's
statistic gathered by the criteria layer's ``collect`` engine through
``torch.func.functional_call`` (summed across a process group, if one is
given: one ``all_reduce`` per block), the method called on the block's
weights (``_pruned``: plain weights in one call, each experts module's
stacks in one more, experts no token reached by magnitude), and the pruned
block run on the held hidden states to give the next block's inputs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .._apply import functional_call_masked
from .._criteria import Call, Statistic, collect, same_hessians
from .._specs import Spec
from .._types import Tensor
from ._layers import Captured, hidden_of
from ._memory import trim
from ._methods import Magnitude, Method, SparseGPT, Wanda, prune_with

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["UnroutedExpertsWarning", "step"]


class UnroutedExpertsWarning(UserWarning):
    """Experts of an MoE layer that no calibration token reached: :func:`~funcprune.oneshot` pruned them by magnitude.

    A stacked expert weight's slice ``W[e]`` is calibrated on the tokens
    routed to expert ``e`` alone. An expert that none reached (on the model
    pruned so far, padding left out) has no statistics to prune from: its
    slices are pruned by magnitude (``|W[e]|``) to the same spec, so that
    the counts stay exact, and left as they are otherwise (SparseGPT does
    not update them). The message names the experts module and the
    experts. Calibrate on more tokens to prune every expert from its
    inputs.
    """


def step(
    fn: str,
    method: Method,
    statistic: Statistic,
    held: Captured,
    i: int,
    block: nn.Module,
    prefix: str,
    own: dict[str, Tensor],
    buffers: dict[str, Tensor] | None,
    where: torch.device | None,
    names: list[str],
    specs: dict[str, Spec],
    dims: Mapping[str, int],
    experts: Mapping[str, int],
    *,
    advance: bool,
    group: ProcessGroup | None = None,
    inplace: bool = False,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Block ``i`` (``own``: its parameters by local name) pruned on ``held``, which then advances if ``advance``;
    its statistics summed across ``group`` (``oneshot``'s); the new weights written into ``own``'s tensors if
    ``inplace`` (the streamed run's, which read them for this block alone).

    The new value (on ``where``) and mask of each of ``names``, by full name (oneshot's and the streamed run's).
    """
    moved = {n: p.detach().to(where) for n, p in own.items()} if where is not None else dict(own)
    these: dict[str, Tensor] = {}  # by local name
    weights: dict[str, Tensor] = {}
    failure: Exception | None = None
    try:
        if names:
            # each on a copy of the states held: a block may add to its input in place, and they are
            # needed as they are to advance
            block_calls = (held.call(i, b, held.hidden[b].clone()) for b in range(len(held.hidden)))
            changed, got = _prune_block(fn, method, statistic, block, prefix, moved, buffers, where, names,
                                        block_calls, specs, dims, experts, group, inplace)  # fmt: skip
            for full, mask in got.items():
                local_name = full[len(prefix) :]
                these[local_name] = mask
                moved[local_name] = changed.get(full, moved[local_name])
                weights[full] = moved[local_name]
        if advance:
            # SparseGPT's new weights are 0 wherever pruned (an expert's slices pruned by magnitude are not):
            # multiplying them by their masks would change no bit, and costs a pass and a copy of each
            zeroed = type(method) is SparseGPT
            applied = {n: m for n, m in these.items() if not (zeroed and prefix + n not in experts)}
            for b in range(len(held.hidden)):
                call = _on(held.call(i, b), where)
                with torch.no_grad():
                    out = functional_call_masked(block, moved, applied, call.args, call.kwargs, buffers=buffers)
                held.hidden[b] = hidden_of(fn, i, out).detach()
    except Exception as error:  # noqa: BLE001 (re-raised below, after the group has heard of it)
        if group is None:
            raise
        failure = error
    if group is not None:  # every process learns whether one failed, so that none waits in the next block's
        _agree(fn, i, failure, group, next(iter(moved.values())).device if moved else torch.device("cpu"))
    return weights, {full: these[full[len(prefix) :]] for full in weights}


def _agree(fn: str, i: int, failure: Exception | None, group: ProcessGroup, device: torch.device) -> None:
    """One small ``all_reduce`` of whether each process failed in block ``i``: its own error on the process that
    failed, a :class:`ValueError` saying so on the others (none waits for a collective another never reaches)."""
    import torch.distributed as dist

    flag = torch.tensor([0.0 if failure is None else 1.0], dtype=torch.float64, device=device)
    dist.all_reduce(flag, group=group)
    if failure is not None:
        raise failure
    if float(flag.item()) > 0:
        raise ValueError(f"{fn}: another process of the group failed in block {i} (its own error says why)")


#: The built-in methods, whose result for a weight depends on its own statistic alone: called a weight at a time.
_SEPARABLE = (Magnitude, Wanda, SparseGPT)


def _dims_of(names: list[str], dims: Mapping[str, int]) -> dict[str, int]:
    """The input dims of ``names`` that have one."""
    return {n: dims[n] for n in names if n in dims}


def _at_once(
    fn: str,
    method: Method,
    params: dict[str, Tensor],
    specs: dict[str, Spec],
    dims: Mapping[str, int],
    experts: Mapping[str, int],
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """A method without statistics, on every weight in one call (one per experts module): ``(params, masks)``."""
    names = list(specs)
    changed, masks = _pruned(fn, method, names, params, {}, None, specs, dims, experts, inplace=False)
    return {**params, **changed}, {n: masks[n] for n in names}


def _pruned(
    fn: str,
    method: Method,
    names: list[str],
    weights: Mapping[str, Tensor],
    statistics: Mapping[str, Tensor],
    routed: Mapping[str, Tensor] | None,
    specs: Mapping[str, Spec],
    dims: Mapping[str, int],
    experts: Mapping[str, int],
    *,
    inplace: bool,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``names`` pruned by ``method``: the ordinary weights in one call (a built-in method's, one weight at a
    time), each experts module's stacks in one more.

    ``routed``: each stacked weight's tokens per expert (``None``: a method
    without statistics, every expert pruned alike). The experts no token
    reached are pruned by magnitude to the same spec, with a
    :class:`UnroutedExpertsWarning`. ``inplace``: each new weight is
    written into its tensor in ``weights`` as soon as it is made, and
    returned as that tensor. ``statistics`` are the caller's own (what
    ``collect`` made for this call): SparseGPT overwrites each Hessian with
    its factor.

    The built-in methods prune each weight from its own statistic alone (a
    weight's result does not depend on the others'), so they are called a
    weight at a time: what a call makes (Wanda's scores, the plan's
    workspace, SparseGPT's copy) is one weight's at most, not the block's;
    SparseGPT takes consecutive weights whose Hessians are equal (q, k and
    v; gate and up) in one call, which factors that Hessian once.
    A method of your own gets the block's weights in one call, as
    :meth:`Method.prune` says.
    """
    plain = [n for n in names if n not in experts]
    calls = [[n] for n in plain] if isinstance(method, _SEPARABLE) else [plain]
    if isinstance(method, SparseGPT):  # weights with equal Hessians (q, k, v; gate, up): one call, one factor
        calls, statistics = _sharing(calls, statistics)
    new: dict[str, Tensor] = {}
    masks: dict[str, Tensor] = {}
    for some in calls:  # (the statistics are collect's, made for this call: SparseGPT may consume them)
        got, more = prune_with(fn, method, {n: weights[n] for n in some}, {n: statistics[n] for n in some if n in
                               statistics}, {n: specs[n] for n in some}, _dims_of(some, dims),
                               consume=True)  # fmt: skip
        masks.update(more)
        for n, t in got.items():
            if inplace:
                with torch.no_grad():  # (the model's own parameters, for oneshot's inplace=True)
                    new[n] = weights[n].copy_(t)
            else:
                new[n] = t
        del got, more
    stacked = [n for n in names if n in experts]
    for module in dict.fromkeys(n.rpartition(".")[0] for n in stacked):
        group = [n for n in stacked if n.rpartition(".")[0] == module]
        count = weights[group[0]].shape[0]
        reached = torch.ones(count, dtype=torch.bool)
        if routed is not None:
            reached = torch.stack([routed[n] > 0 for n in group]).all(dim=0)
        cut = {n: specs[n] for n in group}
        slice_dims = {n: experts[n] for n in group}
        pieces: list[tuple[Tensor, Method, dict[str, Tensor]]] = []
        if bool(reached.any()):
            which = reached.nonzero().flatten()
            pieces.append((which, method, {n: statistics[n][which.to(statistics[n].device)] for n in group
                                           if n in statistics}))  # fmt: skip
        if not bool(reached.all()):
            which = (~reached).nonzero().flatten()
            warnings.warn(
                f"{fn}: no calibration token reached experts {which.tolist()} of {count} of {module!r}; their "
                f"slices of {', '.join(map(repr, group))} are pruned by magnitude to the same spec (counts stay "
                "exact; their weights are not updated); calibrate on more tokens to prune them from their inputs",
                UnroutedExpertsWarning,
                stacklevel=4,
            )
            pieces.append((which, Magnitude(), {}))
        for n in group:
            masks[n] = torch.empty(weights[n].shape, dtype=torch.bool, device=weights[n].device)
        for which, how, stats in pieces:
            at = which.to(weights[group[0]].device)
            got, more = prune_with(fn, how, {n: weights[n][at] for n in group}, stats, cut, slice_dims, experts=True)
            for n in group:
                masks[n][at] = more[n]
                if n in got:
                    if n not in new:
                        new[n] = weights[n].detach() if inplace else weights[n].detach().clone()
                    with torch.no_grad():
                        new[n][at] = got[n]
    return new, masks


def _sharing(
    calls: list[list[str]], statistics: Mapping[str, Tensor]
) -> tuple[list[list[str]], Mapping[str, Tensor]]:
    """``calls`` with each call of one name joined to the call before where their Hessians are equal, and the
    statistics with the joined names given the first one's tensor (``sparsegpt`` then sees one Hessian, without
    comparing them again)."""
    joined: list[list[str]] = []
    shared = dict(statistics)
    for some in calls:
        if joined and len(some) == 1 and some[0] in shared and joined[-1][-1] in shared:
            before = shared[joined[-1][-1]]
            if same_hessians(before, shared[some[0]]):
                joined[-1] = [*joined[-1], *some]
                shared[some[0]] = before
                continue
        joined.append(list(some))
    return joined, shared


def _on(call: Call, where: torch.device | None) -> Call:
    """``call`` with its tensors on ``where`` (as it is for ``None``)."""
    if where is None:
        return call
    return Call(_to(call.args, where), _to(call.kwargs, where), call.tokens)


def _to(value: Any, where: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(where)
    if isinstance(value, tuple):
        return tuple(_to(v, where) for v in value)
    if isinstance(value, list):
        return [_to(v, where) for v in value]
    if isinstance(value, dict):
        return {k: _to(v, where) for k, v in value.items()}
    return value


def _runner(
    block: nn.Module, params: dict[str, Tensor], buffers: dict[str, Tensor] | None, where: torch.device | None
) -> Callable[[Call], object]:
    """A call of ``block`` on ``params`` (and ``buffers``), through ``functional_call``, on ``where``."""
    state = {**params, **(buffers or {})}

    def run(call: Call) -> object:
        moved = _on(call, where)
        return torch.func.functional_call(block, state, moved.args, moved.kwargs)

    return run


def _prune_block(
    fn: str,
    method: Method,
    statistic: Statistic,
    block: nn.Module,
    prefix: str,
    params: dict[str, Tensor],
    buffers: dict[str, Tensor] | None,
    where: torch.device | None,
    names: list[str],
    block_calls: Iterable[Call],
    specs: dict[str, Spec],
    dims: Mapping[str, int],
    experts: Mapping[str, int],
    group: ProcessGroup | None,
    inplace: bool,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """One block's new weights and masks from ``method``, by full name (so that errors name them whole).

    Across ``group``, the block's statistics (and tokens per expert) of every process are added by one
    ``all_reduce`` (:func:`~funcprune._criteria.collect`'s ``across``).
    """
    local = [n[len(prefix) :] for n in names]
    stacked = {n[len(prefix) :]: experts[n] for n in names if n in experts}
    counts: dict[str, Tensor] = {}
    sums = collect(fn, block, block_calls, local, statistic, across=group, run=_runner(block, params, buffers, where),
                   experts=stacked, routed=counts, device=where, shared=True)  # fmt: skip
    trim()  # (the calls' workspace handed back before the pruning's is made)
    weights = {prefix + n: params[n] for n in local}
    statistics = {prefix + n: s for n, s in sums.items()}
    routed = {prefix + n: c for n, c in counts.items()}
    return _pruned(fn, method, names, weights, statistics, routed, specs, dims, experts, inplace=inplace)
