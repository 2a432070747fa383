"""The collection engine: run calls of a module with hooks on some weights and sum a statistic of their inputs.

:func:`collect` is the one engine behind :func:`~funcprune.input_norms`,
:func:`~funcprune.hessians` and the one-shot runner: hooks from
:mod:`._hooks` on the weights' modules, the calls made without autograd,
the hooks removed in a ``finally``, and, with ``across=``, the sums of
every process of a group added by one ``all_reduce``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from .._types import Tensor
from ._calls import Call
from ._exact import FOLDS, ExactSum, Scratch, fold
from ._hooks import (
    ExpertTarget, Running, Statistic, Sum, Target, check_names, collector, expert_target_of,
    experts_collector, holder, target_of,
)  # fmt: skip

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["check_group", "collect"]


def collect(
    fn: str,
    module: nn.Module,
    calls: Iterable[Call],
    names: Iterable[str],
    statistic: Statistic,
    *,
    across: ProcessGroup | None = None,
    run: Callable[[Call], object] | None = None,
    experts: Mapping[str, int] | None = None,
    routed: dict[str, Tensor] | None = None,
    device: torch.device | None = None,
    shared: bool = False,
) -> dict[str, Tensor]:
    """Sum ``statistic`` over every token reaching each named weight's module, in ``calls`` of ``module``.

    The engine of :func:`~funcprune.input_norms` and :func:`~funcprune.hessians` (and
    of the one-shot runner, which calls a block on captured arguments):
    forward pre-hooks, removed before returning, that sum in ``float64`` for
    inputs narrower than ``float32``, in the input's dtype otherwise (the
    ``float64`` ones in an :class:`~._exact.ExactSum`, the same bits in any
    order of the calls); ``across`` sums over a process group in one
    ``all_reduce`` (see :func:`_across`). Everything
    but the calls themselves is checked before the first one runs. Returns
    the sums by name, in the order of ``names``: ``float64`` where an input
    was ``float64`` or narrower than ``float32``, ``float32`` otherwise.
    ``run`` makes each call (``module(*call.args, **call.kwargs)`` if
    ``None``): the runner calls a block through ``functional_call``.

    ``experts``: the names that are stacked expert weights (``(count, ...)``,
    one Linear weight per expert), each with its slices' input dim (``1``
    or ``0``, as :func:`~funcprune._expert_linears.expert_input_dims` gives
    it). Each expert's statistic is summed over the tokens routed to it
    (:func:`~._hooks.experts_collector`) and returned stacked: ``(count,
    in)`` norms (``(count, in, 1)`` for slices stored ``(in, out)``),
    ``(count, in, in)`` Gram matrices; zeros for an expert no token reached.
    ``routed`` receives each one's ``(count,)`` number of tokens per expert.

    With ``across``, every process of the group calls this with its own
    calls and gets the same sums: those of every process's calls, added by
    one ``all_reduce`` (see :func:`_across`; expert sums and token counts
    included). ``device``: where the sums lie (where ``run`` runs the
    calls), for that ``all_reduce``'s buffer; default: the first weight's
    device.

    ``shared``: weights that took the same statistic in every call (a
    block's query, key and value projections) may be given one tensor (the
    runner's, which then factors SparseGPT's Hessian once); by default each
    gets its own.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"{fn}: module must be a torch.nn.Module, got {type(module).__name__}")
    stacked = dict(experts or {})
    chosen = list(dict.fromkeys(check_names(fn, names)))
    targets = [target_of(fn, module, name, statistic) for name in chosen if name not in stacked]
    expert_targets = [expert_target_of(fn, module, name, stacked[name]) for name in chosen if name in stacked]
    check_group(fn, across)
    if not targets and not expert_targets:
        return {}
    sums: dict[str, Sum] = {}  # by weight name
    scratch = Scratch()  # the work tensors of the exact sums
    wide: set[str] = set()  # the weights that received a float64 input
    current = Running(sums)  # the call running: its real tokens, its last input seen, who takes it
    counts: dict[str, Tensor] = {}  # by stacked expert weight: tokens per expert
    handles = []
    try:
        for target in targets:
            hook = collector(fn, target, sums, wide, statistic, current, scratch)
            handles.append(target.owner.register_forward_pre_hook(hook, with_kwargs=True))
        for path in dict.fromkeys(t.path for t in expert_targets):
            group = [t for t in expert_targets if t.path == path]
            hook = experts_collector(fn, path, group, sums, counts, wide, statistic, current, scratch)
            handles.append(group[0].owner.register_forward_pre_hook(hook, with_kwargs=True))
        if across is not None:  # every process's calls: fail together, count together
            every = _across(fn, run or _caller(module), calls, targets, expert_targets, sums, counts, wide, statistic,
                            current, across, device)  # fmt: skip
            if routed is not None:
                routed.update({t.name: counts[t.name] for t in expert_targets})
            return {name: every[name] for name in chosen}
        ran = _run(run or _caller(module), calls, current)
    finally:
        for handle in handles:
            handle.remove()
    out = _totals(fn, ran, targets, sums, wide, statistic, shared)
    out.update(_expert_totals(fn, expert_targets, sums, wide, statistic))
    if routed is not None:
        routed.update({t.name: counts[t.name] for t in expert_targets})
    return {name: out[name] for name in chosen}


def _expert_totals(
    fn: str, targets: list[ExpertTarget], sums: dict[str, Sum], wide: set[str], statistic: Statistic
) -> dict[str, Tensor]:
    """The stacked sums of expert weights, each slice's shaped as a Linear's (or ``Conv1D``'s) would be."""
    out: dict[str, Tensor] = {}
    for t in targets:
        if t.name not in sums:
            raise ValueError(f"{fn}: {holder(t.path)}, holding the experts {t.name!r}, was never called by any "
                             "batch, so their inputs have no statistics; leave it out of names")  # fmt: skip
        total = _value(sums[t.name])
        wider = t.name in wide or (statistic.narrow_in_float64 and total.dtype == torch.float64)
        if statistic.finish is not None:
            total = statistic.finish(total)
        total = total.to(torch.float64 if wider else torch.float32)
        out[t.name] = total.reshape(t.count, *t.shape) if len(statistic.shape(t.features)) == 1 else total
    return out


def _value(total: Sum) -> Tensor:
    return total.value() if isinstance(total, ExactSum) else total


def _totals(
    fn: str, ran: int, targets: list[Target], sums: dict[str, Sum], wide: set[str], statistic: Statistic,
    shared: bool = False,
) -> dict[str, Tensor]:
    """The sums, once the calls ran and every target was called, in their result dtype and shape; one tensor
    each, unless ``shared``."""
    if not ran:
        raise ValueError(
            f"{fn}: no batches: batches was empty; pass at least one calibration batch"
        )
    never = [target for target in targets if target.name not in sums]
    if never:
        raise ValueError(
            f"{fn}: {holder(never[0].path)}, holding {never[0].name!r}, was never called by "
            "any batch, so its inputs have no statistics; leave it out of names (a layer whose "
            "parent uses its weight without calling it, like MultiheadAttention's out_proj, "
            "is never called)"
        )
    out: dict[str, Tensor] = {}
    storages: set[int] = set()
    for t in targets:
        total = _value(sums[t.name])
        wider = t.name in wide or (statistic.narrow_in_float64 and total.dtype == torch.float64)
        if statistic.finish is not None:
            total = statistic.finish(total)
        total = total.to(torch.float64 if wider else torch.float32)
        if not shared and total.untyped_storage().data_ptr() in storages:  # another weight's (the same input)
            total = total.clone()
        storages.add(total.untyped_storage().data_ptr())
        out[t.name] = total.reshape(t.shape) if total.dim() == 1 else total
    return out


def check_group(fn: str, group: object, argument: str = "across") -> None:
    """Refuse, before any batch runs, a ``group`` that is no process group of an initialized ``torch.distributed``.

    ``argument`` names it in the errors (``across``, ``group``).
    """
    if group is None:
        return
    import torch.distributed as dist

    if not dist.is_available() or not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            f"{fn}: {argument} must be a torch.distributed process group (dist.group.WORLD, or one from "
            f"dist.new_group) or None, got {group!r} of type {type(group).__name__}"
        )
    if not dist.is_initialized():
        raise ValueError(f"{fn}: {argument} is a process group, but torch.distributed is not initialized "
                         "(call dist.init_process_group first)")  # fmt: skip


def _across(
    fn: str,
    run: Callable[[Call], object],
    calls: Iterable[Call],
    targets: list[Target],
    expert_targets: list[ExpertTarget],
    sums: dict[str, Sum],
    counts: dict[str, Tensor],
    wide: set[str],
    statistic: Statistic,
    current: Running,
    group: ProcessGroup,
    device: torch.device | None,
) -> dict[str, Tensor]:
    """:func:`collect` over every process of ``group``, each with its own calls; the totals by name.

    A first, small ``all_reduce`` carries whether each process failed, how
    many calls it ran, and per weight whether it was called, had a
    ``float64`` input, and summed in ``float64`` (an input narrower than
    ``float32``): every process decides from the same numbers, and a
    failure on one (a bad batch) fails all instead of leaving them waiting.
    Then the sums, in one ``all_reduce`` (``float64``; expert token counts
    included):

    - those of a weight with a ``float64`` input (on any process) are
      :class:`~._exact.ExactSum` bins, first moved to the highest top bin of
      every process (an ``int8`` ``all_reduce`` of the tops, ``MAX``): bins
      add exactly, so the totals are the bits of one process over every
      process's calls, however they were split;
    - the others, ``float32`` sums (exactly so in ``float64``) or those of
      narrower inputs, are added as they are and cast back: equal to one
      process's up to the order of the additions.
    """
    import torch.distributed as dist

    failure: Exception | None = None
    ran = 0
    try:
        ran = _run(run, calls, current)
    except Exception as e:  # noqa: BLE001 (raised below, on every process)
        failure = e
    every: list[Target | ExpertTarget] = [*targets, *expert_targets]
    shapes = [statistic.shape(t.features) for t in targets]
    shapes += [(t.count, *statistic.shape(t.features)) for t in expert_targets]
    sizes = [math.prod(shape) for shape in shapes]
    k = len(every)
    head = [float(failure is not None), float(ran)] + [float(t.name in sums) for t in every]
    head += [float(t.name in wide) for t in every]
    head += [float(t.name in sums and _dtype(sums[t.name]) == torch.float64) for t in every]
    if device is None:
        first = targets[0].owner.weight if targets else getattr(expert_targets[0].owner, expert_targets[0].attr)
        assert isinstance(first, torch.Tensor)  # a Linear's, Conv1D's or Conv's weight, or a stacked one
        device = first.device  # the same on every process, batches run or not (a CUDA group's)
    flags = torch.tensor(head, dtype=torch.float64, device=device)
    dist.all_reduce(flags, group=group)
    if failure is not None:
        raise failure
    if flags[0]:
        raise ValueError(f"{fn}: another process of the group failed on its batches (its own error says why)")
    called, widened, narrow = flags[2 : 2 + k], flags[2 + k : 2 + 2 * k], flags[2 + 2 * k : 2 + 3 * k]
    # the exact sums of the weights that had a float64 input on some process: this one's (none called here, or
    # called with another dtype: its running sum as one term)
    exact = {t.name: ExactSum.of(sums.get(t.name), shape, device) for i, (t, shape) in enumerate(zip(every, shapes,
             strict=True)) if widened[i]}  # fmt: skip
    if exact:  # every process's bins moved to the same tops
        tops = torch.cat([held.top.flatten() for held in exact.values()])
        dist.all_reduce(tops, op=dist.ReduceOp.MAX, group=group)
        start = 0
        for held in exact.values():
            held.move_to(tops[start : start + held.top.numel()])
            start += held.top.numel()
    parts = []
    for t, n in zip(every, sizes, strict=True):
        mine = exact[t.name].bins if t.name in exact else sums.get(t.name)
        parts.append(_value(mine).to(device, torch.float64).flatten() if mine is not None
                     else torch.zeros(n, dtype=torch.float64, device=device))  # fmt: skip
    for t in expert_targets:
        tokens = counts[t.name].to(device, torch.float64) if t.name in counts else None
        parts.append(tokens if tokens is not None else torch.zeros(t.count, dtype=torch.float64, device=device))
    flat = torch.cat(parts)
    dist.all_reduce(flat, group=group)
    total: dict[str, Sum] = {}
    start = 0
    for i, (t, n, shape) in enumerate(zip(every, sizes, shapes, strict=True)):
        if t.name in exact:
            size = n * FOLDS
            total[t.name] = fold(flat[start : start + size].reshape(FOLDS, *shape))
            start += size
            continue
        if called[i]:
            dtype = torch.float64 if narrow[i] else torch.float32
            total[t.name] = flat[start : start + n].reshape(shape).to(dtype)
        start += n
    for t in expert_targets:
        counts[t.name] = flat[start : start + t.count].to("cpu", torch.int64)
        start += t.count
    wider = {t.name for i, t in enumerate(every) if widened[i]}
    out = _totals(fn, int(flags[1]), targets, total, wider, statistic)
    out.update(_expert_totals(fn, expert_targets, total, wider, statistic))
    return out


def _dtype(total: Sum) -> torch.dtype:
    return torch.float64 if isinstance(total, ExactSum) else total.dtype


def _caller(module: nn.Module) -> Callable[[Call], object]:
    return lambda call: module(*call.args, **call.kwargs)


def _run(run: Callable[[Call], object], calls: Iterable[Call], current: Running) -> int:
    """Make every call, without autograd; return how many ran."""
    ran = 0
    with torch.no_grad():
        try:
            for call in calls:
                current.tokens = call.tokens
                run(call)
                current.end_call()
                ran += 1
        finally:
            current.tokens = None
            current.forget()
    return ran
