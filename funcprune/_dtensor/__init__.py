"""DTensor inputs: masks computed block by block where the tensors lie, never gathered (the door).

``README.md`` in this folder says what is supported, what is exact and what
crosses processes; ``_dispatch.py`` holds the one registry of the specs
computed on DTensors (``supported()`` lists them).
"""

from ._checks import check_layouts as check_layouts
from ._checks import check_like as check_like
from ._checks import check_not_fsdp as check_not_fsdp
from ._cuts import box as box
from ._cuts import cut_dim as cut_dim
from ._cuts import strided as strided
from ._dispatch import check_group as check_group
from ._dispatch import compute_joint_masks as compute_joint_masks
from ._dispatch import compute_mask as compute_mask
from ._dispatch import described as described
from ._dispatch import supported as supported
from ._layout import Layout as Layout
from ._layout import all_reduce as all_reduce
from ._layout import layout_of as layout_of
from ._layout import parameter_block as parameter_block
from ._layout import wrap as wrap
from ._rules import fold_rule as fold_rule
