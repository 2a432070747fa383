"""The structure of a model built on the meta device, read off a smaller copy with values: its *shadow*.

A model on the meta device has shapes and no values, and the analysis
computes real values through the graph (masks, index tensors) and tries
removals against the model's outputs. So the structure of a transformers
model on meta is read off a copy that has fewer blocks and random values:

- each stack of repeated blocks (the payoff's ``stacks_of``) keeps, of each
  *kind* of block, its first two, and the stack keeps its last block. Two
  blocks are of one kind when their modules (classes, plain attributes but
  the layer index), parameters and buffers (names, shapes, dtypes) and the
  config's per-layer entries (a list as long as the stack, a list of layer
  indices, a threshold counted in layers) agree: a sliding-window layer and
  a full one, a dense MLP and a MoE one, are of two kinds;
- the copy is made as ``shrink`` removes blocks (the payoff's
  ``without_blocks``, the config made to describe its depth), then built
  again from that config with the model's class, on the CPU, seeded, and
  checked to be the same modules, attributes and tensors;
- the copy is analyzed for real (:func:`~funcprune.structure`) and its
  groups are mapped onto the full model: a group of one block onto every
  block of its kind, a group spanning blocks (the hidden size, T5's heads
  tied by a shared position bias) onto every block, a ``"layers"`` group
  onto every block of the kinds whose block can go.

The copy's blocks of one kind must give the same groups (up to their
names); where they do not (the structure depends on where a block sits),
or the copy cannot be built, ``structure`` refuses by name rather than
guess. Example inputs on the meta device get seeded random values of their
shape and dtype (token ids below the config's ``vocab_size``, masks of
ones); those on another device are read on the CPU.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, final

import torch
from torch import nn

from .. import _graph as graph
from .._families import DEPTH_INDEX_LISTS, DEPTH_THRESHOLDS, LAYER_INDEX
from .._payoff import block_names, describe_depth_, is_transformers_model, stacks_of, without_blocks
from .._units import Member, Structure, UnitGroup

__all__ = ["Shallow", "on_meta", "shadow_structure", "shallow_copy", "standing_for"]

#: Reads the structure of a model with values (``structure`` itself, past its checks).
Read = Callable[[nn.Module, object, bool], Structure]


def on_meta(model: nn.Module) -> bool:
    """Whether any parameter or buffer of ``model`` is on the meta device (it has no values to run on)."""
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def shadow_structure(fn: str, model: nn.Module, example_inputs: object, outputs: bool, read: Read) -> Structure:
    """The structure of ``model`` (on the meta device) read off its shadow, as the module docstring says.

    Raises:
        ValueError: if ``model`` is no transformers model (no config to build
            a smaller copy from), the copy cannot be built as the model is,
            or blocks of one kind give different groups.
    """
    if not is_transformers_model(model):
        raise ValueError(
            f"{fn}: model ({type(model).__name__}) is on the meta device, with no values to run on; funcprune reads "
            "the structure of a model on meta only for a transformers model (a config to build a smaller copy "
            "with values from): build the model on a real device"
        )
    graph.as_inputs(fn, model, example_inputs)  # the inputs' type errors, as for any model
    sizes = stacks_of(model)
    kinds = {path: _kinds(model, path, size) for path, size in sizes.items()}
    kept = {path: _kept(k) for path, k in kinds.items()}
    removed = {path: [i for i in range(sizes[path]) if i not in kept[path]] for path in sizes}
    removed = {path: gone for path, gone in removed.items() if gone}
    small = without_blocks(fn, model, removed)
    why = describe_depth_(small, removed, sizes)
    if why:
        path, reason = next(iter(why.items()))
        raise ValueError(
            f"{fn}: model is on the meta device, and its structure is read off a copy with fewer blocks of "
            f"{path!r}, which its config cannot describe ({reason}): build the model on a real device"
        )
    shadow = _built(fn, model, small)
    config: Any = getattr(model, "config")
    example = _valued(example_inputs, getattr(config, "vocab_size", None))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = read(shadow, example, outputs)
    mapped = _Mapping(fn, model, kinds, kept)
    result = mapped.structure(found)
    shown = ", ".join(f"{kept[p]} of the {sizes[p]} of {p!r}" for p in sizes)
    note = f" (read on a copy of the model with blocks {shown}; the others are alike)" if sizes else ""
    for w in caught:
        warnings.warn(f"{mapped.text(str(w.message))}{note}", w.category, stacklevel=3)
    return result


@final
@dataclass(frozen=True, slots=True, eq=False)
class Shallow:
    """A copy of a model with values that has fewer blocks (the shadow's, sharing the model's tensors), and how
    the names of the two map (:meth:`to_copy`; the copy's texts back: ``mapping.text``)."""

    model: nn.Module
    mapping: _Mapping

    def to_copy(self, name: str) -> str | None:
        """``name`` (a parameter or module of the full model) as the copy names it; ``None`` in a block it lacks."""
        for path, blocks in self.mapping.names.items():
            for i, block in enumerate(blocks):
                if name == block or name.startswith(f"{block}."):
                    kept = self.mapping.kept[path]
                    return self.mapping.shadow_names[path][kept.index(i)] + name[len(block) :] if i in kept else None
        return name

    def group_in_copy(self, group: UnitGroup) -> UnitGroup | None:
        """``group`` (of the full model) as the copy names it; ``None`` where a member lies in a block it lacks."""
        members = []
        for m in group.members:
            name = self.to_copy(m.name)
            if name is None:
                return None
            members.append(replace(m, name=name))
        return replace(group, members=tuple(members))


#: The share of a model's blocks (of every stack) that a :func:`shallow_copy` keeps at most.
_AT_MOST = 0.5


def shallow_copy(fn: str, model: nn.Module) -> Shallow | None:
    """The copy of a transformers ``model`` (with values) that its shadow would be, sharing its tensors: each
    stack keeps the first two blocks of each kind and its last, and the config says the depth. ``None`` where the
    copy would keep more than half of the blocks (:data:`_AT_MOST`: no stack has a block to leave out, or too few),
    the model is no transformers model, or its config cannot say the depth."""
    if not is_transformers_model(model):
        return None
    sizes = stacks_of(model)
    kinds = {path: _kinds(model, path, size) for path, size in sizes.items()}
    kept = {path: _kept(k) for path, k in kinds.items()}
    removed = {path: [i for i in range(sizes[path]) if i not in kept[path]] for path in sizes}
    removed = {path: gone for path, gone in removed.items() if gone}
    if sum(len(k) for k in kept.values()) > _AT_MOST * sum(sizes.values()):
        return None  # the copy's analysis would cost about what running its trials on the model saves
    small = without_blocks(fn, model, removed, probe=True)
    if describe_depth_(small, removed, sizes):
        return None
    return Shallow(small, _Mapping(fn, model, kinds, kept))


def _plain(value: object) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str, torch.dtype))


def _kinds(model: nn.Module, path: str, size: int) -> list[str]:
    """The kind of each block of the stack at ``path``: what it holds and what the config says of it (a string)."""
    config: Any = getattr(model, "config", None)
    entries = vars(config) if config is not None else {}
    out = []
    for i, block in enumerate(model.get_submodule(path).children()):
        parts: list[object] = []
        for name, sub in block.named_modules():
            attrs = sorted((k, repr(v)) for k, v in vars(sub).items() if k not in LAYER_INDEX and _plain(v))
            tensors = [(n, tuple(t.shape), str(t.dtype)) for n, t in [*sub.named_parameters(recurse=False),
                                                                       *sub.named_buffers(recurse=False)]]  # fmt: skip
            parts.append((name, type(sub).__module__, type(sub).__qualname__, attrs, tensors))
        for attr, value in sorted(entries.items()):
            if attr in DEPTH_INDEX_LISTS and isinstance(value, (list, tuple)):
                parts.append((attr, i in value))
            elif attr in DEPTH_THRESHOLDS and isinstance(value, int) and not isinstance(value, bool):
                parts.append((attr, i < value))
            elif isinstance(value, (list, tuple)) and len(value) == size:
                parts.append((attr, repr(value[i])))
        out.append(repr(parts))
    return out


def _kept(kinds: Sequence[str]) -> list[int]:
    """The blocks the shadow keeps: the first two of each kind, and the last."""
    kept: list[int] = []
    for kind in dict.fromkeys(kinds):
        kept += [i for i, k in enumerate(kinds) if k == kind][:2]
    return sorted({*kept, len(kinds) - 1})


def _built(fn: str, model: nn.Module, small: nn.Module) -> nn.Module:
    """``type(model)`` built from ``small``'s config on the CPU (seeded), checked to be ``small`` with values."""
    config: Any = getattr(small, "config")
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        torch.manual_seed(0)
        shadow = type(model)(config)
    if len(dtypes) == 1:
        shadow = shadow.to(next(iter(dtypes)))
    shadow.train(model.training)
    differ = _difference(small, shadow)
    if differ is not None:
        raise ValueError(
            f"{fn}: model is on the meta device, and its structure is read off a copy with fewer blocks built "
            f"from its config, but {type(model).__name__}(config) builds another model than it is ({differ}): "
            "build the model on a real device"
        )
    return shadow


def _difference(small: nn.Module, shadow: nn.Module) -> str | None:
    """What differs between the two models (modules, plain attributes, tensors), or ``None``."""
    mine, theirs = dict(small.named_modules()), dict(shadow.named_modules())
    if mine.keys() != theirs.keys():
        return f"modules {sorted(mine.keys() ^ theirs.keys())[:3]}"
    for name, module in mine.items():
        other = theirs[name]
        if type(module) is not type(other):
            return f"{name!r} is a {type(other).__name__}, not a {type(module).__name__}"
        a = {k: v for k, v in vars(module).items() if not k.startswith("_") and _plain(v)}  # no private flags
        b = {k: v for k, v in vars(other).items() if not k.startswith("_") and _plain(v)}
        if a != b:
            key = next(k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k))
            return f"{name or 'the model'}.{key} is {b.get(key)!r}, not {a.get(key)!r}"
    a_t = {n: (tuple(t.shape), t.dtype) for n, t in [*small.named_parameters(), *small.named_buffers()]}
    b_t = {n: (tuple(t.shape), t.dtype) for n, t in [*shadow.named_parameters(), *shadow.named_buffers()]}
    if a_t != b_t:
        key = next(k for k in sorted(a_t.keys() | b_t.keys()) if a_t.get(k) != b_t.get(k))
        return f"{key!r} is {b_t.get(key)}, not {a_t.get(key)}"
    return None


def _valued(example: object, vocab: object) -> object:
    """``example`` with values on the CPU: a tensor on meta gets seeded random ones of its shape and dtype."""
    g = torch.Generator().manual_seed(0)
    high = vocab if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0 else 2

    def valued(t: object, key: str = "") -> object:
        if not isinstance(t, torch.Tensor):
            return t
        if not t.is_meta:
            return t.cpu()
        if t.dtype == torch.bool or (not t.is_floating_point() and "mask" in key):
            return torch.ones(t.shape, dtype=t.dtype)
        if not t.is_floating_point():
            return torch.randint(0, high, t.shape, generator=g, dtype=t.dtype)
        return torch.randn(t.shape, generator=g).to(t.dtype)

    if isinstance(example, tuple):
        return tuple(valued(t) for t in example)
    if isinstance(example, Mapping):
        return {k: valued(v, k) for k, v in example.items()}
    return valued(example)


class _Mapping:
    """The shadow's groups and texts, mapped onto the full model."""

    def __init__(self, fn: str, model: nn.Module, kinds: Mapping[str, list[str]], kept: Mapping[str, list[int]]) -> None:
        self.fn = fn
        self.model = model
        self.kinds = kinds
        self.kept = kept
        self.order = {name: i for i, name in enumerate(dict(model.named_parameters()))}
        self.names = {path: block_names(model, path) for path in kept}
        #: each stack's shadow block names (as the shadow's parameters are prefixed) to their index in the shadow
        self.shadow_names = {path: [self._at(path, j) for j in range(len(k))] for path, k in kept.items()}
        #: for each stack and kind, the shadow index of its first block
        self.first: dict[str, dict[str, int]] = {}
        for path, k in kept.items():
            for j, i in enumerate(k):
                self.first.setdefault(path, {}).setdefault(kinds[path][i], j)
        paths = sorted(kept, key=len, reverse=True)
        self._pattern = (
            re.compile("(?<![\\w.])(" + "|".join(re.escape(p) for p in paths) + ")\\.(\\d+)(?![\\w])") if paths else None
        )

    @staticmethod
    def _at(path: str, j: int) -> str:
        return f"{path}.{j}" if path else str(j)

    def text(self, text: str) -> str:
        """``text`` with the shadow's block names as the full model's."""
        if self._pattern is None:
            return text

        def full(m: re.Match[str]) -> str:
            path, j = m.group(1), int(m.group(2))
            return self._at(path, self.kept[path][j]) if j < len(self.kept[path]) else m.group(0)

        return self._pattern.sub(full, text)

    def _block(self, name: str) -> tuple[str, int] | None:
        """The stack and shadow block a parameter name of the shadow lies in, or ``None``."""
        for path, names in self.shadow_names.items():
            for j, block in enumerate(names):
                if name.startswith(f"{block}."):
                    return path, j
        return None

    def _renamed(self, name: str, path: str, j: int, i: int) -> str:
        return self._at(path, i) + name[len(self.shadow_names[path][j]):]

    def _canon(self, members: Sequence[Member], path: str, j: int) -> tuple[tuple[object, ...], ...]:
        prefix = self.shadow_names[path][j]
        return tuple((m.name.removeprefix(prefix), m.dim, m.width, m.start, m.unit) for m in members)

    def structure(self, found: Structure) -> Structure:
        """The full model's structure from the shadow's."""
        width: list[tuple[tuple[int, int], str, UnitGroup]] = []
        rest: dict[str, UnitGroup] = {}
        seen: dict[tuple[str, str], dict[int, list[tuple[str, tuple[tuple[object, ...], ...]]]]] = {}
        for path, k in self.kept.items():
            for j, i in enumerate(k):
                seen.setdefault((path, self.kinds[path][i]), {})[j] = []
        for name, group in found.items():
            if group.kind == "layers":
                rest[name] = self.layers(name, group)
                continue
            blocks: dict[tuple[str, int], list[Member]] = {}
            outside: list[Member] = []
            for m in group.members:
                at = self._block(m.name)
                if at is None:
                    outside.append(m)
                else:
                    blocks.setdefault(at, []).append(m)
            if len(blocks) == 1 and not outside and group.kind != "hidden":
                (path, j), members = next(iter(blocks.items()))
                kind = self.kinds[path][self.kept[path][j]]
                seen[(path, kind)][j].append((self._local(name, path, j), self._canon(members, path, j)))
                if self.first[path][kind] != j:
                    continue
                for i, other in enumerate(self.kinds[path]):
                    if other == kind:
                        renamed = self._moved(group, {(path, j): members}, [], {path: i})
                        width.append(self._keyed(self._group_name(name, path, j, i), renamed))
                continue
            touched = {path for path, _ in blocks}
            for path in touched:
                js = {j for p, j in blocks if p == path}
                if js != set(range(len(self.kept[path]))):
                    raise self._refused(name, f"it spans blocks {sorted(self.kept[path][j] for j in js)} of {path!r}")
                for j in js:
                    first = self.first[path][self.kinds[path][self.kept[path][j]]]
                    if self._canon(blocks[(path, j)], path, j) != self._canon(blocks[(path, first)], path, first):
                        raise self._refused(name, f"its members differ between blocks of one kind of {path!r}")
            spread = self._spread(group, blocks, outside)
            if group.kind == "hidden":
                rest[name] = spread
            else:
                width.append(self._keyed(name, spread))
        for (path, _), entries in seen.items():
            if any(e != next(iter(entries.values())) for e in entries.values()):
                blocks_of_kind = [self.kept[path][j] for j in entries]
                raise self._refused("", f"blocks {blocks_of_kind} of {path!r}, of one kind, give different groups")
        width.sort(key=lambda item: item[0])
        groups = {name: group for _, name, group in width}
        groups.update(rest)
        return Structure(groups, {k: self.text(v) for k, v in found.left_out.items()})

    def _local(self, name: str, path: str, j: int) -> str:
        block = self.shadow_names[path][j]
        return name[len(block):] if name == block or name.startswith(f"{block}.") else name

    def _group_name(self, name: str, path: str, j: int, i: int) -> str:
        block = self.shadow_names[path][j]
        return self._at(path, i) + name[len(block):] if name == block or name.startswith(f"{block}.") else name

    def _keyed(self, name: str, group: UnitGroup) -> tuple[tuple[int, int], str, UnitGroup]:
        first = group.members[0]
        return (self.order[first.name], first.start), name, group

    def _moved(
        self, group: UnitGroup, blocks: Mapping[tuple[str, int], Sequence[Member]], outside: Sequence[Member],
        to: Mapping[str, int],
    ) -> UnitGroup:  # fmt: skip
        """``group`` with the members of each shadow block of ``blocks`` moved to full block ``to[path]``."""
        members = list(outside)
        for (path, j), ms in blocks.items():
            members += [Member(self._renamed(m.name, path, j, to[path]), m.dim, m.width, m.start, m.unit) for m in ms]
        return UnitGroup(group.kind, group.size, tuple(members), group.least, group.parts)

    def _spread(self, group: UnitGroup, blocks: Mapping[tuple[str, int], Sequence[Member]],
                outside: Sequence[Member]) -> UnitGroup:  # fmt: skip
        """``group`` (spanning every block of the stacks it touches) over every block of the full model."""
        members = list(outside)
        for path in dict.fromkeys(p for p, _ in blocks):
            for i, kind in enumerate(self.kinds[path]):
                j = self.first[path][kind]
                members += [Member(self._renamed(m.name, path, j, i), m.dim, m.width, m.start, m.unit)
                            for m in blocks[(path, j)]]  # fmt: skip
        members.sort(key=lambda m: (self.order[m.name], m.dim))  # stable: the parts of one dim keep their order
        return UnitGroup(group.kind, group.size, tuple(members), group.least, group.parts)

    def layers(self, name: str, group: UnitGroup) -> UnitGroup:
        """A ``"layers"`` group of the shadow's stack onto the full stack: every block of a kind whose block goes."""
        path = name.removesuffix("#layers") if name != "layers" else ""
        if path not in self.kept:
            raise self._refused(name, "it names no stack of the model")
        # a unit numbers only the blocks that can go: each member's block is read off its name
        gone = {self.kept[path][b[1]] for m in group.members if (b := self._block(m.name)) is not None and b[0] == path}
        units = [i for i, kind in enumerate(self.kinds[path]) if self.kept[path][self.first[path][kind]] in gone]
        stack = self.model.get_submodule(path)
        params = {id(p): n for n, p in self.model.named_parameters()}
        blocks = list(stack.children())
        members = tuple(
            Member(params[id(p)], 0, p.shape[0], unit=u)
            for u, i in enumerate(units)
            for p in blocks[i].parameters()
            if id(p) in params
        )
        return UnitGroup("layers", len(units), members, group.least, group.parts)

    def _refused(self, name: str, why: str) -> ValueError:
        shown = f" ({name!r} of the copy)" if name else ""
        return ValueError(
            f"{self.fn}: model is on the meta device, and its structure is read off a copy with fewer blocks, "
            f"but that copy's groups cannot be mapped onto the model{shown}: {why}; build the model on a real device"
        )


def standing_for(model: nn.Module, names: Sequence[str]) -> dict[str, str]:
    """For each of ``names`` (unit groups), the group whose trial stands for it: itself, or, for a group of a
    block of a stack beyond the first two blocks of its kind and the stack's last, the same group of the first
    block of its kind, where there is one (blocks of one kind as a model on the meta device is read: modules,
    plain attributes but the layer index, tensors and the config's per-layer entries agreeing)."""
    out = {name: name for name in names}
    for path, size in stacks_of(model).items():
        kinds = _kinds(model, path, size)
        kept = set(_kept(kinds))
        blocks = block_names(model, path)
        first = {kind: blocks[kinds.index(kind)] for kind in kinds}
        alike = {block: first[kinds[i]] for i, block in enumerate(blocks) if i not in kept}
        for name in names:
            parts = name.split(".")
            for k in range(1, len(parts) + 1):
                block = ".".join(parts[:k])
                if block in alike:
                    by = alike[block] + name[len(block) :]
                    out[name] = by if by in out else name
                    break
    return out
