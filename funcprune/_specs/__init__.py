"""What to prune: the spec protocol, the built-in specs, their kernels and the fold (the door).

``Spec`` and ``checked_mask`` (``_spec.py``) are the protocol; ``fold``,
``Chain`` and ``chain`` (``_fold.py``) compose specs; ``_torch_specs.py``
holds torch's methods as specs, ``_shape_specs.py`` the mask shapes (N:M,
blocks, per slice); each spec's ``compute_mask`` calls its kernel
(``_kernels.py``, ``_shape_kernels.py``), which ranks through
``funcprune._select``; ``_keep_units.py`` ranks the keys of units of
several groups together (the plans over units, ``global_structured``'s
channels included). Other layers use the kernels listed here.
"""

from ._fold import Chain as Chain
from ._fold import RuleItem as RuleItem
from ._fold import ScoresOf as ScoresOf
from ._fold import Step as Step
from ._fold import chain as chain
from ._fold import fold as fold
from ._keep_units import NORMALIZE as NORMALIZE
from ._keep_units import Normalize as Normalize
from ._keep_units import StructuredSpec as StructuredSpec
from ._keep_units import check_channels as check_channels
from ._keep_units import check_normalize as check_normalize
from ._keep_units import keep_units as keep_units
from ._keep_units import normalized as normalized
from ._kernels import as_bool as as_bool
from ._kernels import check_matrix_norm as check_matrix_norm
from ._kernels import custom_from_mask as custom_from_mask
from ._kernels import keep_all as keep_all
from ._kernels import l1_part as l1_part
from ._kernels import l1_unstructured_jointly as l1_unstructured_jointly
from ._kernels import ln_structured as ln_structured
from ._kernels import structured_by_keys as structured_by_keys
from ._kernels import unpruned_units as unpruned_units
from ._shape_kernels import block_view as block_view
from ._shape_kernels import blocks as blocks
from ._shape_kernels import kept_blocks as kept_blocks
from ._shape_kernels import n_m as n_m
from ._shape_specs import Block as Block
from ._shape_specs import NM as NM
from ._shape_specs import PerSlice as PerSlice
from ._shape_specs import check_dim_indexes as check_dim_indexes
from ._spec import Spec as Spec
from ._spec import checked_mask as checked_mask
from ._torch_specs import CustomFromMask as CustomFromMask
from ._torch_specs import Identity as Identity
from ._torch_specs import L1Unstructured as L1Unstructured
from ._torch_specs import LnStructured as LnStructured
from ._torch_specs import RandomStructured as RandomStructured
from ._torch_specs import RandomUnstructured as RandomUnstructured
