"""One-shot pruning of a model block by block, on calibration batches (the door).

``_layers.py`` finds a model's repeated layers (its blocks: ``find_layers``,
also read by the command line's progress bars) and captures what reaches
them; ``_methods.py`` holds the one-shot methods as values (``Method``:
the statistic to collect, a pure ``prune``; ``Magnitude``, ``Wanda``,
``SparseGPT``); ``_weights.py`` chooses the weights and each
one's spec (uniform, a mapping, OWL's); ``_oneshot.py`` walks the blocks
(``oneshot``): statistics from the criteria layer's engine, masks from the
method, each block advanced through ``functional_call_masked``;
``_streamed.py`` walks a checkpoint directory one block in memory at a
time (``oneshot_checkpoint``); ``_depth.py`` scores the blocks and the
hidden channels on the same walk
(``layer_scores``: ShortGPT's, Gromov et al.'s, Minitron's; ``hidden_scores``:
Minitron's); ``_routing.py`` reads what each MoE layer's router and experts
do on calibration tokens (``expert_stats``: REAP's statistics;
``super_experts``).
"""

from ._depth import hidden_scores as hidden_scores
from ._depth import layer_scores as layer_scores
from ._layers import find_layers as find_layers
from ._methods import Magnitude as Magnitude
from ._methods import Method as Method
from ._methods import SparseGPT as SparseGPT
from ._methods import Wanda as Wanda
from ._oneshot import UnroutedExpertsWarning as UnroutedExpertsWarning
from ._oneshot import oneshot as oneshot
from ._routing import EXPERT_STATISTICS as EXPERT_STATISTICS
from ._routing import expert_stats as expert_stats
from ._routing import super_experts as super_experts
from ._streamed import oneshot_checkpoint as oneshot_checkpoint
