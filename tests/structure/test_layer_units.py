"""Whole layers as units (issue 38, depth): a pruned layer unit is the dense model without that block, and
shrink removes it with a config that plain ``from_pretrained`` reloads, the cache and ``generate()`` working."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from _hf import Tiny, greedy_masked, inputs, logits, masked_logits, shrunk_exactly, tiny, transformers
from torch import nn

import funcprune as fp

#: The decoders the issue names, each of 4 layers: Llama, Qwen3, Mistral, Gemma 3 (sliding and full layers in
#: ``layer_types``: the optipfair#20 case), Mixtral and GPT-2.
DECODERS = ("llama", "qwen3", "mistral", "gemma3", "mixtral", "gpt2")
STACK = {"gpt2": "transformer.h"}


def _stack(name: str) -> str:
    return STACK.get(name, "model.layers")


def _quiet_structure(model: nn.Module, x: Any) -> fp.Structure:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fp.UnitsLeftOutWarning)
        return fp.structure(model, x)


def _without_block(model: nn.Module, path: str, block: int) -> Any:
    """A forward hook that makes block ``block`` of the stack at ``path`` pass its hidden states through: the dense
    model without that block, computed without funcprune."""
    module: Any = model.get_submodule(path)
    module = module[block]

    def skip(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        hidden = args[0] if args else kwargs["hidden_states"]
        return (hidden, *out[1:]) if isinstance(out, tuple) else hidden

    return module.register_forward_hook(skip, with_kwargs=True)


def _layer_masks(s: fp.Structure, params: fp.Params, path: str, blocks: list[int]) -> fp.Masks:
    group = s[path]
    scores = torch.ones(group.size, dtype=torch.float64)
    scores[blocks] = 0.0
    plan = fp.structured(s, fp.LnStructured(len(blocks), n=2), kinds="layers")
    return plan(params, unit_scores={path: scores})


@pytest.mark.parametrize("name", DECODERS)
def test_a_pruned_layer_unit_is_the_dense_model_without_that_block(name: str) -> None:
    t = tiny(name, layers=4)
    x = inputs(t)
    s = _quiet_structure(t.model, x)
    path = _stack(name)
    assert s[path].kind == "layers" and s[path].size == 4 and s[path].least == 1
    params = dict(t.model.named_parameters())
    for block in (0, 2):
        masks = _layer_masks(s, params, path, [block])
        prefix = f"{path}.{block}."
        assert {n for n, m in masks.items() if not m.any()} == {n for n in params if n.startswith(prefix)}
        assert all(bool(m.all()) for n, m in masks.items() if not n.startswith(prefix))
        handle = _without_block(t.model, path, block)
        try:
            without = logits(t.model, x)
        finally:
            handle.remove()
        torch.testing.assert_close(masked_logits(t.model, masks, x), without, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", DECODERS)
def test_shrink_removes_the_blocks_and_a_plain_reload_generates_with_a_cache(name: str, tmp_path: Path) -> None:
    t = tiny(name, layers=4)
    x = inputs(t)
    s = _quiet_structure(t.model, x)
    path = _stack(name)
    masks = _layer_masks(s, dict(t.model.named_parameters()), path, [0, 2])
    small: Any = shrunk_exactly(t.model, masks, x)
    assert len(small.get_submodule(path)) == 2
    config = small.config
    assert config.num_hidden_layers == 2
    before: Any = t.model.config
    if getattr(before, "layer_types", None) is not None:  # sliced, as optipfair#20 needed
        assert config.layer_types == [before.layer_types[i] for i in (1, 3)]
    assert not hasattr(config, "funcprune_shrunk")
    small.save_pretrained(tmp_path)
    cls: Any = type(t.model)
    again = cls.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(logits(again, x), logits(small, x), atol=0, rtol=0)
    ids = t.args[0][:1, :5]
    with torch.no_grad():
        cached = again.generate(ids, max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
        uncached = again.generate(ids, max_new_tokens=6, do_sample=False, use_cache=False, pad_token_id=0)
        masked = greedy_masked(t.model, masks, ids, 6)
    assert torch.equal(cached, uncached) and torch.equal(cached, masked)


@pytest.mark.ci  # the default suite's 5 minutes (Gemma 3's sliding layers go by default, above): CI runs it
def test_qwen2_sliding_window_layers_are_counted_again() -> None:
    config = transformers.Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, use_sliding_window=True, sliding_window=4, max_window_layers=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    x = {"input_ids": torch.randint(0, 64, (2, 9)), "use_cache": False}
    s = _quiet_structure(model, x)
    masks = _layer_masks(s, dict(model.named_parameters()), "model.layers", [0])
    small: Any = shrunk_exactly(model, masks, x)
    assert small.config.max_window_layers == 1
    assert small.config.layer_types == config.layer_types[1:]


@pytest.mark.parametrize("name", ["bert", "opt"])
def test_post_norm_blocks_are_refused_by_name_and_stay_in_shrink(name: str) -> None:
    t = tiny(name, layers=2)
    x = inputs(t)
    if name == "opt":  # OPT-350m's placement: the norm after the residual add
        config: Any = t.model.config
        config.do_layer_norm_before = False
        torch.manual_seed(0)
        t = Tiny(name, transformers.OPTForCausalLM(config).eval(), t.args, t.kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = fp.structure(t.model, x)
    assert not s.of_kinds("layers")
    said = " ".join(str(w.message) for w in caught if issubclass(w.category, fp.UnitsLeftOutWarning))
    assert "(layers): removing the block changes what the model computes (a zeroed post-norm block" in said
    params = dict(t.model.named_parameters())
    path = "bert.encoder.layer" if name == "bert" else "model.decoder.layers"
    masks = {n: torch.zeros_like(p, dtype=torch.bool) for n, p in params.items() if n.startswith(f"{path}.0.")}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        small = fp.shrink(t.model, masks, x)
    kept = [str(w.message) for w in caught if issubclass(w.category, fp.KeptChannelsWarning)]
    assert any("1 block whose every parameter the masks prune stays" in k and f"'{path}.0'" in k for k in kept), kept
    assert len(list(small.get_submodule(path).children())) == 2
    torch.testing.assert_close(logits(small, x), masked_logits(t.model, masks, x), atol=1e-5, rtol=1e-5)


class _Residual(nn.Module):
    """A ResNet-like block: ``relu(bn(conv(x)) + skip)``, the skip a 1x1 conv where the widths differ."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.down = nn.Conv2d(cin, cout, 1, bias=False) if cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = x if self.down is None else self.down(x)
        return torch.relu(self.bn(self.conv(x)) + skip)


def test_a_trial_checks_the_blocks_that_go_once_and_shrink_checks_them_with_every_mask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from funcprune._payoff._verify import mismatch

    torch.manual_seed(0)
    stack = nn.Sequential(_Residual(4, 8), _Residual(8, 8), _Residual(8, 8))
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), stack, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 2)).eval()  # fmt: skip
    x = torch.randn(2, 3, 8, 8)
    checks: list[object] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        checks.append(args[0])
        return mismatch(*args, **kwargs)

    monkeypatch.setattr("funcprune._payoff._depth.mismatch", counted)  # depthless' checks alone
    s = fp.structure(model, x)
    assert s["2"].kind == "layers" and s["2"].size == 2  # the blocks of 8 channels; the first changes the width
    assert len(checks) == 1  # the trial's blocks that go, checked once: not again with the first block zeroed
    checks.clear()
    masks = {n: torch.zeros_like(p, dtype=torch.bool) for n, p in model.named_parameters() if n.startswith(("2.0.", "2.1."))}
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        small: Any = fp.shrink(model, masks, x)
    assert any("'2.0'" in str(w.message) for w in said if w.category is fp.KeptChannelsWarning)  # it stays
    assert len(checks) == 2  # shrink: without the first block's masks, then with every mask
    assert len(small[2]) == 2
    masked = fp.functional_call_masked(model, dict(model.named_parameters()), masks, (x,))
    torch.testing.assert_close(small(x), masked, rtol=1e-4, atol=1e-6)
