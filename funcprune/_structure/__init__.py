"""A model's structural units, and plans over them (the door).

``_units.py`` holds the values (``Member``, ``UnitGroup``, ``Structure``);
``_find.py`` reads them off the channel analysis of ``funcprune._graph``
(:func:`structure`); ``_plan.py`` ranks whole units (:func:`structured`).
``README.md`` has the design.
"""

from ._find import UnitsLeftOutWarning as UnitsLeftOutWarning
from ._find import structure as structure
from ._find import units_of as units_of
from ._plan import Scope as Scope
from ._plan import UnitPlan as UnitPlan
from ._plan import structured as structured
from ._units import KINDS as KINDS
from ._units import Kind as Kind
from ._units import Member as Member
from ._units import Structure as Structure
from ._units import UnitGroup as UnitGroup
