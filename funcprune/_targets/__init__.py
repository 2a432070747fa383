"""Which weights to prune, how much each, and when (the door).

``_prunable.py`` names the weights (plan keys), leaving out the output
layers that ``_outputs.py`` recognizes; ``_input_dims.py`` says where each
weight's input features run (``_layers.py`` holds the layer tables both
read); ``_allocate.py`` splits a total sparsity across tensors (uniform,
ERK), ``_schedules.py`` gives the target sparsity at a training step. Pure
data and functions of module types, names and shapes: nothing here
computes a mask.
"""

from ._allocate import erk_sparsity as erk_sparsity
from ._allocate import uniform_sparsity as uniform_sparsity
from ._input_dims import input_dims as input_dims
from ._outputs import output_parameters as output_parameters
from ._prunable import prunable as prunable
from ._schedules import Iterative as Iterative
from ._schedules import OneShot as OneShot
from ._schedules import Polynomial as Polynomial
from ._schedules import Schedule as Schedule
