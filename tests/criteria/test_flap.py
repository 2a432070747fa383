"""FLAP without training (issue 40, item 3): input moments, the fluctuation metric, bias compensation, and export.

``fp.input_moments`` is checked against ``torch.var_mean`` of the inputs a
forward pre-hook of the test's own captured (padding left out), and against
FLAP's running ``BiasGPT`` (``_flap_reference.py``); ``fp.fluctuation``'s
rankings against FLAP's per-layer channel and head metric on the same
statistics; ``fp.compensate`` against FLAP's ``compress`` and its meaning (the
mean output of each compensated layer on the calibration tokens is the dense
layer's, float64, 1e-10); ``fp.with_biases`` + ``fp.shrink`` + ``save_pretrained``
against plain ``from_pretrained``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import funcprune as fp
from _hf import inputs, tiny, transformers

from _flap_reference import BiasGPT, compress_bias, head_metric, keep_ul, wifv

Tensor = torch.Tensor
OUTPUTS = ("self_attn.o_proj", "mlp.down_proj")


def _llama(dtype: torch.dtype = torch.float64) -> Any:
    return tiny("llama", seed=3).model.to(dtype)


def _batches(seed: int = 0, padded: bool = True) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(3):
        ids = torch.randint(0, 64, (2, 8), generator=g)
        mask = torch.ones(2, 8, dtype=torch.long)
        if padded:
            mask[1, 5 + i :] = 0  # right padding, a different amount per batch
        out.append({"input_ids": ids, "attention_mask": mask, "use_cache": False})
    return out


def _names(model: Any) -> list[str]:
    return [f"model.layers.{i}.{p}.weight" for i in range(len(model.model.layers)) for p in OUTPUTS]


def _captured(model: nn.Module, batches: list[dict[str, Any]], names: list[str]) -> dict[str, Tensor]:
    """The rows reaching each named weight's module on the real tokens, by a hook of the test's own."""
    rows: dict[str, list[Tensor]] = {n: [] for n in names}
    real: list[Tensor] = []

    def hook(name: str) -> Any:
        def grab(_: nn.Module, args: tuple[Tensor, ...]) -> None:
            rows[name].append(args[0].detach().reshape(-1, args[0].shape[-1])[real[0]].to(torch.float64))

        return grab

    handles = [model.get_submodule(n.rpartition(".")[0]).register_forward_pre_hook(hook(n)) for n in names]
    try:
        with torch.no_grad():
            for b in batches:
                real[:] = [b["attention_mask"].reshape(-1) != 0]
                model(**b)
    finally:
        for h in handles:
            h.remove()
    return {n: torch.cat(r) for n, r in rows.items()}


def test_input_moments_are_the_mean_and_sample_variance_of_the_real_tokens() -> None:
    model = _llama(torch.float32)
    names, batches = _names(model), _batches()
    moments = fp.input_moments(model, batches, names)
    seen = _captured(model, batches, names)
    assert list(moments) == names
    for name in names:
        var, mean = torch.var_mean(seen[name], dim=0, correction=1)
        m = moments[name]
        assert m.tokens == seen[name].shape[0] == 2 * 8 * 3 - (3 + 2 + 1)
        assert m.mean.dtype == m.var.dtype == torch.float64
        torch.testing.assert_close(m.mean, mean, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(m.var, var, rtol=1e-9, atol=1e-12)


@pytest.mark.ci  # the default suite's 5 minutes: CI runs it
def test_input_moments_give_flap_s_mean_and_the_variance_flap_approximates() -> None:
    """FLAP feeds one sample of equal length at a time: its mean is ours; its fluctuation approximates tokens x var."""
    model = _llama()
    samples = [{"input_ids": torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(i)),
                "use_cache": False} for i in range(40)]  # fmt: skip
    names = _names(model)
    moments = fp.input_moments(model, samples, names)
    seen = _captured(model, [{**s, "attention_mask": torch.ones(1, 8, dtype=torch.long)} for s in samples], names)
    for name in names:
        ref = BiasGPT(seen[name].shape[1])
        for sample in torch.split(seen[name], 8):
            ref.add_batch(sample)
        torch.testing.assert_close(moments[name].mean, ref.baseline_inp, rtol=1e-12, atol=1e-12)
        assert isinstance(ref.fluc_inp, Tensor)
        ratio = ref.fluc_inp / (8 * moments[name].var)  # its first sample left out, its mean updated first
        assert 0.8 < float(ratio.min()) and float(ratio.max()) < 1.0, ratio  # measured 0.83-0.94 (40 samples of 8)


def _structure(model: nn.Module) -> fp.Structure:
    x = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(9))
    return fp.structure(model, x)


@pytest.mark.ci  # the default suite's 5 minutes: CI runs it
def test_fluctuation_ranks_channels_and_kv_groups_as_flap_s_metric_per_layer() -> None:
    model = _llama()
    params = dict(model.named_parameters())
    names = _names(model)
    moments = fp.input_moments(model, _batches(), names)
    scores = {n: torch.zeros_like(p) for n, p in params.items()} | fp.fluctuation(params, moments)
    s = _structure(model)
    cases: tuple[tuple[fp.Kind, int], ...] = (("channels", 12), ("kv_groups", 1))
    for kind, count in cases:
        masks = fp.structured(s, fp.LnStructured(count, n=2), kinds=kind, scope="group")(params, scores=scores)
        for i in range(len(model.model.layers)):
            name = f"model.layers.{i}.{'mlp.down_proj' if kind == 'channels' else 'self_attn.o_proj'}.weight"
            w, var = params[name], moments[name].var
            if kind == "channels":
                expected = keep_ul(wifv(var, w), count)
            else:  # a KV group's query heads (2 of 8 channels here) summed, as FLAP sums a head's 128
                expected = keep_ul(head_metric(var, w, 16), count).repeat_interleave(16)
            assert torch.equal(masks[name].all(dim=0), expected), (name, kind)


def test_fluctuation_s_column_norms_are_wifv_for_linear_and_conv1d_layouts() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(5, 3, generator=g)
    var = torch.rand(3, generator=g, dtype=torch.float64)
    m = fp.Moments(torch.zeros(3, dtype=torch.float64), var, 10)
    linear = fp.fluctuation({"fc.weight": w}, {"fc.weight": m})["fc.weight"]
    conv1d = fp.fluctuation({"fc.weight": w.T.contiguous()}, {"fc.weight": fp.Moments(m.mean[:, None], var[:, None], 10)})["fc.weight"]
    torch.testing.assert_close(linear.norm(dim=0), wifv(var, w), rtol=1e-12, atol=0)
    torch.testing.assert_close(conv1d, linear.T, rtol=0, atol=0)


def _flap_masks(model: nn.Module, moments: dict[str, fp.Moments]) -> dict[str, Tensor]:
    params = dict(model.named_parameters())
    scores = {n: torch.zeros_like(p) for n, p in params.items()} | fp.fluctuation(params, moments)
    s = _structure(model)  # a quarter of each layer's MLP channels, one of its two KV groups
    channels = fp.structured(s, fp.LnStructured(12, n=2), kinds="channels", scope="group")
    kv_groups = fp.structured(s, fp.LnStructured(1, n=2), kinds="kv_groups", scope="group")
    return fp.compose(channels, kv_groups)(params, scores=scores)


def test_compensated_layers_keep_the_dense_mean_output_and_equal_flap_s_compress() -> None:
    model = _llama()
    names, batches = _names(model), _batches()
    params = dict(model.named_parameters())
    moments = fp.input_moments(model, batches, names)
    masks = _flap_masks(model, moments)
    new = fp.compensate(params, masks, moments)
    seen = _captured(model, batches, names)
    for name in names:
        w, bias = params[name], new[name[: -len("weight")] + "bias"]
        keep = masks[name].any(dim=0)
        assert not bool(keep.all())
        dense = (seen[name] @ w.T).mean(dim=0)
        masked = (seen[name] @ (w * masks[name]).T + bias).mean(dim=0)
        torch.testing.assert_close(masked, dense, rtol=0, atol=1e-10)
        torch.testing.assert_close(bias, compress_bias(moments[name].mean, keep, w), rtol=1e-12, atol=1e-12)
    assert all(new[n] is params[n] for n in params)  # the rest untouched


def test_compensate_adds_to_a_bias_and_leaves_unpruned_layers_alone() -> None:
    lin = nn.Linear(3, 2).double()
    params = dict(lin.named_parameters())
    m = {"weight": fp.Moments(torch.tensor([1.0, 2.0, 3.0]).double(), torch.ones(3).double(), 5)}
    keep = torch.tensor([[True, False, True]] * 2)
    new = fp.compensate(params, {"weight": keep}, m)
    torch.testing.assert_close(new["bias"], params["bias"] + 2.0 * params["weight"][:, 1].detach())
    assert fp.compensate(params, {"weight": torch.ones(2, 3, dtype=torch.bool)}, m)["bias"] is params["bias"]
    assert fp.compensate(params, {}, m)["bias"] is params["bias"]


@pytest.mark.ci  # a shrink and a reload: CI runs it (the default suite's 5 minutes)
def test_a_compensated_llama_shrinks_saves_and_reloads_with_plain_from_pretrained(tmp_path: Path) -> None:
    model = _llama(torch.float32)
    names = _names(model)
    moments = fp.input_moments(model, _batches(), names)
    masks = _flap_masks(model, moments)
    new = fp.compensate(dict(model.named_parameters()), masks, moments)
    biased: Any = fp.with_biases(model, new)
    assert biased.config.attention_bias and biased.config.mlp_bias and not model.config.mlp_bias
    assert model.model.layers[0].mlp.down_proj.bias is None  # the model is left as it was
    x = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        masked = fp.functional_call_masked(biased, dict(biased.named_parameters()), masks, (x,)).logits
        dense = model(x).logits
    assert not torch.allclose(masked, dense, atol=1e-3)  # the biases matter
    small = fp.shrink(biased, masks, x)
    small.save_pretrained(tmp_path)
    reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert sum(p.numel() for p in reloaded.parameters()) < sum(p.numel() for p in biased.parameters())
    with torch.no_grad():
        torch.testing.assert_close(reloaded(x).logits, masked, rtol=1e-5, atol=1e-5)


def test_with_biases_refuses_a_bias_the_config_cannot_build() -> None:
    model = tiny("qwen3", seed=0).model  # attention_bias, but no flag for the MLP's biases
    params = dict(model.named_parameters())
    new = {**params, "model.layers.0.mlp.down_proj.bias": torch.zeros(32)}
    with pytest.raises(ValueError, match=r"with_biases: 'model.layers.0.mlp.down_proj.bias' is a new bias that "
                       r"Qwen3Config has no flag to build"):  # fmt: skip
        fp.with_biases(model, new)
    with pytest.raises(fp.UnknownNameError, match="with_biases: params name 'model.layers.0.mlp.up.bias'"):
        fp.with_biases(model, {"model.layers.0.mlp.up.bias": torch.zeros(32)})


def test_errors_name_the_argument() -> None:
    w = torch.randn(2, 3)
    m = fp.Moments(torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64), 4)
    with pytest.raises(fp.UnknownNameError, match="fluctuation: moments name 'v.weight'"):
        fp.fluctuation({"fc.weight": w}, {"v.weight": m})
    with pytest.raises(ValueError, match=r"compensate: moments\['fc.weight'\] must hold one value per input feature"):
        fp.compensate({"fc.weight": w}, {}, {"fc.weight": fp.Moments(torch.zeros(2), torch.zeros(2), 4)})
    with pytest.raises(ValueError, match=r"compensate: masks\['fc.weight'\] must be a bool tensor of shape \(2, 3\)"):
        fp.compensate({"fc.weight": w}, {"fc.weight": torch.ones(3, 2, dtype=torch.bool)}, {"fc.weight": m})
    with pytest.raises(TypeError, match=r"fluctuation: moments\['fc.weight'\] must be fp.Moments"):
        fp.fluctuation({"fc.weight": w}, {"fc.weight": (m.mean, m.var)})  # type: ignore[dict-item]
    model = nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(ValueError, match="input_moments: the module holding '0.weight' received 1 token"):
        fp.input_moments(model, [torch.ones(1, 3)], ["0.weight"])
