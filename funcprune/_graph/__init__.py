"""Channel analysis on ``torch.fx``: which channels of a model hang together (the door).

What the rest of funcprune may use of this folder; ``README.md`` has the design.
"""

from ._removal import Cut as Cut
from ._removal import plan_removal as plan_removal
from ._trace import trace_channels as trace_channels
from ._values import ChannelGraph as ChannelGraph
from ._values import RoleKind as RoleKind
