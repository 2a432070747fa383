"""Which weights to prune, how much each, and when (the door).

``_prunable.py`` names the weights (plan keys), ``_allocate.py`` splits a
total sparsity across tensors (uniform, ERK), ``_schedules.py`` gives the
target sparsity at a training step. Pure data and functions of names and
shapes: nothing here computes a mask.
"""

from ._allocate import erk_sparsity as erk_sparsity
from ._allocate import uniform_sparsity as uniform_sparsity
from ._prunable import prunable as prunable
from ._schedules import Iterative as Iterative
from ._schedules import OneShot as OneShot
from ._schedules import Polynomial as Polynomial
from ._schedules import Schedule as Schedule
