"""Validation helpers with torch.nn.utils.prune's rules, messages and types.

The compat layer re-exports the ``validate_*`` ones under torch's underscore
names, so their behaviour (including the exception types and message texts)
follows ``torch.nn.utils.prune`` exactly. funcprune's own ``check_*`` ones
(values of specs and schedules, shapes and devices that must match) name the
function or class, the argument and what was expected.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import torch

from ._torch_private import is_functorch_wrapped
from ._types import Amount, is_dtensor


def validate_amount_init(amount: object) -> None:
    """Check an ``amount`` before any tensor is known (torch's rules).

    Args:
        amount: an ``int`` (a count, at least 0) or a ``float`` in [0, 1]
            (a fraction).

    Raises:
        TypeError: if ``amount`` is not a real number.
        ValueError: if it is a negative integer or a float outside [0, 1].
    """
    if not isinstance(amount, numbers.Real):
        raise TypeError(f"Invalid type for amount: {amount}. Must be int or float.")
    if (isinstance(amount, numbers.Integral) and amount < 0) or (
        not isinstance(amount, numbers.Integral)
        and (float(amount) > 1.0 or float(amount) < 0.0)
    ):
        raise ValueError(
            f"amount={amount} should either be a float in the range [0, 1] "
            "or a non-negative integer"
        )


def count_to_prune(amount: Amount, size: int) -> int:
    """Turn ``amount`` into a count of units out of ``size`` (torch's rule).

    An integer is the count itself; a float is a fraction of ``size`` rounded
    with Python's :func:`round` (half to even).

    >>> count_to_prune(0.5, 5), count_to_prune(0.3, 10), count_to_prune(3, 10)
    (2, 3, 3)
    """
    if isinstance(amount, numbers.Integral):
        return int(amount)
    return round(amount * size)


def validate_count(amount: object, size: int) -> None:
    """Refuse an integer amount larger than the ``size`` units available."""
    if isinstance(amount, numbers.Integral) and int(amount) > size:
        raise ValueError(
            f"amount={amount} should be smaller than the number of parameters "
            f"to prune={size}"
        )


def validate_structured(t: torch.Tensor) -> None:
    """Refuse structured pruning of a tensor with fewer than 2 dims."""
    shape = t.shape
    if len(shape) <= 1:
        raise ValueError(
            "Structured pruning can only be applied to multidimensional tensors. "
            f"Found tensor of shape {shape} with {len(shape)} dims"
        )


def validate_dim(t: torch.Tensor, dim: int) -> None:
    """Refuse a ``dim`` at or past ``t.dim()`` (torch's rule: IndexError)."""
    if dim >= t.dim():
        raise IndexError(f"Invalid index {dim} for tensor of size {t.shape}")


def validate_dim_range(t: torch.Tensor, dim: int) -> None:
    """Refuse any ``dim`` that does not index ``t``, negative ones included."""
    validate_dim(t, dim)
    if dim < -t.dim():
        raise IndexError(
            f"dim={dim} is out of range for a tensor of shape {tuple(t.shape)}: "
            f"expected -{t.dim()} <= dim < {t.dim()}"
        )


def is_concrete(t: torch.Tensor) -> bool:
    """Whether ``t`` holds real values that Python may read.

    False while ``torch.compile`` traces, when ``t`` is wrapped by a
    ``torch.func`` transform (``vmap``, ``grad``, ...) and for tensors on the
    ``meta`` device, which have shapes but no values. Only concrete inputs
    take the eager paths that read values (``int(...)``).
    """
    if torch.compiler.is_compiling() or t.is_meta:
        return False
    return not is_functorch_wrapped(t)


def non_binary(mask: torch.Tensor, limit: int) -> list[float]:
    """Up to ``limit`` values of ``mask`` other than 0 and 1 (none: a valid mask).

    Reads values: call it in eager mode only. A ``meta`` tensor has no values
    to check and passes.
    """
    if mask.dtype == torch.bool or mask.is_meta:
        return []
    binary = (mask == 0) | (mask == 1)
    if bool(binary.all()):
        return []
    bad: list[float] = mask[~binary].flatten()[:limit].tolist()
    return bad


def check_generator(fn: str, generator: object) -> None:
    """Refuse anything but ``None`` or a :class:`torch.Generator`."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"{fn}: generator must be a torch.Generator or None, got {generator!r} of type "
            f"{type(generator).__name__}; make one with torch.Generator().manual_seed(seed)"
        )


def _shown(value: object) -> str:
    """A wrongly typed value for a message: ``the bool True``, ``'3' of type str``."""
    if isinstance(value, bool):
        return f"the bool {value!r}"
    return f"{value!r} of type {type(value).__name__}"


def check_sparsity(owner: str, argument: str, value: object) -> float:
    """``value`` as a float, refusing anything but a real number in [0, 1].

    Raises:
        TypeError: if ``value`` is a ``bool`` or not a real number.
        ValueError: if it is NaN or outside [0, 1].
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {argument} must be a float in [0, 1], got {_shown(value)}")
    if not 0.0 <= float(value) <= 1.0:  # NaN fails too
        raise ValueError(f"{owner}: {argument} must be a float in [0, 1], got {value!r}")
    return float(value)


def check_count(owner: str, argument: str, value: object, *, least: int) -> int:
    """``value`` as an int, refusing anything but an integer (not bool) >= ``least``.

    Raises:
        TypeError: if ``value`` is a ``bool`` or not an integer.
        ValueError: if it is smaller than ``least``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: {argument} must be an int >= {least}, got {_shown(value)}")
    if value < least:
        raise ValueError(f"{owner}: {argument} must be an int >= {least}, got {value!r}")
    return int(value)


def check_dim(dim: object) -> None:
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"dim must be an int, got {dim!r} of type {type(dim).__name__}")


def check_norm_order(n: object) -> None:
    if isinstance(n, str):
        if n not in ("fro", "nuc"):
            raise ValueError(
                f"n={n!r} is not a norm order: expected a number, inf, -inf, "
                "'fro' or 'nuc' (see torch.norm's p)"
            )
        return
    if isinstance(n, bool) or not isinstance(n, numbers.Real):
        raise TypeError(
            f"n must be a number, inf, -inf, 'fro' or 'nuc' (see torch.norm's p), "
            f"got {n!r} of type {type(n).__name__}"
        )
    if isinstance(n, numbers.Integral) and not -(2**63) <= int(n) < 2**63:
        raise ValueError(
            f"n={n} is too large for torch.norm (integers must fit in 64 bits); "
            "use float('inf') for the largest entry's magnitude"
        )
    if math.isnan(float(n)):
        raise ValueError("n=nan is not a norm order: expected a number, inf, -inf, 'fro' or 'nuc'")


def check_same_shape(
    fn: str, subject: str, shape: torch.Size, other: str, other_shape: torch.Size, *, plural: bool = False
) -> None:
    """Refuse unless ``subject``'s ``shape`` is ``other``'s (``plural``: "the scores have")."""
    if shape != other_shape:
        has = "have" if plural else "has"
        raise ValueError(
            f"{fn}: {subject} has shape {tuple(shape)} but {other} {has} shape "
            f"{tuple(other_shape)}; they must be equal"
        )


def check_fits(fn: str, subject: str, value: torch.Tensor, other: str, target: torch.Tensor, *,
               plural: bool = False) -> None:  # fmt: skip
    """Refuse ``value`` unless it has ``target``'s shape and device; messages name both."""
    check_same_shape(fn, subject, value.shape, other, target.shape, plural=plural)
    if value.device != target.device:
        are = "are" if plural else "is"
        raise ValueError(
            f"{fn}: {subject} is on {value.device} but {other} {are} on {target.device}; "
            f"move it with .to({str(target.device)!r})"
        )


def refuse_dtensors(fn: str, *tensors: object) -> None:
    """Refuse DTensors where whole tensors are expected (the kernels, selection).

    A DTensor's values there would be read as this process's block only, or
    gathered. :func:`funcprune.compute_mask` and the plans hand the kernels
    each process's block with a ``LocalShard`` instead (``funcprune/_dtensor``).

    Raises:
        TypeError: if any of ``tensors`` is a DTensor.
    """
    if any(map(is_dtensor, tensors)):
        raise TypeError(
            f"{fn}: got a DTensor where the kernels take whole tensors (a spec's own "
            "compute_mask method); call funcprune.compute_mask(spec, scores), a Plan or "
            "global_unstructured instead, which prune DTensors block by block, nothing gathered"
        )


def refuse_in(fn: str, tensors: Mapping[str, object] | None, what: str = "parameter") -> None:
    """Refuse DTensors where a function rebuilds whole tensors (payoff: bake, shrink, to_sparse; structure).

    Rebuilt into a module or a sparse tensor, a DTensor would be gathered,
    or be that process's block only. Not supported yet, so refused, naming
    the first DTensor and its layout (read off the tensor; nothing of
    ``funcprune._dtensor`` is needed to refuse one).

    Raises:
        NotImplementedError: if any value of ``tensors`` is a DTensor.
    """
    for name, t in (tensors or {}).items():
        if is_dtensor(t):
            raise NotImplementedError(
                f"{fn}: the {what} {name!r} is a DTensor ({list(t.placements)} on {t.device_mesh}); "
                f"{fn} does not support DTensors yet (it would rebuild this process's "
                "block only); DTensors are supported by compute_mask, the plans, the "
                "apply functions and sparsity_report"
            )
