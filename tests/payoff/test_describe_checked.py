"""A shrunk transformers model's config is made to describe it and checked in one run; a model that reads a width
off its config as it runs keeps its config, with a record.

``shrink`` makes the config describe the smaller model, then runs it
against the masked model: where they agree, that one run checks both the
removal and the config. Where the described config changes what the model
computes (a module that reads ``config.intermediate_size`` as it runs), the
config is put back, the model is checked with it, and it gets a record that
``load_shrunk`` reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _hf import inputs, logits, masked_logits, tiny

import funcprune as fp
from funcprune._payoff import _verify

Tensor = torch.Tensor


def _channels_masks(t: Any) -> fp.Masks:
    s = fp.structure(t.model, inputs(t))
    return fp.structured(s.of_kinds("channels"), fp.LnStructured(16, n=2), scope="group")(dict(t.model.named_parameters()))


def test_a_config_that_describes_the_model_is_checked_by_the_same_run(monkeypatch: pytest.MonkeyPatch) -> None:
    t = tiny("llama")
    width = getattr(t.model, "config").intermediate_size
    masks = _channels_masks(t)
    runs: list[Any] = []
    in_eval = _verify._in_eval

    def counted(module: Any, x: Any) -> Any:
        runs.append(module)
        return in_eval(module, x)

    monkeypatch.setattr(_verify, "_in_eval", counted)
    small: Any = fp.shrink(t.model, masks, inputs(t))
    assert len(runs) == 1  # the smaller model, run once (the masked model runs through functional_call)
    assert small.config.intermediate_size == width - 16
    assert "funcprune_shrunk" not in small.config.to_dict()
    torch.testing.assert_close(logits(small, inputs(t)), masked_logits(t.model, masks, inputs(t)), rtol=1e-4, atol=1e-5)


def test_a_model_reading_a_width_off_its_config_keeps_the_config_with_a_record(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from transformers.models.llama import modeling_llama

    def forward(self: Any, x: Tensor) -> Tensor:  # scales by the width the config says, as it runs
        out: Tensor = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x)) / self.config.intermediate_size
        return out

    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", forward)
    t = tiny("llama")
    width = getattr(t.model, "config").intermediate_size
    masks = _channels_masks(t)
    small: Any = fp.shrink(t.model, masks, inputs(t))
    assert small.config.intermediate_size == width  # described, it computed otherwise
    assert "funcprune_shrunk" in small.config.to_dict()
    assert small.model.layers[0].mlp.down_proj.in_features == width - 16
    torch.testing.assert_close(logits(small, inputs(t)), masked_logits(t.model, masks, inputs(t)), rtol=1e-4, atol=1e-5)
    small.save_pretrained(tmp_path)
    again = fp.load_shrunk(tmp_path)
    torch.testing.assert_close(logits(again, inputs(t)), logits(small, inputs(t)), rtol=0, atol=0)
