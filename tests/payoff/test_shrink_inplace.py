"""``fp.shrink(..., inplace=True)``: the model itself made the smaller model shrink copies, bit for bit.

Each tensor that loses indices is cut into its own object (a Parameter
stays the object a dict of parameters holds) and its old values freed;
the masked model of the check is the model itself, its zeros written. The
result is compared with the copy ``shrink`` returns: the same state dict
bit for bit, the same config, the same attributes. What it cannot do (a
check that fails, blocks and hidden channels) is an error, said before
anything changes where it can be.
"""

from __future__ import annotations

import copy
import gc
import warnings
import weakref
from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from _hf import ARCHITECTURES, MATRIX, inputs, logits, masked_logits, tiny
from hypothesis import given, settings
from test_shrink import LeNetView
from torch import nn

import funcprune as fp
from funcprune._graph import as_inputs, remembered

Tensor = torch.Tensor
#: Run by default: a Llama (KV groups, MLP channels); GPT-2 (Conv1D, heads), Qwen2-MoE (routed experts, a shared
#: expert) and the rest of the matrix under the ci profile (the default run's 5 minutes).
DEFAULT = ("llama",)
EVERY = [pytest.param(n, marks=() if n in DEFAULT else pytest.mark.ci) for n in (*MATRIX, "qwen2_moe", *ARCHITECTURES)]


def _bits(t: Tensor) -> Tensor:
    return t.view(torch.uint8) if t.is_floating_point() else t


def _same_state(a: nn.Module, b: nn.Module) -> bool:
    mine, theirs = a.state_dict(), b.state_dict()
    return mine.keys() == theirs.keys() and all(
        mine[k].shape == theirs[k].shape and torch.equal(_bits(mine[k].contiguous()), _bits(theirs[k].contiguous()))
        for k in mine
    )


def _settings(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Each module's plain int and int-tuple attributes (its sizes, head counts...)."""
    return {
        path: {k: v for k, v in vars(m).items() if isinstance(v, (int, tuple)) and not k.startswith("_")}
        for path, m in model.named_modules()
    }


def _owns_its_storage(t: Tensor) -> bool:
    """Whether ``t`` holds no more memory than its own entries (not a view of a larger, older tensor)."""
    return t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _unit_masks(model: nn.Module, x: Any) -> fp.Masks:
    """One unit of each group pruned (channels, heads, KV groups, experts; no blocks, no hidden channels)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fp.UnitsLeftOutWarning)
        s = fp.structure(model, x)
    kinds: tuple[fp.Kind, ...] = ("channels", "heads", "kv_groups", "experts")
    return fp.structured(s, fp.LnStructured(1, n=2), scope="group", kinds=kinds)(dict(model.named_parameters()))


@pytest.mark.parametrize("name", EVERY)
def test_the_model_itself_becomes_the_copy_shrink_returns(name: str) -> None:
    t = tiny(name)
    x = inputs(t)
    model: Any = t.model
    masks = _unit_masks(model, x)
    want: Any = fp.shrink(model, masks, x)
    masked = masked_logits(model, masks, x)
    held = dict(model.named_parameters(remove_duplicate=False))  # what an optimizer would hold
    old = {id(p): weakref.ref(p.untyped_storage()) for p in held.values()}  # (each old tensor's memory)
    shapes = {n: p.shape for n, p in held.items()}
    got: Any = fp.shrink(model, masks, x, inplace=True)
    assert got is model
    now = dict(got.named_parameters(remove_duplicate=False))
    assert now.keys() == held.keys() and all(now[n] is held[n] for n in held)  # the same objects, cut
    assert _same_state(got, want) and _settings(got) == _settings(want)
    assert got.config.to_dict() == want.config.to_dict()
    torch.testing.assert_close(logits(got, x), masked, atol=1e-5, rtol=1e-5)
    cut = [n for n in held if held[n].shape != shapes[n]]
    assert cut and all(_owns_its_storage(held[n]) for n in cut)
    gc.collect()
    assert all(old[id(held[n])]() is None for n in cut)  # the old values freed, nothing holding them


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in DEFAULT else pytest.mark.ci)
                                  for n in ("llama", "gpt2", "qwen2_moe")])  # fmt: skip
def test_unchecked_in_place_is_the_checked_copy(name: str) -> None:
    t = tiny(name)
    x = inputs(t)
    masks = _unit_masks(t.model, x)
    want: Any = fp.shrink(t.model, masks, x)
    got: Any = fp.shrink(t.model, masks, x, check=False, inplace=True)
    assert id(got) == id(t.model) and _same_state(got, want) and got.config.to_dict() == want.config.to_dict()


def test_a_structure_of_the_model_is_not_taken_back_once_it_is_cut() -> None:
    t = tiny("llama")
    x = inputs(t)
    s = fp.structure(t.model, x)
    masks = fp.structured(s, fp.LnStructured(1, n=2), scope="group", kinds="channels")(dict(t.model.named_parameters()))
    memo: Any = s._analyzed
    assert remembered("shrink", t.model, as_inputs("shrink", t.model, x), memo) is memo.analysis  # (valid before)
    fp.shrink(t.model, masks, x, structure=s, inplace=True)
    assert remembered("shrink", t.model, as_inputs("shrink", t.model, x), memo) is not memo.analysis


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 10), nn.ReLU(), nn.Linear(10, 3))


def test_unstructured_zeros_that_stay_are_written_into_the_model_s_tensors() -> None:
    model = _mlp()
    params = dict(model.named_parameters())
    masks = fp.compose(fp.Plan({"0.weight": fp.LnStructured(0.5, n=2, dim=0)}),
                       fp.Plan({"2.weight": fp.L1Unstructured(0.4), "4.weight": fp.L1Unstructured(0.3)}))(params)  # fmt: skip
    x = torch.randn(5, 6)
    kept = masks["0.weight"].any(1)  # the hidden units of layer 0 that stay
    for check in (True, False):
        other: Any = copy.deepcopy(model)
        want = fp.shrink(other, masks, x)
        got: Any = fp.shrink(other, masks, x, check=check, inplace=True)
        assert got is other and _same_state(got, want)
        assert torch.equal(got[2].weight == 0, ~masks["2.weight"][:, kept])  # the zeros that stay, and no others
        assert torch.equal(got[4].weight == 0, ~masks["4.weight"])
    assert _same_state(model, _mlp())  # the given model was a copy each time: untouched


def test_a_check_that_fails_in_place_is_an_error_that_says_the_model_is_cut() -> None:
    torch.manual_seed(0)
    model = LeNetView()  # view(-1, 6 * 3 * 3): the check fails where channels go
    mask = torch.ones(6, 3, 3, 3, dtype=torch.bool)
    mask[:2] = False
    x = torch.randn(2, 3, 8, 8)
    with pytest.warns(fp.KeptChannelsWarning, match="removing them changes the model's outputs"):
        kept = fp.shrink(model, {"conv.weight": mask}, x)  # the copy: searched, the channels kept
    assert kept.conv.out_channels == 6
    with pytest.raises(ValueError, match=r"shrink: the smaller model differs from the masked model on the example "
                                         r"inputs \(RuntimeError: shape .*\); with inplace=True the module was cut "
                                         r"already, .* left cut and unchecked"):  # fmt: skip
        fp.shrink(model, {"conv.weight": mask}, x, inplace=True)
    assert model.conv.out_channels == 4


def test_a_masked_model_that_fails_in_place_is_an_error_that_says_what_was_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from funcprune._payoff import _smaller

    def fails(*args: object, **kwargs: object) -> None:
        raise RuntimeError("out of memory\nmore")

    model: Any = _mlp()
    masks = fp.Plan({"0.weight": fp.LnStructured(0.5, n=2, dim=0)})(dict(model.named_parameters()))
    monkeypatch.setattr(_smaller, "masked_run", fails)
    with pytest.raises(ValueError, match=r"^shrink: the masked model failed on the example inputs \(RuntimeError: "
                                         r"out of memory\); with inplace=True, the masks' zeros may be written into "
                                         r"the module's tensors already \(nothing was cut\)$"):  # fmt: skip
        fp.shrink(model, masks, torch.randn(2, 6), inplace=True)
    assert model[0].weight.shape == (12, 6)
    assert torch.equal(model[0].weight == 0, ~masks["0.weight"].expand(12, 6))  # the masked model: zeros, not cut


def test_blocks_and_hidden_channels_are_refused_before_anything_changes() -> None:
    t = tiny("llama", layers=4)
    x = inputs(t)
    model: Any = t.model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fp.UnitsLeftOutWarning)
        s = fp.structure(t.model, x)
    params = dict(t.model.named_parameters())
    before = {n: p.detach().clone() for n, p in params.items()}
    config = model.config.to_dict()
    scores = torch.ones(s["model.layers"].size, dtype=torch.float64)
    scores[1] = 0.0
    blocks = fp.structured(s, fp.LnStructured(1, n=2), kinds="layers")(params, unit_scores={"model.layers": scores})
    hidden = fp.structured(s, fp.LnStructured(8, n=2), kinds="hidden")(params)
    for masks, what in ((blocks, r"blocks model\.layers\.1"), (hidden, "8 hidden channels")):
        with pytest.raises(ValueError, match=rf"shrink: inplace=True cuts the module's own tensors, but the masks "
                                             rf"remove {what}, which makes a new model.*nothing was changed"):  # fmt: skip
            fp.shrink(t.model, masks, x, inplace=True)
        now = dict(t.model.named_parameters())
        assert all(now[n] is params[n] and torch.equal(now[n], before[n]) for n in params)
        assert model.config.to_dict() == config


def test_inplace_must_be_a_bool() -> None:
    model = _mlp()
    with pytest.raises(TypeError, match=r"shrink: inplace must be a bool, got 'yes'"):
        fp.shrink(model, {}, torch.randn(1, 6), inplace="yes")  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 70), min_size=1, max_size=3), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))  # fmt: skip
def test_zeroed_into_its_own_tensor_is_zeroed_into_a_new_one(shape: list[int], seed: int, dtype: torch.dtype) -> None:
    """``zeroed(t, mask, out=t)`` (the in-place cut's and the in-place masked model's) gives the bits of
    ``zeroed(t, mask)``: ``+0.0`` where the mask prunes, even over ``nan``, ``-0.0`` and ``-inf``."""
    from funcprune._payoff._smaller import _CHUNK_ENTRIES, zeroed

    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g).to(dtype)
    flat = t.view(-1)
    flat[: min(3, flat.numel())] = torch.tensor([float("nan"), -0.0, float("-inf")], dtype=dtype)[: min(3, flat.numel())]
    mask = torch.rand(shape, generator=g) > 0.5
    want = zeroed(t, mask)
    zeroed(t, mask, out=t)
    assert torch.equal(_bits(t), _bits(want))
    big = torch.randn(_CHUNK_ENTRIES + 5, generator=g)  # more than one chunk
    m = torch.rand(big.shape, generator=g) > 0.5
    want = zeroed(big, m)
    assert torch.equal(_bits(zeroed(big, m, out=big)), _bits(want))
