"""Names and name-keyed dicts: pattern matching and the checks every layer shares.

Parameters, masks and scores travel as dicts keyed like ``named_parameters()``.
This module resolves names and glob patterns against such a dict, refuses
unknown names with close suggestions (:mod:`difflib`), and checks that masks
and scores fit their parameter (shape, device, dtype) before any work starts.
Checks that read tensor values run in eager mode only, never under a
``torch.func`` transform or ``torch.compile``.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Mapping, Sequence

import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

from ._types import Params, Tensor
from ._validate import check_fits, is_concrete, non_binary

__all__ = [
    "UnknownNameError",
    "match_names",
    "select_names",
    "check_params",
    "check_not_hook_mode",
    "check_not_hooked",
    "pruning_hook",
    "check_masks",
    "check_module_not_hook_mode",
    "check_scores",
    "as_bool_mask",
    "check_binary",
    "not_a_parameter",
]


class UnknownNameError(KeyError, ValueError):
    """A rule, mask or score names no parameter (a ``KeyError`` and a ``ValueError``)."""

    __module__ = "funcprune"

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


#: How ``torch.nn.utils.prune`` renames a pruned parameter (hook mode).
_ORIG = "_orig"
_HOOK_MODE_HINT = (
    "turn the module back into plain parameters and a mask dict with "
    "funcprune.compat.unprune_(module), or read its masks with "
    "funcprune.compat.masks_from_module(module)"
)


def unknown_name(fn: str, problem: str, name: str, known: Sequence[str]) -> UnknownNameError:
    """An :class:`UnknownNameError` suggesting the names closest to ``name``."""
    if name + _ORIG in known:
        return UnknownNameError(
            f"{fn}: {problem}, but {name + _ORIG!r} is: the module is pruned in hook mode "
            f"(torch.nn.utils.prune or funcprune.compat); {_HOOK_MODE_HINT}"
        )
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
    if close:
        quoted = [repr(c) for c in close]
        hint = "did you mean " + (", ".join(quoted[:-1]) + " or " if len(quoted) > 1 else "")
        hint += quoted[-1] + "?"
    else:
        shown = ", ".join(map(repr, list(known)[:8])) + (", ..." if len(known) > 8 else "")
        hint = f"the parameters are {shown}" if known else "there are no parameters"
    return UnknownNameError(f"{fn}: {problem}; {hint}")


def not_a_parameter(fn: str, module: nn.Module, name: str, params: Mapping[str, Tensor]) -> UnknownNameError:
    """The error for ``name``, not in ``params`` (``module.named_parameters()``): a tied alias's hint, or
    :func:`unknown_name`'s."""
    listed = {id(p): n for n, p in params.items()}
    every = dict(module.named_parameters(remove_duplicate=False))
    if name in every and id(every[name]) in listed:
        return UnknownNameError(
            f"{fn}: {name!r} is not a parameter name: it is the same Parameter as "
            f"{listed[id(every[name])]!r}, the one name named_parameters() gives it (a tied "
            "weight or a shared module); ask for that name"
        )
    return unknown_name(fn, f"{name!r} is not a parameter name", name, tuple(params))


def check_params(fn: str, params: object) -> None:
    """Refuse anything but a mapping of names to tensors."""
    if isinstance(params, torch.nn.Module):
        raise TypeError(
            f"{fn}: params must be a mapping of names to tensors, got a module; "
            "pass dict(module.named_parameters())"
        )
    if not isinstance(params, Mapping):
        raise TypeError(
            f"{fn}: params must be a mapping of names to tensors, got {type(params).__name__}"
        )
    for name, value in params.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{fn}: params[{name!r}] must be a tensor, got {type(value).__name__}")


def check_not_hook_mode(fn: str, params: Params) -> None:
    """Refuse the parameters of a module pruned in hook mode (``weight_orig``).

    A plan over them would silently skip the rules naming ``weight``.
    """
    hooked = [n for n in params if n.endswith(_ORIG) and n[: -len(_ORIG)] not in params]
    if hooked:
        raise ValueError(
            f"{fn}: params holds {hooked[0]!r} but no {hooked[0][: -len(_ORIG)]!r}: these are "
            f"the parameters of a module pruned in hook mode, which funcprune's rules do not "
            f"name; {_HOOK_MODE_HINT}, then pass dict(module.named_parameters()). If instead "
            "that layer is under the deprecated torch.nn.utils.spectral_norm (which also makes a "
            "'weight_orig'), move it to torch.nn.utils.parametrizations.spectral_norm: its "
            "parameter is then 'parametrizations.weight.original', which rules can name"
        )


def check_module_not_hook_mode(fn: str, module: nn.Module) -> None:
    """Refuse a module pruned in hook mode, read off its hooks (a ``weight_orig`` of spectral_norm is no such)."""
    hooked = pruning_hook(module)
    if hooked is not None:
        raise ValueError(
            f"{fn}: {hooked[0] + _ORIG!r} belongs to a module pruned in hook mode ({hooked[0]!r} is "
            f"recomputed from it by a pruning hook), which funcprune's rules do not name; {_HOOK_MODE_HINT}"
        )


def pruning_hook(module: nn.Module) -> tuple[str, torch_prune.BasePruningMethod] | None:
    """The first tensor of ``module`` that a pruning hook (torch's or compat's) recomputes, and the hook.

    The dotted name of the tensor, or ``None`` where no hook prunes: the one
    place that reads a pruning hook's ``_tensor_name`` (torch's attribute).
    """
    for prefix, submodule in module.named_modules():
        for hook in submodule._forward_pre_hooks.values():
            if isinstance(hook, torch_prune.BasePruningMethod):
                name = getattr(hook, "_tensor_name", "?")
                return (f"{prefix}.{name}" if prefix else name), hook
    return None


def check_not_hooked(fn: str, module: nn.Module, *, then: str = "") -> None:
    """Refuse a module pruned in hook mode: its ``weight`` is recomputed by a hook.

    The message tells how to go on: ``then``, or ``{fn}(module, masks)`` by default.
    """
    then = then or f"{fn}(module, masks)"
    hooked = pruning_hook(module)
    if hooked is not None:
        key = hooked[0]
        raise ValueError(
            f"{fn}: module is pruned in hook mode (torch.nn.utils.prune or "
            f"funcprune.compat): {key!r} is recomputed by a forward pre-hook from "
            f"{key + '_orig'!r} and a mask buffer; call "
            "`masks = funcprune.compat.unprune_(module)` first, which turns it back "
            f"into plain parameters and returns its masks, then {then}; "
            "or make the pruning permanent with funcprune.compat.remove(submodule, name)"
        )


def _check_fits(fn: str, what: str, name: str, value: object, params: Params) -> Tensor:
    if name not in params:
        raise unknown_name(fn, f"{what} {name!r} is not a parameter name", name, tuple(params))
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{fn}: the {what} {name!r} must be a tensor, got {type(value).__name__}")
    check_fits(fn, f"the {what} {name!r}", value, "the parameter", params[name])
    return value


def as_bool_mask(
    fn: str, name: str, mask: object, params: Params, *, keep_dtype: bool = False,
    values: bool = True,
) -> Tensor:
    """Check that ``mask`` fits ``params[name]``; return it as ``torch.bool``.

    A numeric mask (torch's float 0/1 buffers) is converted with ``mask != 0``
    after checking, in eager mode only, that it holds only 0 and 1; with
    ``keep_dtype`` it is returned as it is (a multiplier). ``values=False``
    skips the value check, for masks checked before (``Multipliers``).
    """
    mask = _check_fits(fn, "mask for", name, mask, params)
    if mask.dtype == torch.bool:
        return mask
    if values:
        check_binary(fn, name, mask)
    return mask if keep_dtype else mask != 0


def check_binary(fn: str, name: str, mask: Tensor) -> None:
    """Refuse a numeric mask holding values other than 0 and 1 (eager only).

    It reads every value on every call; a training loop that passes the same
    float masks each step converts them once with
    :func:`funcprune.to_multipliers` instead.
    """
    if not is_concrete(mask):
        return
    bad = non_binary(mask, 3)
    if bad:
        raise ValueError(
            f"{fn}: the mask for {name!r} must hold only 0 and 1 (or be torch.bool), "
            f"got values such as {bad}; convert it with `mask != 0` if nonzero means kept"
        )


def check_masks(
    fn: str, params: Params, masks: object, *, keep_dtype: bool = False, values: bool = True
) -> dict[str, Tensor]:
    """Every mask checked against its parameter (see :func:`as_bool_mask`)."""
    if masks is None:
        return {}
    if not isinstance(masks, Mapping):
        raise TypeError(
            f"{fn}: masks must be a mapping of names to masks, got {type(masks).__name__}"
        )
    return {
        name: as_bool_mask(fn, name, m, params, keep_dtype=keep_dtype, values=values)
        for name, m in masks.items()
    }


def check_scores(fn: str, params: Params, scores: object) -> dict[str, Tensor]:
    """Every score tensor checked against its parameter's shape and device."""
    if scores is None:
        return {}
    if not isinstance(scores, Mapping):
        raise TypeError(
            f"{fn}: scores must be a mapping of names to tensors, got {type(scores).__name__}"
        )
    return {name: _check_fits(fn, "scores for", name, s, params) for name, s in scores.items()}


def match_names(fn: str, kind: str, pattern: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """The names that ``pattern`` selects, in the order of ``names``.

    A pattern is matched with :func:`fnmatch.fnmatchcase` (``*`` crosses
    dots); a name without ``*``, ``?`` or ``[`` must be one of ``names``.

    Raises:
        UnknownNameError: if nothing matches; ``kind`` ("rule", "name")
            says what the pattern was in the message.
    """
    if not any(c in pattern for c in "*?["):
        found: tuple[str, ...] = (pattern,) if pattern in names else ()
    else:
        found = tuple(n for n in names if fnmatch.fnmatchcase(n, pattern))
    if not found:
        raise unknown_name(fn, f"{kind} {pattern!r} matches no parameter", pattern, names)
    return found


def select_names(fn: str, patterns: Sequence[str], names: tuple[str, ...]) -> tuple[str, ...]:
    """The names a global group's ``patterns`` select, each once.

    In listed order, each pattern's matches in the order of ``names``; a
    pattern that matches nothing raises as :func:`match_names` does.
    """
    found = (n for pattern in patterns for n in match_names(fn, "name", pattern, names))
    return tuple(dict.fromkeys(found))


# Name resolution is pure Python over strings (fnmatch uses re, which dynamo
# cannot trace): torch.compile runs it once and keeps the result, guarded by
# the dict keys. The marker returns the function itself, typed as written.
torch.compiler.assume_constant_result(match_names)  # type: ignore[no-untyped-call]
