"""DTensor inputs: masks computed block by block where the tensors lie, never gathered (the door).

``README.md`` in this folder says what is supported, what is exact and what
crosses processes.
"""

from ._checks import check_layouts as check_layouts
from ._checks import check_like as check_like
from ._checks import check_not_fsdp as check_not_fsdp
from ._checks import refuse_in as refuse_in
from ._dispatch import check_group as check_group
from ._dispatch import compute_joint_masks as compute_joint_masks
from ._dispatch import compute_mask as compute_mask
from ._dispatch import fold_step as fold_step
from ._dispatch import l1_each as l1_each
from ._dispatch import parameter_block as parameter_block
from ._dispatch import shards_of as shards_of
from ._layout import Layout as Layout
from ._layout import LocalBlock as LocalBlock
from ._layout import all_reduce as all_reduce
from ._layout import layout_of as layout_of
from ._layout import wrap as wrap
from ._random import random_unstructured as random_unstructured
from ._structured import Channels as Channels
from ._structured import agree_on_failures as agree_on_failures
from ._structured import all_reduced as all_reduced
from ._structured import channels as channels
from ._structured import check_layout as check_layout
