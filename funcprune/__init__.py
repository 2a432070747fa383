"""funcprune: pure-functional pruning for PyTorch.

Specs say what to prune, :func:`compute_mask` turns a spec and importance
scores into a ``torch.bool`` mask, and :func:`chain` composes specs the way
repeated ``torch.nn.utils.prune`` calls compose. ``funcprune.compat`` is a
drop-in replacement for ``torch.nn.utils.prune``.
"""

from ._fold import compute_mask as compute_mask
from ._fold import prune as prune
from ._specs import Chain as Chain
from ._specs import CustomFromMask as CustomFromMask
from ._specs import Identity as Identity
from ._specs import L1Unstructured as L1Unstructured
from ._specs import LnStructured as LnStructured
from ._specs import RandomStructured as RandomStructured
from ._specs import RandomUnstructured as RandomUnstructured
from ._specs import Spec as Spec
from ._specs import chain as chain
from ._types import Amount as Amount
from ._types import Masks as Masks
from ._types import NormOrder as NormOrder
from ._types import Params as Params
from ._types import PruningType as PruningType
from ._types import Scores as Scores

__version__ = "0.1.0"

__all__ = [
    "Amount",
    "Chain",
    "CustomFromMask",
    "Identity",
    "L1Unstructured",
    "LnStructured",
    "Masks",
    "NormOrder",
    "Params",
    "PruningType",
    "RandomStructured",
    "RandomUnstructured",
    "Scores",
    "Spec",
    "chain",
    "compute_mask",
    "prune",
]
