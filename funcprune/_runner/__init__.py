"""One-shot pruning of a model block by block, on calibration batches (the door).

``_layers.py`` finds a model's repeated layers (its blocks) and captures
what reaches them; ``_methods.py`` holds the one-shot methods as values
(``Method``: the statistic to collect, a pure ``prune``; ``Magnitude``,
``Wanda``, ``SparseGPT``); ``_weights.py`` chooses the weights and each
one's spec (uniform, a mapping, OWL's); ``_oneshot.py`` walks the blocks
(``oneshot``): statistics from the criteria layer's engine, masks from the
method, each block advanced through ``functional_call_masked``.
"""

from ._methods import Magnitude as Magnitude
from ._methods import Method as Method
from ._methods import SparseGPT as SparseGPT
from ._methods import Wanda as Wanda
from ._oneshot import oneshot as oneshot
