"""Masks in training loops, and reports (the door).

``_masked.py`` applies masks to parameters (``apply_masks``,
``functional_call_masked``, ``mask_gradients`` and their in-place forms for
``torch.optim`` loops, ``to_multipliers``); ``_multiply.py`` is the
bool-mask product they use (natively where the kernels load);
``_report.py`` counts what masks prune (``sparsity_report``).
"""

from ._masked import Multipliers as Multipliers
from ._masked import apply_masks as apply_masks
from ._masked import apply_masks_ as apply_masks_
from ._masked import functional_call_masked as functional_call_masked
from ._masked import mask_gradients as mask_gradients
from ._masked import mask_gradients_ as mask_gradients_
from ._masked import to_multipliers as to_multipliers
from ._report import SparsityReport as SparsityReport
from ._report import SparsityRow as SparsityRow
from ._report import sparsity_report as sparsity_report
