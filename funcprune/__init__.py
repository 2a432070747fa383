"""funcprune: pure-functional pruning for PyTorch.

The methods of ``torch.nn.utils.prune`` as immutable data and pure
functions, usable under ``torch.func.vmap``, ``grad`` and ``torch.compile``:

- **Specs** say what to prune: ``Identity``, ``RandomUnstructured``,
  ``L1Unstructured``, ``RandomStructured``, ``LnStructured``,
  ``CustomFromMask``; for mask shapes, ``NM`` (N:M, such as 2:4), ``Block``
  and ``PerSlice`` (a spec within each slice); ``chain(*specs)`` composes
  them. Your own spec is a frozen dataclass subclassing ``Spec`` (set
  ``pruning_type``, implement ``compute_mask``).
- **Which weights**: ``prunable(module)`` names the weights to prune, as plan keys
  (output layers left out); ``input_dims(module)`` says where each weight's
  input features run (0 for GPT-2's ``Conv1D``), for plans and ``wanda``.
- **How much per tensor**: ``uniform_sparsity`` and ``erk_sparsity`` split a
  total sparsity across tensors (``dict[str, float]``, ready for a ``Plan``).
- **When**: ``OneShot``, ``Polynomial``, ``Iterative`` (or your ``Schedule``
  subclass) give ``schedule(step)``, the target sparsity at a training step.
- **Scores**: ``saliency`` and ``taylor`` (from gradients), ``wanda`` (from the
  ``input_norms`` of calibration batches) give a plan's ``scores=``.
- **One-shot**: ``oneshot(model, batches, method=..., spec=...)`` prunes a
  model block by block on calibration batches; its methods are values,
  ``Magnitude()``, ``Wanda()``, ``SparseGPT(blocksize=128, percdamp=0.01)``
  (or the strings ``"magnitude"``, ``"wanda"``, ``"sparsegpt"``), and your
  own is a frozen dataclass subclassing ``Method`` (the statistic to collect
  per weight, a pure ``prune``). ``oneshot_checkpoint(model_dir, out_dir,
  batches, ...)`` does the same on a transformers checkpoint directory
  larger than memory, one block's weights read at a time.
- **Quality**: ``perplexity(model, batches)`` measures a causal language
  model (dense, masked through ``params=``/``masks=``, shrunk or reloaded):
  the token-weighted mean next-token loss and its count;
  ``distill_loss(student_logits, teacher_logits)`` is the distillation loss
  of a recovery loop (docs: "Recovering quality").
- **Masks**: ``compute_mask(spec, scores, default_mask)`` returns a
  ``torch.bool`` mask (``True`` = kept), ``compute_joint_masks`` ranks several
  tensors together, ``prune`` returns the pruned tensor.
- **Plans** map parameter names or glob patterns to specs:
  ``masks = Plan({...})(params, masks=None, scores=None)``;
  ``global_unstructured(names, spec)`` prunes tensors jointly, and
  ``global_structured(names, spec)`` ranks whole channels across tensors; ``compose``
  applies plans in order. Masks travel as dicts keyed like
  ``named_parameters()``; a missing key means "not pruned".
- **Applying**: ``apply_masks``, ``functional_call_masked``, ``mask_gradients``
  and, for ``torch.optim`` loops, ``mask_gradients_`` and ``apply_masks_``;
  ``to_multipliers`` converts masks once for long training loops.
- **Native kernels**: ``native_status()`` says whether the optional C
  kernels of the eager CPU path are in use (compiled on first use), and
  from where or why not.
- **Reports**: ``sparsity_report(masks)`` gives per-tensor and global
  sparsity as a table.
- **Structure**: ``structure(model, example_inputs)`` finds a model's units
  (MLP channels, attention heads, KV groups; transformers models as
  given) as a ``Structure`` of ``UnitGroup``s of ``Member`` slices;
  ``structured(structure, spec)`` is a plan that prunes whole units.
- **Payoff**: ``bake(module, masks)`` returns a pruned copy of the module;
  ``shrink(module, masks, example_inputs)`` a physically smaller one, with
  the channels the masks prune entirely removed (``propagate`` gives the
  masks it removes; a transformers model's config is updated, and
  ``load_shrunk(path)`` reloads any shrunk model ``save_pretrained`` wrote);
  ``to_sparse(params, masks, layout=...)`` turns masked
  Linear weights into CSR, BSR or 2:4 sparse tensors.
- **funcprune.compat** is a drop-in ``torch.nn.utils.prune`` (hook mode, the
  same masks and errors, with fixes), plus the bridge to mask dicts:
  ``masks_from_module``, ``install_masks_``, ``unprune_``, and
  ``SpecMethod`` for your own specs.

``python -m funcprune`` runs a demo; README.md and the docs (``docs/``) have the tour.
"""

import warnings as _warnings

with _warnings.catch_warnings():  # the first torch import, without NumPy installed,
    # warns "Failed to initialize NumPy"; funcprune does not use NumPy.
    _warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    import torch as _torch  # noqa: F401

from ._apply import Multipliers as Multipliers
from ._apply import SparsityReport as SparsityReport
from ._apply import SparsityRow as SparsityRow
from ._apply import apply_masks as apply_masks
from ._apply import apply_masks_ as apply_masks_
from ._apply import functional_call_masked as functional_call_masked
from ._apply import mask_gradients as mask_gradients
from ._apply import mask_gradients_ as mask_gradients_
from ._apply import sparsity_report as sparsity_report
from ._apply import to_multipliers as to_multipliers
from ._criteria import Moments as Moments
from ._criteria import compensate as compensate
from ._criteria import fluctuation as fluctuation
from ._criteria import hessians as hessians
from ._criteria import input_moments as input_moments
from ._criteria import input_norms as input_norms
from ._criteria import owl_sparsity as owl_sparsity
from ._criteria import saliency as saliency
from ._criteria import sparsegpt as sparsegpt
from ._criteria import taylor as taylor
from ._criteria import wanda as wanda
from ._graph import UnreachedWarning as UnreachedWarning
from ._names import UnknownNameError as UnknownNameError
from ._native import NativeStatus as NativeStatus
from ._native import status as native_status
from ._payoff import BSR_BREAK_EVEN as BSR_BREAK_EVEN
from ._payoff import CSR_BREAK_EVEN as CSR_BREAK_EVEN
from ._payoff import BreakEven as BreakEven
from ._payoff import KeptChannelsWarning as KeptChannelsWarning
from ._payoff import ShrunkConfigWarning as ShrunkConfigWarning
from ._payoff import SlowSparseWarning as SlowSparseWarning
from ._payoff import bake as bake
from ._payoff import load_masks as load_masks
from ._payoff import load_shrunk as load_shrunk
from ._payoff import pack_masks as pack_masks
from ._payoff import propagate as propagate
from ._payoff import save_masks as save_masks
from ._payoff import shrink as shrink
from ._payoff import to_sparse as to_sparse
from ._payoff import unpack_masks as unpack_masks
from ._payoff import with_biases as with_biases
from ._plans import AbstractPlan as AbstractPlan
from ._plans import ComposedPlan as ComposedPlan
from ._plans import GlobalPlan as GlobalPlan
from ._plans import GlobalStructuredPlan as GlobalStructuredPlan
from ._plans import Plan as Plan
from ._plans import Rule as Rule
from ._plans import UnitPlan as UnitPlan
from ._plans import compose as compose
from ._plans import compute_joint_masks as compute_joint_masks
from ._plans import compute_mask as compute_mask
from ._plans import global_structured as global_structured
from ._plans import global_unstructured as global_unstructured
from ._plans import prune as prune
from ._plans import structured as structured
from ._quality import Perplexity as Perplexity
from ._quality import distill_loss as distill_loss
from ._quality import perplexity as perplexity
from ._runner import Magnitude as Magnitude
from ._runner import Method as Method
from ._runner import SparseGPT as SparseGPT
from ._runner import UnroutedExpertsWarning as UnroutedExpertsWarning
from ._runner import Wanda as Wanda
from ._runner import EXPERT_STATISTICS as EXPERT_STATISTICS
from ._runner import expert_stats as expert_stats
from ._runner import hidden_scores as hidden_scores
from ._runner import layer_scores as layer_scores
from ._runner import super_experts as super_experts
from ._runner import oneshot as oneshot
from ._runner import oneshot_checkpoint as oneshot_checkpoint
from ._specs import NM as NM
from ._specs import Block as Block
from ._specs import Chain as Chain
from ._specs import CustomFromMask as CustomFromMask
from ._specs import Identity as Identity
from ._specs import L1Unstructured as L1Unstructured
from ._specs import LnStructured as LnStructured
from ._specs import PerSlice as PerSlice
from ._specs import RandomStructured as RandomStructured
from ._specs import RandomUnstructured as RandomUnstructured
from ._specs import Spec as Spec
from ._specs import chain as chain
from ._structure import UnitsLeftOutWarning as UnitsLeftOutWarning
from ._structure import structure as structure
from ._targets import Iterative as Iterative
from ._targets import OneShot as OneShot
from ._targets import Polynomial as Polynomial
from ._targets import Schedule as Schedule
from ._targets import erk_sparsity as erk_sparsity
from ._targets import input_dims as input_dims
from ._targets import prunable as prunable
from ._targets import uniform_sparsity as uniform_sparsity
from ._types import Amount as Amount
from ._types import Masks as Masks
from ._types import NormOrder as NormOrder
from ._types import Params as Params
from ._types import PruningType as PruningType
from ._types import Scores as Scores
from ._units import KINDS as KINDS
from ._units import Kind as Kind
from ._units import Member as Member
from ._units import Structure as Structure
from ._units import UnitGroup as UnitGroup

__version__ = "0.1.0"

__all__ = [
    "AbstractPlan",
    "Amount",
    "BSR_BREAK_EVEN",
    "Block",
    "BreakEven",
    "CSR_BREAK_EVEN",
    "Chain",
    "ComposedPlan",
    "CustomFromMask",
    "EXPERT_STATISTICS",
    "GlobalPlan",
    "GlobalStructuredPlan",
    "Identity",
    "Iterative",
    "KINDS",
    "KeptChannelsWarning",
    "Kind",
    "L1Unstructured",
    "LnStructured",
    "Magnitude",
    "Masks",
    "Member",
    "Method",
    "Moments",
    "Multipliers",
    "NM",
    "NativeStatus",
    "NormOrder",
    "OneShot",
    "Params",
    "PerSlice",
    "Perplexity",
    "Plan",
    "Polynomial",
    "PruningType",
    "RandomStructured",
    "RandomUnstructured",
    "Rule",
    "Schedule",
    "Scores",
    "ShrunkConfigWarning",
    "SlowSparseWarning",
    "SparseGPT",
    "SparsityReport",
    "SparsityRow",
    "Spec",
    "Structure",
    "UnitGroup",
    "UnitPlan",
    "UnitsLeftOutWarning",
    "UnknownNameError",
    "UnreachedWarning",
    "UnroutedExpertsWarning",
    "Wanda",
    "apply_masks",
    "apply_masks_",
    "bake",
    "chain",
    "compensate",
    "compose",
    "compute_joint_masks",
    "compute_mask",
    "distill_loss",
    "erk_sparsity",
    "expert_stats",
    "fluctuation",
    "functional_call_masked",
    "global_structured",
    "global_unstructured",
    "hessians",
    "hidden_scores",
    "input_dims",
    "input_moments",
    "input_norms",
    "layer_scores",
    "load_masks",
    "load_shrunk",
    "mask_gradients",
    "mask_gradients_",
    "native_status",
    "oneshot",
    "oneshot_checkpoint",
    "owl_sparsity",
    "pack_masks",
    "perplexity",
    "propagate",
    "prunable",
    "prune",
    "saliency",
    "save_masks",
    "shrink",
    "sparsegpt",
    "sparsity_report",
    "structure",
    "structured",
    "super_experts",
    "taylor",
    "to_multipliers",
    "to_sparse",
    "uniform_sparsity",
    "unpack_masks",
    "wanda",
    "with_biases",
]
