"""A model's structural units, found on its traced graph (the door).

``_read.py`` reads the unit groups (``funcprune._units``' values) off the
channel analysis of ``funcprune._graph``; ``_find.py`` keeps those whose removal,
tried through ``funcprune._payoff``, leaves the model computing what the
masked model computes (:func:`structure`); ``_shadow.py`` reads a model on
the meta device off a smaller copy with values. The plans over units live in
``funcprune._plans`` (``structured``). ``README.md`` has the design, and
says why this room sits above ``_graph`` and ``_payoff``.
"""

from ._find import UnitsLeftOutWarning as UnitsLeftOutWarning
from ._find import structure as structure
from ._read import units_of as units_of
