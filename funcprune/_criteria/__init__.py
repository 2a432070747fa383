"""Scores beyond magnitude: from gradients and from calibration data (the door).

``_scores.py`` turns parameters and gradients (``saliency``, ``taylor``) or
input norms (``wanda``) into a plan's ``scores=``; ``_activations.py``
gathers the input norms of calibration batches (``input_norms``) and
``_hessians.py`` their ``XᵀX`` (``hessians``), both through one engine,
``collect`` (``_collect.py``: the calls of ``_calls.py``, the hooks of
``_hooks.py``), summed across processes where asked; ``_sparsegpt.py``
(reading ``H⁻¹`` through the factor of ``_inverse.py``) and ``_owl.py``
prune and allocate from them. ``_moments.py`` collects the
mean and variance of each input feature (``input_moments``) on the same
engine, and ``_flap.py`` ranks by them and compensates with them (FLAP:
``fluctuation``, ``compensate``).
"""

from ._activations import NORMS as NORMS
from ._activations import input_norms as input_norms
from ._calls import Call as Call
from ._calls import calls as calls
from ._collect import check_group as check_group
from ._collect import collect as collect
from ._flap import compensate as compensate
from ._flap import fluctuation as fluctuation
from ._hessians import GRAMS as GRAMS
from ._hessians import hessians as hessians
from ._hooks import Statistic as Statistic
from ._hooks import token_rows as token_rows
from ._moments import MOMENTS as MOMENTS
from ._moments import Moments as Moments
from ._moments import input_moments as input_moments
from ._owl import owl_sparsity as owl_sparsity
from ._scores import saliency as saliency
from ._scores import taylor as taylor
from ._scores import wanda as wanda
from ._sparsegpt import same_hessians as same_hessians
from ._sparsegpt import sparsegpt as sparsegpt
from ._sparsegpt import sparsegpt_consuming as sparsegpt_consuming
