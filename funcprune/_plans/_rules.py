"""Per-parameter rules: :class:`Plan` maps names or glob patterns to specs, folded on each parameter.

Each rule's parameters are folded one by one through ``funcprune._specs``'
fold (a DTensor block by block through ``funcprune._dtensor``), but a rule
of ``L1Unstructured`` steps over several plain tensors (or consecutive
rules of one such spec: :func:`_merged`), whose selections run together
(:func:`_l1_at_once`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Union, final

import torch

from .. import _dtensor as dtensor
from .._names import match_names
from .._specs import (
    Chain,
    L1Unstructured,
    RuleItem,
    ScoresOf,
    Spec,
    checked_mask,
    fold,
    l1_unstructured_jointly,
)
from .._types import Mask, Params, Scores, Tensor, is_dtensor
from .._validate import is_concrete
from ._input_dims import Swapped, as_seen, as_stored, check_input_dims, check_swappable, input_dims_repr
from ._plan import AbstractPlan, as_spec, naming, scores_for, spec_repr

__all__ = ["Plan", "Rule"]

#: What a :class:`~funcprune.Plan` rule maps to: a spec, or a list of specs
#: applied in turn. Annotate a rules dict mixing both with it:
#: ``rules: dict[str, fp.Rule] = {...}``.
Rule = Union[Spec, Sequence[Spec]]



@final
class Plan(AbstractPlan, Mapping[str, Spec]):
    """Per-parameter rules: exact names or glob patterns mapped to specs.

    Patterns are matched against the dotted names with
    :func:`fnmatch.fnmatchcase` (``*`` matches any characters, dots
    included); a name without ``*``, ``?`` or ``[`` must match exactly. A
    rule's value is one spec, or a list of specs applied in turn (a
    :class:`~funcprune.Chain`), each step like a separate torch call: scored
    as the tensor currently is, or by the call's ``scores`` as given (the
    way torch uses ``importance_scores``).

    Rules apply in insertion order, each on top of the masks left by the
    rules before it. A parameter matched by several rules is therefore
    pruned by each in turn (the rules chain), so
    ``Plan({a: s, b: t})`` equals ``compose(Plan({a: s}), Plan({b: t}))``.
    A plan is an immutable mapping from its patterns to their specs (a list
    reads back as a ``Chain``); its repr reads like the rules.

    A weight stored ``(in, out)`` (transformers' ``Conv1D``, GPT-2's
    layers) is told apart by ``input_dims`` (:func:`~funcprune.input_dims`
    gives it for a model): a weight whose input dim is 0 is shown to the
    specs as a Linear weight ``(out, in)``, its dims 0 and 1 swapped (its
    scores and earlier mask too), and its mask swapped back (contiguous).
    So ``NM(2, 4)`` groups along the inputs, ``LnStructured(dim=0)`` prunes
    output channels and ``PerSlice(spec, dim=0)`` works per output row, on
    a Linear and a ``Conv1D`` alike. Without ``input_dims`` a plan reads
    every weight as it is stored: ``NM(2, 4)`` on a ``Conv1D`` weight would
    group along its outputs. (A grouped ``ConvTranspose`` weight, ``(in,
    out / groups, *kernel)``, is seen as ``(out / groups, in, *kernel)``.)

    Args:
        rules: a mapping from names or patterns to a spec or list of specs.
        input_dims: the dim along which each weight's input features run,
            by exact parameter name (0 or 1), such as
            ``fp.input_dims(model)``; names the rules do not select are
            ignored, so one dict serves the whole model. Only the names of
            input dim 0 change anything: a plan keeps those (its repr and
            equality show them). ``None``: every weight as stored.

    Raises:
        TypeError: if ``rules`` is not a mapping, a key not a non-empty
            string, or a value not a spec or a list of specs; or
            ``input_dims`` not a mapping of names to ints.
        ValueError: if an input dim is not 0 or 1. When called: also if a
            weight of input dim 0 has fewer than 2 dims.

    >>> import torch, funcprune as fp
    >>> plan = fp.Plan({"fc*.weight": fp.L1Unstructured(0.5), "fc2.bias": [fp.L1Unstructured(1)]})
    >>> plan
    Plan({'fc*.weight': L1Unstructured(amount=0.5), 'fc2.bias': [L1Unstructured(amount=1)]})
    >>> params = {"fc1.weight": torch.tensor([[0.1, -2.0], [3.0, 0.2]]),
    ...           "fc2.bias": torch.tensor([1.0, -0.5, 2.0])}
    >>> plan(params)
    {'fc1.weight': tensor([[False,  True],
            [ True, False]]), 'fc2.bias': tensor([ True, False,  True])}
    >>> c_fc = params["fc1.weight"].T  # the same layer stored (in, out), as by a Conv1D
    >>> by_rows = fp.Plan({"c_fc.weight": fp.LnStructured(1, n=1, dim=0)}, input_dims={"c_fc.weight": 0})
    >>> by_rows
    Plan({'c_fc.weight': LnStructured(amount=1, n=1, dim=0)}, input_dims={'c_fc.weight': 0})
    >>> by_rows({"c_fc.weight": c_fc})["c_fc.weight"]  # output 0 (column 0 as stored) goes
    tensor([[False,  True],
            [False,  True]])
    """

    __slots__ = ("_rules", "_swapped")
    _FN = "Plan"
    _rules: tuple[tuple[str, Spec], ...]
    _swapped: Swapped

    def __init__(self, rules: Mapping[str, Rule], *, input_dims: Mapping[str, int] | None = None) -> None:
        if not isinstance(rules, Mapping):
            is_list = isinstance(rules, (list, tuple))
            hint = "; to apply plans in order use funcprune.compose(*plans)" if is_list else ""
            raise TypeError(
                f"Plan: rules must be a mapping of names or patterns to specs, "
                f"got {type(rules).__name__}{hint}"
            )
        checked: list[tuple[str, Spec]] = []
        for pattern, value in rules.items():
            if not isinstance(pattern, str) or not pattern:
                raise TypeError(f"Plan: rule keys must be non-empty strings, got {pattern!r}")
            checked.append((pattern, as_spec(pattern, value)))
        object.__setattr__(self, "_rules", tuple(checked))
        object.__setattr__(self, "_swapped", check_input_dims(self._FN, input_dims))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Plan is immutable; build a new one instead of setting {name!r}")

    def __getitem__(self, pattern: str) -> Spec:
        for key, spec in self._rules:
            if key == pattern:
                return spec
        raise KeyError(pattern)

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self._rules)

    def __len__(self) -> int:
        return len(self._rules)

    @property
    def input_dims(self) -> dict[str, int]:
        """The weights whose input dim is 0, as a new dict (the only ``input_dims`` that matter)."""
        return dict.fromkeys(self._swapped, 0)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Plan):
            return self._rules == other._rules and self._swapped == other._swapped  # rule order matters
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._rules, self._swapped))

    def __reduce__(self) -> tuple[Callable[..., Plan], tuple[dict[str, Spec], dict[str, int]]]:
        """Rebuild from the rules and input dims: ``copy``, ``deepcopy`` and ``pickle`` work."""
        return (_plan, (dict(self._rules), self.input_dims))

    def __repr__(self) -> str:
        body = ", ".join(f"{key!r}: {spec_repr(spec)}" for key, spec in self._rules)
        return f"Plan({{{body}}}{input_dims_repr(self._swapped)})"

    def masks_for(
        self,
        params: Params,
        masks: dict[str, Tensor],
        scores: Scores,
        generator: torch.Generator | None,
    ) -> dict[str, Tensor]:
        names = tuple(params)
        matched = [(spec, match_names(self._FN, "rule", key, names)) for key, spec in self._rules]
        swapped = frozenset(self._swapped)
        for name in dict.fromkeys(name for _, selected in matched for name in selected if name in swapped):
            check_swappable(self._FN, name, params[name])  # before any work
        out = dict(masks)
        for spec, selected in _merged(matched):
            # A chain's steps run one by one, each scored like a new torch call:
            # as the tensor currently is, or by the given scores as they are.
            # A weight stored (in, out) is seen as (out, in), and its mask stored back.
            items = [self._item(name, name in swapped, params, scores, out) for name in selected]
            if any(is_dtensor(item.param) for item in items):  # block by block, nothing gathered
                new = dtensor.fold_rule(self._FN, spec, items, generator, self._naming)
            else:
                steps = spec.specs if isinstance(spec, Chain) else (spec,)
                found = _l1_at_once(steps, items)
                new = {} if found is None else found
                for item in items if found is None else ():
                    with naming(self._FN, repr(item.name), spec):
                        new[item.name] = fold(steps, item.scores_of, item.mask, generator, step=checked_mask)
            out.update((name, as_stored(mask, name in swapped)) for name, mask in new.items())
        return out

    @staticmethod
    def _item(
        name: str, swap: bool, params: Params, scores: Scores, masks: dict[str, Tensor]
    ) -> RuleItem:
        """A parameter a rule selects, as the specs see it (dims 0 and 1 swapped for ``swap``)."""
        param, given = as_seen(params[name], swap), as_seen(scores.get(name), swap)
        return RuleItem(name, param, _scores_of(param, given), as_seen(masks.get(name), swap))

    def _naming(self, what: str, spec: Spec) -> contextlib.AbstractContextManager[None]:
        return naming(self._FN, what, spec)


def _merged(matched: Sequence[tuple[Spec, Sequence[str]]]) -> list[tuple[Spec, list[str]]]:
    """Consecutive rules of one ``L1Unstructured`` spec (or chain of them) on parameters no other of them
    selects, made one rule: ``{name: fp.L1Unstructured(0.5) for name in names}`` then takes
    :func:`_l1_at_once`'s joint selections as one glob rule does.

    Each parameter's mask depends on its own fold alone, and every parameter
    of a merged rule gets the same spec once, in the same order: the same
    masks. A parameter two of them select keeps them apart (folded twice,
    in order), as do other specs (their equality is not always a value's).
    """
    out: list[tuple[Spec, list[str]]] = []
    taken: set[str] = set()
    for spec, selected in matched:
        steps = spec.specs if isinstance(spec, Chain) else (spec,)
        joinable = bool(steps) and all(type(step) is L1Unstructured for step in steps)
        if joinable and out and out[-1][0] == spec and taken.isdisjoint(selected):
            out[-1][1].extend(selected)
        else:
            out.append((spec, list(selected)))
            taken = set()
        taken.update(selected)
    return out


def _l1_at_once(steps: Sequence[Spec], items: Sequence[RuleItem]) -> dict[str, Tensor] | None:
    """A rule of ``L1Unstructured`` steps folded on every item at once: each step's selections
    made together (``l1_unstructured_jointly(..., separately=True)``), as the items' own folds
    would make them one by one.

    ``None`` where the fold goes item by item instead: other specs, one item, a tensor not
    floating or not eager (under ``vmap``, ``grad`` or ``torch.compile``), or a step that
    raises (the item by item fold then raises it, naming the parameter).
    """
    if len(items) < 2 or not steps or not all(type(step) is L1Unstructured for step in steps):
        return None
    for item in items:
        if not item.param.is_floating_point() or not is_concrete(item.param):
            return None
        if item.mask is not None and not is_concrete(item.mask):
            return None
    masks: list[Mask] = [item.mask for item in items]
    try:
        for i, step in enumerate(steps):
            assert isinstance(step, L1Unstructured)
            scores = [item.scores_of(i, mask) for item, mask in zip(items, masks, strict=True)]
            if not all(s.is_floating_point() and is_concrete(s) for s in scores):
                return None
            masks = list(l1_unstructured_jointly(step.target, scores, masks, separately=True))
    except (TypeError, ValueError, IndexError):
        return None
    return {item.name: mask for item, mask in zip(items, masks, strict=True) if mask is not None}


def _plan(rules: dict[str, Spec], input_dims: dict[str, int]) -> Plan:
    """A plan rebuilt by :meth:`Plan.__reduce__`."""
    return Plan(rules, input_dims=input_dims)


def _scores_of(param: Tensor, given: Tensor | None) -> ScoresOf:
    """A parameter's scores for each step of a rule: as it currently is, or as given."""

    def scores_of(i: int, mask: Mask) -> Tensor:
        return scores_for(param, mask, given)

    return scores_of


