"""How good a pruned model is, and how to get quality back (the door).

``_perplexity.py`` measures a causal language model's token-weighted
next-token perplexity on batches (``perplexity``: dense, masked through
``functional_call_masked``, shrunk or reloaded); ``_distill.py`` is the
distillation loss on logits (``distill_loss``), a pure function for a
recovery loop in ``torch.func``.
"""

from ._distill import distill_loss as distill_loss
from ._perplexity import Perplexity as Perplexity
from ._perplexity import perplexity as perplexity
