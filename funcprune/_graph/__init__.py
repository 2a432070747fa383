"""Channel analysis on the exported graph: which channels of a model hang together (the door).

What the rest of funcprune may use of this folder; ``README.md`` has the design.
"""

from ._analysis import Analysis as Analysis
from ._analysis import Attention as Attention
from ._analysis import Experts as Experts
from ._analysis import UnreachedWarning as UnreachedWarning
from ._analysis import analyze as analyze
from ._analysis import warn_unreached as warn_unreached
from ._atoms import Slice as Slice
from ._export import Inputs as Inputs
from ._export import as_inputs as as_inputs
from ._export import copy_module as copy_module
from ._export import first_line as first_line
from ._export import run as run
from ._memo import Analyzed as Analyzed
from ._memo import analyzed as analyzed
from ._memo import remembered as remembered
from ._removal import Removal as Removal
from ._removal import closure as closure
from ._removal import dropped_indices as dropped_indices
from ._removal import kept_indices as kept_indices
from ._removal import own_indices as own_indices
from ._removal import plan_removal as plan_removal
