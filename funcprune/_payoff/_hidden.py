"""The hidden size: channels of a model's residual stream, removed with the norms that span them corrected.

The channel analysis couples the channels of the residual stream into one
group, since every norm reduces over all of them: the embedding's columns,
each norm's weight, the input columns of the layers that read the stream
(queries, keys, values, gates, ups, routers, the LM head) and the output
rows of those that write it (attention outputs, downs). :func:`hidden_of`
reads that group off an analysis: channel ``i`` is index ``i`` of every
member (checked: the copy without channels must compute the masked model).

A channel the masks prune in every member is zero all along the stream of
the masked model, so each RMS norm there averages its square over ``d``
channels, ``d - k`` of them nonzero, where the smaller model averages over
``d' = d - k``: ``x / sqrt(mean_d(x²) + eps) * g(w)`` is
``x * sqrt(d/d') / sqrt(mean_d'(x²) + eps * d/d') * g(w)``. So the smaller
model computes the masked one exactly with each norm's ``g(w)`` scaled by
``sqrt(d/d')`` and its ``eps`` by ``d/d'`` (:func:`narrowed`). ``g`` is
read off the norm by a probe, as any affine form ``a + w`` (``w``; Gemma's
``1 + w``). A norm that centres by the mean (LayerNorm) has no such form:
the masked model's mean counts the zeros, the smaller one's does not; those
models are refused, by name.

A transformers model is then rebuilt from its new config (``hidden_size``,
the norms' ``eps``; a head size derived from the hidden size pinned), its
weights loaded, so that it is what plain ``from_pretrained`` gives; what the
config changes beyond the stream's norms is put right where it is exact:
an embedding scaled by a size the config derives (Gemma's ``sqrt(hidden)``)
gets the old scale folded into its weight, and a norm off the stream that
reads the same ``eps`` (Qwen3's per-head ``q_norm``) gets its input scaled
by ``sqrt(d/d')`` in the rows of the layer that makes it (an RMS norm of
``c * u`` with ``eps * c²`` is that of ``u`` with ``eps``). The copy is then
checked against the masked model; where it fails, nothing is removed and
the caller says why.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, final

import torch
from torch import nn

from .._families import NORM_EPS
from .._graph import Analysis, Inputs, copy_module, own_indices, run
from .._types import Tensor
from ._config import _pinned, is_transformers_model, shapes_of
from ._resize import resize_modules
from ._smaller import cut, masked_run, zeroed_
from ._verify import mismatch

__all__ = ["Hidden", "Narrowed", "hidden_of", "narrowed", "pruned_channels"]

#: How close float64 outputs must be: transformers' RMS norms compute in float32 inside, and average over ``d``
#: channels in the masked model, ``d'`` in the smaller one, so they round differently (float32's precision).
_FLOAT32_INSIDE = (1e-6, 1e-6)


@final
@dataclass(frozen=True, slots=True)
class Hidden:
    """A model's hidden channels: the members ``(parameter, dim)`` that span all ``size`` of them, in order."""

    members: tuple[tuple[str, int], ...]
    size: int


@final
@dataclass(frozen=True, slots=True)
class Narrowed:
    """A model without the hidden channels the masks prune, and its masks by name.

    ``removed``: the channels that went; ``why``: why none went though the
    masks prune some (``None``: none pruned, or they went).
    """

    model: nn.Module
    masks: dict[str, Tensor]
    removed: tuple[int, ...] = ()
    why: str | None = None
    #: What each member's parameter keeps along its dims.
    keep: dict[str, dict[int, list[int]]] = field(default_factory=dict)

    def widened(self, name: str, mask: Tensor, given: Tensor | None) -> Tensor:
        """A mask of :attr:`model`'s parameter ``name`` laid out as in the model before: the removed channels as
        ``given`` prunes them (all of them: they went)."""
        dims = self.keep.get(name)
        if not dims:
            return mask
        assert given is not None  # the masks pruned the channels that went
        index: list[Tensor] = []
        for d in range(mask.dim()):
            kept = dims.get(d)
            line = torch.tensor(kept, device=mask.device) if kept is not None else torch.arange(mask.shape[d], device=mask.device)
            index.append(line.reshape([-1 if i == d else 1 for i in range(mask.dim())]))
        full = given.clone()
        full[tuple(index)] = mask
        return full


def hidden_of(analysis: Analysis, shapes: Mapping[str, tuple[int, ...]]) -> Hidden | None:
    """The hidden channels of the analyzed model, or ``None``: the largest group that a norm couples whole,
    spanning whole dims of one length in every parameter it holds, a norm's weight among them."""
    best: Hidden | None = None
    for group, feet in own_indices(analysis).items():
        if group not in analysis.coupled or group in analysis.blocked or group in analysis.refused:
            continue
        whole = [(name, dim) for (name, dim), indices in feet.items() if name in shapes and len(indices) == shapes[name][dim]]
        lengths = [shapes[name][dim] for name, dim in whole]
        if not lengths:
            continue
        size = max(set(lengths), key=lengths.count)  # the hidden size: the length most members span whole
        keys = [(name, dim) for name, dim in whole if shapes[name][dim] == size]
        if {name for name, _ in feet if name in shapes} != {name for name, _ in keys}:
            continue  # a parameter the group holds only part of
        if not any(len(shapes[name]) == 1 for name, _ in keys):
            continue
        if best is None or len(keys) > len(best.members):
            order = {name: i for i, name in enumerate(shapes)}
            best = Hidden(tuple(sorted(keys, key=lambda k: (order[k[0]], k[1]))), size)
    return best


def pruned_channels(hidden: Hidden, masks: Mapping[str, Tensor]) -> list[int]:
    """The channels every member's mask prunes entirely (one stays at least)."""
    size = hidden.size
    alive = torch.zeros(size, dtype=torch.bool)
    for name, dim in hidden.members:
        mask = masks.get(name)
        if mask is None:
            return []
        others = tuple(d for d in range(mask.dim()) if d != dim)
        alive |= (mask.any(dim=others) if others else mask).cpu()
    gone = [i for i in range(size) if not alive[i]]
    return gone[:-1] if len(gone) == size else gone


def narrowed(
    fn: str, module: nn.Module, masks: Mapping[str, Tensor], analysis: Analysis,
    channels: Sequence[int] | None = None,
) -> Narrowed:  # fmt: skip
    """``module`` without the hidden channels ``masks`` prune (or ``channels``, a trial), where that is exact.

    The masks returned with the smaller model are ``masks`` cut to the channels kept. A trial makes no masks of
    its own (cut, they would prune nothing): the masked model's tensors get zeros at ``channels``, and the copy,
    only run, is cut to views where the channels kept are one run.
    """
    shapes = {name: tuple(p.shape) for name, p in module.named_parameters()}
    hidden = hidden_of(analysis, shapes)
    if hidden is None:
        return Narrowed(module, dict(masks))
    gone = list(channels) if channels is not None else pruned_channels(hidden, masks)
    if not gone:
        return Narrowed(module, dict(masks))
    trial = channels is not None
    d, kept = hidden.size, [i for i in range(hidden.size) if i not in set(gone)]
    params = dict(module.named_parameters())
    norms = _norms(module, hidden, params)
    why = _no_exact_form(module, norms)
    if why is not None:
        return Narrowed(module, dict(masks), why=why)
    dropped = {name: {dim: gone} for name, dim in hidden.members} if trial else None
    reference = masked_run(module, masks, analysis.inputs, dropped=dropped)  # first: its tensors are gone before ours
    # the copy shares what it does not cut; every member is cut into a new tensor (a trial's: a view where it
    # can), and the corrections below replace the tensors they change, writing into none
    model = copy_module(fn, module, sharing=[*module.parameters(), *module.buffers()])
    keep = {name: {dim: kept} for name, dim in hidden.members}
    resize_modules(model, keep, analysis, set(), views=trial)
    _tied_again_(module, model)
    eps = _corrected_norms_(model, norms, d, len(kept))
    if is_transformers_model(model):
        reason = _config_(model, d, len(kept), eps)
        if reason is not None:
            return Narrowed(module, dict(masks), why=reason)
        try:
            rebuilt = _loaded(model)
        except _NoConfig as e:
            return Narrowed(module, dict(masks), why=str(e))
        reason = _put_right_(model, rebuilt, module, hidden, norms, d, len(kept), analysis.inputs)
        if reason is not None:
            return Narrowed(module, dict(masks), why=reason)
        model = rebuilt
    sliced = {name: cut(mask, keep.get(name, {})) for name, mask in masks.items()}
    probe = copy_module(fn, model, sharing=[*model.parameters(), *model.buffers()])
    zeroed_(probe, sliced)
    failure = mismatch(probe, analysis.inputs, reference, float64=_FLOAT32_INSIDE)
    if failure is not None:
        return Narrowed(module, dict(masks), why=f"the model without them computes something else ({failure.why})")
    return Narrowed(model, sliced, tuple(gone), None, keep)


def _replaced_(model: nn.Module, old: Tensor, value: Tensor) -> nn.Parameter:
    """Every name of ``model``'s parameter ``old`` made to hold a new parameter of ``value`` (returned): the
    corrections write no tensor in place, which a trial's copy may share with the model (a view)."""
    new = nn.Parameter(value, old.requires_grad)
    for layer in model.modules():
        for attr, param in list(layer._parameters.items()):
            if param is old:
                layer._parameters[attr] = new
    return new


def _tied_again_(module: nn.Module, model: nn.Module) -> None:
    """Every other name of a tied parameter of ``module`` (a tied LM head) made to hold ``model``'s new one again."""
    first: dict[int, str] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) not in first:
            first[id(p)] = name
            continue
        owner, _, attr = name.rpartition(".")
        layer = model.get_submodule(owner)
        setattr(layer, attr, model.get_parameter(first[id(p)]))
        if isinstance(layer, nn.Linear):  # a tied LM head
            layer.out_features, layer.in_features = layer.weight.shape


def _norms(module: nn.Module, hidden: Hidden, params: Mapping[str, Tensor]) -> list[str]:
    """The paths of the norms on the stream: modules whose own 1-D weight is a member."""
    return [name.rpartition(".")[0] for name, dim in hidden.members if params[name].dim() == 1 and name.endswith(".weight")]


def _eps_attr(norm: nn.Module) -> str | None:
    return next((a for a in NORM_EPS if isinstance(getattr(norm, a, None), float)), None)


@torch.no_grad()
def _no_exact_form(module: nn.Module, norms: Sequence[str]) -> str | None:
    """Why the norms on the stream have no exact form without some channels (``None``: they have one)."""
    if not norms:
        return "no norm spans them (a norm's weight is how the hidden channels are told)"
    for path in dict.fromkeys(norms):
        norm = module.get_submodule(path)
        if _eps_attr(norm) is None:
            return f"{path!r} ({type(norm).__name__}) keeps its epsilon in no attribute funcprune knows ({list(NORM_EPS)})"
        weight = getattr(norm, "weight")
        x = torch.linspace(1.0, 2.0, weight.shape[0], dtype=weight.dtype, device=weight.device).unsqueeze(0)
        try:
            centred = torch.allclose(norm(x), norm(x + 3.0), rtol=1e-4, atol=1e-6)
            _offset(norm, weight)
        except Exception as e:  # a norm over another layout (ConvNeXt's channels-first LayerNorm)
            return f"{path!r} ({type(norm).__name__}) does not run on a vector of its width ({type(e).__name__}), so funcprune cannot tell its form"
        if centred:
            return (
                f"{path!r} ({type(norm).__name__}) centres by the mean: the masked model's mean counts the removed "
                "channels' zeros, the smaller model's cannot (no exact form)"
            )
    return None


@torch.no_grad()
def _corrected_norms_(model: nn.Module, norms: Sequence[str], d: int, kept: int) -> float | None:
    """Scale each norm's ``g(w)`` by ``sqrt(d/kept)`` and its eps by ``d/kept`` (in place); the old eps, if one."""
    scale, old = math.sqrt(d / kept), None
    for path in dict.fromkeys(norms):
        norm = model.get_submodule(path)
        weight: Any = getattr(norm, "weight")
        offset = _offset(norm, weight)
        _replaced_(model, weight, (weight + offset) * scale - offset)
        attr = _eps_attr(norm)
        assert attr is not None
        old = getattr(norm, attr)
        setattr(norm, attr, old * d / kept)
    return old


def _offset(norm: nn.Module, weight: Tensor) -> float:
    """``a`` of the norm's ``g(w) = a + w`` (0 for ``x * w``, 1 for Gemma's ``x * (1 + w)``), by a probe."""
    x = torch.ones(1, weight.shape[0], dtype=weight.dtype, device=weight.device)
    zero = torch.func.functional_call(norm, {"weight": torch.zeros_like(weight)}, (x,))
    one = torch.func.functional_call(norm, {"weight": torch.ones_like(weight)}, (x,))
    ratio = float((zero / one).mean())  # a / (a + 1)
    return ratio / (1.0 - ratio)


def _config_(model: nn.Module, d: int, kept: int, eps: float | None) -> str | None:
    """Make ``model``'s config say the new hidden size and eps (in place), or say why it cannot."""
    config: Any = getattr(model, "config")
    new = _pinned(copy.deepcopy(config))
    sizes = [a for a, v in vars(new).items() if isinstance(v, int) and not isinstance(v, bool) and v == d]
    names = [a for a in sizes if "hidden" in a or "embd" in a or a in ("d_model", "dim")]
    if not names:
        return f"no attribute of the config holds the hidden size {d}"
    for attr in names:
        setattr(new, attr, kept)
    if eps is not None:
        for attr, value in list(vars(new).items()):
            if isinstance(value, float) and "eps" in attr and value == eps:
                setattr(new, attr, eps * d / kept)
    vars(config).clear()
    vars(config).update(vars(new))
    return None


class _NoConfig(ValueError):
    """The config with the new hidden size cannot describe the model."""


def _loaded(model: nn.Module) -> nn.Module:
    """``model``'s class built from its config, its state loaded: what ``from_pretrained`` gives."""
    config: Any = getattr(model, "config")
    dtype = next(model.parameters()).dtype
    quiet: Any = contextlib.nullcontext
    try:  # no random initialization: every weight is loaded next (a 1B model's init takes seconds)
        from transformers.initialization import no_init_weights as quiet
    except ImportError:  # pragma: no cover - another transformers
        pass
    try:
        with quiet():
            rebuilt = type(model)(config).to(dtype)
    except Exception as e:  # a class that refuses the new size (heads that must divide it...)
        raise _NoConfig(f"its class refuses the new hidden size ({type(e).__name__}: {e})") from e
    built, have = shapes_of(rebuilt), shapes_of(model)
    wrong = next((n for n in have if built.get(n) != have[n]), None)
    if wrong is not None or built.keys() != have.keys():
        where = f"{wrong!r} {built.get(wrong)}, not {have[wrong]}" if wrong is not None else "other tensors"
        raise _NoConfig(f"the config with the new hidden size builds {where} (a width it derives from the hidden size)")
    rebuilt.load_state_dict(model.state_dict(), assign=True)  # its tensors, not copies
    tie = getattr(rebuilt, "tie_weights", None)
    if callable(tie):  # as from_pretrained ties them, once loaded (assigning gave each name its own Parameter)
        tie()
    rebuilt.train(model.training)
    return rebuilt


def _values(module: nn.Module) -> dict[str, float]:
    """A module's own float attributes and 0-d non-persistent buffers, by name (what its class derives from a config)."""
    out = {a: v for a, v in vars(module).items() if isinstance(v, float)}
    persistent = {name for name, _ in module.named_buffers(recurse=False)} - module._non_persistent_buffers_set
    for name, b in module.named_buffers(recurse=False):
        if name not in persistent and b.dim() == 0 and b.is_floating_point():
            out[name] = float(b)
    return out


@torch.no_grad()
def _put_right_(
    model: nn.Module, rebuilt: nn.Module, module: nn.Module, hidden: Hidden, norms: Sequence[str], d: int, kept: int,
    inputs: Inputs,
) -> str | None:  # fmt: skip
    """Put right in ``rebuilt`` what its config changes beyond the stream's norms (in place), or say why it cannot.

    A scale an embedding's module derives from the config (Gemma's
    ``sqrt(hidden)``) is folded into its weight; a norm off the stream that
    reads the config's eps gets its input scaled in the rows that make it.
    """
    embeddings = {name.rpartition(".")[0] for name, dim in hidden.members if dim == 1}
    eps_norms: list[str] = []  # norms off the stream that read the config's eps
    folded: list[tuple[Tensor, float]] = []  # embedding weights scaled, and the ratio a tied head must get back
    for path, new in rebuilt.named_modules():
        if path in norms:
            continue
        was, now = _values(model.get_submodule(path)), _values(new)
        changed = {a: (v, now[a]) for a, v in was.items() if a in now and now[a] != v}
        if not changed:
            continue
        eps = next((a for a in NORM_EPS if a in changed), None)
        if eps is not None and len(changed) == 1 and math.isclose(changed[eps][1], changed[eps][0] * d / kept):
            eps_norms.append(path)
            continue
        weight = getattr(new, "weight", None)
        pairs = list(changed.values())
        alike = all(math.isclose(a, pairs[0][0], rel_tol=1e-6) and math.isclose(b, pairs[0][1], rel_tol=1e-6) for a, b in pairs)
        if path in embeddings and alike and isinstance(weight, nn.Parameter):
            old_value, new_value = pairs[0]  # one scale (Gemma holds it twice: a float and a buffer)
            folded.append((_replaced_(rebuilt, weight, weight * (old_value / new_value)), new_value / old_value))
            continue
        attrs = ", ".join(f"{a} {v:g} to {w:g}" for a, (v, w) in changed.items())
        return f"the config with the new hidden size changes {path!r} ({attrs}), and funcprune cannot make up for it"
    heads = {p: ratio for weight, ratio in folded for p, m in rebuilt.named_modules()
             if isinstance(m, nn.Linear) and m.weight is weight}  # fmt: skip
    if not eps_norms and not heads:
        return None
    def within(path: str) -> str:  # the Linears that may make a norm's input: those of the module holding it
        parent = path.rpartition(".")[0]
        return f"{parent}." if parent else ""

    linears = [p for p, m in module.named_modules() if isinstance(m, nn.Linear)]
    layers = [p for p in linears if any(p.startswith(within(n)) for n in eps_norms)]
    outputs, ins = _seen(module, inputs, [*layers, *(dict.fromkeys(norms) if heads else ())], [*eps_norms, *heads])
    for path in eps_norms:
        mine = {p: outputs[p] for p in layers if p.startswith(within(path)) and p in outputs}
        why = _scaled_input_(rebuilt, path, ins.get(path), mine, math.sqrt(d / kept))
        if why is not None:
            return why
    for head, ratio in heads.items():
        made = next((n for n in dict.fromkeys(norms) if n in outputs and head in ins and torch.equal(outputs[n], ins[head])), None)
        if made is None:
            return f"the embedding is tied to {head!r}, whose input no norm on the stream makes"
        norm = rebuilt.get_submodule(made)
        w: Any = getattr(norm, "weight")
        offset = _offset(norm, w)
        _replaced_(rebuilt, w, (w + offset) * ratio - offset)  # the head computes what it did
    return None


def _seen(module: nn.Module, inputs: Inputs, outputs_of: Sequence[str], inputs_of: Sequence[str]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """One run of ``module`` on ``inputs``: the first output of each module of ``outputs_of``, the first input of
    each of ``inputs_of``, by path."""
    outputs: dict[str, Tensor] = {}
    ins: dict[str, Tensor] = {}
    hooks = [module.get_submodule(p).register_forward_hook(lambda m, a, o, p=p: outputs.setdefault(p, o.detach()))
             for p in outputs_of]  # fmt: skip
    hooks += [module.get_submodule(p).register_forward_pre_hook(lambda m, a, p=p: ins.setdefault(p, a[0].detach()))
              for p in inputs_of]  # fmt: skip
    try:
        run(module, inputs)
    finally:
        for h in hooks:
            h.remove()
    return outputs, ins


@torch.no_grad()
def _scaled_input_(rebuilt: nn.Module, path: str, u: Tensor | None, outputs: Mapping[str, Tensor], scale: float) -> str | None:
    """Scale by ``scale`` the rows of the Linear (one of ``outputs``, by path) whose output holds ``u``, the input of
    the norm at ``path`` (in ``rebuilt``)."""
    if u is None:
        return f"{path!r} reads the config's eps, and runs on none of the example inputs"
    made = u.flatten().sort().values  # its values, however laid out (transposed)
    for name, out in outputs.items():
        tokens = out.numel() // max(out.shape[-1], 1)
        if tokens == 0 or u.numel() % tokens:
            continue
        width, rows = u.numel() // tokens, out.reshape(tokens, -1)
        for start in range(0, rows.shape[1] - width + 1):
            if torch.equal(rows[:, start:start + width].flatten().sort().values, made):
                layer: Any = rebuilt.get_submodule(name)  # new tensors: the layer's may be the user's (uncut)
                for attr in ("weight", "bias"):
                    old = getattr(layer, attr)
                    if old is not None:
                        new = old.detach().clone()
                        new[start:start + width] *= scale
                        setattr(layer, attr, nn.Parameter(new, old.requires_grad))
                return None
    return f"{path!r} reads the config's eps, and funcprune finds no layer that makes its input to scale it"
