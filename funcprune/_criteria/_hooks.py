"""The weights whose inputs are observed, and the forward pre-hooks that sum a statistic of them.

A :class:`Statistic` says what to sum of each input's ``(tokens, features)``
rows; :func:`target_of` resolves a weight name to the module whose inputs
carry its features (a Linear, transformers' ``Conv1D``, a Conv with
``groups=1``); :func:`collector` is the hook that adds each input's
statistic to the sums, padding left out, shared by modules fed the same
unchanged tensor (:class:`Running`). A stacked expert weight
(:class:`ExpertTarget`) is one Linear weight per expert: its experts
module's hook (:func:`experts_collector`) sums each expert's statistic over
the tokens routed to it alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, final

import torch
from torch import nn

from .._expert_linears import SliceReads, eager_call
from .._names import not_a_parameter
from .._types import Tensor, is_conv1d
from ._exact import ExactSum, Scratch

__all__ = [
    "ExpertTarget", "Running", "Statistic", "Sum", "Target", "add_exact", "check_names", "collector", "expert_target_of",
    "experts_collector", "holder", "target_of", "token_rows",
]  # fmt: skip


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
    #: ``part`` returns a tensor of its own (not a view of its rows): a running sum may start as it and be
    #: added to in place from the second term (else the first term is held as it is).
    fresh: bool = True


@final
@dataclass(frozen=True, slots=True)
class Target:
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


def holder(path: str) -> str:
    """A module by its path, for messages: ``'blocks.0.fc'``, or the module itself."""
    return f"the module {path!r}" if path else "the module itself"


def check_names(fn: str, names: object) -> list[str]:
    """``names`` as a list of str, refusing a bare str or anything else with an error naming the argument."""
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


def target_of(fn: str, module: nn.Module, name: str, statistic: Statistic) -> Target:
    """Resolve ``name`` to its owner and check that ``statistic`` is defined on its inputs."""
    params = dict(module.named_parameters())
    if name not in params:
        raise not_a_parameter(fn, module, name, params)
    path, _, attr = name.rpartition(".")
    owner = module.get_submodule(path)
    where = f"{name!r} belongs to {holder(path)}, of type {type(owner).__name__}"
    supported = (
        f"{fn} supports the weight of nn.Linear and of transformers' Conv1D"
        if statistic.linear_only
        else f"{fn} supports the weight of nn.Linear and of nn.Conv1d/2d/3d with groups=1, "
        "and of transformers' Conv1D"
    )
    if attr == "weight" and is_conv1d(owner):  # x @ W, W stored (in, out)
        features = params[name].shape[0]
        return Target(name, path, owner, -1, features, (features, 1))
    if attr == "weight" and isinstance(owner, nn.Linear):
        return Target(name, path, owner, -1, owner.in_features, (owner.in_features,))
    if attr != "weight" or statistic.linear_only or not isinstance(owner, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        raise ValueError(f"{fn}: {where}; {supported}")
    if owner.groups != 1:
        raise ValueError(
            f"{fn}: {where} with groups={owner.groups}: its weight's dim 1 counts the input "
            f"channels of one group, not all {owner.in_channels}; {supported}"
        )
    features = owner.in_channels
    return Target(name, path, owner, -(len(owner.kernel_size) + 1), features, (features,))


@dataclass(slots=True)
class Running:
    """The call running: its real tokens, the last input a hook summed with what it gave, and who takes it.

    Modules fed the same input tensor in one call (a block's query, key and
    value projections) share its statistic instead of computing it again,
    as long as the tensor was not changed in place in between (``x +=
    fc1(x)``, ``relu_()``, through a view of it): its version counter,
    recorded with the statistic, tells (:meth:`reuses`).

    Their running sums are shared too (:meth:`flush`): a statistic is added
    once every module that takes it is known (when the next statistic is
    taken, and at the end of the call), once per sum tensor: names whose
    sums are one tensor and that take the same statistic keep one tensor.
    Each name's sum has the bits of its own ordered sum (the first term,
    then ``total + part`` in place, or as a new tensor where the first is
    not a tensor of its own or is another name's too), and a name whose statistic
    differs once gets a tensor of its own from then on. The exact sums of
    ``float64`` inputs are added at once, a name at a time.
    """

    sums: dict[str, Sum] = field(default_factory=dict)
    tokens: Tensor | None = None
    seen: Tensor | None = None
    version: int = 0
    dim: int = 0
    part: Tensor | None = None
    #: The statistic waiting to be added, whether it is a tensor of its own, and the names that took it.
    pending: Tensor | None = None
    fresh: bool = False
    takers: list[str] = field(default_factory=list)
    #: The names whose sum is a tensor :meth:`flush` made (``total + part``): it may add to it in place.
    owned: set[str] = field(default_factory=set)

    def forget(self) -> None:
        self.seen = self.part = None

    def end_call(self) -> None:
        """The call is over: its last statistic added, the input seen forgotten."""
        self.flush()
        self.forget()

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

    def take(self, name: str, part: Tensor, fresh: bool) -> None:
        """``name`` takes ``part`` (``fresh``: a tensor of its own), added with the other takers' by
        :meth:`flush` (the statistic waiting is added first where ``part`` is another)."""
        if part is not self.pending or name in self.takers:  # (a module called twice on one input: two terms)
            self.flush()
            self.pending, self.fresh = part, fresh
        self.takers.append(name)

    def flush(self) -> None:
        """Add the statistic waiting to the sums of the names that took it, once per sum tensor."""
        part, takers, sums = self.pending, self.takers, self.sums
        self.pending, self.takers = None, []
        if part is None:
            return
        groups: dict[int, list[str]] = {}
        for name in takers:
            groups.setdefault(id(sums.get(name)), []).append(name)
        for group in groups.values():
            total = sums.get(group[0])
            if isinstance(total, ExactSum):  # (a name that had a float64 input before: its own exact sum)
                total.add(part.to(torch.float64))
                continue
            if (total is not None and total is not part and all(n in self.owned for n in group)
                    and total.dtype == torch.promote_types(total.dtype, part.dtype)
                    and not any(t is total for n, t in sums.items() if n not in group)):  # fmt: skip
                total.add_(part)  # (the bits of total + part, without a new tensor a term)
                continue
            made = part if total is None else total + part
            for name in group:
                sums[name] = made
                if total is None and not self.fresh:  # (a view of the rows: held as it is)
                    self.owned.discard(name)
                else:
                    self.owned.add(name)


def _version(x: Tensor) -> int | None:
    """``x``'s version counter, which every in-place change to it or to a view of it bumps.

    ``None`` for an inference tensor (made under ``inference_mode``), which
    has no counter: its statistic is never reused. A write that bypasses
    the counter (through ``x.data``, or NumPy's view of the memory) is not
    seen, as autograd does not see it either.
    """
    return None if x.is_inference() else x._version


#: A running sum: a tensor, or, for ``float64`` inputs, an :class:`~._exact.ExactSum` (the same bits in any order).
Sum = Tensor | ExactSum


def add_exact(sums: dict[str, Sum], name: str, part: Tensor, scratch: Scratch) -> None:
    """Add the ``float64`` ``part`` to ``sums[name]``, an :class:`~._exact.ExactSum` (made, holding the running
    sum of another dtype as one term, where it is not one yet): the same bits in any order. The other sums are
    added by :meth:`Running.flush`."""
    total = sums[name] = ExactSum.of(sums.get(name), part.shape, part.device, scratch)
    total.add(part)


def collector(
    fn: str,
    target: Target,
    sums: dict[str, Sum],
    wide: set[str],
    statistic: Statistic,
    current: Running,
    scratch: Scratch,
) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], None]:
    """A forward pre-hook adding ``statistic`` of each input of ``target``'s module to ``sums``.

    The statistics of ``float64`` inputs add up in an :class:`~._exact.ExactSum`
    (on ``scratch``'s work tensors): the same bits however the calls are
    ordered or split between processes.
    """

    def hook(owner: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            got = f"dtype {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(f"{fn}: the input of {holder(target.path)} must be a floating-point "
                            f"tensor, got {got}")  # fmt: skip
        features = target.features
        if x.dim() < -target.feature_dim or x.shape[target.feature_dim] != features:
            raise ValueError(
                f"{fn}: {holder(target.path)} received an input of shape {tuple(x.shape)}; "
                f"expected its {features} input features in dim {target.feature_dim}"
            )
        part = current.reuses(x, target.feature_dim)  # the same input as the module before, unchanged
        if part is None:  # (q, k and v; gate and up share theirs: summed once)
            part = statistic.part(_rows(fn, target, x, current.tokens))
            current.record(x, target.feature_dim, part)
        if x.dtype == torch.float64:
            add_exact(sums, target.name, part, scratch)  # (the same bits in any order: added now)
            wide.add(target.name)
        else:
            current.take(target.name, part, statistic.fresh)  # (added with the other takers' once all are known)

    return hook


def _rows(fn: str, target: Target, x: Tensor, tokens: Tensor | None) -> Tensor:
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
                f"{fn}: {holder(target.path)} received an input of shape {tuple(x.shape)}, whose "
                f"tokens do not match the batch's attention_mask of shape {tuple(tokens.shape)}, so "
                "its padding cannot be left out; leave this weight out of names, or pass batches "
                "without an attention_mask (every token then counts)"
            )
    return rows.to(dtype)


def token_rows(fn: str, who: str, count: int, tokens: Tensor | None, remedy: str = "") -> Tensor | None:
    """Which of ``count`` flattened ``(batch * tokens)`` rows are real tokens (the batch's ``attention_mask``
    flattened), or ``None`` where every token counts; refused where the mask marks another number of tokens.

    ``who`` names what received the rows; ``remedy`` starts the error's advice (``"leave ... , or "``).
    """
    if tokens is None:
        return None
    if count != tokens.numel():
        raise ValueError(
            f"{fn}: {who} received {count} tokens, where the batch's attention_mask of shape "
            f"{tuple(tokens.shape)} has {tokens.numel()}, so its padding cannot be left out; {remedy}pass "
            "batches without an attention_mask"
        )
    return tokens.reshape(-1)


def _squeezed(shape: Sequence[int]) -> tuple[int, ...]:
    """A shape without its dims of size 1 (they do not change the order of the entries)."""
    return tuple(n for n in shape if n != 1)


@final
@dataclass(frozen=True, slots=True)
class ExpertTarget:
    """A stacked expert weight ``(count, ...)`` whose slices are Linear weights: each expert's inputs collected apart.

    ``dim`` is the input dim of a slice (``1``: ``F.linear(x, W[e])``;
    ``0``: ``x @ W[e]``), as :func:`~funcprune._expert_linears.expert_input_dims`
    finds it; ``shape`` the shape of a per-feature result of one slice,
    ``(features,)`` or ``(features, 1)``, as for a Linear or ``Conv1D``.
    """

    name: str
    path: str
    attr: str
    owner: nn.Module
    dim: int
    count: int
    features: int
    shape: tuple[int, ...]


def expert_target_of(fn: str, module: nn.Module, name: str, dim: int) -> ExpertTarget:
    """The stacked weight ``name`` of ``module``, its slices read along input dim ``dim`` (0 or 1)."""
    params = dict(module.named_parameters())
    if name not in params:
        raise not_a_parameter(fn, module, name, params)
    weight = params[name]
    path, _, attr = name.rpartition(".")
    if weight.dim() != 3 or dim not in (0, 1):
        raise ValueError(f"{fn}: {name!r} of shape {tuple(weight.shape)} is not a stack of Linear weights "
                         f"(count, out, in) read along dim {dim}")  # fmt: skip
    features = weight.shape[1 + dim]
    return ExpertTarget(name, path, attr, module.get_submodule(path), dim, weight.shape[0], features,
                        (features,) if dim == 1 else (features, 1))  # fmt: skip


def experts_collector(
    fn: str,
    path: str,
    targets: list[ExpertTarget],
    sums: dict[str, Sum],
    counts: dict[str, Tensor],
    wide: set[str],
    statistic: Statistic,
    current: Running,
    scratch: Scratch,
) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], None]:
    """A forward pre-hook on the experts module at ``path``: each expert's statistic, from its own tokens.

    The experts module is called ``experts(hidden_states (tokens, hidden),
    top_k_index, top_k_weights)``. The hook runs its eager forward once more
    on the real tokens alone (padding left out, as for a Linear) under
    :class:`~funcprune._expert_linears.SliceReads`: each ``W[e]`` read
    there adds the statistic of the rows it got to ``sums[name][e]`` (an
    :class:`~._exact.ExactSum` for ``float64`` hidden states), and
    their number to ``counts[name][e]``. The module's own call then runs as
    it would (its implementation may be another: ``grouped_mm``).
    """
    by_attr = {t.attr: t for t in targets}

    def seen(attr: str, e: int, x: Tensor, dim: int) -> None:
        target = by_attr[attr]
        if dim != target.dim:
            raise ValueError(f"{fn}: {target.name!r} was read along input dim {dim} of its slices, where "
                             f"running its experts alone read it along {target.dim}")  # fmt: skip
        part = statistic.part(x.to(torch.float64 if x.dtype.itemsize < 4 else x.dtype))
        total = sums[target.name]
        if isinstance(total, ExactSum):
            total.add_at(e, part.to(torch.float64))
        else:
            total[e] += part.to(total.dtype)
        counts[target.name][e] += x.shape[0]
        if x.dtype == torch.float64:
            wide.add(target.name)

    def hook(owner: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs.get("hidden_states")
        if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2 or not hidden.is_floating_point():
            got = f"shape {tuple(hidden.shape)}" if isinstance(hidden, torch.Tensor) else type(hidden).__name__
            raise ValueError(f"{fn}: {holder(path)} (experts) must be called with its hidden states as a "
                             f"floating-point (tokens, hidden) tensor first, got {got}")  # fmt: skip
        rows = token_rows(fn, f"{holder(path)} (experts)", hidden.shape[0], current.tokens,
                          "leave its weights out of names, or ")  # fmt: skip
        dtype = torch.float64 if hidden.dtype.itemsize < 4 else hidden.dtype
        for t in targets:
            shape = (t.count, *statistic.shape(t.features))
            if t.name not in sums:
                sums[t.name] = (ExactSum(shape, hidden.device, scratch) if hidden.dtype == torch.float64
                                else torch.zeros(shape, dtype=dtype, device=hidden.device))  # fmt: skip
                counts[t.name] = torch.zeros(t.count, dtype=torch.int64)
        stacked = {t.attr: getattr(owner, t.attr) for t in targets}
        with SliceReads(stacked, seen):
            eager_call(owner, args, kwargs, rows)

    return hook
