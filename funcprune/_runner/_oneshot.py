"""``oneshot``: prune a model block by block with calibration data, as Wanda's and SparseGPT's scripts do."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from .._apply import functional_call_masked
from .._criteria import (
    GRAMS,
    NORMS,
    Call,
    calls,
    collect,
    owl_sparsity,
    sparsegpt,
    wanda,
)
from .._names import not_a_parameter
from .._plans import Plan
from .._specs import NM, L1Unstructured, PerSlice, Spec
from .._targets import input_dims, prunable
from .._types import Tensor, is_conv1d
from ._layers import Capture, RepeatedLayers, find_layers, hidden_of

__all__ = ["oneshot"]

_METHODS = ("magnitude", "wanda", "sparsegpt")


def oneshot(
    model: nn.Module,
    batches: Iterable[object],
    *,
    method: str,
    spec: Spec,
    names: Iterable[str] | None = None,
    allocation: str | Mapping[str, float] | None = None,
    device: torch.device | str | None = None,
    blocksize: int = 128,
    percdamp: float = 0.01,
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
       hooks collecting what its weights need (``"wanda"``: input norms,
       :func:`~funcprune.input_norms`; ``"sparsegpt"``: Hessians,
       :func:`~funcprune.hessians`; ``"magnitude"``: nothing), computes the
       block's masks (and, for SparseGPT, its new weights), then runs the
       *pruned* block on the same hidden states to get the next block's
       inputs. Later blocks are calibrated on what the pruned model
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

    Specs are read on each weight as ``(out, in)`` (a transformers
    ``Conv1D`` weight, stored ``(in, out)``, included: see
    :func:`~funcprune.input_dims`): ``fp.L1Unstructured(f)`` prunes a
    fraction of each weight (SparseGPT: of each block of ``blocksize``
    columns), ``fp.PerSlice(fp.L1Unstructured(f), dim=0)`` of each output
    row (Wanda's default comparison group; SparseGPT: of each row of each
    column block), ``fp.NM(n, m)`` keeps ``n`` of every ``m`` consecutive
    inputs. Magnitude and Wanda take any spec a :class:`~funcprune.Plan`
    takes, scored by ``|W|`` or by Wanda's ``|W| * ||X||``; SparseGPT
    takes these three (see :func:`~funcprune.sparsegpt`). Counts are exact.

    Args:
        model: the model. It is never modified: its parameters, buffers,
            hooks and mode stay as they are (call ``model.eval()`` first to
            calibrate without dropout).
        batches: calibration batches, each called as ``model(batch)`` (a
            tensor), ``model(*batch)`` (a tuple or list) or
            ``model(**batch)`` (a dict; its ``attention_mask`` keeps padding
            out of the statistics). Consumed once; not read by
            ``"magnitude"`` without ``"owl"``.
        method: ``"magnitude"``, ``"wanda"`` or ``"sparsegpt"``.
        spec: the mask shape and amount, as above.
        names: the weights to prune, as ``named_parameters()`` names them.
            Default: :func:`~funcprune.prunable`'s weights inside the blocks
            (Linear and ``Conv1D`` layers; routers, embeddings and the LM
            head stay dense). Wanda and SparseGPT need Linear or ``Conv1D``
            weights.
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
        blocksize: SparseGPT's column block (default 128).
        percdamp: SparseGPT's dampening (default 0.01).

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
            blocks are found, if there are no batches, or if a block is
            called other than once per forward with its hidden states.
    """
    fn = "oneshot"
    if not isinstance(model, nn.Module):
        raise TypeError(f"{fn}: model must be a torch.nn.Module, got {type(model).__name__}")
    if method not in _METHODS:
        raise ValueError(f"{fn}: method must be one of {', '.join(map(repr, _METHODS))}, got {method!r}")
    if not isinstance(spec, Spec):
        raise TypeError(f"{fn}: spec must be a funcprune spec (fp.L1Unstructured(0.5), fp.NM(2, 4), ...), "
                        f"got {type(spec).__name__}")  # fmt: skip
    if method == "sparsegpt":
        sparsegpt({}, {}, spec, blocksize=blocksize, percdamp=percdamp)  # checks them, on nothing
    blocks = find_layers(fn, model)
    params: dict[str, Tensor] = dict(model.named_parameters())
    chosen = _names(fn, model, blocks, names, params, method)
    specs = _specs(fn, spec, chosen, allocation)
    dims = input_dims(model)
    _check_shapes(fn, specs, params, dims)
    where = torch.device(device) if device is not None else None
    stream = calls(fn, batches)
    owl = allocation == "owl"
    inside = [[n for n in chosen if n.startswith(blocks.prefix(i))] for i in range(len(blocks.modules))]
    outside = [n for n in chosen if not any(n in block for block in inside)]
    if owl and not any(inside):
        raise ValueError(f"{fn}: allocation='owl' sets per-block sparsities, but no weight named is inside the "
                         f"blocks {blocks.path!r}")  # fmt: skip
    if not chosen or (method == "magnitude" and not owl):
        return dict(params), _magnitude(specs, params, dims)

    kept_calls: list[Call] = []
    if outside and method != "magnitude":
        stream = _kept(stream, kept_calls)
    capture = Capture(fn, model, blocks, whole=owl)
    with capture:
        if owl:
            named = [n for block in inside for n in block]
            norms = collect(fn, model, stream, named, NORMS, run=capture)
            specs.update(_owl(fn, spec, {n: params[n] for n in named}, norms, blocks))
        else:
            for call in stream:
                capture(call)
    held = capture.captured
    if not held.hidden:
        raise ValueError(f"{fn}: no batches: batches was empty; pass at least one calibration batch")
    if method == "magnitude":  # OWL's sparsities were all it needed the batches for
        return dict(params), _magnitude(specs, params, dims)
    new: dict[str, Tensor] = dict(params)
    masks: dict[str, Tensor] = {}
    last = max((i for i, here in enumerate(inside) if here), default=-1)
    for i, block in enumerate(blocks.modules[: last + 1]):
        prefix = blocks.prefix(i)
        own: dict[str, Tensor] = {n: new[prefix + n] for n, _ in block.named_parameters()}
        moved = {n: p.detach().to(where) for n, p in own.items()} if where is not None else own
        buffers = {n: b.to(where) for n, b in block.named_buffers()} if where is not None else None
        these: dict[str, Tensor] = {}  # by local name
        if inside[i]:
            # each on a copy of the states held: a block may add to its input in place, and they are
            # needed as they are to advance
            block_calls = (held.call(i, b, held.hidden[b].clone()) for b in range(len(held.hidden)))
            got, weights = _prune_block(fn, method, block, prefix, moved, buffers, where, inside[i], block_calls,
                                        specs, dims, blocksize, percdamp)  # fmt: skip
            for full, mask in got.items():
                local = full[len(prefix) :]
                these[local] = mask
                moved[local] = weights.get(full, moved[local])
                new[full] = moved[local].to(params[full].device) if where is not None else moved[local]
                masks[full] = mask.to(params[full].device)
        if i < last:
            for b in range(len(held.hidden)):
                call = _on(held.call(i, b), where)
                with torch.no_grad():
                    out = functional_call_masked(block, moved, these, call.args, call.kwargs, buffers=buffers)
                held.hidden[b] = hidden_of(fn, i, out).detach()
    del held
    if outside:
        weights, more = _outside(fn, method, model, new, masks, outside, specs, dims, kept_calls, blocksize, percdamp)
        new.update(weights)
        masks.update(more)
    return new, {n: masks[n] for n in chosen}


def _magnitude(specs: dict[str, Spec], params: dict[str, Tensor], dims: Mapping[str, int]) -> dict[str, Tensor]:
    return Plan(specs, input_dims=dims)({n: params[n] for n in specs}) if specs else {}


def _check_shapes(fn: str, specs: dict[str, Spec], params: dict[str, Tensor], dims: Mapping[str, int]) -> None:
    """Refuse, before any batch runs, an N:M spec whose groups do not divide a weight's inputs."""
    for name, spec in specs.items():
        if isinstance(spec, NM):
            w = params[name]
            inputs = w.shape[dims[name]] if name in dims else w.shape[-1]
            if inputs % spec.m:
                raise ValueError(f"{fn}: {name!r} has {inputs} inputs, not a multiple of the spec's m={spec.m}: "
                                 f"{spec!r} cannot group them; leave it out of names")  # fmt: skip


def _names(
    fn: str, model: nn.Module, blocks: RepeatedLayers, names: Iterable[str] | None, params: Mapping[str, Tensor], method: str
) -> list[str]:
    """The weights to prune, checked: by default :func:`prunable`'s inside the blocks."""
    if names is None:
        ours = tuple(blocks.prefix(i) for i in range(len(blocks.modules)))
        return [n for n in prunable(model) if n.startswith(ours)]
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise TypeError(f"{fn}: names must be a list of parameter names or None, got {names!r}")
    chosen = list(dict.fromkeys(names))
    for i, name in enumerate(chosen):
        if not isinstance(name, str):
            raise TypeError(f"{fn}: names[{i}] must be a str, got {type(name).__name__}")
        if name not in params:
            raise not_a_parameter(fn, model, name, params)
        if method != "magnitude":
            path, _, attr = name.rpartition(".")
            owner = model.get_submodule(path)
            if attr != "weight" or not (isinstance(owner, nn.Linear) or is_conv1d(owner)):
                raise ValueError(
                    f"{fn}: {name!r} belongs to a {type(owner).__name__}; method={method!r} prunes the weights "
                    "of Linear and transformers' Conv1D layers, from their inputs (method='magnitude' takes any)"
                )
    return chosen


def _specs(fn: str, spec: Spec, chosen: list[str], allocation: object) -> dict[str, Spec]:
    """Each weight's spec: ``spec``, or ``spec`` at the sparsity ``allocation`` gives it (OWL's: later)."""
    if allocation is None or allocation == "uniform" or allocation == "owl":
        if allocation == "owl":
            _fraction(fn, spec)  # refuses a spec without one, before any batch runs
        return dict.fromkeys(chosen, spec)
    if not isinstance(allocation, Mapping):
        raise TypeError(f"{fn}: allocation must be None, 'uniform', 'owl' or a mapping of names to sparsities, "
                        f"got {allocation!r}")  # fmt: skip
    extra = [n for n in allocation if n not in chosen]
    if extra:
        raise ValueError(f"{fn}: allocation has a sparsity for {extra[0]!r}, which is not a weight pruned here "
                         "(names, or by default the Linear and Conv1D weights of the blocks); leave it out")  # fmt: skip
    missing = [n for n in chosen if n not in allocation]
    if missing:
        raise ValueError(f"{fn}: allocation has no sparsity for {missing[0]!r} (and {len(missing) - 1} more "
                         "weights pruned); give one for every name pruned")  # fmt: skip
    _fraction(fn, spec)
    out = {}
    for name in chosen:
        value = allocation[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ValueError(f"{fn}: allocation[{name!r}] must be a sparsity in [0, 1], got {value!r}")
        out[name] = _at(spec, float(value))
    return out


def _fraction(fn: str, spec: Spec) -> float:
    """The fraction an allocation replaces: ``spec``'s, an ``L1Unstructured`` float, alone or per slice."""
    inner = spec.spec if isinstance(spec, PerSlice) else spec
    if isinstance(inner, L1Unstructured):
        fraction = inner.amount if inner.sparsity is None else inner.sparsity
        if isinstance(fraction, float):
            return fraction
    raise ValueError(f"{fn}: an allocation other than uniform sets each weight's fraction: spec must be "
                     f"L1Unstructured(fraction) or PerSlice(L1Unstructured(fraction), dim=0), got {spec!r}")  # fmt: skip


def _at(spec: Spec, sparsity: float) -> Spec:
    """``spec`` (checked by :func:`_fraction`) pruning the fraction ``sparsity`` instead of its own."""
    at = L1Unstructured(sparsity)
    return PerSlice(at, dim=spec.dim) if isinstance(spec, PerSlice) else at


def _owl(fn: str, spec: Spec, params: dict[str, Tensor], norms: dict[str, Tensor], blocks: RepeatedLayers) -> dict[str, Spec]:
    """OWL's spec per weight, averaging the spec's fraction over the blocks."""
    fraction = _fraction(fn, spec)
    count = len(blocks.modules)

    def block_of(name: str) -> str:
        return next(blocks.prefix(i) for i in range(count) if name.startswith(blocks.prefix(i)))

    targets = owl_sparsity(params, norms, fraction, blocks=block_of)
    return {name: _at(spec, target) for name, target in targets.items()}


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
    method: str,
    block: nn.Module,
    prefix: str,
    params: dict[str, Tensor],
    buffers: dict[str, Tensor] | None,
    where: torch.device | None,
    names: list[str],
    block_calls: Iterable[Call],
    specs: dict[str, Spec],
    dims: Mapping[str, int],
    blocksize: int,
    percdamp: float,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """One block's masks and SparseGPT's new weights, by full name (so that errors name them whole)."""
    weights = {n: params[n[len(prefix) :]] for n in names}
    plan = {n: specs[n] for n in names}
    here = {n: dims[n] for n in names if n in dims}
    stats: dict[str, Tensor] = {}
    if method != "magnitude":
        local = [n[len(prefix) :] for n in names]
        statistic = NORMS if method == "wanda" else GRAMS
        sums = collect(fn, block, block_calls, local, statistic, run=_runner(block, params, buffers, where))
        stats = {prefix + n: s for n, s in sums.items()}
    return _prune(method, weights, stats, plan, here, blocksize, percdamp)


def _prune(
    method: str,
    weights: dict[str, Tensor],
    stats: dict[str, Tensor],
    plan: dict[str, Spec],
    dims: Mapping[str, int],
    blocksize: int,
    percdamp: float,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Masks (and SparseGPT's new weights) of ``weights`` from their statistics: input norms or ``XᵀX``."""
    if method == "magnitude":
        return Plan(plan, input_dims=dims)(weights), {}
    if method == "wanda":
        scores = wanda(weights, stats, input_dims=dims)
        return Plan(plan, input_dims=dims)(weights, scores=scores), {}
    masks: dict[str, Tensor] = {}
    new: dict[str, Tensor] = {}
    for spec in dict.fromkeys(plan.values()):
        group = [n for n in plan if plan[n] == spec]
        updated, more = sparsegpt(weights, {n: stats[n] for n in group}, spec,
                                  blocksize=blocksize, percdamp=percdamp, input_dims=dims)  # fmt: skip
        new.update({n: updated[n] for n in group})
        masks.update(more)
    return {n: masks[n] for n in plan}, new


def _outside(
    fn: str,
    method: str,
    model: nn.Module,
    params: dict[str, Tensor],
    masks: dict[str, Tensor],
    names: list[str],
    specs: dict[str, Spec],
    dims: Mapping[str, int],
    kept: list[Call],
    blocksize: int,
    percdamp: float,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The weights named outside the blocks (Wanda, SparseGPT): pruned from one pass of the model pruned so far."""
    weights = {n: params[n] for n in names}
    here = {n: dims[n] for n in names if n in dims}
    plan = {n: specs[n] for n in names}

    def run(call: Call) -> object:
        return functional_call_masked(model, params, masks, call.args, call.kwargs)

    sums = collect(fn, model, kept, names, NORMS if method == "wanda" else GRAMS, run=run)
    got, new = _prune(method, weights, sums, plan, here, blocksize, percdamp)
    return new, got
