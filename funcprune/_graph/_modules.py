"""What modules do to the channels they read: layers with parameters, stateless modules.

:func:`call_module` handles a ``call_module`` node (Linear, Conv, norms,
depthwise convolutions, stateless modules as their functions);
:func:`roles` and :func:`fixed_layers` read each layer's atoms off the walk.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from torch import fx, nn

from ._ops import softmax_over, spanning, spatial, unary
from ._shapes import flatten_dims
from ._values import ChannelLayout, Role, RoleKind, Value
from ._walk import Walk, shape_of

__all__ = ["call_module", "fixed_layers", "roles", "shared_modules"]

_UNARY_MODULES: tuple[type[nn.Module], ...] = (
    nn.Identity, nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.LeakyReLU,
    nn.ELU, nn.SELU, nn.CELU, nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Mish,
    nn.Softplus, nn.Softsign, nn.Tanhshrink, nn.Dropout, nn.Dropout1d, nn.Dropout2d,
    nn.Dropout3d, nn.AlphaDropout,
)  # fmt: skip
_SPANNING_MODULES: tuple[type[nn.Module], ...] = (
    nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.LocalResponseNorm,
)  # fmt: skip
_POOL_MODULES: tuple[tuple[type[nn.Module], int], ...] = tuple(
    (getattr(nn, f"{kind}{k}d"), k)
    for kind in ("MaxPool", "AvgPool", "AdaptiveAvgPool", "AdaptiveMaxPool", "LPPool")
    for k in (1, 2, 3)
)
_SHARED = "has parameters that are shared or read elsewhere"
_UNFOLLOWED = "is not called in forward as a layer that shrink follows"


def shared_modules(gm: fx.GraphModule) -> set[str]:
    """Modules whose tensors are shared with another, or read by ``get_attr`` nodes."""
    owners: dict[int, set[str]] = {}
    for name, sub in gm.named_modules(remove_duplicate=False):
        tensors = itertools.chain(sub.parameters(recurse=False), sub.buffers(recurse=False))
        for t in tensors:
            owners.setdefault(id(t), set()).add(name)
    shared = {name for names in owners.values() if len(names) > 1 for name in names}
    shared |= {str(n.target).rpartition(".")[0] for n in gm.graph.nodes if n.op == "get_attr"}
    return shared


def call_module(walk: Walk, node: fx.Node) -> Value:
    """What the module that ``node`` calls does to the channels of its input."""
    name = str(node.target)
    mod, shape = walk.gm.get_submodule(name), shape_of(node.args[0] if node.args else None)
    if isinstance(mod, nn.Linear):
        return _weighted(walk, node, name, "linear", 0)
    if isinstance(mod, nn.modules.conv._ConvNd) and not mod.transposed:
        return _conv(walk, node, name, mod)
    if isinstance(mod, nn.modules.batchnorm._BatchNorm):
        return _follow(walk, node, name, ("norm", 1), len(shape or (0, 0)) - 2)
    if isinstance(mod, nn.modules.instancenorm._InstanceNorm):
        return _follow(walk, node, name, ("norm", 1), _spatial_dims(mod))
    if not walk.inputs(node):
        return None
    return _stateless(walk, node, mod)


# --- layers with parameters ----------------------------------------------------------


def _weighted(walk: Walk, node: fx.Node, name: str, kind: RoleKind, spatial: int) -> Value:
    """A Linear (``spatial=0``) or a Conv with ``groups=1``: reads columns, makes rows."""
    out_shape = shape_of(node)
    if name in walk.shared or out_shape is None:
        walk.fixed[name] = f"{walk.describe(node)} {_SHARED}"
        return walk.block_node(node, _SHARED)
    walk.kinds[name] = (kind, 1)
    _merge_in(walk, name, _read_channels(walk, node, spatial))
    axis = len(out_shape) - 1 - spatial
    if name not in walk.out_atoms:
        atoms = walk.new_atoms(out_shape[axis])
        walk.produced.update((a, (name, row)) for row, a in enumerate(atoms))
        walk.out_atoms[name] = atoms
    return ChannelLayout(axis, walk.out_atoms[name])


def _conv(walk: Walk, node: fx.Node, name: str, mod: nn.modules.conv._ConvNd) -> Value:
    """A Conv: makes channels (``groups=1``), follows them (depthwise), or blocks them."""
    spatial = len(mod.kernel_size)
    if mod.groups == 1:
        return _weighted(walk, node, name, "conv", spatial)
    if mod.groups == mod.in_channels:
        expand = mod.out_channels // mod.in_channels
        return _follow(walk, node, name, ("depthwise", expand), spatial)
    why = f"is a grouped convolution (groups={mod.groups})"
    walk.fixed[name] = f"{walk.describe(node)} {why}"
    return walk.block_node(node, why)


def _follow(
    walk: Walk, node: fx.Node, name: str, kind: tuple[RoleKind, int], spatial: int
) -> Value:
    """A per-channel layer (norm, depthwise conv) whose entries follow their channel."""
    if name in walk.shared:
        _merge_in(walk, name, None)
        walk.fixed[name] = f"{walk.describe(node)} {_SHARED}"
        return walk.block_node(node, _SHARED)
    walk.kinds[name] = kind
    atoms = _read_channels(walk, node, spatial)
    _merge_in(walk, name, atoms)
    x = walk.layout(node.args[0])
    if atoms is None or x is None or walk.in_atoms[name] is None:
        return None
    return ChannelLayout(x.axis, tuple(a for a in atoms for _ in range(kind[1])))


def _read_channels(walk: Walk, node: fx.Node, spatial: int) -> tuple[int, ...] | None:
    """The atoms of a layer's input channels (dim ``-1 - spatial``), or ``None``."""
    x = walk.first(node)
    if x is not None and x[0].axis == len(x[1]) - 1 - spatial:
        return x[0].atoms
    walk.block_node(node, "reads its input along another dim than the channels")
    return None


def _merge_in(walk: Walk, name: str, atoms: tuple[int, ...] | None) -> None:
    """Record a call's input atoms; the calls of one module must agree channel by channel."""
    if name not in walk.in_atoms:
        walk.in_atoms[name] = atoms
        return
    old = walk.in_atoms[name]
    if old is not None and atoms is not None and len(old) == len(atoms):
        walk.pair(old, atoms)
        return
    reason = f"{name!r} is called on inputs whose channels do not match"
    walk.block(old or (), reason)
    walk.block(atoms or (), reason)
    walk.in_atoms[name] = None


def _spatial_dims(mod: nn.Module) -> int:
    """How many dims follow the channels in an InstanceNorm's input."""
    kinds = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
    return next((k for k, kind in enumerate(kinds, start=1) if isinstance(mod, kind)), 1)


# --- stateless modules ---------------------------------------------------------------


def _stateless(walk: Walk, node: fx.Node, mod: nn.Module) -> Value:
    """A module without parameters, as its function would be; unknown if none is."""
    if isinstance(mod, _SPANNING_MODULES):
        return spanning(walk, node)
    if isinstance(mod, _UNARY_MODULES):
        return unary(walk, node)
    if isinstance(mod, nn.Flatten):
        return flatten_dims(walk, node, mod.start_dim, mod.end_dim)
    if isinstance(mod, (nn.Softmax, nn.LogSoftmax)):
        return softmax_over(walk, node, mod.dim)
    if isinstance(mod, nn.Upsample):
        return spatial(walk, node, None)
    pooled = _pooled_dims(mod)
    return walk.unknown_op(node) if pooled is None else spatial(walk, node, pooled)


def _pooled_dims(mod: nn.Module) -> int | None:
    """How many trailing dims a pooling module pools (``None``: not one the walk follows)."""
    for kind, k in _POOL_MODULES:
        if isinstance(mod, kind) and not getattr(mod, "return_indices", False):
            return k
    return None


# --- roles ---------------------------------------------------------------------------


def roles(walk: Walk) -> dict[str, Role]:
    """The role of each module the walk met that may shrink, in the order it met them."""
    found = {name: _role(walk, name) for name in walk.kinds}
    return {name: role for name, role in found.items() if role is not None}


def _role(walk: Walk, name: str) -> Role | None:
    kind, expand = walk.kinds[name]
    in_atoms = walk.in_atoms.get(name)
    if kind in ("linear", "conv"):
        return Role(kind, walk.out_atoms[name], in_atoms)
    if in_atoms is None:
        return None
    return Role(kind, tuple(a for a in in_atoms for _ in range(expand)), in_atoms)


def fixed_layers(walk: Walk, found: Mapping[str, Role]) -> dict[str, str]:
    """The Linear and Conv layers without a role in ``found``, each with why its channels stay.

    Transposed convolutions are left out: their weight rows are input channels.
    """
    return {
        name: walk.fixed.get(name, f"{name!r} {_SHARED if name in walk.shared else _UNFOLLOWED}")
        for name, mod in walk.gm.named_modules()
        if _has_output_rows(mod) and name not in found
    }


def _has_output_rows(mod: nn.Module) -> bool:
    """Whether ``mod`` is a Linear or a Conv whose weight rows are its output channels."""
    if isinstance(mod, nn.modules.conv._ConvNd):
        return not mod.transposed
    return isinstance(mod, nn.Linear)
