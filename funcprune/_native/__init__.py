"""Optional native kernels for the eager CPU path (the door); ``README.md`` has the design."""

from ._build import NativeStatus as NativeStatus
from ._build import disabled as disabled
from ._build import load as load
from ._build import open_library as open_library
from ._build import status as status
from ._build import using as using
from ._calls import CODE_BINS as CODE_BINS
from ._calls import as_many_threads_as_torch as as_many_threads_as_torch
from ._calls import block_any as block_any
from ._calls import block_expand as block_expand
from ._calls import block_norms as block_norms
from ._calls import code_collect as code_collect
from ._calls import code_histogram as code_histogram
from ._calls import mask_multiply as mask_multiply
from ._calls import n_m as n_m
from ._calls import plain as plain
from ._calls import ragged_keep as ragged_keep
from ._calls import row_counts as row_counts
from ._calls import rows_keep as rows_keep
from ._calls import scan as scan
from ._calls import survivors as survivors
from ._calls import threaded as threaded
from ._sparsegpt import sparsegpt_block as sparsegpt_block
from ._unit_keys import unit_abs_max as unit_abs_max
from ._unit_keys import unit_rounded as unit_rounded
