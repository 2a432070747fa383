"""Depth: whole blocks of a model's repeated layers, removed where the masks prune every parameter of them.

A *stack* is a ``ModuleList`` (or ``Sequential``) of two blocks or more of
one class, each holding parameters (a transformer's layers, a ResNet
stage's blocks). A block whose every parameter the masks prune entirely
computes, in a pre-norm residual block, the identity (its output
projections are zero, so the residual stream goes through unchanged);
removing it leaves what the masked model computes. :func:`pruned_blocks`
finds such blocks, :func:`without_blocks` makes a copy without them: the
stack renumbered, each kept block's modules told their new index
(:data:`~funcprune._families.LAYER_INDEX`: the key-value cache's slot of an
attention), and a transformers model's config made to describe the new
depth (:func:`describe_depth_`): its count of layers, every per-layer list
sliced (``layer_types``, sliding-window layouts), thresholds counted in
layers (:data:`~funcprune._families.DEPTH_THRESHOLDS`) and lists of layer
indices renumbered, checked by building the class from the new config on
the meta device. Whether removing a block is exact (a post-norm block,
``LayerNorm(x + f(x))``, is no identity when zeroed) is checked by the
caller against the masked model.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, final

from torch import nn

from .._families import DEPTH_INDEX_LISTS, DEPTH_THRESHOLDS, LAYER_INDEX
from .._graph import Inputs, copy_module
from .._types import Tensor
from ._config import _built_shapes, _refused_by_class, is_transformers_model, shapes_of
from ._smaller import masked_run, zeroed_
from ._stacks import block_names, stacks_of
from ._verify import mismatch

__all__ = [
    "Depthless", "blocks_of", "depthless", "describe_depth_", "pruned_blocks", "renamed", "without_blocks",
]  # fmt: skip

#: Why a block stays whose every parameter the masks prune.
NOT_IDENTITY = "removing the block changes what the model computes (a zeroed post-norm block is no identity)"
#: Why a block stays whose output is not of its input's shape (a ResNet stage's first, which downsamples).
NOT_SAME_SHAPE = ("removing the block changes what the model computes (its output is not of its input's shape: "
                  "no identity)")  # fmt: skip


@final
@dataclass(frozen=True, slots=True)
class Depthless:
    """A model without the blocks the masks prune entirely, and what was done.

    Attributes:
        model: the copy without them (``module`` itself where none goes).
        masks: the masks of its parameters, by their new names.
        removed: the blocks removed, by stack path.
        kept: the blocks the masks prune entirely that stay, each with why.
        renames: name prefixes of kept blocks, old to new.
        config: why the config cannot describe the new depth, by stack (empty: it does, or there is none).
    """

    model: nn.Module
    masks: dict[str, Tensor]
    removed: dict[str, list[int]]
    kept: dict[str, str]
    renames: dict[str, str]
    config: dict[str, str] = field(default_factory=dict)

    def old_name(self, name: str) -> str:
        """The name a parameter of :attr:`model` has in the original model."""
        for old, new in self.renames.items():
            if name.startswith(new):
                return old + name[len(new):]
        return name


def depthless(
    fn: str, module: nn.Module, masks: Mapping[str, Tensor], inputs: Inputs,
    blocks: Mapping[str, Sequence[int]] | None = None, *, probe: bool = False,
) -> Depthless:  # fmt: skip
    """``module`` without the blocks whose every parameter ``masks`` prune, where that is exact.

    The copy without them (its config describing it) is checked against the
    masked model on ``inputs``; where it fails, each block is tried alone,
    and those whose removal fails stay (:data:`NOT_IDENTITY`). A block whose
    output is not of its input's shape (seen on the masked model's run) is
    no identity: it stays without a trial (:data:`NOT_SAME_SHAPE`), and its
    zeroed parameters are left out of the masks the others are tried with
    (a zeroed block that stays hides what follows it), as a block tried
    alone leaves the others' out; the blocks that go are then checked with
    every mask. ``blocks``:
    the blocks to try, by stack path (a trial: all of a stack's may go),
    instead of those :func:`pruned_blocks` finds. With ``probe`` (a caller
    that reads what goes and why, not the model), the model returned shares
    ``module``'s tensors, as a probe's copy does: no copy of a 1B model's
    weights made for nothing; and the masks of the blocks that stay are a
    trial's, whose model nobody runs: the blocks that go are checked
    without them only (one run of each model fewer where a block changes
    shapes: a ResNet's first block of each stage).
    """
    sizes = stacks_of(module)
    removed = pruned_blocks(module, masks) if blocks is None else {p: list(b) for p, b in blocks.items() if b}
    if not removed:
        return Depthless(module, dict(masks), {}, {}, {})
    shapes: dict[tuple[str, int], tuple[object, object]] = {}
    with _watching(module, removed, shapes):
        reference = masked_run(module, masks, inputs)
    kept: dict[str, str] = {}
    hidden: set[str] = set()  # the parameters of blocks that stay zeroed, left out where blocks are tried
    changers = [b for b, (seen, made) in shapes.items() if seen is not None and made is not None and seen != made]
    if changers:  # a block that changes the shape of what it is given is no identity: no run needed to tell
        kept = {block_names(module, p)[i]: NOT_SAME_SHAPE for p, i in changers}
        hidden = {n for p, i in changers for n in blocks_of(module, p)[i]}
        removed = {p: [i for i in gone if (p, i) not in changers] for p, gone in removed.items()}
        removed = {p: gone for p, gone in removed.items() if gone}
        if not removed:
            return Depthless(module, dict(masks), {}, kept, {})
    together = {n: m for n, m in masks.items() if n not in hidden}
    against = masked_run(module, together, inputs) if hidden else reference
    if _fails(fn, module, together, inputs, removed, sizes, against) or (
        hidden and not probe and _fails(fn, module, masks, inputs, removed, sizes, reference)
    ):
        alone = [(path, i) for path, gone in removed.items() for i in gone]
        params = {path: blocks_of(module, path) for path in removed}
        owned = {(p, i): set(params[p][i]) for p, i in alone}
        good = []
        for block in alone:  # the others' masks left out: a zeroed block that cannot go hides what follows it
            others = {n for b, names in owned.items() if b != block for n in names} | hidden
            mine = {n: m for n, m in masks.items() if n not in others}
            if not _fails(fn, module, mine, inputs, {block[0]: [block[1]]}, sizes, masked_run(module, mine, inputs)):
                good.append(block)
        kept.update({block_names(module, p)[i]: NOT_IDENTITY for p, i in alone if (p, i) not in good})
        removed = {}
        for p, i in good:
            removed.setdefault(p, []).append(i)
        if removed and (_fails(fn, module, together, inputs, removed, sizes, against) if probe
                        else _fails(fn, module, masks, inputs, removed, sizes, reference)):  # each goes alone, not all
            kept.update({block_names(module, p)[i]: NOT_IDENTITY for p, i in good})
            removed = {}
    if not removed:
        return Depthless(module, dict(masks), {}, kept, {})
    model = without_blocks(fn, module, removed, probe=probe)
    why = describe_depth_(model, removed, sizes)
    return Depthless(model, _moved(module, masks, removed), removed, kept, renamed(module, removed), why)


@contextlib.contextmanager
def _watching(
    module: nn.Module, blocks: Mapping[str, Sequence[int]], shapes: dict[tuple[str, int], tuple[object, object]]
) -> Iterator[None]:
    """While inside, each call of the ``blocks`` records into ``shapes`` the shape of its first positional input and
    of its output (the first of a tuple's), or ``None`` where it is no tensor (or given by keyword); a block called
    twice records its last call."""

    def first(value: object) -> object:
        if isinstance(value, (tuple, list)) and value:
            value = value[0]
        return tuple(value.shape) if isinstance(value, Tensor) else None

    handles = []
    try:
        for path, gone in blocks.items():
            children = list(module.get_submodule(path).children())
            for i in gone:
                def hook(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                         key: tuple[str, int] = (path, i)) -> None:  # fmt: skip
                    shapes[key] = (first(args[0]) if args else None, first(out))

                handles.append(children[i].register_forward_hook(hook, with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _moved(module: nn.Module, masks: Mapping[str, Tensor], removed: Mapping[str, Sequence[int]]) -> dict[str, Tensor]:
    """``masks`` by the names their parameters have once the ``removed`` blocks go (theirs left out)."""
    renames = renamed(module, removed)
    gone = tuple(f"{block_names(module, p)[i]}." for p, blocks in removed.items() for i in blocks)
    out: dict[str, Tensor] = {}
    for name, mask in masks.items():
        if name.startswith(gone):
            continue
        old = next((o for o in renames if name.startswith(o)), None)
        out[name if old is None else renames[old] + name[len(old):]] = mask
    return out


def _fails(
    fn: str, module: nn.Module, masks: Mapping[str, Tensor], inputs: Inputs, removed: Mapping[str, Sequence[int]],
    sizes: Mapping[str, int], reference: Any,
) -> bool:  # fmt: skip
    probe = without_blocks(fn, module, removed, probe=True)
    describe_depth_(probe, removed, sizes)
    zeroed_(probe, _moved(module, masks, removed))
    return mismatch(probe, inputs, reference) is not None


def blocks_of(model: nn.Module, path: str) -> list[list[str]]:
    """The parameter names (as ``named_parameters`` gives them) of each block of the stack at ``path``."""
    stack = model.get_submodule(path)
    names = {id(p): n for n, p in model.named_parameters()}
    return [[names[id(p)] for p in block.parameters() if id(p) in names] for block in stack.children()]


def pruned_blocks(model: nn.Module, masks: Mapping[str, Tensor]) -> dict[str, list[int]]:
    """For each stack, the blocks whose every parameter ``masks`` prune entirely (one block stays at least).

    A block holding a parameter that another module also holds (tied) is
    not one of them: removing it would not remove that parameter.
    """
    owners: dict[int, int] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    out: dict[str, list[int]] = {}
    for path, size in stacks_of(model).items():
        stack = model.get_submodule(path)
        gone = []
        for i, (block, names) in enumerate(zip(stack.children(), blocks_of(model, path), strict=True)):
            own = all(owners[id(p)] == 1 for p in block.parameters())
            if own and names and all(n in masks and not bool(masks[n].any()) for n in names):
                gone.append(i)
        if len(gone) == size:
            gone = gone[:-1]  # the last block stays, zero
        if gone:
            out[path] = gone
    return out


def renamed(model: nn.Module, removed: Mapping[str, Sequence[int]]) -> dict[str, str]:
    """Name prefixes of kept blocks, old to new (``"model.layers.3."`` to ``"model.layers.2."``): blocks named by
    their index are numbered again, others keep their names."""
    out: dict[str, str] = {}
    for path, gone in removed.items():
        names = block_names(model, path)
        kept = [name for i, name in enumerate(names) if i not in set(gone)]
        if not _numbered(model.get_submodule(path)):
            continue
        for new, old in enumerate(kept):
            fresh = f"{path}.{new}" if path else str(new)
            if fresh != old:
                out[f"{old}."] = f"{fresh}."
    return out


def _numbered(stack: nn.Module) -> bool:
    return all(name.isdigit() for name, _ in stack.named_children())


def without_blocks(fn: str, module: nn.Module, removed: Mapping[str, Sequence[int]], *, probe: bool = False) -> nn.Module:
    """A copy of ``module`` without the blocks ``removed`` names, each kept block told its new index.

    A ``probe`` (a copy only run and thrown away) shares the tensors of
    ``module``. The config of a transformers model is left to
    :func:`describe_depth_`.
    """
    sharing = [*module.parameters(), *module.buffers()] if probe else []
    result = copy_module(fn, module, sharing=sharing)
    for path, gone in removed.items():
        stack = result.get_submodule(path)
        numbered = _numbered(stack)
        kept = [(i, name, m) for i, (name, m) in enumerate(stack.named_children()) if i not in set(gone)]
        for new, (old, _, block) in enumerate(kept):
            for sub in block.modules():
                for attr in LAYER_INDEX:
                    value = getattr(sub, attr, None)
                    if isinstance(value, int) and not isinstance(value, bool) and value == old:
                        setattr(sub, attr, new)
        stack._modules.clear()
        for new, (_, name, block) in enumerate(kept):
            stack._modules[str(new) if numbered else name] = block
    return result


def describe_depth_(model: nn.Module, removed: Mapping[str, Sequence[int]], sizes: Mapping[str, int]) -> dict[str, str]:
    """Make a transformers ``model``'s config (without the ``removed`` blocks) describe its depth, in place.

    Returns ``{}`` when it does (or ``model`` has no config), else why not,
    by stack path (the config is then left as it was).
    """
    if not is_transformers_model(model):
        return {}
    failed: dict[str, str] = {}
    config: Any = getattr(model, "config")
    updated = copy.deepcopy(config)
    one = len(removed) == 1  # per-layer lists belong to the one stack (two of equal length: which one's?)
    cls = type(model)
    for path, gone in removed.items():
        old = sizes[path]
        kept = [i for i in range(old) if i not in set(gone)]
        if one:
            _sliced_lists_(updated, old, kept)
        chosen = None
        candidates = [a for a, v in vars(updated).items() if isinstance(v, int) and not isinstance(v, bool) and v == old]
        for attr in sorted(candidates, key=lambda a: "layer" not in a):
            trial = copy.deepcopy(updated)
            setattr(trial, attr, len(kept))
            if _stack_size(cls, trial, path) == len(kept):
                chosen, updated = attr, trial
                break
        if chosen is None:
            failed[path] = f"no attribute of the config counts the {old} blocks of {path!r}"
    if failed:
        return failed
    refused = _refused_by_class(updated)
    if refused is not None:
        return dict.fromkeys(removed, f"its class refuses the new depth ({refused})")
    if _built_shapes(cls, updated) != shapes_of(model):
        return dict.fromkeys(removed, "the config with the new depth builds other tensors than the model has")
    vars(config).clear()
    vars(config).update(vars(updated))
    return {}


def _sliced_lists_(config: Any, old: int, kept: Sequence[int]) -> None:
    for attr, value in list(vars(config).items()):
        if attr in DEPTH_INDEX_LISTS and isinstance(value, (list, tuple)):
            setattr(config, attr, type(value)(kept.index(i) for i in value if i in kept))
        elif isinstance(value, (list, tuple)) and len(value) == old:
            setattr(config, attr, type(value)(value[i] for i in kept))
    for attr in DEPTH_THRESHOLDS:
        value = getattr(config, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            setattr(config, attr, sum(1 for i in kept if i < value))


def _stack_size(cls: type[nn.Module], config: Any, path: str) -> int | None:
    """How many blocks the stack at ``path`` has in ``cls(config)`` built on the meta device (``None``: none)."""
    shapes = _built_shapes(cls, config)
    if shapes is None:
        return None
    prefix = f"{path}."
    indices = {n[len(prefix):].split(".", 1)[0] for n in shapes if n.startswith(prefix)}
    return len(indices) if all(i.isdigit() for i in indices) else None
