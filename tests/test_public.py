"""The public surface: every exported name imports and is documented."""

from __future__ import annotations

import importlib
import inspect

import pytest

import funcprune as fp

DESIGN_NAMES = [
    "Identity", "RandomUnstructured", "L1Unstructured", "RandomStructured",
    "LnStructured", "CustomFromMask", "Chain", "chain", "compute_mask", "prune",
    "Plan", "global_unstructured", "apply_masks",
    "saliency", "taylor", "wanda", "input_norms", "NM", "Block", "PerSlice", "prunable", "input_dims",
    "global_structured", "bake", "propagate", "shrink", "to_sparse", "KeptChannelsWarning",
    "structure", "Structure", "UnitGroup", "Member", "structured", "load_shrunk",
    "hessians", "sparsegpt", "oneshot", "owl_sparsity", "Magnitude", "Wanda", "SparseGPT",
    "pack_masks", "unpack_masks", "save_masks", "load_masks", "layer_scores", "hidden_scores",
    "expert_stats", "perplexity", "distill_loss", "input_moments", "fluctuation", "compensate",
]  # fmt: skip
DESIGN_SIGNATURES = {
    fp.compute_mask: "(spec, scores, default_mask=None, *, generator=None)",
    fp.prune: "(spec, t, default_mask=None, importance_scores=None, *, generator=None)",
    fp.Plan.__call__: "(self, params, masks=None, scores=None, generator=None, *, unit_scores=None)",
    # the card's (amount, dim=-1) and (amount, n, dim=-1), with the card's
    # sparsity= instead of amount: amount may be left out, n is still required
    fp.RandomStructured: "(amount=None, dim=-1, *, sparsity=None)",
    fp.LnStructured: "(amount=None, n=None, dim=-1, *, sparsity=None)",
    fp.L1Unstructured: "(amount=None, *, sparsity=None)",
    fp.saliency: "(params, grads)",
    fp.taylor: "(params, grads)",
    fp.wanda: "(params, input_norms, *, input_dims=None)",  # DESIGN's, and issue 23's layout
    fp.prunable: "(module, *, embeddings=False, types=(), outputs=False, experts=False)",  # issue 23's
    fp.input_dims: "(module)",
    fp.Plan: "(rules, *, input_dims=None)",
    fp.input_norms: "(module, batches, names, *, across=None)",  # DESIGN's, and a keyword-only extra
    fp.input_moments: "(model, batches, names, *, across=None)",  # issue 40's, and a keyword-only extra
    fp.fluctuation: "(params, moments)",
    fp.compensate: "(params, masks, moments)",
    # the card's (n, m, dim=-1), (amount, shape) with sparsity= as for every amount spec
    # (shape is required: its default only lets amount have one) and (spec, dim=0)
    fp.NM: "(n, m, dim=-1)",
    fp.Block: "(amount=None, shape=None, *, sparsity=None)",
    fp.PerSlice: "(spec, dim=0)",
    fp.global_structured: "(names, spec, *, normalize=None, input_dims=None)",
    fp.bake: "(module, masks)",
    fp.propagate: "(module, masks, example_inputs)",
    fp.shrink: "(module, masks, example_inputs, *, structure=None, check=True, inplace=False)",  # DESIGN's, and issue 42's keyword-only extras
    fp.to_sparse: "(params, masks, *, layout, blocksize=None, below_break_even='warn', module=None)",
    fp.structure: "(model, example_inputs, *, outputs=False)",  # DESIGN's, and prunable's outputs=
    fp.structured: "(structure, spec, *, kinds=None, scope='global', normalize=None, protect=None)",  # issue 39's
    fp.UnitGroup: "(kind, size, members, least=1, parts=1)",  # issue 39's: a router's expert groups
    fp.expert_stats: "(model, batches, *, renormalize=False)",  # issue 39's: reap's renormalize_router_weights
    fp.Member: "(name, dim, width, start=0, unit=None)",  # issue 38's: a member of one unit (a layer's block)
    fp.layer_scores: "(model, batches, *, metric='bi', n=1)",  # issue 38's: n, a run of blocks (angular)
    fp.hidden_scores: "(model, batches, *, final_norm=True)",  # final_norm=False: ModelOpt's set of norms
    fp.load_shrunk: "(path, **kwargs)",
    # issue 25's, with keyword-only extras
    fp.hessians: "(module, batches, names, *, across=None)",
    fp.sparsegpt: "(params, hessians, spec, *, blocksize=128, percdamp=0.01, input_dims=None)",
    fp.oneshot: "(model, batches, *, method, spec, names=None, allocation=None, device=None, group=None, inplace=False)",  # issues 41, 42
    fp.Magnitude: "()",
    fp.Wanda: "()",
    fp.SparseGPT: "(blocksize=128, percdamp=0.01)",  # issue 37's: SparseGPT's knobs live in its value only
    fp.owl_sparsity: "(params, input_norms, sparsity, *, lam=0.08, m=5, blocks=None)",
    # masks at rest
    fp.pack_masks: "(masks)",
    fp.unpack_masks: "(packed, *, like=None)",  # like=: DTensor masks rebuilt where they were saved
    fp.save_masks: "(masks, path)",
    fp.load_masks: "(path, *, like=None)",
    # issue 40's: evaluation and recovery
    fp.perplexity: "(model, batches, *, params=None, masks=None)",
    fp.distill_loss: "(student_logits, teacher_logits, *, temperature=1.0, attention_mask=None)",
}


@pytest.mark.parametrize("name", fp.__all__)
def test_every_exported_name_imports(name: str) -> None:
    module = importlib.import_module("funcprune")
    assert getattr(module, name) is not None


@pytest.mark.parametrize("name", DESIGN_NAMES)
def test_design_names_exist_and_are_documented(name: str) -> None:
    assert name in fp.__all__
    assert (getattr(fp, name).__doc__ or "").strip()


def test_all_is_sorted_and_unique() -> None:
    assert len(set(fp.__all__)) == len(fp.__all__)
    assert fp.__all__ == sorted(fp.__all__)


@pytest.mark.parametrize(("fn", "expected"), DESIGN_SIGNATURES.items(), ids=lambda v: getattr(v, "__qualname__", str(v)))
def test_design_signatures(fn: object, expected: str) -> None:
    """The parameter names, order, defaults and kinds DESIGN.md promises."""
    signature = inspect.signature(fn)  # type: ignore[arg-type]
    plain = signature.replace(
        parameters=[p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()],
        return_annotation=inspect.Signature.empty,
    )
    assert str(plain) == expected
