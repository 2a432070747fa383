"""The hidden size as units (issue 38, width): a model's residual-stream channels go, with every RMS norm that spans
them corrected so that the smaller model computes the masked one, and a config that plain ``from_pretrained``
reloads; LayerNorm models refused by name; depth, hidden size and the widths inside blocks in one plan."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from _hf import greedy_masked, inputs, logits, masked_logits, shrunk_exactly, tiny
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import funcprune as fp

#: The models whose hidden size goes exactly: RMS norms ``x * w`` (Llama, Mistral, Mixtral, Qwen3, whose per-head
#: q/k norms read the same eps and get their input scaled instead) and Gemma 3 (``x * (1 + w)``, post-norms, an
#: embedding scaled by ``sqrt(hidden_size)``, tied to the LM head).
EXACT = ("llama", "qwen3", "mistral", "mixtral", "gemma3")


def _structure(model: nn.Module, x: Any) -> fp.Structure:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fp.UnitsLeftOutWarning)
        return fp.structure(model, x)


class GemmaNorm(nn.Module):
    """An RMS norm of Gemma's form, ``x * (1 + w)``."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)
        return out


class Block(nn.Module):
    def __init__(self, d: int, h: int, gemma: bool) -> None:
        super().__init__()
        self.norm: nn.Module = GemmaNorm(d, 1e-3) if gemma else nn.RMSNorm(d, eps=1e-3)
        self.up, self.down = nn.Linear(d, h), nn.Linear(h, d)
        self.post: nn.Module = GemmaNorm(d, 1e-3) if gemma else nn.Identity()  # Gemma's norm of the sublayer's output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.post(self.down(torch.tanh(self.up(self.norm(x)))))
        return out


class Tiny(nn.Module):
    """A float64 decoder of pre-norm (or Gemma-style pre- and post-norm) residual blocks, RMS norms in float64."""

    def __init__(self, d: int, h: int, blocks: int, gemma: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, d)
        self.layers = nn.ModuleList(Block(d, h, gemma) for _ in range(blocks))
        self.norm: nn.Module = GemmaNorm(d, 1e-3) if gemma else nn.RMSNorm(d, eps=1e-3)
        self.head = nn.Linear(d, 11, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        out: torch.Tensor = self.head(self.norm(x))
        return out


@settings(max_examples=6, deadline=None)
@given(d=st.integers(3, 12), gone=st.integers(1, 11), gemma=st.booleans(), seed=st.integers(0, 2**16))
def test_the_norms_correction_is_exact(d: int, gone: int, gemma: bool, seed: int) -> None:
    # rms over d' channels of x, eps * d/d', g(w) * sqrt(d/d') == rms over d channels of x with zeros, eps, g(w)
    gone = min(gone, d - 1)
    torch.manual_seed(seed)
    model = Tiny(d, 5, 2, gemma).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    ids = torch.randint(0, 11, (2, 6))
    s = _structure(model, ids)
    group = s["hidden"]
    assert group.kind == "hidden" and group.size == d
    assert {m.name for m in group.members} >= {"embed.weight", "norm.weight", "head.weight", "layers.0.norm.weight"}
    scores = torch.randperm(d, generator=torch.Generator().manual_seed(seed)).double()
    masks = fp.structured(s, fp.LnStructured(gone, n=2), kinds="hidden")(
        dict(model.named_parameters()), unit_scores={"hidden": scores}
    )
    small = fp.shrink(model, masks, ids)
    assert small.embed.weight.shape == (11, d - gone)
    with torch.no_grad():
        want = fp.functional_call_masked(model, dict(model.named_parameters()), masks, ids)
        torch.testing.assert_close(small(ids), want, atol=1e-12 * float(want.abs().max()), rtol=0)
    norm: Any = small.norm
    assert math.isclose(norm.eps, 1e-3 * d / (d - gone))


@pytest.mark.parametrize("name", EXACT)
def test_hidden_channels_go_and_a_plain_reload_generates_with_a_cache(name: str, tmp_path: Path) -> None:
    t = tiny(name, layers=2)
    x = inputs(t)
    s = _structure(t.model, x)
    params = dict(t.model.named_parameters())
    scores = torch.rand(32, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    masks = fp.structured(s, fp.LnStructured(0.25, n=2), kinds="hidden")(params, unit_scores={"hidden": scores})
    small: Any = shrunk_exactly(t.model, masks, x)
    assert small.config.hidden_size == 24
    before: Any = t.model.config
    assert math.isclose(small.config.rms_norm_eps, before.rms_norm_eps * 32 / 24)
    assert not hasattr(small.config, "funcprune_shrunk")
    small.save_pretrained(tmp_path)
    cls: Any = type(t.model)
    again = cls.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(logits(again, x), masked_logits(t.model, masks, x), atol=1e-5, rtol=1e-5)
    dense: Any = t.model
    tied = dense.get_output_embeddings().weight is dense.get_input_embeddings().weight
    for m in (small, again):  # tied embeddings (Gemma 3's) stay tied
        assert (m.get_output_embeddings().weight is m.get_input_embeddings().weight) == tied
    ids = t.args[0][:1, :5]
    with torch.no_grad():
        cached = again.generate(ids, max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
        uncached = again.generate(ids, max_new_tokens=6, do_sample=False, use_cache=False, pad_token_id=0)
    assert torch.equal(cached, uncached) and torch.equal(cached, greedy_masked(t.model, masks, ids, 6))


@pytest.mark.parametrize(("name", "norm"), [("gpt2", "transformer.h.0.ln_1"), ("opt", "model.decoder"),
                                            ("bert", "bert.embeddings.LayerNorm"), ("vit", "vit.")])  # fmt: skip
def test_layernorm_models_are_refused_by_name(name: str, norm: str) -> None:
    t = tiny(name)
    s = _structure(t.model, inputs(t))
    assert not s.of_kinds("hidden")
    assert "centres by the mean" in s.left_out["hidden"] and norm in s.left_out["hidden"]
    with pytest.raises(ValueError, match=r"no 'hidden' group: '.*' \(LayerNorm\) centres by the mean"):
        fp.structured(s, fp.LnStructured(0.25, n=2), kinds="hidden")


@pytest.mark.parametrize("name", ["llama", pytest.param("mixtral", marks=pytest.mark.ci)])  # (the default's 5 minutes)
def test_depth_hidden_heads_channels_and_experts_go_in_one_plan(name: str, tmp_path: Path) -> None:
    t = tiny(name, layers=4)
    x = inputs(t)
    s = _structure(t.model, x)
    params = dict(t.model.named_parameters())
    batches = [{"input_ids": t.args[0]}]
    plan = fp.compose(
        fp.structured(s, fp.LnStructured(1, n=2), kinds="layers"),
        fp.structured(s, fp.LnStructured(8, n=2), kinds="hidden"),
        fp.structured(s, fp.LnStructured(0.25, n=2), kinds=("channels", "kv_groups", "experts"), scope="group"),
    )
    masks = plan(params, unit_scores={"model.layers": fp.layer_scores(t.model, batches),
                                      "hidden": fp.hidden_scores(t.model, batches)})  # fmt: skip
    small: Any = shrunk_exactly(t.model, masks, x)
    config = small.config
    assert (config.num_hidden_layers, config.hidden_size, config.num_key_value_heads) == (3, 24, 2)
    small.save_pretrained(tmp_path)
    cls: Any = type(t.model)
    again = cls.from_pretrained(tmp_path)
    torch.testing.assert_close(logits(again, x), logits(small, x), atol=0, rtol=0)


def test_stacked_experts_keep_hidden_widths_torch_cannot_run() -> None:
    # torch's grouped matmul (Mixtral's experts) needs widths in multiples of 16 bytes: 31 float32 channels fail
    t = tiny("mixtral")
    x = inputs(t)
    s = _structure(t.model, x)
    masks = fp.structured(s, fp.LnStructured(1, n=2), kinds="hidden")(dict(t.model.named_parameters()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        small: Any = fp.shrink(t.model, masks, x)
    said = [str(w.message) for w in caught if issubclass(w.category, fp.KeptChannelsWarning)]
    assert any("the hidden channels that the masks prune entirely stay" in m and "16 bytes" in m for m in said), said
    assert small.config.hidden_size == 32
    torch.testing.assert_close(logits(small, x), masked_logits(t.model, masks, x), atol=1e-5, rtol=1e-5)


def test_the_hidden_size_s_trial_cuts_no_mask_and_shrink_cuts_the_masks_it_was_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """structure's trial of one hidden channel prunes it in every member and checks the copy without it; its own
    masks, cut to the channels kept, would prune nothing: none is cut (a copy of every member's mask, saved).
    shrink still cuts every mask it was given, and its smaller model computes the masked one."""
    from funcprune._payoff import _hidden

    cut: list[tuple[int, ...]] = []
    real = vars(_hidden)["cut"]

    def spied(mask: torch.Tensor, dims: Any) -> torch.Tensor:
        cut.append(tuple(mask.shape))
        out: torch.Tensor = real(mask, dims)
        return out

    monkeypatch.setattr(_hidden, "cut", spied)
    torch.manual_seed(0)
    model = Tiny(6, 5, 2, False).double().eval()
    ids = torch.randint(0, 11, (2, 6))
    s = _structure(model, ids)
    assert s["hidden"].size == 6 and not cut
    masks = fp.structured(s, fp.LnStructured(2, n=2), kinds="hidden")(dict(model.named_parameters()))
    small = fp.shrink(model, masks, ids)
    assert len(cut) == len(masks) and small.embed.weight.shape == (11, 4)
    with torch.no_grad():
        want = fp.functional_call_masked(model, dict(model.named_parameters()), masks, ids)
        torch.testing.assert_close(small(ids), want, atol=1e-12 * float(want.abs().max()), rtol=0)


@pytest.mark.parametrize(
    "name", [n if n in ("llama", "gemma3", "mixtral") else pytest.param(n, marks=pytest.mark.ci) for n in EXACT]
)  # (the others alike in the default suite's 5 minutes: CI runs them)
def test_structure_writes_into_no_tensor_of_the_model_and_copies_none(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """structure's trials (a unit of every group, one hidden channel, one block of each kind) run on copies that
    share the model's tensors, cut to views where they can: no parameter is copied whole, and the corrections of
    the hidden size's trial (the norms' weights, Gemma's scaled, tied embedding) write into none of the model's."""
    t = tiny(name, layers=3)
    x = inputs(t)
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    copied: list[tuple[int, ...]] = []
    real = nn.Parameter.__deepcopy__

    def spied(self: nn.Parameter, memo: dict[int, Any]) -> nn.Parameter:
        copied.append(tuple(self.shape))
        result: nn.Parameter = real(self, memo)  # type: ignore[no-untyped-call]
        return result

    monkeypatch.setattr(nn.Parameter, "__deepcopy__", spied)
    s = _structure(t.model, x)
    assert s.of_kinds("hidden") and s.of_kinds("layers")
    assert copied == []
    after = t.model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():  # bit for bit (nan-safe)
        assert torch.equal(v.view(torch.uint8) if v.is_floating_point() else v, after[k].view(torch.uint8) if v.is_floating_point() else after[k]), k
