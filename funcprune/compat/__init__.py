"""Drop-in replacement for ``torch.nn.utils.prune``, built on funcprune's kernels.

Switch one import::

    import funcprune.compat as prune   # instead of: import torch.nn.utils.prune as prune

Every public name of ``torch.nn.utils.prune`` (and its underscore helpers)
is here with the same signature, behaviour, masks (random methods draw the
same numbers) and exceptions. The fixes:

* ``copy.deepcopy`` of a pruned module works, and a saved pruned tensor is a
  plain tensor (``torch.load`` with ``weights_only=True`` accepts it);
* re-pruning keeps the hook's place among the forward pre-hooks;
* a failing call leaves the module as it was;
* :func:`is_pruned` / :func:`remove` also recognise modules pruned by torch;
* pruning ``MultiheadAttention.out_proj`` works in training and inference:
  the attention reads ``out_proj.weight`` without calling ``out_proj``, so
  compat refreshes the pruned tensors before the attention's forward (torch
  fails on the second backward, or keeps a stale weight under ``no_grad``);
* pruning one user of a tied weight (``lm_head.weight = embedding.weight``)
  raises a ``ValueError`` before changing anything, where torch silently
  unties the weight; :func:`install_masks_` prunes every user instead.

The bridge (:func:`install_masks_`, :func:`masks_from_module`,
:func:`unprune_`) converts between hook mode and funcprune's mask dicts,
one key per Parameter (tied ones included); :func:`masks_from_module` is
funcprune's one reader of hook mode. :class:`SpecMethod` makes any funcprune
spec, your own included, a pruning method:
``SpecMethod.apply(module, "weight", spec=my_spec)``.
"""

from ._base import BasePruningMethod as BasePruningMethod
from ._base import PruningContainer as PruningContainer
from ._bridge import install_masks_ as install_masks_
from ._bridge import masks_from_module as masks_from_module
from ._bridge import unprune_ as unprune_
from ._functions import custom_from_mask as custom_from_mask
from ._functions import identity as identity
from ._functions import l1_unstructured as l1_unstructured
from ._functions import ln_structured as ln_structured
from ._functions import random_structured as random_structured
from ._functions import random_unstructured as random_unstructured
from ._global import global_unstructured as global_unstructured
from ._methods import CustomFromMask as CustomFromMask
from ._methods import Identity as Identity
from ._methods import L1Unstructured as L1Unstructured
from ._methods import RandomUnstructured as RandomUnstructured
from ._remove import is_pruned as is_pruned
from ._remove import remove as remove
from ._spec_method import SpecMethod as SpecMethod
from ._structured import LnStructured as LnStructured
from ._structured import RandomStructured as RandomStructured
from ._torch_helpers import _compute_norm as _compute_norm
from ._torch_helpers import _compute_nparams_toprune as _compute_nparams_toprune
from ._torch_helpers import _validate_pruning_amount as _validate_pruning_amount
from ._torch_helpers import (
    _validate_pruning_amount_init as _validate_pruning_amount_init,
)
from ._torch_helpers import _validate_pruning_dim as _validate_pruning_dim
from ._torch_helpers import _validate_structured_pruning as _validate_structured_pruning

__all__ = [
    "BasePruningMethod",
    "CustomFromMask",
    "Identity",
    "L1Unstructured",
    "LnStructured",
    "PruningContainer",
    "RandomStructured",
    "RandomUnstructured",
    "SpecMethod",
    "custom_from_mask",
    "global_unstructured",
    "identity",
    "install_masks_",
    "is_pruned",
    "l1_unstructured",
    "ln_structured",
    "masks_from_module",
    "random_structured",
    "random_unstructured",
    "remove",
    "unprune_",
]
