"""``fp.structure`` of a model built on the meta device (issue 41): read off a smaller copy with values, it is the
structure of the same model built with values, for every model of the transformers matrix, and picklable; what it
cannot read exactly it refuses by name; and it never allocates the model's weights."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from _hf import ARCHITECTURES, MATRIX, MOE, inputs, tiny, transformers
from torch import nn

import funcprune as fp

#: How many layers each model is built with: more than the copy keeps (the first two blocks of each kind and the
#: last), so that blocks go; 8 where layers alternate kinds (Gemma 2's sliding and full layers, Gemma 3's 5:1).
LAYERS = {"gemma2": 8, "gemma3": 8}
FAST = ("llama",)


def _on_meta(model: nn.Module) -> nn.Module:
    config: Any = getattr(model, "config")
    with torch.device("meta"):
        return type(model)(config)


def _read(model: nn.Module, x: Any) -> tuple[fp.Structure, list[type[Warning]]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = fp.structure(model, x)
    return s, sorted({w.category for w in caught}, key=lambda c: c.__name__)


def _same(model: nn.Module, x: Any, meta_x: Any = None) -> fp.Structure:
    """The structure of ``model`` on meta, asserted equal (groups, their order, what is left out, the kinds of
    warnings) to that of ``model`` with values, and picklable."""
    real, real_warned = _read(model, x)
    meta = _on_meta(model)
    assert all(p.is_meta for p in meta.parameters())
    s, warned = _read(meta, x if meta_x is None else meta_x)
    assert s == real and list(s) == list(real) and dict(s.left_out) == dict(real.left_out)
    assert warned == real_warned
    assert pickle.loads(pickle.dumps(s)) == real
    assert all(p.is_meta for p in meta.parameters())  # nothing materialized in place
    return s


def _params(names: tuple[str, ...]) -> list[Any]:
    return [pytest.param(n, marks=() if n in FAST else pytest.mark.ci) for n in names]


@pytest.mark.parametrize("name", _params(tuple(dict.fromkeys((*MATRIX, *ARCHITECTURES, *MOE)))))
def test_the_structure_on_meta_is_the_structure_with_values(name: str) -> None:
    t = tiny(name, layers=LAYERS.get(name, 4))
    s = _same(t.model, inputs(t))
    assert any(g.kind != "layers" for g in s.values())


def test_meta_example_inputs_read_as_random_ids() -> None:
    t = tiny("llama", layers=5)
    x = inputs(t)
    meta_x = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in x.items()}
    s = _same(t.model, x, meta_x)
    assert s["model.layers"].size == 5 and "model.layers.4.mlp" in s


@pytest.mark.ci
def test_per_layer_kinds_of_qwen2_moe_mlp_only_layers() -> None:
    config = transformers.Qwen2MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, moe_intermediate_size=24, shared_expert_intermediate_size=40, num_experts=4,
        num_experts_per_tok=2, mlp_only_layers=[1, 4],
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen2MoeForCausalLM(config).eval()
    s = _same(model, {"input_ids": torch.randint(0, 64, (2, 8)), "use_cache": False})
    assert s["model.layers.4.mlp"].kind == "channels" and s["model.layers.5.mlp"].kind == "experts"


def test_a_meta_model_without_a_config_is_refused_by_name() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    with pytest.raises(ValueError, match=r"structure: model \(Sequential\) is on the meta device.*transformers"):
        fp.structure(model, torch.randn(1, 4))


def test_a_meta_model_its_config_does_not_build_is_refused_by_name() -> None:
    meta: Any = _on_meta(tiny("llama", layers=4).model)
    meta.model.layers[0].mlp.act_fn = nn.GELU()  # changed after it was built: no copy from the config is this model
    with pytest.raises(ValueError, match=r"builds another model than it is \('model.layers.0.mlp.act_fn' is a "):
        fp.structure(meta, torch.randint(0, 64, (2, 8)))


_PEAK = """
import sys
sys.path.insert(0, {tests!r})
import _torchvision  # before transformers imports torchvision
import pickle, torch, transformers, funcprune as fp
config = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=1024, num_hidden_layers=384,
                                  num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64)
with torch.device("meta"):
    model = transformers.LlamaForCausalLM(config)
weights = sum(p.numel() * p.element_size() for p in model.parameters())
def kib(field):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field))
before = kib("VmRSS:")
s = fp.structure(model, torch.randint(0, 256, (1, 8)))
assert s["model.layers"].size == 384 and "model.layers.383.mlp" in s and len(pickle.dumps(s)) > 0
print(weights, before * 1024, kib("VmHWM:") * 1024)
"""


@pytest.mark.ci
def test_the_meta_path_never_allocates_the_weights() -> None:
    """A Llama of 1.4 GiB of weights (384 layers) on meta: reading its structure raises the peak RSS by less than
    an eighth of that (measured: about 110 MiB, the copy of 3 blocks and its analysis)."""
    script = textwrap.dedent(_PEAK.format(tests=str(Path(__file__).parents[1])))
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    weights, before, peak = map(int, done.stdout.split()[-3:])
    assert weights > 1.3 * 2**30
    assert peak - before < weights / 8, (weights, before, peak)
