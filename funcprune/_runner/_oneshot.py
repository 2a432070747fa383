"""``oneshot``: prune a model block by block with calibration data, as Wanda's and SparseGPT's scripts do."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from .._apply import functional_call_masked
from .._criteria import NORMS, Call, Statistic, calls, collect
from .._expert_linears import expert_input_dims
from .._experts import routers
from .._specs import Spec
from .._targets import input_dims
from .._types import Tensor
from ._layers import Capture, Captured, find_layers, hidden_of
from ._methods import Magnitude, Method, method_of, prune_with
from ._weights import check_groups, owl_specs, specs_of, weights_named

__all__ = ["UnroutedExpertsWarning", "oneshot", "step"]


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


def oneshot(
    model: nn.Module,
    batches: Iterable[object],
    *,
    method: Method | str,
    spec: Spec,
    names: Iterable[str] | None = None,
    allocation: str | Mapping[str, float] | None = None,
    device: torch.device | str | None = None,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Prune ``model`` once, block by block, on calibration batches; return its new params and masks.

    The runner finds the model's repeated blocks (a transformers model's
    decoder or encoder layers: the ``ModuleList`` of modules of one class
    holding the most parameters) and walks them in order, as the Wanda and
    SparseGPT scripts do:

    1. it runs the model once per batch up to the first block (the later
       blocks pass their input through while this runs, so that their
       arguments are recorded without computing them) and keeps the first
       block's input hidden states and every block's other arguments
       (attention mask, position ids or rotary embeddings; a transformers
       forward gets ``use_cache=False``); with ``allocation="owl"`` the
       dense blocks compute, for OWL's statistics;
    2. for each block: it runs the block on the hidden states held, with
       hooks collecting what the method's ``statistic`` names for its
       weights (:class:`~funcprune.Wanda`: input norms,
       :func:`~funcprune.input_norms`; :class:`~funcprune.SparseGPT`:
       Hessians, :func:`~funcprune.hessians`), gets the block's masks (and
       new weights, SparseGPT's) from the method's ``prune``, then runs
       the *pruned* block on the same hidden states to get the next
       block's inputs. Later blocks are calibrated on what the pruned model
       computes; all the weights of one block are calibrated on the same
       inputs (not re-run after each layer: SparseGPT's default, not its
       ``--true-sequential``).

    Only one block's hidden states over the calibration set are held at a
    time, beside the model, the new weights and the blocks' other
    arguments (small, but a padded batch's 4-D attention mask is ``tokens²``
    per sequence). Weights named outside the blocks are pruned last, with
    statistics from one pass of the whole pruned model: an LM head, if
    named, on what the pruned blocks compute; a layer before the blocks
    (OPT's ``project_in``) after the blocks were calibrated on its dense
    output.

    A method that needs no statistic (:class:`~funcprune.Magnitude`)
    prunes every weight in one call and reads no batch (unless OWL's
    allocation needs them).

    Specs are read on each weight as ``(out, in)`` (a transformers
    ``Conv1D`` weight, stored ``(in, out)``, included: see
    :func:`~funcprune.input_dims`): ``fp.L1Unstructured(f)`` prunes a
    fraction of each weight (SparseGPT: of each block of its ``blocksize``
    columns), ``fp.PerSlice(fp.L1Unstructured(f), dim=0)`` of each output
    row (Wanda's default comparison group; SparseGPT: of each row of each
    column block), ``fp.NM(n, m)`` keeps ``n`` of every ``m`` consecutive
    inputs. Magnitude and Wanda take any spec a :class:`~funcprune.Plan`
    takes, scored by ``|W|`` or by Wanda's ``|W| * ||X||``; SparseGPT
    takes these three (see :func:`~funcprune.sparsegpt`). Counts are exact.

    Mixture-of-experts layers (transformers' experts modules, whose experts'
    weights are stacked: Mixtral's ``experts.gate_up_proj`` ``(E, 2I, H)``
    and ``experts.down_proj`` ``(E, H, I)``) are pruned expert by expert:
    each slice ``W[e]`` is pruned as its own Linear weight (the spec applies
    to each expert's matrix: half of it, 2 of every 4 of its inputs), from
    the statistics of the calibration tokens that the model pruned so far
    routes to expert ``e`` alone (padding left out). To collect them, a
    hook runs the experts' eager forward once more on the real tokens
    (whatever ``config._experts_implementation`` says) and reads each
    ``F.linear(x, W[e])`` (or ``x @ W[e]``, GPT-OSS's layout). An expert
    that no calibration token reaches is pruned by magnitude to the same
    spec (counts stay exact; its weights are not updated), with an
    :class:`~funcprune.UnroutedExpertsWarning` naming the layer and the
    experts. Routers stay dense unless named.

    Args:
        model: the model. It is never modified: its parameters, buffers,
            hooks and mode stay as they are (call ``model.eval()`` first to
            calibrate without dropout).
        batches: calibration batches, each called as ``model(batch)`` (a
            tensor), ``model(*batch)`` (a tuple or list) or
            ``model(**batch)`` (a dict; its ``attention_mask`` keeps padding
            out of the statistics). Consumed once; not read by a method
            without a statistic (magnitude) unless ``allocation="owl"``.
        method: the one-shot method, a value: :class:`~funcprune.Magnitude`,
            :class:`~funcprune.Wanda`, :class:`~funcprune.SparseGPT` (with
            its ``blocksize`` and ``percdamp``) or your own
            :class:`~funcprune.Method`; or a shorthand for a built-in's
            defaults: ``"magnitude"``, ``"wanda"`` or ``"sparsegpt"``.
        spec: the mask shape and amount, as above.
        names: the weights to prune, as ``named_parameters()`` names them.
            Default: ``fp.prunable(model, experts=True)``'s weights inside
            the blocks (Linear and ``Conv1D`` layers, and the stacked
            expert weights of MoE layers; routers, embeddings and the LM
            head stay dense). A method with a statistic (Wanda, SparseGPT)
            needs Linear or ``Conv1D`` weights, or stacked expert weights
            whose slices the experts read as Linear weights (not their
            biases).
        allocation: how much each weight prunes. ``None`` or ``"uniform"``:
            the spec's amount everywhere; ``"owl"``: OWL's per-block
            sparsities (:func:`~funcprune.owl_sparsity`, ``lam=0.08,
            m=5``, from the Wanda scores of the dense model, collected in
            step 1), averaging the spec's fraction; a mapping ``{name:
            sparsity}`` for every name. Other than uniform, the spec must be
            ``L1Unstructured`` or ``PerSlice(L1Unstructured)`` with a float
            fraction, which each weight's sparsity replaces.
        device: where each block runs (``"cuda"``): its parameters, buffers
            and the hidden states are copied there one block at a time and
            the results copied back to where each weight lies (so the
            params returned for the blocks' weights are copies, not the
            model's tensors). The capture pass (the embeddings and block 0)
            runs where the model is. ``None``: where the model is.

    Returns:
        ``(params, masks)``: a new dict of every parameter by name (the
        model's own tensors, but SparseGPT's updated weights, whose pruned
        entries are 0) and ``{name: mask}`` (``torch.bool``, ``True`` =
        kept) for every weight pruned: ready for
        :func:`~funcprune.functional_call_masked`, ``model.load_state_dict(
        params, strict=False)`` and :func:`~funcprune.bake`, or
        :func:`~funcprune.shrink`.

    Raises:
        TypeError: if an argument has the wrong type.
        UnknownNameError: if a name is not a parameter of ``model``.
        ValueError: if the method, spec, allocation or a name is not one
            this supports (raised before any batch runs), if no repeated
            blocks are found, if there are no batches, if a block is
            called other than once per forward with its hidden states, or
            if a method's ``prune`` returns other than a mask of each
            weight it was given (and new weights like them).
    """
    fn = "oneshot"
    if not isinstance(model, nn.Module):
        raise TypeError(f"{fn}: model must be a torch.nn.Module, got {type(model).__name__}")
    chosen_method, statistic = method_of(fn, method)
    if not isinstance(spec, Spec):
        raise TypeError(f"{fn}: spec must be a funcprune spec (fp.L1Unstructured(0.5), fp.NM(2, 4), ...), "
                        f"got {type(spec).__name__}")  # fmt: skip
    chosen_method.check_spec(spec)
    layers = find_layers(fn, model)
    params: dict[str, Tensor] = dict(model.named_parameters())
    expert_dims = expert_input_dims(model, routers(model))
    chosen = weights_named(fn, model, layers, names, params, method, statistic is not None, expert_dims)
    specs = specs_of(fn, spec, chosen, allocation)
    dims = input_dims(model)
    experts = {n: d for n in chosen if (d := expert_dims.get(n)) is not None}  # stacks: one weight per expert
    check_groups(fn, specs, params, dims, experts)
    where = torch.device(device) if device is not None else None
    stream = calls(fn, batches)
    owl = allocation == "owl"
    inside = [[n for n in chosen if n.startswith(layers.prefix(i))] for i in range(len(layers.modules))]
    outside = [n for n in chosen if not any(n in block for block in inside)]
    if owl and not any(inside):
        raise ValueError(f"{fn}: allocation='owl' sets per-block sparsities, but no weight named is inside the "
                         f"blocks {layers.path!r}")  # fmt: skip
    if not chosen:
        return dict(params), {}
    if statistic is None and not owl:  # nothing to collect: no batch is read
        return _at_once(fn, chosen_method, params, specs, dims, experts)

    kept_calls: list[Call] = []
    if outside and statistic is not None:
        stream = _kept(stream, kept_calls)
    capture = Capture(fn, model, layers, whole=owl)
    with capture:
        if owl:
            named = [n for block in inside for n in block]
            norms = collect(fn, model, stream, named, NORMS, run=capture, experts=experts)
            specs.update(owl_specs(fn, spec, {n: params[n] for n in named}, norms, layers, experts))
        else:
            for call in stream:
                capture(call)
    held = capture.captured
    if not held.hidden:
        raise ValueError(f"{fn}: no batches: batches was empty; pass at least one calibration batch")
    if statistic is None:  # OWL's sparsities were all it needed the batches for
        return _at_once(fn, chosen_method, params, specs, dims, experts)
    new: dict[str, Tensor] = dict(params)
    masks: dict[str, Tensor] = {}
    last = max((i for i, here in enumerate(inside) if here), default=-1)
    for i, block in enumerate(layers.modules[: last + 1]):
        prefix = layers.prefix(i)
        own: dict[str, Tensor] = {n: new[prefix + n] for n, _ in block.named_parameters()}
        buffers = {n: b.to(where) for n, b in block.named_buffers()} if where is not None else None
        weights, got = step(fn, chosen_method, statistic, held, i, block, prefix, own, buffers, where, inside[i],
                            specs, dims, experts, advance=i < last)  # fmt: skip
        for full, mask in got.items():
            new[full] = weights[full].to(params[full].device) if where is not None else weights[full]
            masks[full] = mask.to(params[full].device)
    del held
    if outside:
        weights, more = _outside(fn, chosen_method, statistic, model, new, masks, outside, specs, dims, experts,
                                 kept_calls)  # fmt: skip
        new.update(weights)
        masks.update(more)
    return new, {n: masks[n] for n in chosen}


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
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Block ``i`` (``own``: its parameters by local name) pruned on ``held``, which then advances if ``advance``.

    The new value (on ``where``) and mask of each of ``names``, by full name (oneshot's and the streamed run's).
    """
    moved = {n: p.detach().to(where) for n, p in own.items()} if where is not None else dict(own)
    these: dict[str, Tensor] = {}  # by local name
    weights: dict[str, Tensor] = {}
    if names:
        # each on a copy of the states held: a block may add to its input in place, and they are
        # needed as they are to advance
        block_calls = (held.call(i, b, held.hidden[b].clone()) for b in range(len(held.hidden)))
        changed, got = _prune_block(fn, method, statistic, block, prefix, moved, buffers, where, names, block_calls,
                                    specs, dims, experts)  # fmt: skip
        for full, mask in got.items():
            local_name = full[len(prefix) :]
            these[local_name] = mask
            moved[local_name] = changed.get(full, moved[local_name])
            weights[full] = moved[local_name]
    if advance:
        for b in range(len(held.hidden)):
            call = _on(held.call(i, b), where)
            with torch.no_grad():
                out = functional_call_masked(block, moved, these, call.args, call.kwargs, buffers=buffers)
            held.hidden[b] = hidden_of(fn, i, out).detach()
    return weights, {full: these[full[len(prefix) :]] for full in weights}


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
    changed, masks = _pruned(fn, method, names, params, {}, None, specs, dims, experts)
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
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``names`` pruned by ``method``: the ordinary weights in one call, each experts module's stacks in one more.

    ``routed``: each stacked weight's tokens per expert (``None``: a method
    without statistics, every expert pruned alike). The experts no token
    reached are pruned by magnitude to the same spec, with a
    :class:`UnroutedExpertsWarning`.
    """
    plain = [n for n in names if n not in experts]
    new, masks = prune_with(fn, method, {n: weights[n] for n in plain}, {n: statistics[n] for n in plain if n in
                            statistics}, {n: specs[n] for n in plain}, _dims_of(plain, dims))  # fmt: skip
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
                        new[n] = weights[n].detach().clone()
                    new[n][at] = got[n]
    return new, masks


def _kept(stream: Iterable[Call], into: list[Call]) -> Iterator[Call]:
    """The calls of ``stream``, each also appended to ``into`` (for a second pass)."""
    for call in stream:
        into.append(call)
        yield call


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
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """One block's new weights and masks from ``method``, by full name (so that errors name them whole)."""
    local = [n[len(prefix) :] for n in names]
    stacked = {n[len(prefix) :]: experts[n] for n in names if n in experts}
    counts: dict[str, Tensor] = {}
    sums = collect(fn, block, block_calls, local, statistic, run=_runner(block, params, buffers, where),
                   experts=stacked, routed=counts)  # fmt: skip
    weights = {prefix + n: params[n] for n in local}
    statistics = {prefix + n: s for n, s in sums.items()}
    routed = {prefix + n: c for n, c in counts.items()}
    return _pruned(fn, method, names, weights, statistics, routed, specs, dims, experts)


def _outside(
    fn: str,
    method: Method,
    statistic: Statistic,
    model: nn.Module,
    params: dict[str, Tensor],
    masks: dict[str, Tensor],
    names: list[str],
    specs: dict[str, Spec],
    dims: Mapping[str, int],
    experts: Mapping[str, int],
    kept: list[Call],
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The weights named outside the blocks: pruned from one pass of the model pruned so far."""

    def run(call: Call) -> object:
        return functional_call_masked(model, params, masks, call.args, call.kwargs)

    counts: dict[str, Tensor] = {}
    stacked = {n: experts[n] for n in names if n in experts}
    sums = collect(fn, model, kept, names, statistic, run=run, experts=stacked, routed=counts)
    return _pruned(fn, method, names, params, sums, counts, specs, dims, experts)
