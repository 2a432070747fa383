"""Masks that pay off: channels the masks remove entirely, removed for real.

:func:`shrink` returns a physically smaller copy of a model, and
:func:`propagate` the closure of the masks it removes; which channel groups
go is decided by ``funcprune._graph``, and this module checks the
arguments, builds the closure and the smaller copy, and checks the copy
against the masked model on the example inputs (``README.md``).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar, final

from torch import nn

from .._collector import paused
from .._graph import Inputs, analyze, as_inputs, closure, first_line, kept_indices, plan_removal, remembered
from .._graph import warn_unreached
from .._names import check_masks, check_not_hooked
from .._types import Masks, Tensor
from .._units import Structure
from .._validate import refuse_in
from ._verify import differ_in_eval, mismatch, outputs_in_eval
from ._checks import check_mask_dtypes, first_names, one_mask_per_parameter
from ._config import Record, ShrunkConfigWarning, describe_, is_transformers_model, record_, shapes_of
from ._depth import depthless
from ._hidden import narrowed
from ._kept import CHANGES_OUTPUTS, KeptChannelsWarning, warn_blocks_kept, warn_kept
from ._probes import breaking
from ._smaller import built, checking, cut_in_place, masked_in_place, masked_outputs, tensor_shapes

__all__ = ["KeptChannelsWarning", "propagate", "shrink"]

_M = TypeVar("_M", bound=nn.Module)


def propagate(module: nn.Module, masks: Mapping[str, Tensor], example_inputs: object) -> Masks:
    """The closure of ``masks``: what :func:`shrink` removes, as masks.

    A channel goes when the masks prune it entirely and nothing keeps it
    (see :func:`shrink`); the closure adds, for each channel that goes, its
    bias entry, the entries of the norms' weights and biases that follow it,
    its depthwise-convolution weights and bias, and the input columns that
    read it; for an attention head (a KV group under GQA), the rows of its
    query, key and value projections and the output projection's columns. It only ever adds pruned entries: every given mask is kept as it is
    or with more entries pruned, never revived. Channels that the masks
    prune entirely but that must stay are listed in a
    :class:`KeptChannelsWarning`, as :func:`shrink` lists them.

    Args:
        module: the model (not modified).
        masks: masks by parameter name (an alias of a tied Parameter is
            accepted), as for :func:`~funcprune.bake`: ``torch.bool``
            (``True`` = kept) or floating-point 0/1.
        example_inputs: the inputs of ``module.forward``: a tensor, a tuple
            of positional arguments, or a dict of keyword arguments (a
            transformers model runs with ``use_cache=False`` unless given).
            The model runs on them (a copy, in eval mode): exported with
            :func:`torch.export.export`, and again to check what it removes.

    Returns:
        A new dict of ``torch.bool`` masks, keyed and ordered like
        ``module.named_parameters()``: each given mask, with the closure's
        entries pruned, and a mask for each other parameter the closure
        prunes entries of. A given ``torch.bool`` mask to which the closure
        adds nothing is returned as the very tensor given; a float mask is
        returned converted (``mask != 0``), and a mask given under another
        name of a tied Parameter under its ``named_parameters()`` name.

    Raises:
        TypeError: if ``module`` is not a module, ``masks`` not a mapping of
            tensors, a mask neither ``torch.bool`` nor floating-point, or
            ``example_inputs`` not a tensor or a tuple of them.
        UnknownNameError: if a mask names no parameter of ``module``.
        ValueError: if ``module`` is pruned in hook mode, a mask does not
            fit its parameter, two names of a tied Parameter carry different
            masks, the model cannot be copied (a layer under the deprecated
            ``torch.nn.utils.weight_norm``), ``torch.export`` cannot trace
            the model, the inputs do not run through it, or an op the
            analysis cannot reason about reads channels that would go (the
            message names the node).

    Warns:
        KeptChannelsWarning: if output channels that the masks prune
            entirely must stay.

    >>> import torch, funcprune as fp
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> masks = {"0.weight": torch.tensor([[True] * 4, [False] * 4, [True] * 4])}
    >>> closure = fp.propagate(model, masks, torch.randn(1, 4))
    >>> closure["0.bias"]
    tensor([ True, False,  True])
    >>> closure["2.weight"]
    tensor([[ True, False,  True],
            [ True, False,  True]])
    """
    closed = _shrunk("propagate", module, masks, example_inputs, describe=False, closing=True).closure
    assert closed is not None  # (asked for)
    return closed


def shrink(
    module: _M, masks: Mapping[str, Tensor], example_inputs: object, *, structure: Structure | None = None,
    check: bool = True, inplace: bool = False,
) -> _M:  # fmt: skip
    """A new, smaller copy of ``module`` without the channels ``masks`` remove.

    The copy keeps the class and the ``forward`` of ``module``; its Linear,
    Conv, BatchNorm and InstanceNorm layers are smaller (parameters and
    running statistics sliced, ``out_features``, ``in_channels``,
    ``num_features``... updated), and every mask of the closure is applied
    to its parameters (pruned entries ``+0.0``, as :func:`~funcprune.bake`
    writes them, even where a weight is ``nan``), so in eval mode it
    computes, to float tolerance::

        functional_call_masked(module, dict(module.named_parameters()),
                               propagate(module, masks, example_inputs), inputs)

    A channel (an output channel of a Linear, a transformers Conv1D or a
    Conv) goes when its weight row is entirely pruned, in every layer it is
    coupled with (a residual ``add`` or ``mul`` couples the channels of both
    sides; attention couples the channels of each head, so a head, or a KV
    group under grouped-query attention, goes whole), unless something keeps
    it:

    - the model's inputs and outputs keep their shapes;
    - LayerNorm, GroupNorm, RMSNorm, softmax or a reduction across the
      channels read all of them;
    - a grouped convolution (``1 < groups < in_channels``) keeps its
      channels; depthwise ones (``groups == in_channels``) shrink with their
      input;
    - arithmetic with a computed tensor of per-channel entries, a divisor,
      ``log``, ``rsqrt`` or a negative power (infinite at zero: ``0 * inf``
      is NaN), a layer whose parameters are read directly in ``forward``;
    - a weight computed from a parameter (a parametrization such as
      ``spectral_norm`` or ``weight_norm``, a hook): no channel of that
      parameter can be followed, and its rows stay (the warning names it);
    - in a mixture-of-experts layer, the router's ``top_k`` experts;
    - each layer keeps at least one channel on each side;
    - channels whose removal changes the model's outputs on the example
      inputs: the shrunk model is run on them and checked against the
      masked model (float64 outputs to 1e-9 of their largest magnitude,
      others to ``rtol=1e-4``), and what a size spelled out in the code
      (``x.view(-1, 400)``, a count read off a shape, ``x[..., :4]``)
      breaks is found and kept.

    When channels that the masks prune entirely stay, a
    :class:`KeptChannelsWarning` says, per layer, how many and why.

    Two more axes go before the channels, each only where exact (checked
    against the masked model; what stays is named in a
    :class:`KeptChannelsWarning`):

    - **blocks**: a block of a stack of repeated layers (a ``ModuleList`` of
      one class) whose every parameter the masks prune is removed, where
      the model without it computes the masked model (a pre-norm residual
      block; not a post-norm one); the kept blocks are renumbered, their
      modules told their new ``layer_idx``, and a transformers config's
      layer count, per-layer lists (``layer_types``) and counts in layers
      (``max_window_layers``) updated;
    - **hidden channels**: a channel of the residual stream that the masks
      prune in every parameter that spans it (a ``"hidden"`` unit of
      :func:`~funcprune.structure`) is removed, each RMS norm over the
      stream corrected (its ``g(w)`` scaled by ``sqrt(d/d')``, its epsilon by
      ``d/d'``) so that the smaller model computes the masked one; a
      transformers model's ``hidden_size`` and epsilon go into its config,
      and it is rebuilt from it. Models whose norms centre by the mean
      (LayerNorm) keep their hidden size.

    Views (``flatten``, ``view``, ``transpose``, ``cat``, ``split``...) move
    channels as they move the values: a Conv channel maps to its block of
    the next Linear's columns; a ``chunk`` into equal parts, or a channel
    shuffle (``view`` into groups, ``transpose``, ``view`` back), lets
    channels go only alike in every part or group, since the shrunk model
    recomputes those sizes from its shapes; elementwise ops (``clamp``, ``exp``, ``pow``
    with a scalar exponent...) and ops over other dims (pooling, ``F.pad``)
    pass them on. The graph comes from :func:`torch.export.export` (on a
    copy in eval mode, ``strict=False``: transformers models work as given,
    hooks included). An attention module's head counts (``num_heads``,
    ``num_key_value_heads``, ``split_size``...) follow its projections.
    Nothing is returned unless the shrunk model computes what the masked
    model computes on the example inputs, and ``module`` itself is not
    modified (unless ``inplace``).

    A transformers model's ``config`` describes the copy: when every layer
    keeps the same widths, its width attributes (``intermediate_size``,
    ``num_attention_heads``, ``num_key_value_heads``, GPT-2's ``n_inner``...)
    are updated, checked by building the class from the new config (on the
    meta device) and comparing every shape, and plain ``from_pretrained``
    reloads what ``save_pretrained`` saves. Otherwise the config keeps its
    values and gets a record, ``funcprune_shrunk``, that
    :func:`~funcprune.load_shrunk` reads.

    Args:
        module: the trained model. It must not be pruned in hook mode
            (``torch.nn.utils.prune`` or ``funcprune.compat``).
        masks: masks by parameter name (an alias of a tied Parameter is
            accepted): ``torch.bool`` (``True`` = kept) or floating-point
            0/1, such as a :class:`~funcprune.Plan` with
            ``LnStructured(amount, n=2, dim=0)`` returns.
        example_inputs: the inputs of ``forward``: a tensor, a tuple of
            positional arguments, or a dict of keyword arguments.
        structure: the :func:`~funcprune.structure` of ``module`` on these
            ``example_inputs``, if there is one: its analysis is taken back
            instead of exporting and walking the model again (about half
            of ``shrink``'s time on a torchvision ResNet), where nothing it
            was made from has changed since: the same ``module`` (its
            submodules, their settings, its parameter and buffer tensors,
            none written in place) and the same input tensors, unchanged.
            Otherwise, or for a structure built by hand or unpickled, the
            model is analyzed again, as without it. The result is the same
            either way.
        check: whether the smaller model is checked against the masked
            one on ``example_inputs`` (the default, and the guarantee
            above). The check costs a run of the masked model (its tensors
            masked into copies block by block of a stack, in one block's
            memory) and a run of the smaller model: on the 1.1B Llama of
            ``benchmarks/llama.py``, about 2.6 s of 6 s (``docs/benchmarks.md``).
            ``check=False`` skips them (the copy is built the same way: cut
            straight from the model's tensors, the masks' zeros that stay
            written after), and what a size spelled out in the code breaks
            is not searched for, so the smaller model may fail or compute
            something else on inputs the analysis saw run; only the
            analysis vouches for it (and, given ``structure``, its trial).
            A transformers model whose config is made to describe it is
            still run once before and once after, so that a module reading
            a width off the config is caught (checked, it is run once, its
            config describing it: the run checks both).
        inplace: make ``module`` itself the smaller model and return it,
            as Torch-Pruning does, for a user who does not need the dense
            model afterwards. Each tensor that loses indices is cut into
            its own object (``param.data``: a Parameter stays the object
            an optimizer or a dict of parameters holds) and its old values
            freed at once, so the memory above the model is its largest
            tensor's (and the check's runs), not a second model's; tensors
            that keep their shape are not copied, the masks' zeros are
            written into them, and a transformers model's own config is
            made to describe it. The check runs as without it, against
            the masked model's outputs taken before the first cut; but if
            it fails, the masked model is gone, and what breaks cannot be
            searched for and kept: a ``ValueError`` says so, and ``module``
            is left cut and unchecked (a masked run that fails leaves it
            masked, not cut). Masks that remove blocks or hidden
            channels (which make a new model) are refused before anything
            is changed. A :class:`~funcprune.Structure` of ``module`` is
            not taken back afterwards (its shapes changed). On the 1.1B
            Llama of ``benchmarks/llama.py``, ``inplace=True`` takes about
            a third of the copy's time (``docs/benchmarks.md``).

    Returns:
        A new module, of the class of ``module``, in its training mode;
        with ``inplace``, ``module`` itself.

    Raises:
        TypeError: as :func:`propagate` raises it.
        UnknownNameError: if a mask names no parameter of ``module``.
        ValueError: as :func:`propagate` raises it; with ``inplace``, if
            the masks remove blocks or hidden channels, or the masked run
            or the check fails.

    Warns:
        KeptChannelsWarning: if output channels that the masks prune
            entirely must stay.

    >>> import torch, funcprune as fp
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    >>> masks = fp.Plan({"0.weight": fp.LnStructured(0.75, n=2, dim=0)})(
    ...     dict(model.named_parameters()))
    >>> small = fp.shrink(model, masks, torch.randn(1, 8))
    >>> small
    Sequential(
      (0): Linear(in_features=8, out_features=4, bias=True)
      (1): ReLU()
      (2): Linear(in_features=4, out_features=2, bias=True)
    )
    """
    for name, value in (("check", check), ("inplace", inplace)):
        if not isinstance(value, bool):
            raise TypeError(f"shrink: {name} must be a bool, got {value!r}")
    return _shrunk("shrink", module, masks, example_inputs, structure=structure, check=check,  # type: ignore[return-value]
                   inplace=inplace).model  # fmt: skip


@final
@dataclass(frozen=True, slots=True)
class _Shrunk:
    """The closure of the masks (``None`` unless asked for: shrink makes none), and the model shrunk to it
    (checked against the masked model, unless unchecked)."""

    closure: Masks | None
    model: nn.Module


def _shrunk(fn: str, module: object, masks: object, example_inputs: object, *, describe: bool = True,
            structure: object = None, check: bool = True, closing: bool = False, inplace: bool = False) -> _Shrunk:  # fmt: skip
    """:func:`_shrinking` with the collector paused (the analysis and the removal's sets are many small objects)."""
    with paused():
        return _shrinking(fn, module, masks, example_inputs, describe=describe, structure=structure, check=check,
                          closing=closing, inplace=inplace)  # fmt: skip


def _shrinking(fn: str, module: object, masks: object, example_inputs: object, *, describe: bool,
               structure: object, check: bool, closing: bool, inplace: bool) -> _Shrunk:  # fmt: skip
    """Check everything, analyze, remove, build and check the smaller model; warn about what stays.

    With ``describe``, a transformers model's config is made to describe the smaller one. ``structure``: a
    :class:`~funcprune.Structure` whose analysis is taken back where still valid (:func:`~funcprune._graph.remembered`).
    Without ``check``, the smaller model is not checked against the masked one (:func:`shrink` says what that
    leaves out). With ``closing``, the closure of the masks is made too (:func:`propagate`'s result). With
    ``inplace``, the module itself is cut (:func:`shrink` says what that changes).
    """
    if structure is not None and not isinstance(structure, Structure):
        raise TypeError(f"{fn}: structure must be the fp.structure of the module (a funcprune Structure) or None, "
                        f"got {type(structure).__name__}")  # fmt: skip
    if not isinstance(module, nn.Module):
        raise TypeError(f"{fn}: module must be a torch.nn.Module, got {type(module).__name__}")
    check_not_hooked(fn, module, then=f"{fn}(module, masks, example_inputs)")
    refuse_in(fn, dict(module.named_parameters()))
    names = first_names(module)
    params = dict(module.named_parameters(remove_duplicate=False))
    checked = one_mask_per_parameter(fn, names, check_masks(fn, params, check_mask_dtypes(fn, masks)))
    inputs = as_inputs(fn, module, example_inputs)
    given, depth = checked, depthless(fn, module, checked, inputs)
    if inplace and depth.removed:
        _refuse_new_model(fn, "blocks " + ", ".join(f"{path}.{i}" for path, idx in depth.removed.items() for i in idx))
    module, checked = depth.model, depth.masks
    analysis = remembered(fn, module, inputs, structure._analyzed if structure is not None else None)
    narrow = narrowed(fn, module, checked, analysis)
    if narrow.removed:  # the hidden channels went: the smaller model analyzed again
        if inplace:
            _refuse_new_model(fn, f"{len(narrow.removed)} hidden channels")
        module, checked = narrow.model, narrow.masks
        analysis = analyze(fn, module, inputs)
    warn_unreached(fn, analysis, stacklevel=3)
    sizes, original = tensor_shapes(module), shapes_of(module)
    vetoed: dict[int, str] = {}

    def describing(copy: nn.Module, gone: list[int]) -> bool:  # whether the smaller model's config is to describe it
        return describe and bool(gone or depth.removed or narrow.removed) and is_transformers_model(copy)

    described = False  # the config made to describe the smaller model, which was checked so
    while True:
        removal = plan_removal(fn, analysis, checked, sizes, vetoed=vetoed)
        removed = sorted(removal.removed)
        # the copy cut first, the masks' zeros that stay written after (no tensor of the model's size made); checked,
        # against the masked model made block by block (no closure made: the indices that go zeroed on the masks)
        keep = kept_indices(analysis, removed, sizes)
        if inplace:  # (the masked model is the module itself, its zeros written: run, then cut)
            try:
                reference: Any = masked_in_place(analysis, checked, keep) if check else None
            except Exception as e:
                raise ValueError(f"{fn}: the masked model failed on the example inputs ({type(e).__name__}: "
                                 f"{first_line(e)}); with inplace=True, the masks' zeros may be written into the "
                                 "module's tensors already (nothing was cut)") from e  # fmt: skip
            small, attributes = module, cut_in_place(module, analysis, keep, checked, removed, zeroed_already=check)
        else:  # (the masked model run first: the copy made in the memory its tensors freed)
            reference = masked_outputs(analysis, *checking(analysis, checked, keep)) if check else None
            small, attributes = built(module, analysis, keep, checked, removed)
        if not check:
            break
        if describing(small, removed):  # its config made to describe it first: one run checks both (else put back)
            described = _describe_checked(small, original, attributes, analysis.inputs, reference, first=True)
            if described:
                break
        failed = mismatch(small, analysis.inputs, reference)
        if failed is None:
            break
        if not removed:  # the masked model itself: a model that runs otherwise each time
            raise ValueError(f"{fn}: the model computes something else on each run ({failed.why}); cannot check what "
                             "shrink removes")  # fmt: skip
        if inplace:
            raise ValueError(f"{fn}: the smaller model differs from the masked model on the example inputs "
                             f"({failed.why}); with inplace=True the module was cut already, so what breaks "
                             "cannot be searched for and kept: the module is left cut and unchecked. Call shrink "
                             "without inplace=True (on the model loaded again) to have it found and kept")  # fmt: skip
        bad = breaking(module, analysis, checked, removed, sizes, failed) or removed
        vetoed.update(dict.fromkeys(bad, CHANGES_OUTPUTS))
    warn_kept(fn, removal.kept)
    warn_blocks_kept(fn, depth.kept)
    if narrow.why is not None:
        warnings.warn(
            f"{fn}: the hidden channels that the masks prune entirely stay, weights zero but compute paid: {narrow.why}",
            KeptChannelsWarning,
            stacklevel=3,
        )
    if describing(small, removed):
        if depth.config:
            warnings.warn(
                f"{fn}: the config cannot describe the model without the removed blocks "
                f"({'; '.join(depth.config.values())}); the shrunk model runs, but what save_pretrained writes "
                "will not reload",
                ShrunkConfigWarning,
                stacklevel=3,
            )
        if not described:
            _describe_checked(small, original, attributes, analysis.inputs, reference, checked=check)
    if not closing:  # shrink returns the model alone
        return _Shrunk(None, small)
    closed = closure(checked, keep, dict(analysis.model.named_parameters()))
    if narrow.removed:  # the closure laid out as before the hidden channels went
        closed = {name: narrow.widened(name, mask, depth.masks.get(name)) for name, mask in closed.items()}
    if depth.removed:  # the closure by the original names, the removed blocks' masks as given
        back = {depth.old_name(name): mask for name, mask in closed.items()}
        closed = {name: back[name] if name in back else given[name] for name in dict.fromkeys(names.values())
                  if name in back or name in given}  # fmt: skip
    return _Shrunk(closed, small)


def _refuse_new_model(fn: str, what: str) -> NoReturn:
    raise ValueError(f"{fn}: inplace=True cuts the module's own tensors, but the masks remove {what}, which makes a "
                     "new model; call shrink without inplace=True (nothing was changed)")


def _describe_checked(small: nn.Module, original: Mapping[str, tuple[int, ...]], attributes: Record, inputs: Inputs,
                      reference: Any, *, checked: bool = True, first: bool = False) -> bool:  # fmt: skip
    """Make the shrunk model's config describe it, and check that it still computes the same: ``reference``, the
    masked model's outputs, or (not ``checked``: no masked model was run) what the shrunk model computes before.
    Where it does not (a module that reads a width off the config as it runs), the config is put back, recorded.

    ``first``: the check's own run, which checks the model and its config at once; where it differs, or describing
    warns, the config is put back and nothing recorded (the caller checks the model with it, then describes it as
    before, saying the warnings). Returns whether the config describes the model.
    """
    if not checked:
        reference = outputs_in_eval("shrink", small, inputs)
    config: Any = getattr(small, "config")
    saved = dict(vars(config))
    with warnings.catch_warnings(record=True) if first else contextlib.nullcontext() as said:  # (first: kept back)
        if first:
            warnings.simplefilter("always")
        describe_(small, original, attributes)
    if not said and differ_in_eval(small, inputs, reference) is None:
        return True
    vars(config).clear()
    vars(config).update(saved)
    if not first:
        record_(small, original, attributes)
    return False
