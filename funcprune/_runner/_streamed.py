"""``oneshot_checkpoint``: :func:`~funcprune.oneshot` on a checkpoint directory, one block in memory at a time."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from .._apply import functional_call_masked
from .._criteria import calls
from .._expert_linears import expert_input_dims
from .._experts import routers
from .._payoff import PackedMasks, ShardLayout, Shards, size_in_bytes
from .._specs import Spec
from .._targets import input_dims
from .._types import Tensor
from ._layers import Capture, Captured, RepeatedLayers, find_layers, hidden_of
from ._memory import trim
from ._methods import Method, method_of
from ._blocks import _at_once, _on, step
from ._converted import Conversion
from ._weights import check_groups, specs_of, weights_named

__all__ = ["MASKS_FILE", "oneshot_checkpoint"]

#: The file of the output directory that holds the masks (:func:`~funcprune.load_masks` reads it).
MASKS_FILE = "masks.safetensors"
#: The files of a checkpoint directory that are weights, never copied to the output as they are.
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".safetensors.index.json",
            ".bin.index.json")  # fmt: skip


def oneshot_checkpoint(
    model_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    batches: Iterable[object],
    *,
    method: Method | str,
    spec: Spec,
    names: Iterable[str] | None = None,
    allocation: str | Mapping[str, float] | None = None,
    device: torch.device | str | None = None,
    max_shard_size: int | str = "1GB",
    overwrite: bool = False,
) -> dict[str, float]:
    """Prune a transformers checkpoint directory as :func:`~funcprune.oneshot` would, one block in memory at a time.

    For a checkpoint larger than memory. The model is built on the meta
    device from ``model_dir``'s ``config.json`` (no weight is allocated),
    and only these weights are ever read into memory: the ones outside the
    blocks that run before them (the embeddings; not the LM head, unless
    tied to them), then one block's at a time. The walk is
    :func:`~funcprune.oneshot`'s, through the same step: the calibration
    batches run up to the first block and its inputs are kept; then, for
    each block, its tensors are read from the safetensors shards, its
    weights are calibrated and pruned exactly as ``oneshot`` prunes them,
    the pruned block computes the next block's inputs, and its tensors are
    written to the output, baked (pruned entries ``+0.0``, as
    :func:`~funcprune.bake`), a tensor at a time into its place in shards
    laid out from the input's headers before anything runs, before the next
    block is read. Peak memory is one block (pruned in place: no masked
    copy), the method's scores and masks of that block, the embeddings and
    the calibration hidden states (and one block's statistics), whatever the
    depth; no output shard is held. The masks and weights written equal ``oneshot``'s on the model
    that ``from_pretrained(model_dir)`` loads (bit for bit on the CPU).

    Why a function of its own and not ``oneshot(path, ...)``: ``oneshot``
    takes a module and returns its new parameters and masks in memory; this
    takes a directory, writes a directory and returns a summary, and never
    holds what ``oneshot`` returns. The command line (``funcprune oneshot
    MODEL_DIR --out OUT``) calls this.

    The output, written into a temporary sibling of ``out_dir`` and renamed
    to it at the end (nothing is left behind on failure), is a checkpoint
    that plain ``from_pretrained(out_dir)`` loads: ``config.json`` and every
    other file of ``model_dir`` that is not a weights file (tokenizer
    files, ``generation_config.json``) copied as they are, the tensors of
    the input under their names and in their dtypes, in shards
    ``model-0000k-of-0000n.safetensors`` of at most ``max_shard_size`` with
    ``model.safetensors.index.json``, and the masks in ``masks.safetensors``
    (:func:`~funcprune.save_masks`'s format, bit-packed: one bit per entry).
    The blocks run in the checkpoint's dtype (the one holding the most
    bytes), as ``from_pretrained`` in that dtype would: a block's tensors
    stored wider (a mixed checkpoint's float32 norms beside bfloat16
    weights) come back rounded to it; the tensors outside the blocks, never
    pruned here, are copied byte for byte.

    Supported: a checkpoint whose safetensors tensors are named as the
    model's parameters (``model.safetensors`` or an index of shards); the
    weights inside the blocks (``names`` outside them are refused: the
    pass that prunes an LM head needs the whole pruned model); allocation
    uniform or a mapping of sparsities. A block's tensors are converted to
    the model's parameters and back by transformers' own conversion
    mapping, the one ``from_pretrained`` applies: a mixture of experts,
    whose experts transformers saves one by one and stacks as it loads
    (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE...), streams like a dense model,
    and its output holds the input's tensor names and shapes. Refused by
    name: ``allocation="owl"`` (its sparsities need the Wanda scores of
    every block before the first is pruned), a tensor outside the blocks
    stored under another name than the model's, a block whose tensors that
    conversion does not map to the model's and back (checked on the
    headers before anything is read): load those with ``from_pretrained``
    and call ``oneshot``. A method without a statistic (magnitude) is called once
    per block here, where ``oneshot`` calls it once on every weight: the
    same masks for the built-in :class:`~funcprune.Magnitude`, whose specs
    apply to each weight alone.

    Args:
        model_dir: a local transformers checkpoint directory (``config.json``
            and safetensors weights).
        out_dir: the directory to write; it must not exist unless
            ``overwrite`` (then it is replaced once the run succeeded); its
            parent must exist.
        batches: calibration batches, as for ``oneshot`` (token ids, or dicts
            with an ``attention_mask``), on the CPU; consumed once.
        method: as for :func:`~funcprune.oneshot`.
        spec: as for :func:`~funcprune.oneshot`.
        names: as for :func:`~funcprune.oneshot`, inside the blocks.
        allocation: ``None`` or ``"uniform"`` (OWL is refused), or a
            mapping ``{name: sparsity}``, as for :func:`~funcprune.oneshot`.
        device: where each block runs; the embeddings run on the CPU.
        max_shard_size: the largest output shard, in bytes or as a string
            (``"500MB"``, ``"2GiB"``); a larger tensor gets a shard alone.
        overwrite: replace ``out_dir`` if it exists.

    Returns:
        ``{name: fraction pruned}`` for every weight pruned, in the order
        pruned.

    Raises:
        TypeError: if an argument has the wrong type.
        ValueError: if a directory is not what is expected (named), the
            checkpoint cannot be read block by block (named), or anything
            ``oneshot`` refuses.
    """
    fn = "oneshot_checkpoint"
    source, target = _dirs(fn, model_dir, out_dir, overwrite)
    chosen_method, statistic = method_of(fn, method)
    if not isinstance(spec, Spec):
        raise TypeError(f"{fn}: spec must be a funcprune spec (fp.L1Unstructured(0.5), fp.NM(2, 4), ...), "
                        f"got {type(spec).__name__}")  # fmt: skip
    chosen_method.check_spec(spec)
    if allocation == "owl":
        raise ValueError(f"{fn}: allocation='owl' is not supported on a checkpoint streamed block by block (OWL's "
                         "sparsities need the Wanda scores of every block before the first is pruned); load the model "
                         "and call fp.oneshot, or give a mapping of sparsities")  # fmt: skip
    limit = size_in_bytes(fn, max_shard_size)
    shards = Shards(fn, source)
    model = _meta_model(fn, source, shards)
    layers = find_layers(fn, model)
    stored = _stored_names(fn, model, shards, source, tuple(layers.prefix(i) for i in range(len(layers.modules))))
    params = dict(model.named_parameters())
    expert_dims = expert_input_dims(model, routers(model))
    chosen = weights_named(fn, model, layers, names, params, method, statistic is not None, expert_dims)
    specs = specs_of(fn, spec, chosen, allocation)
    dims = input_dims(model)
    experts = {n: d for n in chosen if (d := expert_dims.get(n)) is not None}
    check_groups(fn, specs, params, dims, experts)
    inside = [[n for n in chosen if n.startswith(layers.prefix(i))] for i in range(len(layers.modules))]
    outside = [n for n in chosen if not any(n in block for block in inside)]
    if outside:
        raise ValueError(f"{fn}: {outside[0]!r} is outside the blocks {layers.path!r}; a checkpoint streamed block "
                         "by block prunes weights inside them only (the pass that prunes the others needs the whole "
                         "pruned model): leave it out of names, or load the model and call fp.oneshot")  # fmt: skip
    stream = calls(fn, batches) if statistic is not None else None
    where = torch.device(device) if device is not None else None
    parent = os.path.dirname(os.path.abspath(target))
    work = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(target)}.partial-")
    try:
        walk = _Walk(fn, model, layers, shards, stored, work, limit)
        try:
            pruned = walk.run(chosen_method, statistic, stream, inside, specs, dims, experts, where)
        finally:
            walk.writer.abort()
        walk.writer.close()
        walk.masks.save(fn, os.path.join(work, MASKS_FILE))
        for name in sorted(os.listdir(source)):
            if os.path.isfile(os.path.join(source, name)) and not name.endswith(_WEIGHTS):
                shutil.copy2(os.path.join(source, name), os.path.join(work, name))
        _publish(work, target, overwrite)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return pruned


def _dirs(fn: str, model_dir: object, out_dir: object, overwrite: object) -> tuple[str, str]:
    """The checked input and output directories, as absolute paths."""
    source, target = _path(fn, "model_dir", model_dir), _path(fn, "out_dir", out_dir)
    if not isinstance(overwrite, bool):
        raise TypeError(f"{fn}: overwrite must be a bool, got {overwrite!r}")
    if not os.path.isfile(os.path.join(source, "config.json")):
        raise ValueError(f"{fn}: model_dir {source!r} is not a transformers checkpoint directory (no config.json)")
    if os.path.realpath(source) == os.path.realpath(target):
        raise ValueError(f"{fn}: out_dir {target!r} is model_dir; write the pruned checkpoint elsewhere")
    if os.path.lexists(target) and not overwrite:
        raise ValueError(f"{fn}: out_dir {target!r} exists; remove it, choose another or pass overwrite=True")
    if os.path.lexists(target) and not os.path.isdir(target):
        raise ValueError(f"{fn}: out_dir {target!r} exists and is not a directory")
    if not os.path.isdir(os.path.dirname(target)):
        raise ValueError(f"{fn}: out_dir's parent {os.path.dirname(target)!r} is not a directory")
    return source, target


def _path(fn: str, label: str, value: object) -> str:
    """``value``, a path, made absolute."""
    fspath = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(fspath, str):
        raise TypeError(f"{fn}: {label} must be a str or os.PathLike naming a directory, got {type(value).__name__}")
    return os.path.abspath(fspath)


def _publish(work: str, target: str, overwrite: bool) -> None:
    """Rename ``work`` to ``target``, replacing it (only once the new one is in place) if ``overwrite``."""
    if not os.path.lexists(target):
        os.rename(work, target)
        return
    if not overwrite:
        raise ValueError(f"oneshot_checkpoint: out_dir {target!r} appeared while the run wrote; nothing replaced")
    old = tempfile.mkdtemp(dir=os.path.dirname(target), prefix=f".{os.path.basename(target)}.old-")
    os.rename(target, os.path.join(old, "replaced"))
    os.rename(work, target)
    shutil.rmtree(old, ignore_errors=True)


def _meta_model(fn: str, source: str, shards: Shards) -> nn.Module:
    """The model of ``source``'s config, built on the meta device in the checkpoint's dtype, in eval mode, with its
    non-persistent buffers (rotary frequencies) computed on the CPU as ``from_pretrained`` computes them."""
    try:
        import transformers
    except ImportError as err:  # pragma: no cover
        raise ImportError(f'{fn} needs transformers: pip install "funcprune[hf]"') from err
    try:
        config = transformers.AutoConfig.from_pretrained(source)
    except (ValueError, OSError) as err:
        raise ValueError(f"{fn}: cannot read the config of {source!r}: {err}") from None
    floating = {d: 0 for d in shards.dtype.values() if d.is_floating_point}
    for name, d in shards.dtype.items():
        if d in floating:
            floating[d] += shards.nbytes(name)
    dtype = max(floating, key=lambda d: floating[d]) if floating else torch.get_default_dtype()
    classes = [getattr(transformers, a, None) for a in (getattr(config, "architectures", None) or [])]
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            if classes and classes[0] is not None:
                model = classes[0](config)
            else:
                model = transformers.AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
        for name, buffer in list(model.named_non_persistent_buffers()):
            path, _, attr = name.rpartition(".")
            model.get_submodule(path)._buffers[attr] = torch.empty_like(buffer, device="cpu")
        model.initialize_weights()
    finally:
        torch.set_default_dtype(before)
    result: nn.Module = model.eval()
    return result


def _stored_names(fn: str, model: nn.Module, shards: Shards, source: str, blocks: tuple[str, ...]) -> dict[str, str]:
    """The checkpoint's name of each of the model's tensors outside the blocks (every name of a tied one),
    refusing one it lacks; the blocks' tensors are converted as transformers loads them (:class:`_Walk`)."""
    state = model.state_dict(keep_vars=True)
    aliases: dict[int, list[str]] = {}
    for name, tensor in state.items():
        aliases.setdefault(id(tensor), []).append(name)
    stored: dict[str, str] = {}
    for group in aliases.values():
        held = [n for n in group if n in shards.file_of]
        if not held and all(n.startswith(blocks) for n in group):
            continue
        if not held:
            raise ValueError(
                f"{fn}: the checkpoint in {source!r} holds no tensor {group[0]!r}, a tensor of the model its config "
                "builds outside its blocks: a checkpoint streamed block by block reads those by the model's names "
                "only; load the model with from_pretrained and call fp.oneshot"
            )
        stored.update(dict.fromkeys(group, held[0]))
    return stored


class _Walk:
    """The streamed walk: reads, prunes and writes the checkpoint's tensors block by block."""

    def __init__(self, fn: str, model: nn.Module, layers: RepeatedLayers, shards: Shards, stored: dict[str, str],
                 work: str, limit: int) -> None:  # fmt: skip
        self.fn, self.model, self.layers, self.shards, self.stored = fn, model, layers, shards, stored
        self.masks = PackedMasks()
        prefixes = [layers.prefix(i) for i in range(len(layers.modules))]
        self.block_names = [[n for n in shards.file_of if n.startswith(p)] for p in prefixes]
        self.outside = [n for n in shards.file_of if not n.startswith(tuple(prefixes))]
        self.meta = model.state_dict(keep_vars=True)
        self.conversion = Conversion(model)
        for prefix, names in zip(prefixes, self.block_names, strict=True):
            self.conversion.check(fn, prefix, {n: (shards.shape[n], shards.dtype[n]) for n in names})
        # every output tensor is the input's, same name, shape and dtype: the shards are laid out before anything runs
        order = self.outside + [n for names in self.block_names for n in names]
        self.writer = ShardLayout(work, limit, ((n, shards.shape[n], shards.dtype[n]) for n in order))

    def run(self, method: Method, statistic: Any, stream: Any, inside: list[list[str]], specs: dict[str, Spec],
            dims: Mapping[str, int], experts: Mapping[str, int], where: torch.device | None) -> dict[str, float]:  # fmt: skip
        """Write every tensor, the blocks' pruned; the fraction pruned of each weight."""
        pruned: dict[str, float] = {}
        self._before_blocks()
        held = None
        if stream is not None and any(inside):
            first = {n: t for n, t in self._read_block(0).items() if n in self.meta}
            self._put(first)
            capture = Capture(self.fn, self.model, self.layers, whole=False)
            with capture:
                for call in stream:
                    capture(call)
            self._put({n: self.meta[n] for n in first})  # back to meta
            del first
            held = capture.captured
            if not held.hidden:
                raise ValueError(f"{self.fn}: no batches: batches was empty; pass at least one calibration batch")
        last = max((i for i, here in enumerate(inside) if here), default=-1)
        for i, block in enumerate(self.layers.modules):
            prefix = self.layers.prefix(i)
            if i > last:
                self._copy(self.block_names[i])
                continue
            tensors = self._read_block(i)
            own = {n: tensors[prefix + n] for n, _ in block.named_parameters()}
            if held is None:
                weights, masks = _at_once(self.fn, method, {prefix + n: t for n, t in own.items()},
                                          {n: specs[n] for n in inside[i]}, dims, experts)  # fmt: skip
                weights = {n: weights[n] for n in masks}
            else:
                buffers = {n: tensors.get(prefix + n, b) for n, b in block.named_buffers()}
                if where is not None:
                    buffers = {n: b.to(where) for n, b in buffers.items()}
                weights, masks = step(self.fn, method, statistic, held, i, block, prefix, own, buffers, where,
                                      inside[i], specs, dims, experts, advance=False, inplace=True)  # fmt: skip
                if i < last:
                    self._advance(held, i, block, prefix, own, weights, masks, buffers, where)
            del own
            for name in inside[i]:
                mask = masks[name].cpu()
                tensors[name] = weights[name].cpu().masked_fill_(~mask, 0.0)  # (zeroed already where it advanced)
                self.masks.add(name, mask)
                pruned[name] = 1.0 - int(mask.sum()) / max(mask.numel(), 1)
            del weights, masks
            self._write(i, tensors)
            del tensors  # before the next block is read
            trim()
        return pruned

    def _advance(self, held: Captured, i: int, block: nn.Module, prefix: str, own: dict[str, Tensor],
                 weights: dict[str, Tensor], masks: dict[str, Tensor], buffers: dict[str, Tensor] | None,
                 where: torch.device | None) -> None:  # fmt: skip
        """Advance ``held`` through block ``i`` pruned, as ``step`` does, but with its new weights zeroed where
        pruned in place (they were read for this block alone) rather than through a masked copy of the block: the
        same states but for the sign of an exact zero. Only the routers' masks (small) are still applied, for
        ``never_routed``."""
        params = {n: p.to(where) for n, p in own.items()} if where is not None else dict(own)
        for full, mask in masks.items():
            params[full[len(prefix) :]] = weights[full].masked_fill_(~mask, 0.0)
        kept = {prefix + r.weight for r in routers(block)}
        applied = {full[len(prefix) :]: m for full, m in masks.items() if full in kept}
        for b in range(len(held.hidden)):
            call = _on(held.call(i, b), where)
            with torch.no_grad():
                out = functional_call_masked(block, params, applied, call.args, call.kwargs, buffers=buffers)
            held.hidden[b] = hidden_of(self.fn, i, out).detach()

    def _before_blocks(self) -> None:
        """Read what runs before the blocks (every tensor outside them but the LM head's, if not tied to the
        input embeddings) into the model, and copy every tensor outside the blocks to the output."""
        skip: set[int] = set()
        get_out = getattr(self.model, "get_output_embeddings", None)
        head = get_out() if callable(get_out) else None
        if isinstance(head, nn.Module) and isinstance(getattr(head, "weight", None), torch.Tensor):
            get_in = getattr(self.model, "get_input_embeddings", None)
            embeddings = get_in() if callable(get_in) else None
            if getattr(embeddings, "weight", None) is not head.weight:
                skip.add(id(head.weight))
        wanted = [n for n, t in self.meta.items() if n in self.stored and id(t) not in skip
                  and self.stored[n] in self.outside]  # fmt: skip
        loaded = self._read(wanted)
        self._put(loaded)
        by_stored = {self.stored[n]: t for n, t in loaded.items()}
        del loaded
        del by_stored
        self._copy(list(self.outside))  # never pruned here (names outside the blocks are refused): byte for byte

    def _read(self, names: list[str]) -> dict[str, Tensor]:
        """The model's tensors ``names`` from the checkpoint, in the model's dtypes (as ``from_pretrained``)."""
        stored = {n: self.stored[n] for n in names}
        got = self.shards.read(dict.fromkeys(stored.values()))
        out = {}
        for n in names:
            t, like = got[stored[n]], self.meta[n]
            if tuple(t.shape) != tuple(like.shape):
                raise ValueError(f"{self.fn}: the checkpoint holds {stored[n]!r} with the shape {list(t.shape)}, but "
                                 f"the model its config builds has {list(like.shape)}")  # fmt: skip
            out[n] = t.to(like.dtype) if t.is_floating_point() and like.is_floating_point() else t
        return out

    def _read_block(self, i: int) -> dict[str, Tensor]:
        """Block ``i``'s tensors by the model's names, converted from the checkpoint's as ``from_pretrained``
        converts them, in the model's dtypes (its checkpoint tensors that make none of the model's, too)."""
        raw = self.shards.read(self.block_names[i])
        made, unused = self.conversion.to_model(raw)
        raw.clear()
        tensors: dict[str, Tensor] = {}
        for name, t in made.items():
            like = self.meta[name]
            tensors[name] = t.to(like.dtype) if t.is_floating_point() and like.is_floating_point() else t
        del made
        tensors.update(unused)
        return tensors

    def _put(self, tensors: Mapping[str, Tensor]) -> None:
        """Set the model's tensors (every name of a tied one) to ``tensors``: loaded, or back to meta."""
        for name, value in tensors.items():
            path, _, attr = name.rpartition(".")
            module = self.model.get_submodule(path)
            if attr in module._parameters:
                held = value if isinstance(value, nn.Parameter) else nn.Parameter(value, requires_grad=False)
                module._parameters[attr] = held
            else:
                module._buffers[attr] = value

    def _write(self, i: int, tensors: Mapping[str, Tensor]) -> None:
        """Write block ``i``'s checkpoint tensors from its ``tensors`` (by the model's names, converted back as
        ``save_pretrained`` converts them; the checkpoint's that make none of the model's as they are), stored dtypes."""
        prefix = self.layers.prefix(i)
        own = {n: t for n, t in tensors.items() if n in self.meta and n.startswith(prefix)}
        by_stored = self.conversion.to_checkpoint(own)
        del own
        for name in self.block_names[i]:
            tensor = by_stored.pop(name) if name in by_stored else tensors[name]
            self.writer.write(name, tensor.to(self.shards.dtype[name]))

    def _copy(self, names: list[str]) -> None:
        """Copy checkpoint tensors to the output as they are, one at a time."""
        for name in names:
            self.writer.write(name, self.shards.read([name])[name])
