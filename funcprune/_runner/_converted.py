"""transformers' own conversion between a checkpoint's tensor names and a model's parameters, for a fragment.

transformers 5 stores some parameters otherwise than the model holds them:
a mixture of experts' ``experts.gate_up_proj`` ``(E, 2I, H)`` is saved as
``experts.{e}.gate_proj.weight`` and ``experts.{e}.up_proj.weight`` for
each expert ``e``, stacked as it loads and split again as it saves, by the
conversion mapping registered for the model (``conversion_mapping.py``:
``WeightConverter`` with ``MergeModulelist``, ``Concatenate``...).
:class:`Conversion` applies that same mapping to one block's tensors at a
time, both ways: :meth:`~Conversion.to_model` as ``from_pretrained``
renames and converts the checkpoint's tensors (its
``convert_and_load_state_dict_in_model``, without loading them into the
model), :meth:`~Conversion.to_checkpoint` through transformers'
``revert_weight_conversion``, which ``save_pretrained`` calls. No rule of
any architecture is written here: a model whose mapping transformers does
not hold is read by its parameters' names, unconverted. The conversions run
on meta tensors as well, so a checkpoint is checked block by block from its
headers before a byte of it is read.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, cast

import torch
from torch import nn

from .._types import Tensor

__all__ = ["Conversion"]


class Conversion:
    """The conversion mapping ``from_pretrained`` applies to ``model`` (a transformers model), for fragments."""

    def __init__(self, model: nn.Module) -> None:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming

        self.model: Any = cast(Any, model)  # a transformers model (untyped)
        mapping = get_model_conversion_mapping(self.model)  # as from_pretrained, without a key_mapping or a quantizer
        self._renamings = [t for t in mapping if isinstance(t, WeightRenaming)]
        self._converters = [t for t in mapping if isinstance(t, WeightConverter)]
        self._by_pattern = {p: c for c in self._converters for p in c.source_patterns}
        self.state = model.state_dict(keep_vars=True)

    def to_model(self, tensors: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The model's tensors that checkpoint ``tensors`` make (renamed and converted as ``from_pretrained`` does,
        in their stored dtypes), and those of ``tensors`` that are none of the model's (as they are)."""
        from transformers.core_model_loading import WeightRenaming, dot_natural_key, rename_source_key

        prefix, pending, unused = self.model.base_model_prefix, dict[str, Any](), {}
        for key in sorted(tensors, key=dot_natural_key):
            renamed, pattern = rename_source_key(key, self._renamings, self._converters, prefix, self.state)
            if renamed not in self.state and key in self.state:
                renamed, pattern = key, None
            if renamed not in self.state:
                unused[key] = tensors[key]
                continue
            if pattern is not None:
                step = pending.setdefault(renamed, copy.deepcopy(self._by_pattern[pattern]))
            else:
                step = pending.setdefault(renamed, WeightRenaming(key, renamed))
                pattern = key
            step.add_tensor(renamed, key, pattern, tensors[key])
        made: dict[str, Tensor] = {}
        for first, step in pending.items():
            for name, value in step.convert(first, model=self.model, config=self.model.config).items():
                made[name] = value[0] if isinstance(value, list) else value
        return made, unused

    def to_checkpoint(self, tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The checkpoint's tensors that the model's ``tensors`` are saved as (``save_pretrained``'s conversion)."""
        from transformers.core_model_loading import revert_weight_conversion

        saved: dict[str, Tensor] = revert_weight_conversion(self.model, dict(tensors))
        return saved

    def check(self, fn: str, prefix: str, stored: Mapping[str, tuple[tuple[int, ...], torch.dtype]]) -> None:
        """Refuse, by name, a block ``prefix`` whose checkpoint tensors (``stored``: name to shape and dtype) do not
        convert to the model's tensors of the block (names and shapes) and back to themselves: on meta tensors,
        from the headers alone."""
        where = f"the checkpoint's block {prefix!r}"
        raw = {n: torch.empty(shape, dtype=dtype, device="meta") for n, (shape, dtype) in stored.items()}
        try:
            made, unused = self.to_model(raw)
        except Exception as err:  # noqa: BLE001 (transformers' conversion ops raise what they raise)
            raise ValueError(f"{fn}: {where} does not convert to the model's tensors as transformers loads them: "
                             f"{err!r:.300}") from None  # fmt: skip
        wanted = [n for n in self.state if n.startswith(prefix)]
        for name in wanted:
            like = self.state[name]
            if name not in made:
                raise ValueError(f"{fn}: {where} makes no tensor {name!r} of the model its config builds, by name or "
                                 "through transformers' conversion of its tensors; load the model with "
                                 "from_pretrained and call fp.oneshot")  # fmt: skip
            if tuple(made[name].shape) != tuple(like.shape):
                raise ValueError(f"{fn}: {where} makes {name!r} of the shape {list(made[name].shape)}, but the model "
                                 f"its config builds has {list(like.shape)}")  # fmt: skip
        stray = [n for n in made if n not in wanted]
        if stray:
            raise ValueError(f"{fn}: {where}'s tensors convert to {stray[0]!r}, outside the block")
        back = self.to_checkpoint({n: made[n].to(self.state[n].dtype) for n in wanted})
        for name, (shape, _) in stored.items():
            if name not in unused and (name not in back or tuple(back[name].shape) != tuple(shape)):
                got = list(back[name].shape) if name in back else "no tensor"
                raise ValueError(f"{fn}: the checkpoint's {name!r} {list(shape)} is saved back by transformers' "
                                 f"conversion as {got}: not written block by block")  # fmt: skip
        extra = [n for n in back if n not in stored or n in unused]
        if extra:
            raise ValueError(f"{fn}: transformers' conversion saves {where} with {extra[0]!r}, a tensor the checkpoint "
                             "does not hold: not written block by block")  # fmt: skip
