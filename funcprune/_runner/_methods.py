"""One-shot methods as values: what a method needs collected for each weight, and how it prunes from it.

What :func:`~funcprune.oneshot` does on each block is a :class:`Method`
value's: the runner collects the statistic the method names for the
block's weights, on the block's inputs, and calls the method's pure
``prune`` for the new weights and the masks. :class:`Magnitude`,
:class:`Wanda` and :class:`SparseGPT` are the built-in ones, with no
branch of their own in the runner; the strings ``"magnitude"``,
``"wanda"`` and ``"sparsegpt"`` are shorthands for their default values
(:func:`method_of`). :func:`prune_with` calls a method and refuses what
is not a mask of each weight it was given.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, final

import torch

from .._criteria import GRAMS, NORMS, Statistic, sparsegpt, sparsegpt_consuming, wanda
from .._plans import Plan
from .._specs import Spec
from .._types import Tensor

__all__ = ["SHORTHANDS", "STATISTICS", "Magnitude", "Method", "SparseGPT", "StatisticName", "Wanda", "method_of",
           "prune_with"]

#: The names of what the runner can collect for each weight.
StatisticName = Literal["input_norms", "hessians"]
#: What the runner can collect for each weight, by the name a method's ``statistic`` gives.
STATISTICS: Mapping[str, Statistic] = MappingProxyType({"input_norms": NORMS, "hessians": GRAMS})


class Method(abc.ABC):
    """Abstract base of the one-shot methods of :func:`~funcprune.oneshot`, built-in or user-defined.

    A method is a frozen dataclass of hyper-parameters, as a spec is. It
    says what the runner must collect for each weight it prunes
    (``statistic``) and prunes the weights of one block from that with a
    pure :meth:`prune`. To define one, subclass it as a frozen dataclass,
    set ``statistic`` and implement ``prune`` (and, to refuse specs before
    any batch runs, ``check_spec``); ``fp.oneshot(model, batches,
    method=YourMethod(...), spec=...)`` then runs it block by block, each
    block calibrated on what the blocks already pruned compute.

    ``statistic``: what the runner collects for each weight, over every
    calibration token that reaches its layer (padding left out):

    - ``None``: nothing. No batch is read (unless ``allocation="owl"``
      needs them for OWL's sparsities) and ``prune`` is called once, on
      every weight named.
    - ``"input_norms"``: the L2 norm of each input feature, shaped as
      :func:`~funcprune.input_norms` returns it: ``(in,)``, or ``(in, 1)``
      for a weight stored ``(in, out)`` (transformers' ``Conv1D``), so
      that ``w.abs() * norms`` scales any weight along its inputs (Wanda's
      statistic).
    - ``"hessians"``: ``XᵀX``, ``(in, in)``, as :func:`~funcprune.hessians`
      returns it (SparseGPT's; its diagonal holds the squared input norms).

    With a statistic, the weights pruned must be those of Linear or
    transformers' ``Conv1D`` layers, and ``prune`` is called once per
    block with that block's weights, then once with the weights named
    outside the blocks (an LM head), each time with the statistics of
    what the model pruned so far feeds them.

    >>> import dataclasses, torch, funcprune as fp
    >>> from torch import nn
    >>> @dataclasses.dataclass(frozen=True)
    ... class Shuffled(fp.Method):  # prunes at random, drawn from its own seed
    ...     seed: int = 0
    ...     statistic = None
    ...     def prune(self, weights, statistics, specs, input_dims):
    ...         g = torch.Generator().manual_seed(self.seed)
    ...         scores = {n: torch.rand(w.shape, generator=g) for n, w in weights.items()}
    ...         return {}, fp.Plan(dict(specs), input_dims=input_dims)(weights, scores=scores)
    >>> class Net(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(2))
    ...     def forward(self, x):
    ...         for block in self.blocks:
    ...             x = block(x)
    ...         return x
    >>> params, masks = fp.oneshot(Net(), [], method=Shuffled(seed=1), spec=fp.L1Unstructured(0.25))
    >>> {n: int((~m).sum()) for n, m in masks.items()}
    {'blocks.0.0.weight': 4, 'blocks.1.0.weight': 4}
    """

    __slots__ = ()

    @property
    @abc.abstractmethod
    def statistic(self) -> StatisticName | None:
        """What the runner collects for each weight: ``None``, ``"input_norms"`` or ``"hessians"``."""

    def check_spec(self, spec: Spec) -> None:  # noqa: B027 (a hook with a default: every spec is taken)
        """Refuse a spec this method cannot prune with, by raising ``ValueError``; called before any batch runs.

        The default takes every spec.
        """

    @abc.abstractmethod
    def prune(
        self,
        weights: Mapping[str, Tensor],
        statistics: Mapping[str, Tensor],
        specs: Mapping[str, Spec],
        input_dims: Mapping[str, int],
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Prune some weights from their statistics: pure, its inputs left as they are.

        Args:
            weights: the weights pruned together, detached, by their full
                names (``"model.layers.0.mlp.up_proj.weight"``): one
                block's, on the device the block runs on.
            statistics: each weight's statistic, as ``statistic`` says
                (empty if it is ``None``).
            specs: each weight's spec: ``oneshot``'s ``spec``, or that spec
                at the sparsity ``allocation`` gives the weight.
            input_dims: the input dim of each weight that has one, as
                :func:`~funcprune.input_dims` gives it (``1`` for a
                Linear's, ``0`` for a ``Conv1D``'s, stored ``(in, out)``):
                for plans, :func:`~funcprune.wanda` and
                :func:`~funcprune.sparsegpt`.

        Returns:
            ``(new_weights, masks)``: the weights it changed, each of its
            weight's shape, dtype and device (``{}`` for a method that only
            masks), and a ``torch.bool`` mask (``True`` = kept) of each
            weight's shape, on its device, for every weight.
        """

    def prune_experts(
        self,
        weights: Mapping[str, Tensor],
        statistics: Mapping[str, Tensor],
        specs: Mapping[str, Spec],
        input_dims: Mapping[str, int],
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Prune stacked expert weights, each expert's slice ``W[e]`` as its own Linear weight.

        What :func:`~funcprune.oneshot` calls for the experts of one MoE
        layer (those that calibration tokens reached). Everything is stacked
        along a leading dim of experts: ``weights[name]`` is ``(experts,
        out, in)`` (or ``(experts, in, out)``), ``statistics[name]`` holds
        each expert's statistic, computed from the tokens routed to that
        expert alone (``(experts, in)`` norms, ``(experts, in, 1)`` for
        slices stored ``(in, out)``, or ``(experts, in, in)`` Hessians).
        ``specs`` and ``input_dims`` are those of one slice (``input_dims``
        ``1`` for ``(out, in)`` slices, ``0`` for ``(in, out)``), as
        :meth:`prune` takes them for a Linear (or ``Conv1D``) weight.

        The default calls :meth:`prune` once per expert, on the slices of
        every weight (``{name: W[e]}``), and stacks what it returns: each
        expert is pruned exactly as a Linear holding ``W[e]``, with that
        expert's statistics. The built-in methods use it: on CPU it is
        faster than :func:`torch.func.vmap` over the experts (measured on
        a 100M-parameter Mixtral-like layer, ``benchmarks/moe_experts.py``:
        vmap took 15x as long for Wanda per row, 2.5x for 2:4, 1.2x for
        SparseGPT, at 1 thread).

        Returns:
            ``(new_weights, masks)`` stacked like ``weights``, as
            :meth:`prune` returns them.
        """
        count = next(iter(weights.values())).shape[0] if weights else 0
        if not count:
            return {}, {n: torch.ones_like(w, dtype=torch.bool) for n, w in weights.items()}
        slices: list[tuple[dict[str, Tensor], dict[str, Tensor]]] = [
            self.prune({n: w[e] for n, w in weights.items()}, {n: s[e] for n, s in statistics.items()}, specs,
                       input_dims)  # fmt: skip
            for e in range(count)
        ]
        changed = [n for n in weights if any(n in new for new, _ in slices)]
        news = {n: torch.stack([new.get(n, weights[n][e]) for e, (new, _) in enumerate(slices)]) for n in changed}
        return news, {n: torch.stack([mask[n] for _, mask in slices]) for n in weights}


@final
@dataclass(frozen=True, slots=True)
class Magnitude(Method):
    """Magnitude pruning: each weight's spec applied to ``|W|``, as a :class:`~funcprune.Plan` does.

    Needs no calibration statistic, so no batch is read (unless OWL's
    allocation needs them). Takes any spec a plan takes, on any weight.

    >>> import funcprune as fp
    >>> fp.Magnitude().statistic is None
    True
    """

    @property
    def statistic(self) -> None:
        """None: magnitude reads no calibration data."""
        return None

    def prune(
        self,
        weights: Mapping[str, Tensor],
        statistics: Mapping[str, Tensor],
        specs: Mapping[str, Spec],
        input_dims: Mapping[str, int],
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The masks of a plan of ``specs`` on ``weights``; no weight changes."""
        return {}, Plan(dict(specs), input_dims=input_dims)(dict(weights))



@final
@dataclass(frozen=True, slots=True)
class Wanda(Method):
    """Wanda (Sun et al. 2023): each weight's spec applied to ``|W| * ||X||``, from the input norms.

    The scores are :func:`~funcprune.wanda`'s; the masks a
    :class:`~funcprune.Plan`'s, so any spec a plan takes works (Wanda's
    own comparison group is each output row:
    ``fp.PerSlice(fp.L1Unstructured(f), dim=0)``).

    >>> import funcprune as fp
    >>> fp.Wanda().statistic
    'input_norms'
    """

    @property
    def statistic(self) -> Literal["input_norms"]:
        """``"input_norms"``: Wanda scores from the norm of each input feature."""
        return "input_norms"

    def prune(
        self,
        weights: Mapping[str, Tensor],
        statistics: Mapping[str, Tensor],
        specs: Mapping[str, Spec],
        input_dims: Mapping[str, int],
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The masks of a plan of ``specs`` on Wanda's scores; no weight changes."""
        scores = wanda(dict(weights), dict(statistics), input_dims=input_dims)
        return {}, Plan(dict(specs), input_dims=input_dims)(dict(weights), scores=scores)



@final
@dataclass(frozen=True, slots=True)
class SparseGPT(Method):
    """SparseGPT (Frantar and Alistarh 2023): prune from ``XᵀX`` and update the kept weights to reconstruct.

    Each weight goes through :func:`~funcprune.sparsegpt` with its Hessian
    (weights of one spec together), which takes ``fp.L1Unstructured(f)``,
    ``fp.PerSlice(fp.L1Unstructured(f), dim=0)`` and ``fp.NM(n, m)``.

    Args:
        blocksize: columns per block (default 128, the reference's): an
            unstructured spec prunes its fraction of each block of
            ``blocksize`` input columns; N:M needs ``m`` to divide it.
        percdamp: the dampening added to the diagonal of ``H``, a
            fraction of its mean (default 0.01, the reference's).

    Raises:
        TypeError: if ``blocksize`` is not an int or ``percdamp`` not a
            real number.
        ValueError: if ``blocksize`` is below 1 or ``percdamp`` negative
            or not finite.

    >>> import funcprune as fp
    >>> fp.SparseGPT(blocksize=64)
    SparseGPT(blocksize=64, percdamp=0.01)
    """

    blocksize: int = 128
    percdamp: float = 0.01

    def __post_init__(self) -> None:
        name = "SparseGPT"
        if isinstance(self.blocksize, bool) or not isinstance(self.blocksize, int):
            raise TypeError(f"{name}: blocksize must be an int (the columns of a block), got {self.blocksize!r} "
                            f"of type {type(self.blocksize).__name__}")  # fmt: skip
        if self.blocksize < 1:
            raise ValueError(f"{name}: blocksize must be a positive int (the columns of a block), got {self.blocksize}")
        if isinstance(self.percdamp, bool) or not isinstance(self.percdamp, (int, float)):
            raise TypeError(f"{name}: percdamp must be a real number (a fraction of the mean diagonal of H), got "
                            f"{self.percdamp!r} of type {type(self.percdamp).__name__}")  # fmt: skip
        if not 0 <= self.percdamp < math.inf:
            raise ValueError(f"{name}: percdamp must be a finite number >= 0 (a fraction of the mean diagonal of H), "
                             f"got {self.percdamp!r}")  # fmt: skip

    @property
    def statistic(self) -> Literal["hessians"]:
        """``"hessians"``: SparseGPT prunes and reconstructs from ``XᵀX``."""
        return "hessians"

    def check_spec(self, spec: Spec) -> None:
        """Refuse a spec :func:`~funcprune.sparsegpt` does not take, or an N:M whose ``m`` does not divide blocksize."""
        sparsegpt({}, {}, spec, blocksize=self.blocksize, percdamp=self.percdamp)  # checks them, on nothing

    def prune(
        self,
        weights: Mapping[str, Tensor],
        statistics: Mapping[str, Tensor],
        specs: Mapping[str, Spec],
        input_dims: Mapping[str, int],
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """SparseGPT's new weights and masks, the weights of each spec pruned by one call."""
        return self._prune(weights, statistics, specs, input_dims, consume=False)

    def _prune(
        self,
        weights: Mapping[str, Tensor],
        statistics: Mapping[str, Tensor],
        specs: Mapping[str, Spec],
        input_dims: Mapping[str, int],
        *,
        consume: bool,
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """:meth:`prune`; ``consume``: the statistics are the runner's own, each may become its factor."""
        masks: dict[str, Tensor] = {}
        new: dict[str, Tensor] = {}
        call = sparsegpt_consuming if consume else sparsegpt
        for spec in dict.fromkeys(specs.values()):
            group = [n for n in specs if specs[n] == spec]
            updated, more = call(dict(weights), {n: statistics[n] for n in group}, spec, blocksize=self.blocksize,
                                 percdamp=self.percdamp, input_dims=input_dims)  # fmt: skip
            new.update({n: updated[n] for n in group})
            masks.update(more)
        return new, {n: masks[n] for n in specs}



#: The strings ``oneshot`` takes for the built-in methods, and the values they stand for.
SHORTHANDS: Mapping[str, Method] = MappingProxyType(
    {"magnitude": Magnitude(), "wanda": Wanda(), "sparsegpt": SparseGPT()}
)
_VALUES = "fp.Magnitude(), fp.Wanda(), fp.SparseGPT(blocksize=..., percdamp=...) or your own fp.Method"


def method_of(fn: str, method: object) -> tuple[Method, Statistic | None]:
    """``method`` as a :class:`Method` (a shorthand string resolved), and the statistic it has collected, if any."""
    if isinstance(method, str):
        if method not in SHORTHANDS:
            raise ValueError(f"{fn}: method must be one of {', '.join(map(repr, SHORTHANDS))} or a method value "
                             f"({_VALUES}), got {method!r}")  # fmt: skip
        method = SHORTHANDS[method]
    if not isinstance(method, Method):
        raise TypeError(f"{fn}: method must be a one-shot method ({_VALUES}) or one of "
                        f"{', '.join(map(repr, SHORTHANDS))}, got {type(method).__name__}")  # fmt: skip
    name = method.statistic
    if name is None:
        return method, None
    if not (isinstance(name, str) and name in STATISTICS):
        raise ValueError(f"{fn}: {type(method).__name__}.statistic must be None, "
                         f"{' or '.join(map(repr, STATISTICS))} (what the runner can collect for each weight), "
                         f"got {name!r}")  # fmt: skip
    return method, STATISTICS[name]


def prune_with(
    fn: str,
    method: Method,
    weights: Mapping[str, Tensor],
    statistics: Mapping[str, Tensor],
    specs: Mapping[str, Spec],
    input_dims: Mapping[str, int],
    *,
    experts: bool = False,
    consume: bool = False,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``method.prune`` (``experts``: ``method.prune_experts``, on stacked expert weights) on the weights
    detached, its result checked: ``(new weights, masks)``, masks in order. ``consume``: the statistics are
    the caller's own, given up: the built-in SparseGPT overwrites each Hessian with its factor instead of
    copying it."""
    weights = {n: w.detach() for n, w in weights.items()}
    if consume and not experts and isinstance(method, SparseGPT):
        return _checked(f"{fn}: SparseGPT.prune", weights, method._prune(weights, statistics, specs, input_dims,
                                                                          consume=True))  # fmt: skip
    call = method.prune_experts if experts else method.prune
    return _checked(f"{fn}: {type(method).__name__}.{call.__name__}", weights, call(weights, statistics, specs, input_dims))


def _checked(
    who: str, weights: Mapping[str, Tensor], got: object
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """A method's ``(new weights, masks)`` for ``weights``, refused unless each is a mask (or weight) like them."""
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(d, Mapping) for d in got)):
        raise TypeError(f"{who} must return (new_weights, masks), two dicts by weight name; got "
                        f"{type(got).__name__}")  # fmt: skip
    new, masks = got
    for kind, given in (("a mask", masks), ("a new weight", new)):
        extra = [n for n in given if n not in weights]
        if extra:
            raise ValueError(f"{who} returned {kind} for {extra[0]!r}, which is not one of the weights it was given "
                             f"({', '.join(map(repr, weights))})")  # fmt: skip
    for name, w in weights.items():
        mask = masks.get(name)
        if not isinstance(mask, torch.Tensor) or (mask.dtype, mask.shape, mask.device) != (torch.bool, w.shape, w.device):
            raise ValueError(f"{who} returned {_described(mask)} as the mask of {name!r}; expected a torch.bool "
                             f"tensor of its shape {tuple(w.shape)} on {w.device}")  # fmt: skip
        t = new.get(name, w)
        if not isinstance(t, torch.Tensor) or (t.dtype, t.shape, t.device) != (w.dtype, w.shape, w.device):
            raise ValueError(f"{who} returned {_described(t)} as the new weight {name!r}; expected a tensor of "
                             f"its dtype {w.dtype} and shape {tuple(w.shape)} on {w.device}")  # fmt: skip
    return dict(new), {n: masks[n] for n in weights}


def _described(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    return "nothing" if value is None else f"a {type(value).__name__}"
