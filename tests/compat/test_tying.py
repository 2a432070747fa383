"""Tied weights: one Parameter used by several modules (``lm_head.weight =
embedding.weight``).

* the bridge hooks every user, as the functional API masks every user, and
  reads one key per Parameter;
* compat's pruning functions refuse to prune one user of a tie they can see
  (in the call's module trees, or a tie compat hooked before), before
  changing anything; a global call prunes every user alike when all are in
  it; a tie compat cannot see unties as in torch; untied parameters prune as
  in torch; no call scans the heap (but for an ``out_proj`` alone);
* the bridge's functions check their module argument.
"""

from __future__ import annotations

import copy
import gc
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as tp
from torch import nn

import funcprune as fp
import funcprune.compat as cp

from ._helpers import (
    Small,
    TiedLM,
    assert_same_fingerprint,
    assert_same_state,
    assert_same_tensor,
    fingerprint,
    twins,
)

Tensor = torch.Tensor
TOKENS = torch.tensor([[1, 4, 2, 9], [0, 10, 3, 3]])
SHAPES = {"embedding.weight": (11, 6), "linear.weight": (6, 6), "linear.bias": (6,)}


def random_masks(seed: int, names: tuple[str, ...] = ("embedding.weight", "linear.weight")
                 ) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.rand(SHAPES[name], generator=g) > 0.4 for name in names}


def plain_name(name: str) -> str:
    return name.removesuffix("_orig")


Step = tuple[Tensor, dict[str, Tensor]]


def hooked_step(model: nn.Module, opt: torch.optim.Optimizer | None = None) -> Step:
    """Output and gradients (by plain name) of one training step in hook mode."""
    out = model(TOKENS)
    out.square().mean().backward()
    grads = {plain_name(n): p.grad.clone() for n, p in model.named_parameters()
             if p.grad is not None}
    if opt is not None:
        opt.step()
    model.zero_grad()
    return out.detach(), grads


def functional_step(model: nn.Module, masks: dict[str, Tensor],
                    opt: torch.optim.Optimizer | None = None) -> Step:
    """The same with funcprune.functional_call_masked on an unpruned model."""
    params = dict(model.named_parameters())
    out = fp.functional_call_masked(model, params, masks, (TOKENS,))
    out.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in params.items() if p.grad is not None}
    if opt is not None:
        opt.step()
    model.zero_grad()
    return out.detach(), grads


def assert_same_step(a: Step, b: Step) -> None:
    assert torch.allclose(a[0], b[0], atol=1e-6)
    assert sorted(a[1]) == sorted(b[1])
    for name in a[1]:
        assert torch.allclose(a[1][name], b[1][name], atol=1e-6), name


# --- the bridge hooks every user ---------------------------------------------------------


def test_install_hooks_every_user_like_the_functional_api() -> None:
    hooked, functional = twins(TiedLM)
    masks = random_masks(0)
    cp.install_masks_(hooked, masks)
    assert hooked.lm_head.weight_orig is hooked.embedding.weight_orig  # still tied
    assert torch.equal(hooked.lm_head.weight_mask, hooked.embedding.weight_mask)
    assert [n for n, _ in hooked.named_parameters()] == [
        "embedding.weight_orig", "linear.bias", "linear.weight_orig"]
    opt_a = torch.optim.SGD(hooked.parameters(), lr=0.5)
    opt_b = torch.optim.SGD(functional.parameters(), lr=0.5)
    for _ in range(3):  # the tied weight gets both users' gradients, masked
        assert_same_step(hooked_step(hooked, opt_a), functional_step(functional, masks, opt_b))


def test_masks_round_trip_with_one_key_per_parameter() -> None:
    model, functional = twins(TiedLM)
    masks = random_masks(1)
    cp.install_masks_(model, masks)
    expected = hooked_step(model)
    read = cp.masks_from_module(model)
    assert list(read) == list(masks)  # "embedding.weight" only, named_parameters()' name
    back = cp.unprune_(model)
    assert list(back) == list(masks)
    for name in masks:
        assert torch.equal(read[name], masks[name]) and torch.equal(back[name], masks[name])
    assert model.lm_head.weight is model.embedding.weight  # tied again, plain
    assert not cp.is_pruned(model)
    assert_same_step(functional_step(model, back), expected)
    cp.install_masks_(model, back)
    assert_same_step(hooked_step(model), expected)
    assert_same_step(functional_step(functional, masks), expected)


def test_users_hooked_by_torch_read_as_one_key() -> None:
    model: Any = TiedLM()
    mask = random_masks(2)["embedding.weight"]
    tp.custom_from_mask(model.embedding, "weight", mask)
    tp.custom_from_mask(model.lm_head, "weight", mask)
    expected = hooked_step(model)
    assert list(cp.masks_from_module(model)) == ["embedding.weight"]
    back = cp.unprune_(model)
    assert_same_step(functional_step(model, back), expected)


def test_install_accepts_any_users_name_and_one_mask_per_parameter() -> None:
    model: Any = TiedLM()
    mask = random_masks(3)["embedding.weight"]
    cp.install_masks_(model, {"lm_head.weight": mask, "embedding.weight": mask.clone()})
    assert list(cp.masks_from_module(model)) == ["embedding.weight"]
    other: Any = TiedLM()
    before = fingerprint(other)
    with pytest.raises(ValueError, match="'lm_head.weight' and 'embedding.weight'.*tied"):
        cp.install_masks_(other, {"lm_head.weight": mask, "embedding.weight": ~mask})
    assert_same_fingerprint(before, fingerprint(other))


def differently_pruned(how: str) -> Any:
    model: Any = TiedLM()
    mask = random_masks(4)["embedding.weight"]
    if how == "both":
        tp.custom_from_mask(model.embedding, "weight", mask)
        tp.custom_from_mask(model.lm_head, "weight", ~mask)
    elif how == "one":
        tp.custom_from_mask(model.lm_head, "weight", mask)  # torch unties it
    return model


@pytest.mark.parametrize("how, match", [
    ("both", "'embedding.weight' and 'lm_head.weight' are one \\(tied\\) Parameter with "
     "different masks"),
    ("one", "'lm_head.weight' is pruned but 'embedding.weight', the same \\(tied\\) "
     "Parameter, is not"),
])
@pytest.mark.parametrize("fn", ["masks_from_module", "unprune_"])
def test_users_with_different_masks_have_no_mask_dict(how: str, match: str, fn: str) -> None:
    model = differently_pruned(how)
    before = fingerprint(model)
    with pytest.raises(ValueError, match=f"^{fn}: {match}.*one mask per Parameter"):
        getattr(cp, fn)(model)
    assert_same_fingerprint(before, fingerprint(model))


def test_an_unpruned_user_counts_as_a_mask_of_ones() -> None:
    model: Any = TiedLM()
    tp.identity(model.lm_head, "weight")
    assert list(cp.masks_from_module(model)) == ["embedding.weight"]


def test_install_refuses_to_leave_users_with_different_masks() -> None:
    model = differently_pruned("one")
    before = fingerprint(model)
    with pytest.raises(ValueError, match="^install_masks_: 'embedding.weight' and "
                       "'lm_head.weight' .*different masks"):
        cp.install_masks_(model, {"embedding.weight": torch.ones(11, 6, dtype=torch.bool)})
    assert_same_fingerprint(before, fingerprint(model))


# --- compat refuses to prune one user of a tied weight -------------------------------------

Call = Callable[[types.ModuleType, Any], Any]
#: name -> (the message's context, the other user's type, the call)
CALLS: dict[str, tuple[str, str, Call]] = {
    "l1_unstructured": ("L1Unstructured.apply", "Embedding",
                        lambda lib, m: lib.l1_unstructured(m.lm_head, "weight", 0.5)),
    "random_unstructured": ("RandomUnstructured.apply", "Linear",
                            lambda lib, m: lib.random_unstructured(m.embedding, "weight", 3)),
    "ln_structured": ("LnStructured.apply", "Embedding",
                      lambda lib, m: lib.ln_structured(m.lm_head, "weight", 1, n=2, dim=0)),
    "random_structured": ("RandomStructured.apply", "Embedding",
                          lambda lib, m: lib.random_structured(m.lm_head, "weight", 1, dim=1)),
    "identity": ("Identity.apply", "Linear", lambda lib, m: lib.identity(m.embedding, "weight")),
    "custom_from_mask": ("CustomFromMask.apply", "Embedding", lambda lib, m: lib.custom_from_mask(
        m.lm_head, "weight", torch.ones(11, 6))),
    "apply": ("L1Unstructured.apply", "Embedding", lambda lib, m: lib.L1Unstructured.apply(
        m.lm_head, "weight", amount=2)),
    "global_unstructured": ("global_unstructured", "Embedding",
                            lambda lib, m: lib.global_unstructured(
                                [(m.linear, "weight"), (m.lm_head, "weight")],
                                lib.L1Unstructured, amount=4)),
}


def known_tie(lib: types.ModuleType, model: Any) -> None:
    """Make compat see the tie: a global call over every user (pruning nothing)."""
    lib.global_unstructured([(model.embedding, "weight"), (model.lm_head, "weight")],
                            lib.Identity)


@pytest.mark.parametrize("call", list(CALLS))
def test_pruning_one_user_of_a_tied_weight_raises(call: str) -> None:
    context, other, run = CALLS[call]
    model: Any = TiedLM()
    cp.l1_unstructured(model.linear, "bias", 1)  # an unrelated pruned tensor stays as it is
    known_tie(cp, model)
    before = fingerprint(model)
    state = torch.get_rng_state()
    with pytest.raises(ValueError) as info:
        run(cp, model)
    message = str(info.value)
    assert message.startswith(f"{context}: cannot prune 'weight' of ")
    assert f"the Parameter is tied: also held by a module of type {other} (as 'weight')" in message
    assert "funcprune.Plan + funcprune.functional_call_masked" in message
    assert "funcprune.compat.install_masks_(root_module, masks)" in message
    assert_same_fingerprint(before, fingerprint(model))
    assert torch.equal(torch.get_rng_state(), state)
    assert_same_step(hooked_step(model), hooked_step(copy.deepcopy(model)))


def test_a_tie_within_the_call_trees_is_seen_without_a_history() -> None:
    model: Any = TiedLM()
    holder = nn.Module()  # listed for its own parameter; its tree holds the embedding
    holder.embedding = model.embedding
    holder.scale = nn.Parameter(torch.ones(3))
    before = fingerprint(model)
    with pytest.raises(ValueError, match="^global_unstructured: cannot prune 'weight' of Linear: "
                       ".* of type Embedding \\(as 'weight'\\)"):
        cp.global_unstructured([(model.lm_head, "weight"), (holder, "scale")],
                               cp.L1Unstructured, amount=2)
    assert_same_fingerprint(before, fingerprint(model))


@pytest.mark.parametrize("call", ["l1_unstructured", "ln_structured", "global_unstructured"])
def test_a_tie_compat_cannot_see_unties_as_in_torch(call: str) -> None:
    """A holder outside the call's trees, never hooked by compat: torch's result."""
    ours, theirs = twins(TiedLM)
    for lib, model in ((cp, ours), (tp, theirs)):
        torch.manual_seed(3)
        CALLS[call][2](lib, model)
    assert_same_state(theirs, ours)
    assert_same_tensor(ours(TOKENS), theirs(TOKENS))


def test_torch_unties_where_compat_refuses() -> None:
    model: Any = TiedLM()
    tp.l1_unstructured(model.lm_head, "weight", 0.5)
    model(TOKENS)
    assert not torch.equal(model.lm_head.weight, model.embedding.weight)


def test_re_pruning_a_tied_weight_installed_by_the_bridge_raises() -> None:
    model: Any = TiedLM()
    cp.install_masks_(model, random_masks(5))
    before = fingerprint(model)
    with pytest.raises(ValueError, match="^L1Unstructured.apply: .* Embedding"):
        cp.l1_unstructured(model.lm_head, "weight", 0.5)
    assert_same_fingerprint(before, fingerprint(model))


def test_a_parameter_held_twice_by_one_module_is_tied() -> None:
    fc: Any = nn.Linear(3, 2)
    fc.alias = fc.weight
    with pytest.raises(ValueError, match="of type Linear \\(as 'alias'\\)"):
        cp.l1_unstructured(fc, "weight", 1)


def optimized(model: nn.Module) -> torch.optim.Optimizer:
    """An optimizer (its lists reference every Parameter), after one step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 2, 4, 4)).sum().backward()
    opt.step()
    return opt


@pytest.mark.parametrize("with_optimizer", [False, True])
def test_untied_parameters_prune_like_torch(with_optimizer: bool) -> None:
    ours, theirs = twins(Small)
    keep = [optimized(ours), optimized(theirs)] if with_optimizer else []
    x = torch.randn(2, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    for lib, model in ((cp, ours), (tp, theirs)):
        torch.manual_seed(1)
        lib.l1_unstructured(model.conv, "weight", 0.3)
        model(x).sum().backward()  # the pruned attribute's graph holds weight_orig
        lib.random_unstructured(model.conv, "weight", 0.2)  # re-pruning
        lib.global_unstructured([(model.conv, "weight"), (model.fc, "weight")],
                                lib.L1Unstructured, amount=10)
        lib.ln_structured(model.fc, "weight", 1, n=1, dim=0)
        torch.manual_seed(2)
        lib.random_structured(model.fc, "weight", 3, dim=1)
    assert_same_state(theirs, ours)
    assert_same_tensor(ours(x), theirs(x))
    assert len(keep) == (2 if with_optimizer else 0)


def test_no_call_scans_the_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Holders come from the call's trees, optimizer alive or not (but for an out_proj alone)."""
    model: Any = Small()
    opt = optimized(model)

    def scan(*objs: object) -> list[object]:
        raise AssertionError("the heap was scanned")

    monkeypatch.setattr(gc, "get_referrers", scan)
    monkeypatch.setattr(gc, "get_objects", scan)
    cp.l1_unstructured(model.conv, "weight", 0.3)
    model(torch.randn(1, 2, 4, 4)).sum().backward()
    opt.step()
    cp.random_unstructured(model.conv, "weight", 0.3)
    cp.ln_structured(model.fc, "weight", 1, n=2, dim=0)
    cp.global_unstructured([(model.conv, "weight"), (model.fc, "bias")], cp.L1Unstructured, amount=3)
    cp.remove(model.fc, "bias")
    tied: Any = TiedLM()
    cp.install_masks_(tied, random_masks(1))
    with pytest.raises(ValueError, match="tied"):
        cp.l1_unstructured(tied.lm_head, "weight", 1)
    attention = nn.MultiheadAttention(4, 2)  # its out_proj's parent is in the call's tree
    cp.global_unstructured([(attention, "in_proj_weight"), (attention.out_proj, "weight")],
                           cp.L1Unstructured, amount=5)
    assert any(type(hook).__name__ == "RefreshChild"
               for hook in attention._forward_pre_hooks.values())


# --- global pruning prunes every user of a tied weight alike ----------------------------------

NAMES = {"embedding": "embedding.weight", "linear": "linear.weight", "lm_head": "embedding.weight"}


def global_pairs(model: Any, order: tuple[str, ...] = ("embedding", "linear", "lm_head")
                 ) -> list[tuple[nn.Module, str]]:
    return [(getattr(model, name), "weight") for name in order]


@pytest.mark.parametrize("amount", [0.3, 40, 0.75])
@pytest.mark.parametrize("order", [("embedding", "linear", "lm_head"), ("lm_head", "linear", "embedding")])
def test_global_prunes_every_user_alike_like_the_functional_api(
    amount: float, order: tuple[str, ...]
) -> None:
    hooked, functional = twins(TiedLM)
    masks: dict[str, Tensor] | None = None
    for _ in range(2):  # twice, as Lightning's ModelPruning does every epoch
        cp.global_unstructured(global_pairs(hooked, order), cp.L1Unstructured, amount=amount)
        plan = fp.global_unstructured([NAMES[name] for name in order], fp.L1Unstructured(amount))
        masks = plan(dict(functional.named_parameters()), masks=masks)
        assert hooked.lm_head.weight_orig is hooked.embedding.weight_orig  # still tied
        assert torch.equal(hooked.lm_head.weight_mask, hooked.embedding.weight_mask)
        assert torch.equal(hooked.embedding.weight_mask.bool(), masks["embedding.weight"])
        assert torch.equal(hooked.linear.weight_mask.bool(), masks["linear.weight"])
        assert_same_step(hooked_step(hooked), functional_step(functional, masks))
    assert cp.masks_from_module(hooked).keys() == {"embedding.weight", "linear.weight"}


def test_global_counts_a_tied_weight_once_where_torch_counts_it_twice() -> None:
    ours, theirs = twins(TiedLM)
    for lib, model in ((cp, ours), (tp, theirs)):
        lib.global_unstructured(global_pairs(model), lib.L1Unstructured, amount=30)
    pruned = int((ours.embedding.weight_mask == 0).sum() + (ours.linear.weight_mask == 0).sum())
    assert pruned == 30  # 66 + 36 distinct entries ranked, 30 of them pruned
    assert int(sum((getattr(theirs, n).weight_mask == 0).sum() for n in NAMES)) == 30
    assert theirs.lm_head.weight_orig is theirs.embedding.weight_orig  # torch hooks both too


def test_torch_may_give_the_users_of_a_tied_weight_different_masks() -> None:
    differ = 0
    for seed in range(20):
        torch.manual_seed(seed)
        model: Any = TiedLM()
        tp.global_unstructured(global_pairs(model), tp.L1Unstructured, amount=0.5)
        differ += not torch.equal(model.embedding.weight_mask, model.lm_head.weight_mask)
    assert differ > 0  # the cut falls between the two copies of an entry (documented)


def test_global_refuses_a_user_left_out() -> None:
    model: Any = TiedLM()
    known_tie(cp, model)
    before = fingerprint(model)
    with pytest.raises(ValueError, match="^global_unstructured: cannot prune 'weight' of Linear: "
                       ".* of type Embedding \\(as 'weight'\\)"):
        cp.global_unstructured(global_pairs(model, ("linear", "lm_head")),
                               cp.L1Unstructured, amount=3)
    assert_same_fingerprint(before, fingerprint(model))


def test_global_refuses_users_pruned_differently_before() -> None:
    model: Any = TiedLM()
    tp.l1_unstructured(model.lm_head, "weight", 5)  # torch prunes one user
    before = fingerprint(model)
    with pytest.raises(ValueError, match="^global_unstructured: Embedding.weight and "
                       "Linear.weight are one \\(tied\\) Parameter with different masks"):
        cp.global_unstructured(global_pairs(model), cp.L1Unstructured, amount=3)
    assert_same_fingerprint(before, fingerprint(model))


def test_global_refuses_different_scores_for_one_tied_weight() -> None:
    model: Any = TiedLM()
    scores = {(model.embedding, "weight"): torch.rand(11, 6), (model.lm_head, "weight"): torch.rand(11, 6)}
    with pytest.raises(ValueError, match="one tied Parameter, different scores"):
        cp.global_unstructured(global_pairs(model), cp.L1Unstructured, importance_scores=scores,
                               amount=3)
    same = {(model.lm_head, "weight"): scores[(model.embedding, "weight")]}
    cp.global_unstructured(global_pairs(model), cp.L1Unstructured, importance_scores=same, amount=3)
    kept = model.embedding.weight_mask.bool()
    assert torch.equal(kept, model.lm_head.weight_mask.bool())
    assert bool((scores[(model.embedding, "weight")][~kept].max()
                 <= scores[(model.embedding, "weight")][kept].min()))


# --- remove makes every holder of a tied weight permanent together ---------------------------------


def tie_pruned(how: str) -> tuple[Any, Tensor, Tensor]:
    """A TiedLM whose tie compat pruned in both holders (and its linear weight), with its unpruned values and mask."""
    model: Any = TiedLM()
    orig = model.embedding.weight.detach().clone()
    if how == "global_unstructured":
        cp.global_unstructured(global_pairs(model), cp.L1Unstructured, amount=30)
    else:
        cp.install_masks_(model, random_masks(6))
    mask = model.embedding.weight_mask.clone()
    assert mask.min() == 0 and torch.equal(mask, model.lm_head.weight_mask)
    return model, orig, mask


def assert_tied_and_plain(model: Any, values: Tensor) -> None:
    """Both holders hold one plain Parameter with ``values``: no hook, no ``weight_orig``, no ``weight_mask``."""
    for holder in (model.embedding, model.lm_head):
        assert not any(isinstance(h, tp.BasePruningMethod) for h in holder._forward_pre_hooks.values())
        assert [k for k, p in holder._parameters.items() if p is not None] == ["weight"]
        assert "weight_mask" not in holder._buffers
        assert "weight" not in vars(holder)  # no plain attribute left behind
    assert type(model.embedding.weight) is nn.Parameter and model.lm_head.weight is model.embedding.weight
    assert torch.equal(model.embedding.weight.detach(), values)


@pytest.mark.parametrize("holder", ["lm_head", "embedding"])
@pytest.mark.parametrize("how", ["global_unstructured", "install_masks_"])
def test_remove_on_one_holder_of_a_tied_weight_removes_every_holder(how: str, holder: str) -> None:
    model, orig, mask = tie_pruned(how)
    weight_orig = model.embedding.weight_orig
    linear_mask = model.linear.weight_mask.clone()
    assert cp.remove(getattr(model, holder), "weight") is getattr(model, holder)
    assert_tied_and_plain(model, orig * mask)
    assert model.embedding.weight is weight_orig  # the very Parameter (an optimizer's stays valid)
    assert torch.equal(model.linear.weight_mask, linear_mask)  # the other pruned tensor is left as it was
    # training updates one tensor that both holders read, as on a plain tied model holding the pruned values
    reference: Any = TiedLM()
    with torch.no_grad():
        reference.embedding.weight.copy_(orig * mask)
        reference.linear.weight.copy_(model.linear.weight_orig)
        reference.linear.bias.copy_(model.linear.bias)
    opt_a = torch.optim.SGD(model.parameters(), lr=0.5)
    opt_b = torch.optim.SGD(reference.parameters(), lr=0.5)
    for _ in range(2):
        assert_same_step(hooked_step(model, opt_a), functional_step(reference, {"linear.weight": linear_mask.bool()},
                                                                    opt_b))  # fmt: skip
        assert model.lm_head.weight is model.embedding.weight


def test_a_loop_removing_every_pair_pruned_works_as_with_torch() -> None:
    """``for module, name in pairs: remove(module, name)`` after a global call: each holder's own remove passes."""
    model, orig, mask = tie_pruned("global_unstructured")
    linear = model.linear.weight_orig.detach() * model.linear.weight_mask
    for module, name in global_pairs(model):
        cp.remove(module, name)
    assert_tied_and_plain(model, orig * mask)
    assert torch.equal(model.linear.weight.detach(), linear) and not cp.is_pruned(model)
    with pytest.raises(ValueError, match="has to be pruned before pruning can be removed"):
        cp.remove(model.lm_head, "weight")  # once each, as in torch


def test_a_removal_with_a_tie_counts_only_until_the_holder_is_pruned_again() -> None:
    model, _, _ = tie_pruned("global_unstructured")
    cp.remove(model.lm_head, "weight")  # the embedding's pruning goes with it
    cp.global_unstructured(global_pairs(model), cp.L1Unstructured, amount=30)  # pruned again
    for holder in (model.embedding, model.lm_head):  # made permanent hook by hook, as Lightning does
        for key, hook in list(holder._forward_pre_hooks.items()):
            hook.remove(holder)
            del holder._forward_pre_hooks[key]
    with pytest.raises(ValueError, match="has to be pruned before pruning can be removed"):
        cp.remove(model.embedding, "weight")


def test_remove_refuses_holders_of_a_tie_with_different_masks_and_changes_nothing() -> None:
    model: Any = TiedLM()
    known_tie(cp, model)  # compat hooks both (masks of ones)
    tp.custom_from_mask(model.lm_head, "weight", random_masks(7)["embedding.weight"])  # torch: this one only
    before = fingerprint(model)
    with pytest.raises(ValueError) as info:
        cp.remove(model.embedding, "weight")
    message = str(info.value)
    assert message.startswith("remove: cannot remove the pruning of 'weight' of Embedding: the Parameter is tied: "
                              "also pruned in a module of type Linear (as 'weight'), with another mask")  # fmt: skip
    assert "torch.nn.utils.prune.remove removes one holder at a time" in message
    assert_same_fingerprint(before, fingerprint(model))
    assert model.lm_head.weight_orig is model.embedding.weight_orig


def test_a_failing_removal_of_a_tie_leaves_every_holder_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _, _ = tie_pruned("install_masks_")
    before = fingerprint(model)
    calls: list[nn.Module] = []
    remove = cp.CustomFromMask.remove

    def failing(self: Any, module: nn.Module) -> None:
        calls.append(module)
        if len(calls) == 2:  # the second holder: the first is already plain
            raise RuntimeError("boom")
        remove(self, module)

    monkeypatch.setattr(cp.CustomFromMask, "remove", failing)
    with pytest.raises(RuntimeError, match="boom"):
        cp.remove(model.lm_head, "weight")
    assert len(calls) == 2
    assert_same_fingerprint(before, fingerprint(model))


def test_a_tie_compat_cannot_see_is_removed_from_one_holder_as_in_torch() -> None:
    """A tie pruned by torch, never seen by compat: remove acts on the holder given, as torch's does."""
    ours, theirs = twins(TiedLM)
    for model in (ours, theirs):
        tp.global_unstructured(global_pairs(model), tp.L1Unstructured, amount=30)
    cp.remove(ours.lm_head, "weight")
    tp.remove(theirs.lm_head, "weight")
    assert_same_state(theirs, ours)
    assert cp.is_pruned(ours.embedding)


# --- the bridge checks its module argument ---------------------------------------------------

BRIDGE: dict[str, Callable[[Any], Any]] = {
    "masks_from_module": cp.masks_from_module,
    "install_masks_": lambda module: cp.install_masks_(module, {"weight": torch.ones(1)}),
    "unprune_": cp.unprune_,
}


@pytest.mark.parametrize("fn", list(BRIDGE))
@pytest.mark.parametrize("module", [None, {"weight": torch.ones(1)}])
def test_bridge_functions_need_a_module(fn: str, module: object) -> None:
    expected = f"{fn}: module must be a torch.nn.Module, got {type(module).__name__}"
    with pytest.raises(TypeError, match=f"^{expected}$"):
        BRIDGE[fn](module)
