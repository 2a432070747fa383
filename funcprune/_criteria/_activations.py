"""Calibration statistics: what reaches a model's weights when it runs on data.

:func:`input_norms` runs a module on calibration batches and returns, per
named weight, the L2 norm of each input feature over every token that
reached it: the activation statistic of Wanda (Sun et al. 2023), which
:func:`funcprune.wanda` turns into scores. Collection goes through forward
pre-hooks that are removed before returning, so the module is left as it was.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

import torch
from torch import nn

from .._names import not_a_parameter
from .._types import Tensor, is_conv1d

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["NORMS", "Call", "Statistic", "calls", "collect", "input_norms"]


def input_norms(
    module: nn.Module, batches: Iterable[object], names: Iterable[str], *, across: ProcessGroup | None = None
) -> dict[str, Tensor]:
    """The L2 norm of each input feature of some weights, over calibration batches.

    Runs ``module`` on every batch, under :func:`torch.no_grad`, and for
    each weight in ``names`` collects the inputs reaching the module that
    owns it: an :class:`~torch.nn.Linear` or transformers' ``Conv1D``
    (GPT-2's layers; features: the last dim of its input; every other dim
    counts tokens) or a ``Conv1d/2d/3d`` with ``groups=1`` (features: the
    input channels; batch and spatial positions count tokens). The result
    feeds :func:`wanda`. A module called several times per batch (a shared
    layer) counts every call. Each module counts its input as it was when
    it received it, also where the forward changes that tensor in place
    between two layers (``x += fc1(x)`` before ``fc2(x)``).

    The norms of a weight come shaped to scale it as it is stored: a 1-D
    tensor of ``in`` norms for a Linear or Conv weight (``(out, in,
    *kernel)``, features along dim 1), and a column of shape ``(in, 1)``
    for a ``Conv1D`` weight (stored ``(in, out)``, features along dim 0), so
    that :func:`wanda` scales each along its input dim with no more
    argument (``norms.flatten()`` gives the plain vector).

    Sums of squares are accumulated in ``float64`` for inputs narrower than
    ``float32`` (``float16``, ``bfloat16``: their squares overflow early),
    in the input's dtype otherwise; the norms are returned as ``float64``
    if an input was ``float64``, as ``float32`` otherwise, on the inputs'
    device.

    Padding is left out: a dict batch with an ``attention_mask`` (``(batch,
    tokens)``, 1 at real tokens and 0 at padding) counts only the real
    tokens, in every module whose input has those tokens (``(batch, tokens,
    features)``, or the ``batch * tokens`` rows of a 2-D flattened input in
    that order); an input with one row per sequence (a pooler's) counts
    every row; a module whose input has other tokens is refused with an
    error naming it. Every token counts in batches of other kinds, with a
    mask of another shape (a 4-D one), and in encoder-decoder batches (with
    ``decoder_*`` keys), whose mask is the encoder's alone. An input laid
    out ``(tokens, batch, features)`` with as many tokens as sequences
    cannot be told apart from ``(batch, tokens, features)``: such a model
    needs batches without a mask.

    The module runs as it is: call ``module.eval()`` first to calibrate
    without dropout (in training mode, BatchNorm updates its running
    statistics as in any forward). The hooks are removed before returning,
    also on error: the module is left with its hooks, mode and parameters
    as they were. A tied weight goes by the name ``named_parameters()``
    gives it (the first), and only the module holding it under that name is
    observed.

    Args:
        module: the model, as an :class:`torch.nn.Module`.
        batches: an iterable of batches; each is called as
            ``module(batch)`` for a tensor, ``module(*batch)`` for a tuple or
            list, ``module(**batch)`` for a dict. A generator is fine: it is
            consumed once.
        names: weight names as ``module.named_parameters()`` gives them, such
            as ``"blocks.0.mlp.fc1.weight"``. With none, nothing runs and the
            result is empty.
        across: a ``torch.distributed`` process group (``dist.group.WORLD``
            for all): every process of it calls this with its own batches
            (data parallel, FSDP2) and each gets the norms over all of
            them, the sums of squares summed by one ``all_reduce`` (in
            ``float64``) before the root. ``None``: this process's batches
            only.

    Returns:
        A new dict ``{name: norms}``, in the order of ``names``, each with
        one entry per input feature: a 1-D tensor, or a ``(in, 1)`` column
        for a ``Conv1D`` weight.

    Raises:
        TypeError: if an argument or a batch has the wrong type, or an input
            is not floating-point.
        UnknownNameError: if a name is no parameter of ``module``.
        ValueError: if a name is not the weight of a supported module (this
            and the errors above are raised before any batch runs), if there
            are no batches, if a module receives an input without its
            features or whose tokens the batch's ``attention_mask`` does not
            match, or if a weight's module was never called.

    >>> import torch, funcprune as fp
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    >>> batches = [torch.tensor([[3.0, 0.0]]), torch.tensor([[4.0, 1.0]])]
    >>> fp.input_norms(model, batches, ["0.weight"])
    {'0.weight': tensor([5., 1.])}
    """
    fn = "input_norms"
    return collect(fn, module, calls(fn, batches), names, NORMS, across=across)


@final
@dataclass(frozen=True, slots=True)
class Call:
    """One call of a module: its positional and keyword arguments, and which of its tokens are real.

    ``tokens`` is a bool ``(batch, tokens)`` tensor (``True`` = counted, as
    an ``attention_mask`` marks real tokens), or ``None`` to count every token.
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    tokens: Tensor | None = None


@final
@dataclass(frozen=True, slots=True)
class Statistic:
    """What is summed over the tokens reaching a weight's module.

    ``part(x)`` maps an input's ``(tokens, features)`` rows (in the summing
    dtype) to this call's contribution; ``shape(features)`` is the sum's
    shape. ``linear_only``: defined for Linear and ``Conv1D`` weights only.
    ``narrow_in_float64``: the sums of inputs narrower than ``float32`` are
    returned in ``float64`` (in ``float32`` otherwise). ``finish``, if
    given, maps each total before that cast (the norms' square root, taken
    while a ``bfloat16`` input's large sums still fit).
    """

    part: Callable[[Tensor], Tensor]
    shape: Callable[[int], tuple[int, ...]]
    linear_only: bool
    narrow_in_float64: bool
    finish: Callable[[Tensor], Tensor] | None = None


#: ``input_norms``'s: the L2 norm of each feature (the root of its sum of squares, taken before the result's cast).
NORMS = Statistic(
    lambda x: x.square().sum(dim=0), lambda f: (f,), linear_only=False, narrow_in_float64=False, finish=torch.sqrt
)


def calls(fn: str, batches: Iterable[object]) -> Iterator[Call]:
    """The calls of a model on ``batches``: ``module(batch)``, ``module(*batch)`` or ``module(**batch)``.

    ``batches`` is checked now; each batch when its turn comes. A dict
    batch's ``attention_mask`` (a 2-D tensor) marks its real tokens.
    """
    _check_batches(fn, batches)
    return _calls(fn, batches)


def _calls(fn: str, batches: Iterable[object]) -> Iterator[Call]:
    for i, batch in enumerate(batches):
        if isinstance(batch, torch.Tensor):
            yield Call((batch,), {})
        elif isinstance(batch, (tuple, list)):
            yield Call(tuple(batch), {})
        elif isinstance(batch, Mapping):
            kwargs = dict(batch)
            seq2seq = any(k.startswith("decoder_") for k in kwargs)  # the mask is the encoder's only
            yield Call((), kwargs, None if seq2seq else _tokens(fn, i, kwargs.get("attention_mask")))
        else:
            raise TypeError(
                f"{fn}: batch {i} must be a tensor, a tuple or list of arguments or a dict "
                f"of keyword arguments, got {type(batch).__name__}"
            )


def _tokens(fn: str, i: int, mask: object) -> Tensor | None:
    """The real tokens a batch's ``attention_mask`` marks, or ``None`` (every token counts).

    Only a ``(batch, tokens)`` tensor of 0 and 1 (or bool) marks tokens; any
    other mask (a 4-D one, a list) tells nothing per token, and every token
    counts, as the model's own handling of it decides. A 2-D mask of other
    values (an additive one, 0 and ``-inf``) is refused: which of its values
    mean padding is not for this to guess.
    """
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        return None
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(
            f"{fn}: batch {i}'s attention_mask must hold 1 at real tokens and 0 at padding (or be bool); "
            "it holds other values (an additive mask?): pass the 0/1 mask a tokenizer returns"
        )
    return mask != 0


def collect(
    fn: str,
    module: nn.Module,
    calls: Iterable[Call],
    names: Iterable[str],
    statistic: Statistic,
    *,
    across: ProcessGroup | None = None,
    run: Callable[[Call], object] | None = None,
) -> dict[str, Tensor]:
    """Sum ``statistic`` over every token reaching each named weight's module, in ``calls`` of ``module``.

    The engine of :func:`input_norms` and :func:`~funcprune.hessians` (and
    of the one-shot runner, which calls a block on captured arguments):
    forward pre-hooks, removed before returning, that sum in ``float64`` for
    inputs narrower than ``float32``, in the input's dtype otherwise;
    ``across`` sums over a process group in one ``all_reduce``. Everything
    but the calls themselves is checked before the first one runs. Returns
    the sums by name, in the order of ``names``: ``float64`` where an input
    was ``float64`` or narrower than ``float32``, ``float32`` otherwise.
    ``run`` makes each call (``module(*call.args, **call.kwargs)`` if
    ``None``): the runner calls a block through ``functional_call``.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"{fn}: module must be a torch.nn.Module, got {type(module).__name__}")
    targets = [_target(fn, module, name, statistic) for name in dict.fromkeys(_check_names(fn, names))]
    _check_across(fn, across)
    if not targets:
        return {}
    sums: dict[str, Tensor] = {}  # by weight name
    wide: set[str] = set()  # the weights that received a float64 input
    current = _Running()  # the call running: its real tokens, its last input seen
    handles = []
    try:
        for target in targets:
            hook = _collector(fn, target, sums, wide, statistic, current)
            handles.append(target.owner.register_forward_pre_hook(hook, with_kwargs=True))
        if across is not None:  # every process's calls: fail together, count together
            return _across(fn, run or _caller(module), calls, targets, sums, wide, statistic, current, across)
        ran = _run(run or _caller(module), calls, current)
    finally:
        for handle in handles:
            handle.remove()
    return _totals(fn, ran, targets, sums, wide, statistic)


def _totals(
    fn: str, ran: int, targets: list[_Target], sums: dict[str, Tensor], wide: set[str], statistic: Statistic
) -> dict[str, Tensor]:
    """The sums, once the calls ran and every target was called, in their result dtype and shape."""
    if not ran:
        raise ValueError(
            f"{fn}: no batches: batches was empty; pass at least one calibration batch"
        )
    never = [target for target in targets if target.name not in sums]
    if never:
        raise ValueError(
            f"{fn}: {_holder(never[0].path)}, holding {never[0].name!r}, was never called by "
            "any batch, so its inputs have no statistics; leave it out of names (a layer whose "
            "parent uses its weight without calling it, like MultiheadAttention's out_proj, "
            "is never called)"
        )
    out: dict[str, Tensor] = {}
    storages: set[int] = set()
    for t in targets:
        total = sums[t.name]
        wider = t.name in wide or (statistic.narrow_in_float64 and total.dtype == torch.float64)
        if statistic.finish is not None:
            total = statistic.finish(total)
        total = total.to(torch.float64 if wider else torch.float32)
        if total.untyped_storage().data_ptr() in storages:  # shared with another weight's (the same input)
            total = total.clone()
        storages.add(total.untyped_storage().data_ptr())
        out[t.name] = total.reshape(t.shape) if total.dim() == 1 else total
    return out


def _check_across(fn: str, across: object) -> None:
    """Refuse, before any batch runs, an ``across`` that is no process group of an initialized ``torch.distributed``."""
    if across is None:
        return
    import torch.distributed as dist

    if not dist.is_available() or not isinstance(across, dist.ProcessGroup):
        raise TypeError(
            f"{fn}: across must be a torch.distributed process group (dist.group.WORLD, or one from "
            f"dist.new_group) or None, got {across!r} of type {type(across).__name__}"
        )
    if not dist.is_initialized():
        raise ValueError(f"{fn}: across is a process group, but torch.distributed is not initialized")


def _across(
    fn: str,
    run: Callable[[Call], object],
    calls: Iterable[Call],
    targets: list[_Target],
    sums: dict[str, Tensor],
    wide: set[str],
    statistic: Statistic,
    current: _Running,
    group: ProcessGroup,
) -> dict[str, Tensor]:
    """:func:`collect` over every process of ``group``, each with its own calls.

    One ``all_reduce`` (``float64``) carries whether each process failed,
    how many calls it ran, and per target whether it was called, had a
    ``float64`` input, summed in ``float64`` (an input narrower than
    ``float32``), and its sums (zeros where it was not called here): so
    every process decides from the same numbers, and a failure on one (a
    bad batch) fails all instead of leaving them waiting.
    """
    import torch.distributed as dist

    failure: Exception | None = None
    ran = 0
    try:
        ran = _run(run, calls, current)
    except Exception as e:  # noqa: BLE001 (raised below, on every process)
        failure = e
    shapes = [statistic.shape(t.features) for t in targets]
    sizes = [math.prod(shape) for shape in shapes]
    k = len(targets)
    head = [float(failure is not None), float(ran)] + [float(t.name in sums) for t in targets]
    head += [float(t.name in wide) for t in targets]
    head += [float(t.name in sums and sums[t.name].dtype == torch.float64) for t in targets]
    weight = targets[0].owner.weight
    assert isinstance(weight, torch.Tensor)  # a Linear's, Conv1D's or Conv's
    device = weight.device  # the same on every process, batches run or not (a CUDA group's)
    parts = [torch.tensor(head, dtype=torch.float64, device=device)]
    for t, n in zip(targets, sizes, strict=True):
        mine = sums[t.name].to(torch.float64).flatten() if t.name in sums else None
        parts.append(mine if mine is not None else torch.zeros(n, dtype=torch.float64, device=device))
    flat = torch.cat(parts)
    dist.all_reduce(flat, group=group)
    if failure is not None:
        raise failure
    if flat[0]:
        raise ValueError(f"{fn}: another process of the group failed on its batches (its own error says why)")
    called, widened, narrow = flat[2 : 2 + k], flat[2 + k : 2 + 2 * k], flat[2 + 2 * k : 2 + 3 * k]
    total: dict[str, Tensor] = {}
    start = 2 + 3 * k
    for i, (t, n, shape) in enumerate(zip(targets, sizes, shapes, strict=True)):
        if called[i]:
            dtype = torch.float64 if widened[i] or narrow[i] else torch.float32
            total[t.name] = flat[start : start + n].reshape(shape).to(dtype)
        start += n
    return _totals(fn, int(flat[1]), targets, total, {t.name for i, t in enumerate(targets) if widened[i]}, statistic)


# --- the weights observed, and the hooks ---------------------------------------


@final
@dataclass(frozen=True, slots=True)
class _Target:
    """A weight whose inputs are collected: its name, its module, where its features are and how many."""

    name: str
    path: str
    owner: nn.Module
    #: The dim of an input that holds the features, counted from the end
    #: (so that unbatched inputs work too): -1 for Linear and Conv1D, -(k + 1)
    #: for a Conv with a k-dim kernel.
    feature_dim: int
    #: How many input features the module has.
    features: int
    #: The shape of a per-feature result (norms): ``(features,)``, or ``(features, 1)``
    #: for a weight stored ``(in, out)`` (Conv1D), so that they broadcast
    #: against the weight as stored.
    shape: tuple[int, ...]


def _holder(path: str) -> str:
    """A module by its path, for messages: ``'blocks.0.fc'``, or the module itself."""
    return f"the module {path!r}" if path else "the module itself"


def _check_names(fn: str, names: object) -> list[str]:
    if isinstance(names, str):
        raise TypeError(f"{fn}: names must be a list of parameter names, got the str {names!r}; "
                        f"write [{names!r}]")  # fmt: skip
    if not isinstance(names, Iterable):
        raise TypeError(
            f"{fn}: names must be a list of parameter names, got {type(names).__name__}"
        )
    checked = list(names)
    for i, name in enumerate(checked):
        if not isinstance(name, str):
            raise TypeError(f"{fn}: names[{i}] must be a str, got {type(name).__name__}")
    return checked


def _check_batches(fn: str, batches: object) -> None:
    if isinstance(batches, (torch.Tensor, Mapping, str)) or not isinstance(batches, Iterable):
        raise TypeError(
            f"{fn}: batches must be an iterable of batches (a list, a DataLoader, a generator), "
            f"got {type(batches).__name__}; wrap a single batch as [batch]"
        )


def _target(fn: str, module: nn.Module, name: str, statistic: Statistic) -> _Target:
    """Resolve ``name`` to its owner and check that ``statistic`` is defined on its inputs."""
    params = dict(module.named_parameters())
    if name not in params:
        raise not_a_parameter(fn, module, name, params)
    path, _, attr = name.rpartition(".")
    owner = module.get_submodule(path)
    where = f"{name!r} belongs to {_holder(path)}, of type {type(owner).__name__}"
    supported = (
        f"{fn} supports the weight of nn.Linear and of transformers' Conv1D"
        if statistic.linear_only
        else f"{fn} supports the weight of nn.Linear and of nn.Conv1d/2d/3d with groups=1, "
        "and of transformers' Conv1D"
    )
    if attr == "weight" and is_conv1d(owner):  # x @ W, W stored (in, out)
        features = params[name].shape[0]
        return _Target(name, path, owner, -1, features, (features, 1))
    if attr == "weight" and isinstance(owner, nn.Linear):
        return _Target(name, path, owner, -1, owner.in_features, (owner.in_features,))
    if attr != "weight" or statistic.linear_only or not isinstance(owner, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        raise ValueError(f"{fn}: {where}; {supported}")
    if owner.groups != 1:
        raise ValueError(
            f"{fn}: {where} with groups={owner.groups}: its weight's dim 1 counts the input "
            f"channels of one group, not all {owner.in_channels}; {supported}"
        )
    features = owner.in_channels
    return _Target(name, path, owner, -(len(owner.kernel_size) + 1), features, (features,))


@dataclass(slots=True)
class _Running:
    """The call running: its real tokens, and the last input a hook summed with what it gave.

    Modules fed the same input tensor in one call (a block's query, key and
    value projections) share its statistic instead of computing it again,
    as long as the tensor was not changed in place in between (``x +=
    fc1(x)``, ``relu_()``, through a view of it): its version counter,
    recorded with the statistic, tells (:meth:`reuses`).
    """

    tokens: Tensor | None = None
    seen: Tensor | None = None
    version: int = 0
    dim: int = 0
    part: Tensor | None = None

    def forget(self) -> None:
        self.seen = self.part = None

    def reuses(self, x: Tensor, dim: int) -> Tensor | None:
        """The statistic summed for ``x`` (features in ``dim``) if ``x`` is unchanged since, else ``None``."""
        if self.seen is not x or self.dim != dim or self.part is None:
            return None
        version = _version(x)
        return self.part if version is not None and version == self.version else None

    def record(self, x: Tensor, dim: int, part: Tensor) -> None:
        """Remember ``part`` as the statistic of ``x`` as it is now, if its changes can be told (:func:`_version`)."""
        version = _version(x)
        if version is None:
            self.forget()
        else:
            self.seen, self.version, self.dim, self.part = x, version, dim, part


def _version(x: Tensor) -> int | None:
    """``x``'s version counter, which every in-place change to it or to a view of it bumps.

    ``None`` for an inference tensor (made under ``inference_mode``), which
    has no counter: its statistic is never reused. A write that bypasses
    the counter (through ``x.data``, or NumPy's view of the memory) is not
    seen, as autograd does not see it either.
    """
    return None if x.is_inference() else x._version


def _collector(
    fn: str,
    target: _Target,
    sums: dict[str, Tensor],
    wide: set[str],
    statistic: Statistic,
    current: _Running,
) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], None]:
    """A forward pre-hook adding ``statistic`` of each input of ``target``'s module to ``sums``."""

    def hook(owner: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            got = f"dtype {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(f"{fn}: the input of {_holder(target.path)} must be a floating-point "
                            f"tensor, got {got}")  # fmt: skip
        features = target.features
        if x.dim() < -target.feature_dim or x.shape[target.feature_dim] != features:
            raise ValueError(
                f"{fn}: {_holder(target.path)} received an input of shape {tuple(x.shape)}; "
                f"expected its {features} input features in dim {target.feature_dim}"
            )
        part = current.reuses(x, target.feature_dim)  # the same input as the module before, unchanged
        if part is None:  # (q, k and v; gate and up share theirs: summed once)
            part = statistic.part(_rows(fn, target, x, current.tokens))
            current.record(x, target.feature_dim, part)
        sums[target.name] = sums[target.name] + part if target.name in sums else part
        if x.dtype == torch.float64:
            wide.add(target.name)

    return hook


def _rows(fn: str, target: _Target, x: Tensor, tokens: Tensor | None) -> Tensor:
    """``x`` as ``(tokens, features)`` rows in the summing dtype, padding left out.

    Inputs narrower than ``float32`` are summed in ``float64`` (a
    ``float16`` square overflows past 255), the others in their dtype.
    """
    dtype = torch.float64 if x.dtype.itemsize < 4 else x.dtype
    x = x.detach()
    if x.dim() + target.feature_dim != x.dim() - 1:  # a Conv's channels: moved last
        x = x.movedim(x.dim() + target.feature_dim, -1)
    rows = x.reshape(-1, target.features)
    if tokens is not None:
        if _squeezed(x.shape[:-1]) == _squeezed(tokens.shape) and rows.shape[0] == tokens.numel():
            rows = rows[tokens.reshape(-1).to(rows.device)]  # dims of size 1 apart (MLA's (batch, 1, tokens, ...))
        elif x.dim() == 2 and rows.shape[0] == tokens.numel():  # a flattened (batch * tokens, features) input
            rows = rows[tokens.reshape(-1).to(rows.device)]
        elif tuple(x.shape[:-1]) == tuple(tokens.shape[:1]):  # one row per sequence (a pooler's): all count
            pass
        else:
            raise ValueError(
                f"{fn}: {_holder(target.path)} received an input of shape {tuple(x.shape)}, whose "
                f"tokens do not match the batch's attention_mask of shape {tuple(tokens.shape)}, so "
                "its padding cannot be left out; leave this weight out of names, or pass batches "
                "without an attention_mask (every token then counts)"
            )
    return rows.to(dtype)


def _squeezed(shape: Sequence[int]) -> tuple[int, ...]:
    """A shape without its dims of size 1 (they do not change the order of the entries)."""
    return tuple(n for n in shape if n != 1)


def _caller(module: nn.Module) -> Callable[[Call], object]:
    return lambda call: module(*call.args, **call.kwargs)


def _run(run: Callable[[Call], object], calls: Iterable[Call], current: _Running) -> int:
    """Make every call, without autograd; return how many ran."""
    ran = 0
    with torch.no_grad():
        try:
            for call in calls:
                current.tokens = call.tokens
                run(call)
                current.forget()
                ran += 1
        finally:
            current.tokens = None
            current.forget()
    return ran
