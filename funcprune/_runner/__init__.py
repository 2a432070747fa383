"""One-shot pruning of a model block by block, on calibration batches (the door).

``_layers.py`` finds a model's repeated layers (its blocks) and captures what reaches
them; ``_oneshot.py`` walks them (``oneshot``): statistics from the
criteria layer (input norms, Hessians), masks from plans or SparseGPT,
each block advanced through ``functional_call_masked``.
"""

from ._oneshot import oneshot as oneshot
