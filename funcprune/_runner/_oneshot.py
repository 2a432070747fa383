"""``oneshot``: prune a model block by block with calibration data, as Wanda's and SparseGPT's scripts do."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from .._apply import functional_call_masked
from .._criteria import NORMS, Call, Statistic, calls, check_group, collect
from .._expert_linears import expert_input_dims
from .._payoff import pack_masks, unpack_masks
from .._experts import routers
from .._specs import Spec
from .._targets import input_dims
from .._types import Tensor
from ._blocks import UnroutedExpertsWarning, _at_once, _pruned, step
from ._layers import Capture, find_layers
from ._memory import trim
from ._methods import Method, method_of
from ._weights import check_groups, owl_specs, specs_of, weights_named

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["UnroutedExpertsWarning", "oneshot"]


def oneshot(
    model: nn.Module,
    batches: Iterable[object],
    *,
    method: Method | str,
    spec: Spec,
    names: Iterable[str] | None = None,
    allocation: str | Mapping[str, float] | None = None,
    device: torch.device | str | None = None,
    group: ProcessGroup | None = None,
    inplace: bool = False,
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
        group: a ``torch.distributed`` process group (``dist.group.WORLD``,
            or one from ``dist.new_group``) to calibrate data-parallel:
            every process of it calls ``oneshot`` with the same model and
            arguments and its *own share* of the calibration batches (a
            process may hold none while others hold some). For each block,
            the statistics of every process (input norms or Hessians, and
            an MoE layer's tokens per expert) are added by one
            ``all_reduce`` in ``float64``, so every process gets the same
            params and masks: those of one process over the union of the
            batches. In ``float64`` bit for bit, however the batches are
            split (the statistics of ``float64`` inputs are exact sums,
            whose bits depend on neither the order nor the grouping);
            otherwise up to the order in which the sums are added (see the
            guide's "Over several processes"). So
            are OWL's statistics and those of the weights outside the
            blocks, each in one more ``all_reduce``, and the capture pass
            agrees in one: a batch that fails on one process raises on
            every process (its own error there, "another process of the
            group failed" elsewhere), and no batch on any process is the
            error of no batches on every process. ``None``: this process
            alone. Launch with ``torchrun`` and
            ``dist.init_process_group("gloo")`` (CPU) or ``"nccl"`` (one
            GPU per process, ``device=`` its GPU).
        inplace: write the new weights (SparseGPT's) into the model's own
            parameters, each as soon as it is made, instead of returning
            new tensors: for a user who does not need the dense model
            afterwards, it saves a copy of every weight SparseGPT updates
            (the pure call holds them all until it returns). The values are
            the pure call's, bit for bit; the params returned are then the
            model's own tensors. Wanda and magnitude change no weight: only
            the masks come back, as without it. A weight tied to another
            parameter (an LM head sharing the embeddings) is refused, since
            writing it would change both. Default ``False``: the model is
            left as it was.

    Returns:
        ``(params, masks)``: a new dict of every parameter by name (the
        model's own tensors, but SparseGPT's updated weights, whose pruned
        entries are 0) and ``{name: mask}`` (``torch.bool``, ``True`` =
        kept) for every weight pruned: ready for
        :func:`~funcprune.functional_call_masked`, ``model.load_state_dict(
        params, strict=False)`` and :func:`~funcprune.bake`, or
        :func:`~funcprune.shrink`.

    Raises:
        TypeError: if an argument has the wrong type (``group``: not a
            process group).
        UnknownNameError: if a name is not a parameter of ``model``.
        ValueError: if the method, spec, allocation or a name is not one
            this supports (raised before any batch runs), if no repeated
            blocks are found, if there are no batches, if a block is
            called other than once per forward with its hidden states, or
            if a method's ``prune`` returns other than a mask of each
            weight it was given (and new weights like them), or if
            ``group`` is given but ``torch.distributed`` is not
            initialized.
    """
    fn = "oneshot"
    if not isinstance(model, nn.Module):
        raise TypeError(f"{fn}: model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(inplace, bool):
        raise TypeError(f"{fn}: inplace must be a bool, got {inplace!r}")
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
    if inplace:
        _check_untied(fn, model, chosen)
    where = torch.device(device) if device is not None else None
    check_group(fn, group, "group")
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
            norms = collect(fn, model, stream, named, NORMS, across=group, run=capture, experts=experts)
            specs.update(owl_specs(fn, spec, {n: params[n] for n in named}, norms, layers, experts))
        else:
            _capture_all(fn, capture, stream, group, where or _device_of(model))
    held = capture.captured
    if not held.hidden and group is None:  # (across a group: checked on the union, above)
        raise ValueError(f"{fn}: no batches: batches was empty; pass at least one calibration batch")
    if statistic is None:  # OWL's sparsities were all it needed the batches for
        return _at_once(fn, chosen_method, params, specs, dims, experts)
    new: dict[str, Tensor] = dict(params)
    packed: dict[str, Tensor] = {}  # the blocks' masks, a bit an entry until the last block is done
    last = max((i for i, here in enumerate(inside) if here), default=-1)
    for i, block in enumerate(layers.modules[: last + 1]):
        prefix = layers.prefix(i)
        own: dict[str, Tensor] = {n: new[prefix + n] for n, _ in block.named_parameters()}
        buffers = {n: b.to(where) for n, b in block.named_buffers()} if where is not None else None
        weights, got = step(fn, chosen_method, statistic, held, i, block, prefix, own, buffers, where, inside[i],
                            specs, dims, experts, advance=i < last, group=group, inplace=inplace)  # fmt: skip
        for full, mask in got.items():
            if inplace:  # the values are in the model's own parameter already, or copied back into it now
                if where is not None:
                    with torch.no_grad():
                        params[full].copy_(weights[full])
                new[full] = params[full]
            else:
                new[full] = weights[full].to(params[full].device) if where is not None else weights[full]
            packed.update(pack_masks({full: mask.to(params[full].device)}))
        del weights, got
        trim()  # the block's workspace handed back: the next block's sizes do not all fit glibc's free pieces
    del held
    masks = unpack_masks(packed)
    del packed
    if outside:
        weights, more = _outside(fn, chosen_method, statistic, model, new, masks, outside, specs, dims, experts,
                                 kept_calls, group, inplace)  # fmt: skip
        new.update(weights)
        masks.update(more)
    return new, {n: masks[n] for n in chosen}


def _device_of(model: nn.Module) -> torch.device:
    """Where the model's first parameter lies (the capture pass runs there)."""
    return next(model.parameters()).device


def _capture_all(
    fn: str, capture: Capture, stream: Iterable[Call], group: ProcessGroup | None, device: torch.device
) -> None:
    """Run ``capture`` on every call; across ``group``, agree on the outcome in one ``all_reduce``.

    Every process learns whether any failed (then each raises: its own
    error, or one saying another failed) and how many batches they hold
    together (none: the error of no batches, on every process); a process
    with no batch of its own is fine while another has some.
    """
    if group is None:
        for call in stream:
            capture(call)
        return
    import torch.distributed as dist

    failure: Exception | None = None
    try:
        for call in stream:
            capture(call)
    except Exception as e:  # noqa: BLE001 (raised below, on every process)
        failure = e
    flat = torch.tensor([float(failure is not None), float(len(capture.captured.hidden))], dtype=torch.float64,
                        device=device)  # fmt: skip
    dist.all_reduce(flat, group=group)
    if failure is not None:
        raise failure
    if flat[0]:
        raise ValueError(f"{fn}: another process of the group failed on its batches (its own error says why)")
    if not flat[1]:
        raise ValueError(f"{fn}: no batches: batches was empty on every process of group; pass at least one "
                         "calibration batch")  # fmt: skip


def _kept(stream: Iterable[Call], into: list[Call]) -> Iterator[Call]:
    """The calls of ``stream``, each also appended to ``into`` (for a second pass)."""
    for call in stream:
        into.append(call)
        yield call


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
    group: ProcessGroup | None,
    inplace: bool,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The weights named outside the blocks: pruned from one pass of the model pruned so far."""

    def run(call: Call) -> object:
        return functional_call_masked(model, params, masks, call.args, call.kwargs)

    counts: dict[str, Tensor] = {}
    stacked = {n: experts[n] for n in names if n in experts}
    sums = collect(fn, model, kept, names, statistic, across=group, run=run, experts=stacked, routed=counts)
    return _pruned(fn, method, names, params, sums, counts, specs, dims, experts, inplace=inplace)


def _check_untied(fn: str, model: nn.Module, names: list[str]) -> None:
    """Refuse, for ``inplace``, a weight that another parameter name shares: writing it would change both."""
    aliases: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    for name, p in model.named_parameters():
        others = [a for a in aliases[id(p)] if a != name]
        if name in names and others:
            raise ValueError(f"{fn}: inplace=True would write {name!r}, which is tied to {others[0]!r} (one tensor), "
                             "and so change both; leave it out of names, or pass inplace=False")  # fmt: skip
