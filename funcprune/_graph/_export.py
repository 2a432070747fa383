"""A model's graph, as ``torch.export`` gives it: aten ops, every tensor's value on the example inputs.

:func:`export_model` runs the model once on the example inputs (a copy, in
eval mode), then exports it (``strict=False``, so transformers models work
as given) and returns the graph with what its placeholders hold: each
parameter and buffer under its first name in ``named_parameters()``
(``named_buffers()``), and the user inputs. Hooks run inside the export, so
the graph holds what they do.
"""

from __future__ import annotations

import contextlib
import copy
import io
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, final

import torch
from torch import fx, nn

from .._families import takes_use_cache
from .._torch_private import lazy_graph_modules, tree_leaves
from .._types import Tensor

__all__ = ["Exported", "Inputs", "as_inputs", "copy_module", "export_model", "first_line", "run"]


@final
@dataclass(frozen=True, slots=True)
class Inputs:
    """The example inputs of ``forward``: positional and keyword arguments."""

    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def as_inputs(fn: str, module: nn.Module, example_inputs: object) -> Inputs:
    """``example_inputs`` as :class:`Inputs`: a tensor, a tuple of positional arguments, or a dict of keyword ones.

    A model whose ``forward`` takes ``use_cache`` (a transformers language
    model), or takes ``**kwargs`` and has a config with ``use_cache`` (GraniteMoE
    reads it from the keyword arguments), runs with ``use_cache=False`` unless
    the inputs say otherwise: a cache changes nothing of which channels hang
    together, and ``torch.export`` cannot return one.

    >>> as_inputs("example", nn.Linear(2, 2), (torch.zeros(1), 2.0))
    Traceback (most recent call last):
    ...
    TypeError: example: example_inputs must be ..., but example_inputs[1] is a float
    """
    expected = (
        f"{fn}: example_inputs must be a tensor or a tuple of tensors (the positional arguments of "
        "forward), or a dict of keyword arguments"
    )
    if isinstance(example_inputs, Tensor):
        inputs = Inputs((example_inputs,))
    elif isinstance(example_inputs, tuple):
        for i, item in enumerate(example_inputs):
            if not isinstance(item, Tensor):
                raise TypeError(f"{expected}, but example_inputs[{i}] is a {type(item).__name__}")
        inputs = Inputs(example_inputs)
    elif isinstance(example_inputs, Mapping) and all(isinstance(k, str) for k in example_inputs):
        inputs = Inputs((), dict(example_inputs))
    else:
        raise TypeError(f"{expected}, got {type(example_inputs).__name__}")
    if "use_cache" not in inputs.kwargs and takes_use_cache(module):
        inputs = Inputs(inputs.args, {**inputs.kwargs, "use_cache": False})
    return inputs


@final
@dataclass(frozen=True, slots=True)
class Exported:
    """A model's exported graph and what its placeholders hold.

    Attributes:
        model: the exported copy of the model (eval mode).
        graph: the aten graph (``torch.export``'s, parameters lifted to placeholders).
        tensors: for each placeholder of a parameter or a buffer, its first
            name in ``named_parameters()`` (``named_buffers()``).
        values: for each placeholder, the value it takes on the example inputs.
        modules: for each call node, the path of the innermost module it runs in
            (``""``: the model itself).
    """

    model: nn.Module
    graph: fx.Graph
    tensors: Mapping[fx.Node, str]
    values: Mapping[fx.Node, Any]
    modules: Mapping[fx.Node, str]


def run(module: nn.Module, inputs: Inputs) -> Any:
    """``module(*inputs.args, **inputs.kwargs)`` without gradients."""
    with torch.no_grad():
        return module(*inputs.args, **inputs.kwargs)


def copy_module(fn: str, module: nn.Module, *, sharing: Iterable[Tensor] = ()) -> nn.Module:
    """``copy.deepcopy(module)``, or a ValueError saying why it cannot be copied.

    ``sharing``: tensors the copy holds as they are, not copied (a probe that
    changes none of them, thrown away after: never a copy given to a user).
    torch cannot copy a module under the deprecated ``torch.nn.utils.weight_norm``
    (its weight is a computed tensor held as an attribute); the message names it
    and the way out.
    """
    try:
        return copy.deepcopy(module, {id(t): t for t in sharing})
    except Exception as e:
        legacy = [
            path or type(module).__name__
            for path, m in module.named_modules()
            if any(type(hook).__name__ == "WeightNorm" for hook in m._forward_pre_hooks.values())
        ]
        if legacy:
            raise ValueError(
                f"{fn}: cannot copy the model: {legacy[0]!r} is under the deprecated "
                "torch.nn.utils.weight_norm, which torch cannot copy; use "
                "torch.nn.utils.parametrizations.weight_norm instead (or torch.nn.utils.remove_weight_norm)"
            ) from None
        raise ValueError(f"{fn}: cannot copy the model with copy.deepcopy ({type(e).__name__}: {first_line(e)})") from e


def export_model(fn: str, module: nn.Module, inputs: Inputs) -> Exported:
    """The graph of ``module`` (a copy in eval mode, holding its parameters as they are) on ``inputs``.

    Raises:
        ValueError: if the model fails on the inputs, or ``torch.export`` cannot trace it.
    """
    # the copy holds the module's parameters as they are (nothing here writes them: it runs and exports the copy,
    # whose buffers are its own, as a forward may write those): a 1B model's analysis costs no copy of its weights
    model = copy_module(fn, module, sharing=list(module.parameters())).eval()
    name = type(module).__name__
    try:  # the model is run eagerly only where export fails, to tell a failing model from a failing trace
        with _quiet(), _no_stack_traces(), lazy_graph_modules():
            program = torch.export.export(model, inputs.args, dict(inputs.kwargs), strict=False)
    except Exception as e:
        _run_tracked(fn, model, inputs)
        raise ValueError(
            f"{fn}: torch.export cannot trace {name} ({type(e).__name__}: {first_line(e)}); the "
            "channel analysis reads the model's exported graph"
        ) from None
    return _exported(model, program, inputs)


def _run_tracked(fn: str, model: nn.Module, inputs: Inputs) -> None:
    """Run ``model`` on ``inputs``; where it fails, a ValueError naming the module that was running."""
    running: list[str] = []
    try:
        with _quiet(), _tracking(model, running):
            run(model, inputs)
    except Exception as e:
        where = f" in module {running[-1]!r}" if running and running[-1] else ""
        raise ValueError(
            f"{fn}: the model failed on example_inputs{where} ({type(e).__name__}: {first_line(e)}); pass "
            "inputs its forward takes (a tensor, a tuple of positional arguments or a dict of keyword ones)"
        ) from e


def _exported(model: nn.Module, program: torch.export.ExportedProgram, inputs: Inputs) -> Exported:
    firsts = _first_names(model)
    by_name = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers(remove_duplicate=False))}
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    flat_inputs = _flat_user_inputs(program, inputs)
    tensors: dict[fx.Node, str] = {}
    values: dict[fx.Node, Any] = {}
    user = iter(flat_inputs)
    constants = program.constants
    for node, spec in zip(placeholders, program.graph_signature.input_specs, strict=True):
        target = spec.target
        if target is not None and target in by_name:
            tensors[node] = firsts[id(by_name[target])]
            values[node] = by_name[target].detach()
        elif target is not None and target in constants:
            values[node] = constants[target]
        else:
            values[node] = next(user)
    modules = {n: _module_path(n) for n in program.graph.nodes if n.op == "call_function"}
    return Exported(model, program.graph, tensors, values, modules)


def _flat_user_inputs(program: torch.export.ExportedProgram, inputs: Inputs) -> list[Any]:
    """The user inputs in the order of the graph's user-input placeholders (export flattens ``(args, kwargs)``)."""
    return tree_leaves((tuple(inputs.args), dict(inputs.kwargs)))


def _first_names(model: nn.Module) -> dict[int, str]:
    first: dict[int, str] = {}
    for name, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        first.setdefault(id(tensor), name)
    return first


def _module_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path, _ = list(stack.values())[-1]
    return str(path).removeprefix("L['self'].").removeprefix("L__self__.")


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, for an error that names it (its type's name where it has none)."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


@contextlib.contextmanager
def _tracking(model: nn.Module, running: list[str]) -> Iterator[None]:
    """Keep in ``running`` the path of each module while it runs (its last entry: where a failure happened)."""

    def enter(path: str) -> Any:
        return lambda module, args: running.append(path)

    def leave(module: nn.Module, args: Any, out: Any) -> None:
        running.pop()

    handles = []
    for path, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(enter(path)))
        handles.append(module.register_forward_hook(leave))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Keep what a model prints while it runs or is exported out of the caller's output, and export's advice.

    ``torch.export`` warns about what it traces (a tensor attribute assigned
    in ``forward``, as the deprecated ``spectral_norm`` does): advice for
    exporting, not about what funcprune computes.
    """
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The tensor attribute .* was assigned during export")
        yield


@contextlib.contextmanager
def _no_stack_traces() -> Iterator[None]:
    """Export without the Python stack of each node (``torch.fx.config.do_not_emit_stack_traces``), as it was after.

    Nothing here reads ``node.stack_trace``; recording it cost 10-20% of the export of a torchvision model.
    """
    config = torch.fx.config
    was = config.do_not_emit_stack_traces
    config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = was
