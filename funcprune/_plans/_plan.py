"""Plans: the protocol every plan follows, and plans applied in order.

A plan is a pure function from a dict of parameters (keyed like
``named_parameters()``) to a new dict of ``torch.bool`` masks; earlier
masks passed in are folded on (iterative pruning), exactly as a repeated
``torch.nn.utils.prune`` call on the same module folds a new method on its
``<name>_mask`` buffer. :class:`AbstractPlan` checks a call's arguments
once for every plan; its subclasses compute the masks.

The plans, and where they live: :class:`~funcprune.Plan` (per-parameter
rules, ``_rules.py``), :class:`~funcprune.GlobalPlan` (one unstructured
spec over several tensors jointly, ``_global.py``),
:class:`~funcprune.GlobalStructuredPlan` (whole channels ranked across
tensors, ``_global_structured.py``), :class:`~funcprune.UnitPlan` (a
model's units, ``_structured.py``), and :class:`ComposedPlan` (plans
applied in order, built by :func:`compose`, here).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, final

import torch

from .. import _dtensor as dtensor
from .._names import check_masks, check_not_hook_mode, check_params, check_scores
from .._specs import Chain, Spec, chain
from .._types import Masks, Params, Scores, Tensor
from .._validate import check_generator

__all__ = ["AbstractPlan", "ComposedPlan", "as_spec", "compose", "naming", "scores_for", "spec_repr"]


def scores_for(param: Tensor, mask: Tensor | None, given: Tensor | None) -> Tensor:
    """The ``given`` scores, else the parameter as it currently is.

    That is ``param * mask`` (torch multiplies; it does not use ``where``),
    which is how torch scores a tensor it prunes again.
    """
    if given is not None:
        return given
    param = param.detach()
    return param if mask is None else param * mask.to(param.dtype)


@contextlib.contextmanager
def naming(fn: str, what: str, spec: Spec) -> Iterator[None]:
    """Re-raise a spec's error with the plan and the parameter(s) it was pruning."""
    try:
        yield
    except (TypeError, ValueError, IndexError) as e:
        if type(e) not in (TypeError, ValueError, IndexError):
            raise
        raise type(e)(f"{fn}: cannot prune {what} with {spec!r}: {e}") from e


class AbstractPlan(abc.ABC):
    """Base of every plan: a pure function from parameters to masks.

    Its subclasses are :class:`~funcprune.Plan`, :class:`~funcprune.GlobalPlan`,
    :class:`~funcprune.GlobalStructuredPlan`, :class:`~funcprune.UnitPlan` and
    :class:`ComposedPlan`; all are called the same way.
    """

    __slots__ = ()
    #: The name that starts this plan's error messages.
    _FN: ClassVar[str]

    def __call__(
        self,
        params: Params,
        masks: Mapping[str, Tensor] | None = None,
        scores: Scores | None = None,
        generator: torch.Generator | None = None,
        *,
        unit_scores: Mapping[str, Tensor] | None = None,
    ) -> Masks:
        """Compute the masks this plan gives for ``params``.

        Args:
            params: tensors keyed like ``named_parameters()`` (for instance
                ``dict(model.named_parameters())`` or the first dict of
                :func:`torch.func.stack_module_state`, under ``vmap``).
                DTensors (an FSDP2 model's, say) are pruned block by block
                on every process of their mesh, nothing gathered: see
                :func:`~funcprune.compute_mask` for what is supported.
                Their masks and scores are DTensors of their layout.
            masks: earlier masks by name. The plan acts on top of them and
                never revives what they pruned; names the plan does not cover
                keep them. ``bool`` masks are used as they are; numeric masks
                (torch's float 0/1 buffers) are converted with ``mask != 0``
                after checking that they hold only 0 and 1.
            scores: importance scores by name, of each parameter's shape. A
                parameter without one is scored as it currently is: ``param *
                mask`` with its earlier mask, as torch scores a pruned tensor.
            generator: a :class:`torch.Generator` for random specs; by
                default they draw from torch's global RNG as torch does.
            unit_scores: for plans over units (:func:`~funcprune.structured`,
                alone or composed), group names to one score per unit (a 1-D
                real tensor of the group's ``size``: :func:`~funcprune.layer_scores`,
                :func:`~funcprune.hidden_scores`, expert statistics, any score a
                user computes); those groups' units are ranked by them, the
                lowest first (NaN last), instead of by norms, the spec giving
                the amount only. Under sharding every process passes the same.

        Returns:
            A new dict of ``torch.bool`` masks (``True`` = kept) in the order
            of ``params``: one per name the plan covers or ``masks`` holds.

        Raises:
            UnknownNameError: (a ``KeyError`` and ``ValueError``) if a rule,
                a mask or a score names no parameter; close names are listed.
            TypeError: if an argument is not a mapping of tensors, a spec
                cannot prune a parameter's dtype, or ``generator`` is not a
                :class:`torch.Generator`.
            ValueError: if a mask or scores do not fit their parameter's
                shape or device, a numeric mask holds values other than 0 and
                1, an amount does not fit a parameter, or ``params`` are
                those of a module in hook mode (``weight_orig``).
            IndexError: if a structured spec's ``dim`` does not index a
                parameter.
            NotImplementedError: if a spec or a layout is not supported on
                DTensors yet.

        A DTensor's mask or scores must be a DTensor of its mesh and
        placements (a ``TypeError`` if plain, a ``ValueError`` if laid out
        otherwise); a DTensor mask must be ``torch.bool``.

        Every mask returned is a new tensor, the caller's masks included
        where the plan does not touch them.
        """
        fn = self._FN
        if unit_scores is not None:
            if not isinstance(unit_scores, Mapping):
                raise TypeError(f"{fn}: unit_scores must be a mapping of group names to tensors, got {unit_scores!r}")
            plan, used = self.with_unit_scores(unit_scores)
            unknown = [name for name in unit_scores if name not in used]
            if unknown:
                raise KeyError(f"{fn}: unit_scores names {unknown[0]!r}, which is no unit group this plan ranks")
            if plan is not self:
                return plan(params, masks, scores, generator)
        check_params(fn, params)
        check_not_hook_mode(fn, params)
        check_generator(fn, generator)
        dtensor.check_layouts(fn, params, masks, scores)
        current = check_masks(fn, params, masks)
        given = masks if isinstance(masks, Mapping) else {}
        by_name = check_scores(fn, params, scores)
        out = self.masks_for(params, current, by_name, generator)
        return {name: _own(out[name], given.get(name)) for name in params if name in out}

    def with_unit_scores(self, unit_scores: Mapping[str, object]) -> tuple[AbstractPlan, set[str]]:
        """This plan ranking the unit groups named in ``unit_scores`` by them, and the names it used (none here)."""
        return self, set()

    @abc.abstractmethod
    def masks_for(
        self,
        params: Params,
        masks: dict[str, Tensor],
        scores: Scores,
        generator: torch.Generator | None,
    ) -> dict[str, Tensor]:
        """Return new checked masks: ``masks`` with this plan folded on."""


def _own(mask: Tensor, given: object) -> Tensor:
    """``mask``, copied if it is the caller's own tensor (untouched by the plan)."""
    return mask.clone() if mask is given else mask


def as_spec(pattern: str, value: object) -> Spec:
    if isinstance(value, Spec):
        return value
    if isinstance(value, Sequence) and not isinstance(value, str):
        for i, step in enumerate(value):
            if not isinstance(step, Spec):
                raise TypeError(
                    f"Plan: rule {pattern!r}: item {i} of the list must be a funcprune spec, "
                    f"got {step!r} of type {type(step).__name__}"
                )
        return chain(*value)
    raise TypeError(
        f"Plan: rule {pattern!r} must map to a funcprune spec or a list of specs, "
        f"got {value!r} of type {type(value).__name__}"
    )


def spec_repr(spec: Spec) -> str:
    """A rule's value as written: a chain reads as the list of its steps."""
    if isinstance(spec, Chain):
        return "[" + ", ".join(map(repr, spec.specs)) + "]"
    return repr(spec)


@final
@dataclass(frozen=True, slots=True)
class ComposedPlan(AbstractPlan):
    """Plans applied in order, each on the masks the plans before it left.

    Build it with :func:`compose`, which checks and flattens its arguments.
    """

    _FN: ClassVar[str] = "compose"
    plans: tuple[AbstractPlan, ...]

    def __post_init__(self) -> None:
        for i, plan in enumerate(self.plans):
            if not isinstance(plan, AbstractPlan) or isinstance(plan, ComposedPlan):
                raise TypeError(
                    f"ComposedPlan.plans[{i}] must be a non-composed plan, got {plan!r}; "
                    "build compositions with funcprune.compose(...), which flattens them"
                )

    def __repr__(self) -> str:
        return "compose(" + ", ".join(map(repr, self.plans)) + ")"

    def with_unit_scores(self, unit_scores: Mapping[str, object]) -> tuple[AbstractPlan, set[str]]:
        """Each plan with the unit scores of its groups."""
        given = [plan.with_unit_scores(unit_scores) for plan in self.plans]
        used = {name for _, names in given for name in names}
        if not used:
            return self, set()
        return ComposedPlan(tuple(plan for plan, _ in given)), used

    def masks_for(
        self,
        params: Params,
        masks: dict[str, Tensor],
        scores: Scores,
        generator: torch.Generator | None,
    ) -> dict[str, Tensor]:
        for plan in self.plans:
            masks = plan.masks_for(params, masks, scores, generator)
        return masks


def compose(*plans: AbstractPlan) -> ComposedPlan:
    """Compose plans: each acts on top of the masks the ones before it left.

    Composition is closed and flat: ``compose(compose(a, b), c)`` equals
    ``compose(a, b, c)``, and calling it equals calling ``a``, then ``b`` on
    ``a``'s masks, then ``c`` on those (with the same ``scores``).

    Raises:
        TypeError: if an argument is not a plan.

    >>> import funcprune as fp
    >>> fp.compose(fp.Plan({"conv*.weight": fp.L1Unstructured(0.2)}),
    ...            fp.global_unstructured(["conv*.weight", "fc*.weight"], fp.L1Unstructured(0.2)))
    compose(Plan({'conv*.weight': L1Unstructured(amount=0.2)}),
            global_unstructured(['conv*.weight', 'fc*.weight'], L1Unstructured(amount=0.2)))
    """
    flat: list[AbstractPlan] = []
    for i, plan in enumerate(plans):
        if isinstance(plan, ComposedPlan):
            flat.extend(plan.plans)
        elif isinstance(plan, AbstractPlan):
            flat.append(plan)
        else:
            raise TypeError(
                f"compose: argument {i} must be a plan (Plan, global_unstructured(...), "
                f"global_structured(...) or compose(...)), got {plan!r} of type {type(plan).__name__}"
            )
    return ComposedPlan(tuple(flat))
