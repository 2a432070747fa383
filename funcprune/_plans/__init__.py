"""From tensors and dicts to masks: the checked entry points and the plans (the door).

``_compute.py`` holds the public mask functions, where plain and DTensor
inputs part ways; ``_plan.py`` the plan protocol (``AbstractPlan``) and
``compose``; ``_rules.py`` the per-parameter ``Plan``; ``_global.py`` the
global unstructured plan; ``_structured.py`` and ``_global_structured.py``
the plans over units (a model's units, and each tensor's channels), both
ranked by ``_rank_units.py`` (keys in ``_unit_keys.py``, members where this
process holds them in ``_held_members.py``); ``_input_dims.py`` shows the
specs a weight stored ``(in, out)`` (a ``Conv1D``'s) as ``(out, in)``.
Plans fold specs through ``funcprune._specs`` and hand DTensors to
``funcprune._dtensor``; they never reach below the fold. ``README.md`` has
the design of the plans over units.
"""

from ._compute import compute_joint_masks as compute_joint_masks
from ._compute import compute_mask as compute_mask
from ._compute import prune as prune
from ._global import GlobalPlan as GlobalPlan
from ._global import global_unstructured as global_unstructured
from ._global_structured import GlobalStructuredPlan as GlobalStructuredPlan
from ._global_structured import Normalize as Normalize
from ._global_structured import global_structured as global_structured
from ._plan import AbstractPlan as AbstractPlan
from ._plan import ComposedPlan as ComposedPlan
from ._plan import compose as compose
from ._rules import Plan as Plan
from ._rules import Rule as Rule
from ._structured import Scope as Scope
from ._structured import UnitPlan as UnitPlan
from ._structured import structured as structured
