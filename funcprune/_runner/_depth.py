"""``layer_scores`` and ``hidden_scores``: how much each repeated block and each hidden channel matters.

Both walk a model block by block on calibration batches, as
:func:`~funcprune.oneshot` does (:class:`~._layers.Capture` records block 0's
inputs, then each block runs through ``torch.func.functional_call`` on the
hidden states held, one block's activations at a time), and never modify
the model. ``layer_scores`` compares the hidden states entering and leaving
each block (ShortGPT's block influence, Gromov et al.'s angular distance,
Minitron's cosine depth importance); ``hidden_scores`` is Minitron's
activation statistic of the hidden size, on the outputs of the norms that
read the residual stream.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._criteria import Call, calls
from .._families import takes_use_cache
from .._types import Tensor
from ._layers import Capture, Captured, RepeatedLayers, find_layers, hidden_of

__all__ = ["METRICS", "hidden_scores", "layer_scores"]

#: The metrics of :func:`layer_scores`.
METRICS = ("bi", "angular", "cosine")
#: Autograd nodes through which a tensor stays the residual stream: a sum (``residual + branch``, in place too),
#: a copy, a cast or a view of it.
_SUMS = frozenset({"AddBackward0", "AddBackward1"})
_SAME = frozenset({"CloneBackward0", "ToCopyBackward0", "ViewBackward0", "UnsafeViewBackward0", "ExpandBackward0"})

Hook = Callable[..., Any]


def layer_scores(model: nn.Module, batches: Iterable[object], *, metric: str = "bi", n: int = 1) -> Tensor:
    """One importance score per repeated block of ``model``, from the hidden states entering and leaving it.

    The blocks are those :func:`~funcprune.oneshot` walks (a transformers
    model's decoder or encoder layers), in order. Higher is more important:
    a depth plan removes the lowest first. Padding (0 in a batch's
    ``attention_mask``) is left out of every metric. The blocks run on the
    dense model's hidden states, block by block (one block's activations
    over the calibration set are held at a time), in ``float32`` or the
    model's dtype; the metrics are computed in ``float64``.

    - ``"bi"``: ShortGPT's *block influence* (Men et al. 2024), ``1 -
      cos(h_in, h_out)`` per token, as ``block_influence`` in
      sramshetty/ShortGPT's ``short_gpt/metrics.py`` (``cos`` is
      ``h_in . h_out / (|h_in| |h_out|)``, and 0.5 where that is ``0/0``),
      **summed** over every real token of every batch, as its
      ``compute_bi`` (``short_gpt/short_llama.py``, ``short_hf.py``) adds
      ``block_influence(...).sum()`` per forward: token-weighted, not a
      mean, so a batch counts by its tokens. (ShortGPT's HF version reads
      ``output_hidden_states``, whose last entry was, in the transformers
      of its time, after the final norm; here each block's own output.)
    - ``"angular"``: Gromov et al. 2024's angular distance
      ``arccos(cos) / pi`` (``cos`` as above, clamped to ``[-1, 1]``)
      between the hidden state entering block ``l`` and the one leaving
      block ``l + n - 1``, on the last real token of each sequence,
      **averaged** over every sequence of every batch (ShortGPT's
      ``compute_bi(angular=True)`` sums it: the same ranking). With
      ``n > 1`` a run of ``n`` contiguous blocks is removed: each block
      scores the smallest distance of any run of ``n`` blocks that holds
      it, so the ``n`` lowest scores (ties broken toward the lower index,
      as funcprune's selection does) are the run of least distance.
    - ``"cosine"``: NVIDIA ModelOpt's Minitron depth importance
      (``_register_depth_cosine_importance`` in
      ``modelopt/torch/prune/plugins/mcore_minitron.py``): per forward,
      ``1 - mean(F.cosine_similarity(h_in, h_out, dim=-1))`` over the
      forward's real tokens (every sequence of the batch together), then
      **summed** over forwards: a batch counts once, whatever its size.

    Args:
        model: the model (``model.eval()`` first, to score without
            dropout). It is never modified.
        batches: calibration batches, as :func:`~funcprune.oneshot` takes
            them (a dict with ``input_ids`` and optionally
            ``attention_mask``, a tensor, or a tuple of arguments). Consumed
            once.
        metric: ``"bi"``, ``"angular"`` or ``"cosine"``.
        n: the number of contiguous blocks removed together (``"angular"``
            only): 1 to the number of blocks minus 1.

    Returns:
        A ``float64`` tensor (on the CPU) of one score per block.

    Raises:
        TypeError: if ``model`` is not a module, ``metric`` not a string,
            ``n`` not an int, or a batch not one of the forms above.
        ValueError: if ``metric`` is unknown, ``n`` is not 1 for ``"bi"``
            or ``"cosine"`` or out of range for ``"angular"``, there are
            no batches or no real tokens, no repeated blocks are found, or a
            block's hidden states are not ``(batch, tokens, hidden)`` like
            the ``attention_mask``.
    """
    fn = "layer_scores"
    _check_model(fn, model)
    _check_metric(fn, metric, n)
    layers = find_layers(fn, model)
    count = len(layers.modules)
    if metric == "angular" and not 1 <= n <= count - 1:
        raise ValueError(f"{fn}: n must be between 1 and the number of blocks minus 1 ({count - 1}: the model has "
                         f"{count} blocks in {layers.path!r}) for metric='angular', got {n}")  # fmt: skip
    held = _capture(fn, model, layers, calls(fn, batches))
    scores = torch.zeros(count, dtype=torch.float64)
    ends = [torch.cat([_last_tokens(fn, h, t) for h, t in zip(held.hidden, held.tokens, strict=True)])]
    for i, block in enumerate(layers.modules):
        state = _state(block)
        for b, (h_in, tokens) in enumerate(zip(list(held.hidden), held.tokens, strict=True)):
            h_out = _advance(fn, i, b, block, state, held)
            if metric != "angular":
                x, y = _rows(fn, h_in, tokens), _rows(fn, h_out, tokens)
                if metric == "bi":
                    scores[i] += (1 - _cos(x, y)).sum().cpu()
                elif x.shape[0]:  # cosine: a forward without real tokens adds nothing
                    scores[i] += (1 - F.cosine_similarity(x, y, dim=-1).mean()).cpu()
        if metric == "angular":
            ends.append(torch.cat([_last_tokens(fn, h, t) for h, t in zip(held.hidden, held.tokens, strict=True)]))
    return _runs(ends, n) if metric == "angular" else scores


def hidden_scores(model: nn.Module, batches: Iterable[object], *, final_norm: bool = True) -> Tensor:
    """One importance score per hidden channel of ``model``'s residual stream: Minitron's activation statistic.

    NVIDIA ModelOpt's Minitron (``_register_hidden_size_importance`` in
    ``modelopt/torch/prune/plugins/mcore_minitron.py``) scores the hidden
    size from the outputs ``a`` of the norms that read the residual stream:
    for each norm and each sequence, the mean over the sequence's tokens of
    ``|a|`` per channel is squared and summed over the sequences of every
    batch (ModelOpt: ``a.abs().mean(dim=0).pow(2).sum(dim=0)`` on Megatron's
    ``(tokens, batch, hidden)``, added up over forwards); the score is the
    square root of that sum (an L2 norm over sequences of per-sequence mean
    magnitudes, not over tokens), summed over the norms. Here padding is
    left out (each sequence's mean is over its real tokens; a sequence
    without any adds nothing) and everything is in ``float64`` (ModelOpt:
    ``float32``).

    The norms are found by what they do, not by name: a module inside a
    block whose own 1-D ``weight`` has the hidden size (the last dim of the
    blocks' hidden states) and whose input is the block's hidden-state
    stream: the block's input itself, or a sum with it (``residual +
    attention``) or with the output of a norm found reading it (a
    post-norm block's stream), followed through copies, casts and views by
    autograd (the blocks run with gradients on their input only). A
    Llama's ``input_layernorm`` and ``post_attention_layernorm``, GPT-2's
    ``ln_1`` and ``ln_2``, OPT's, BERT's post-norms are such norms (a
    ``residual * alpha + branch`` is not followed); a ``q_norm`` or
    ``k_norm`` (of a head's width, or OLMo-2's of the hidden size, which
    reads the queries) is not, nor OLMo-2's post-norms, which read a
    branch's output. After the blocks, a module with such a weight whose
    input is the last block's output (a final norm: ``model.norm``,
    ``ln_f``), as one forward of the first batch shows, counts too (ModelOpt
    hooks the blocks' norms only; pass ``final_norm=False`` for exactly
    its set). Norms before the blocks (BERT's embedding norm) never count.

    Args:
        model: the model (``model.eval()`` first). It is never modified.
        batches: calibration batches, as :func:`layer_scores` takes them.
        final_norm: whether a final norm after the blocks counts.

    Returns:
        A ``float64`` tensor (on the CPU) of one score per hidden channel.

    Raises:
        TypeError: if ``model`` is not a module, ``final_norm`` not a bool,
            or a batch not one of :func:`layer_scores`'s forms.
        ValueError: if there are no batches or no real tokens, no repeated
            blocks, no norm reading the residual stream, or a norm's output
            is not ``(batch, tokens, hidden)`` like the ``attention_mask``.
    """
    fn = "hidden_scores"
    _check_model(fn, model)
    if not isinstance(final_norm, bool):
        raise TypeError(f"{fn}: final_norm must be a bool, got {type(final_norm).__name__}")
    layers = find_layers(fn, model)
    first: list[Call] = []
    held = _capture(fn, model, layers, _keep_first(calls(fn, batches), first))
    width = held.hidden[0].shape[-1]
    sums: dict[str, Tensor] = {}
    for i, block in enumerate(layers.modules):
        state = _state(block)
        norms = {layers.prefix(i) + name: m for name, m in block.named_modules() if _has_weight_of(m, width)}
        for b, tokens in enumerate(held.tokens):
            root = held.hidden[b].detach().requires_grad_(True)  # the stream's origin, for autograd to trace
            with _StreamNorms(fn, norms, root, tokens, sums):
                _advance(fn, i, b, block, state, held, root.clone())
    if final_norm:
        for name, norm, args, kwargs in _after_blocks(fn, model, layers, first[0], width):
            norm_state = _state(norm)
            for h, tokens in zip(held.hidden, held.tokens, strict=True):
                with torch.no_grad():
                    out = torch.func.functional_call(norm, norm_state, (h, *args), kwargs)
                _add_magnitudes(fn, name, hidden_of(fn, 0, out), tokens, h.shape, sums)
    if not sums:
        raise ValueError(
            f"{fn}: found no norm reading the residual stream of {layers.path!r} (a module whose 1-D weight has "
            f"the hidden size, {width}, and whose input is the blocks' hidden states)"
        )
    return torch.stack([s.sqrt() for s in sums.values()]).sum(0).cpu()


def _check_model(fn: str, model: object) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"{fn}: model must be a torch.nn.Module, got {type(model).__name__}")


def _check_metric(fn: str, metric: object, n: object) -> None:
    if not isinstance(metric, str):
        raise TypeError(f"{fn}: metric must be a string, one of {', '.join(map(repr, METRICS))}, "
                        f"got {type(metric).__name__}")  # fmt: skip
    if metric not in METRICS:
        raise ValueError(f"{fn}: metric must be one of {', '.join(map(repr, METRICS))}, got {metric!r}")
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{fn}: n must be an int (the number of contiguous blocks removed together), "
                        f"got {type(n).__name__}")  # fmt: skip
    if metric != "angular" and n != 1:
        raise ValueError(f"{fn}: n applies to metric='angular' only (runs of n contiguous blocks); metric={metric!r} "
                         f"scores blocks one by one and needs n=1, got n={n}")  # fmt: skip


def _capture(fn: str, model: nn.Module, layers: RepeatedLayers, stream: Iterable[Call]) -> Captured:
    """Block 0's hidden states and every block's other arguments, per batch (refused without a real token)."""
    capture = Capture(fn, model, layers, whole=False)
    with capture:
        for call in stream:
            capture(call)
    held = capture.captured
    if not held.hidden:
        raise ValueError(f"{fn}: no batches: batches was empty; pass at least one calibration batch")
    if all(t is not None and not bool(t.any()) for t in held.tokens):
        raise ValueError(f"{fn}: the batches hold no real tokens (their attention_mask is 0 everywhere)")
    return held


def _keep_first(stream: Iterable[Call], into: list[Call]) -> Iterator[Call]:
    """The calls of ``stream``, the first also appended to ``into``."""
    for call in stream:
        if not into:
            into.append(call)
        yield call


def _state(module: nn.Module) -> dict[str, Tensor]:
    """``module``'s parameters (detached) and buffers, for ``functional_call``."""
    return {**{n: p.detach() for n, p in module.named_parameters()}, **dict(module.named_buffers())}


def _advance(
    fn: str, i: int, b: int, block: nn.Module, state: dict[str, Tensor], held: Captured, hidden: Tensor | None = None
) -> Tensor:
    """Block ``i`` on batch ``b``'s states held (or on ``hidden``); its output replaces them and is returned.

    The block runs on a copy: one that adds to its input in place leaves the states held as they were.
    """
    call = held.call(i, b, held.hidden[b].clone() if hidden is None else hidden)
    with torch.no_grad() if hidden is None else torch.enable_grad():
        out = torch.func.functional_call(block, state, call.args, call.kwargs)
    result = hidden_of(fn, i, out).detach()
    held.hidden[b] = result
    return result


def _check_shape(fn: str, what: str, h: Tensor, tokens: Tensor | None) -> None:
    """Refuses ``h`` unless ``(batch, tokens, hidden)`` with the ``attention_mask``'s ``(batch, tokens)``."""
    if h.dim() != 3 or (tokens is not None and tuple(h.shape[:2]) != tuple(tokens.shape)):
        raise ValueError(
            f"{fn}: {what} have shape {tuple(h.shape)}; expected (batch, tokens, hidden)"
            + (f" matching the attention_mask's {tuple(tokens.shape)}" if tokens is not None else "")
        )


def _rows(fn: str, h: Tensor, tokens: Tensor | None) -> Tensor:
    """The ``(real tokens, hidden)`` rows of hidden states ``(batch, tokens, hidden)``, in ``float64``."""
    _check_shape(fn, "the blocks' hidden states", h, tokens)
    rows = h.detach().reshape(-1, h.shape[-1])
    if tokens is not None:
        rows = rows[tokens.reshape(-1).to(rows.device)]
    return rows.to(torch.float64)


def _last_tokens(fn: str, h: Tensor, tokens: Tensor | None) -> Tensor:
    """Each sequence's hidden state at its last real token, ``(sequences, hidden)`` in ``float64``.

    A sequence without a real token is left out.
    """
    _check_shape(fn, "the blocks' hidden states", h, tokens)
    if tokens is None:
        return h[:, -1].detach().to(torch.float64)
    real = tokens.to(h.device)
    last = real.shape[1] - 1 - real.flip(1).to(torch.int8).argmax(1)
    some = real.any(1)
    return h.detach()[torch.arange(h.shape[0], device=h.device)[some], last[some]].to(torch.float64)


def _cos(x: Tensor, y: Tensor) -> Tensor:
    """ShortGPT's ``block_influence`` cosine per row: ``x . y / (|x| |y|)``, 0.5 where that is ``0/0``."""
    sim: Tensor = (x * y).sum(-1) / (x.norm(dim=-1) * y.norm(dim=-1))
    return torch.nan_to_num(sim, nan=0.5)


def _runs(ends: list[Tensor], n: int) -> Tensor:
    """Per block, the least angular distance of a run of ``n`` blocks holding it, from the states at each boundary."""
    count = len(ends) - 1
    runs = torch.stack([
        (_cos(ends[s], ends[s + n]).clamp(-1.0, 1.0).arccos() / math.pi).mean().cpu() for s in range(count - n + 1)
    ])  # fmt: skip
    return torch.stack([runs[max(0, k - n + 1) : min(k, count - n) + 1].min() for k in range(count)])


def _has_weight_of(module: nn.Module, width: int) -> bool:
    """Whether ``module``'s own ``weight`` is 1-D of length ``width`` (a norm of the hidden size, by its shape)."""
    weight = dict(module.named_parameters(recurse=False)).get("weight")
    return weight is not None and weight.dim() == 1 and weight.shape[0] == width


def _from_stream(x: Tensor, stream: list[object]) -> bool:
    """Whether ``x`` is a stream tensor or a sum with one (through copies, casts and views), by its autograd graph.

    ``stream`` holds the stream's autograd nodes: the block input's (a leaf's ``AccumulateGrad``, matched by its
    variable) and the outputs' of the norms found reading it (a post-norm block's stream: BERT's).
    """
    todo, seen = [x.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if any(node is s or getattr(node, "variable", None) is s for s in stream):
            return True
        if node.name() in _SUMS or node.name() in _SAME:
            todo.extend(following for following, _ in node.next_functions)
    return False


def _add_magnitudes(
    fn: str, name: str, out: Tensor, tokens: Tensor | None, shape: torch.Size, sums: dict[str, Tensor]
) -> None:
    """Adds Minitron's ``sum over sequences of (mean over real tokens of |out|)^2`` per channel to ``sums[name]``.

    ``shape`` is the blocks' hidden states' ``(batch, tokens, hidden)``: an output flattened to ``(batch *
    tokens, hidden)`` (OPT's MLP norm) is read as one of that shape.
    """
    if out.dim() == 2 and out.shape[0] == shape[0] * shape[1] and out.shape[1] == shape[2]:
        out = out.reshape(shape)
    _check_shape(fn, f"the outputs of {name!r}", out, tokens)
    a = out.detach().to(torch.float64).abs()
    real = torch.ones(a.shape[:2], dtype=torch.bool, device=a.device) if tokens is None else tokens.to(a.device)
    counts = real.sum(1, keepdim=True)
    means = torch.where(real[..., None], a, 0.0).sum(1) / counts.clamp(min=1)
    part = means[counts[:, 0] > 0].pow(2).sum(0).cpu()
    sums[name] = sums[name] + part if name in sums else part


class _StreamNorms:
    """While entered: hooks on ``norms`` adding the magnitudes of those whose input comes from ``root``."""

    def __init__(self, fn: str, norms: dict[str, nn.Module], root: Tensor, tokens: Tensor | None,
                 sums: dict[str, Tensor]) -> None:  # fmt: skip
        self.fn, self.norms, self.root, self.tokens, self.sums = fn, norms, root, tokens, sums
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._reading: dict[str, bool] = {}
        self._stream: list[object] = [root]  # the input, then the outputs of the norms found reading the stream

    def __enter__(self) -> _StreamNorms:
        try:
            for name, module in self.norms.items():
                self._handles.append(module.register_forward_pre_hook(self._before(name), with_kwargs=True))
                self._handles.append(module.register_forward_hook(self._after(name)))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _before(self, name: str) -> Hook:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = args[0] if args else next(iter(kwargs.values()), None)
            width = self.root.shape[-1]
            self._reading[name] = isinstance(x, torch.Tensor) and x.shape[-1] == width and _from_stream(x, self._stream)

        return hook

    def _after(self, name: str) -> Hook:
        def hook(module: nn.Module, args: tuple[Any, ...], out: object) -> None:
            if self._reading.pop(name, False):
                got = hidden_of(self.fn, 0, out)
                self._stream.append(got.grad_fn)
                _add_magnitudes(self.fn, name, got, self.tokens, self.root.shape, self.sums)

        return hook


def _after_blocks(
    fn: str, model: nn.Module, layers: RepeatedLayers, call: Call, width: int
) -> list[tuple[str, nn.Module, tuple[Any, ...], dict[str, Any]]]:
    """The modules outside the blocks, with a weight of the hidden size, that read the last block's output.

    One forward of ``call`` shows them: ``(name, module, other args, kwargs)`` as each was called.
    """
    inside = layers.path + "." if layers.path else ""
    candidates = [(name, m) for name, m in model.named_modules()
                  if not (inside and name.startswith(inside)) and _has_weight_of(m, width)]  # fmt: skip
    last: list[Tensor] = []
    found: dict[str, tuple[str, nn.Module, tuple[Any, ...], dict[str, Any]]] = {}

    def record(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: object) -> None:
        last[:] = [hidden_of(fn, len(layers.modules) - 1, out)]

    def reader(name: str) -> Hook:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if args and last and isinstance(args[0], torch.Tensor) and _same(args[0], last[0]):
                found.setdefault(name, (name, module, tuple(args[1:]), dict(kwargs)))

        return hook

    handles = [layers.modules[-1].register_forward_hook(record, with_kwargs=True)]
    try:
        handles += [m.register_forward_pre_hook(reader(name), with_kwargs=True) for name, m in candidates]
        kwargs = call.kwargs if not takes_use_cache(model) or "use_cache" in call.kwargs else {
            **call.kwargs, "use_cache": False}  # fmt: skip
        with torch.no_grad():
            model(*call.args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return list(found.values())


def _same(a: Tensor, b: Tensor) -> bool:
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and bool(torch.equal(a, b)))
