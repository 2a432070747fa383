"""``load_shrunk``: a model shrunk twice reloads exactly; a record that does not fit is refused, naming the file.

A record (``funcprune_shrunk`` in ``config.json``) describes the whole model
against what its config builds, however many times it was shrunk. An edited
record is refused before anything is built at its sizes: its shapes against
the checkpoint's safetensors headers and the model the config builds, its
attributes against the size attributes shrink changes (``SIZE_ATTRIBUTES``).
"""

from __future__ import annotations

import json
import re
import resource
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _hf import Tiny, tiny

import funcprune as fp
from funcprune._units import Kind

Tensor = torch.Tensor
Record = dict[str, Any]


def logits(model: torch.nn.Module, t: Tiny) -> Tensor:
    with torch.no_grad():
        out: Tensor = model(*t.args, **t.kwargs).logits
    return out


def mlp_masks(layer: int, kept: int, width: int = 48, hidden: int = 32) -> dict[str, Tensor]:
    """A Llama layer's MLP keeping its first ``kept`` of ``width`` channels (its gate and up rows)."""
    rows = (torch.arange(width) < kept).unsqueeze(1).expand(width, hidden)
    return {f"model.layers.{layer}.mlp.{p}.weight": rows for p in ("gate_proj", "up_proj")}


def units_of(model: torch.nn.Module, t: Tiny, group: str, kinds: Kind) -> dict[str, Tensor]:
    """Masks that prune half the units of one group of ``model`` (of ``kinds``), the others left alone."""
    structure = fp.structure(model, t.args[0])
    masks = fp.structured(structure, fp.LnStructured(0.5, n=2), kinds=kinds, scope="group")(
        dict(model.named_parameters())
    )
    members = {m.name for m in structure[group].members}
    return {name: mask for name, mask in masks.items() if name in members}


def reloads_exactly(small: Any, t: Tiny, directory: Path) -> torch.nn.Module:
    small.save_pretrained(directory)
    again = fp.load_shrunk(directory)
    assert type(again) is type(small)
    torch.testing.assert_close(logits(again, t), logits(small, t), atol=0, rtol=0)
    return again


# Item 7: shrinking a shrunk model


def test_a_llama_shrunk_twice_reloads_exactly(tmp_path: Path) -> None:
    """Layer 0's MLP keeps 32 of 48 channels (a record), then layer 1's keeps 24: the record says both."""
    t = tiny("llama")
    once = fp.shrink(t.model, mlp_masks(0, 32), t.args[0])
    twice: Any = fp.shrink(once, mlp_masks(1, 24), t.args[0])
    shapes = twice.config.funcprune_shrunk["shapes"]
    assert shapes["model.layers.0.mlp.up_proj.weight"] == [32, 32]
    assert shapes["model.layers.1.mlp.up_proj.weight"] == [24, 32]
    assert twice.config.funcprune_shrunk["attributes"]["model.layers.0.mlp.down_proj"] == {"in_features": 32}
    again: Any = reloads_exactly(twice, t, tmp_path)
    assert [layer.mlp.up_proj.out_features for layer in again.model.layers] == [32, 24]


def test_a_uniform_shrink_then_a_non_uniform_one_records_against_the_new_config(tmp_path: Path) -> None:
    """Every layer keeps 32 (the config says it), then layer 1 keeps 24 of those: recorded against 32."""
    t = tiny("llama")
    once: Any = fp.shrink(t.model, mlp_masks(0, 32) | mlp_masks(1, 32), t.args[0])
    assert once.config.intermediate_size == 32 and not hasattr(once.config, "funcprune_shrunk")
    twice: Any = fp.shrink(once, mlp_masks(1, 24, width=32), t.args[0])
    assert twice.config.funcprune_shrunk["shapes"] == {
        "model.layers.1.mlp.gate_proj.weight": [24, 32], "model.layers.1.mlp.up_proj.weight": [24, 32],
        "model.layers.1.mlp.down_proj.weight": [32, 24],
    }  # fmt: skip
    reloads_exactly(twice, t, tmp_path)


def test_gpt2_channels_then_heads_reload_exactly(tmp_path: Path) -> None:
    """GPT-2: layer 0 loses MLP channels, then layer 1 loses heads (which its config cannot count)."""
    t = tiny("gpt2")
    once = fp.shrink(t.model, units_of(t.model, t, "transformer.h.0.mlp", "channels"), t.args[0])
    twice: Any = fp.shrink(once, units_of(once, t, "transformer.h.1.attn", "heads"), t.args[0])
    record = twice.config.funcprune_shrunk
    assert record["shapes"]["transformer.h.0.mlp.c_fc.weight"] == [32, 64]
    assert record["attributes"]["transformer.h.1.attn"]["num_heads"] == 2
    again: Any = reloads_exactly(twice, t, tmp_path)
    assert again.transformer.h[0].mlp.c_fc.nf == 64 and again.transformer.h[1].attn.num_heads == 2


# Items 10 and 11: a record that does not fit


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama whose layer 0 MLP keeps 32 channels, saved with its record (one file), and again in shards."""
    t = tiny("llama")
    small: Any = fp.shrink(t.model, mlp_masks(0, 32), t.args[0])
    directory = tmp_path_factory.mktemp("shrunk")
    small.save_pretrained(directory / "one")
    small.save_pretrained(directory / "shards", max_shard_size="20KB")
    assert (directory / "shards" / "model.safetensors.index.json").is_file()
    return directory


def edited(saved: Path, tmp_path: Path, edit: Callable[[Record], object], which: str = "one") -> Path:
    copy = tmp_path / which
    shutil.copytree(saved / which, copy)
    config = json.loads((copy / "config.json").read_text())
    edit(config["funcprune_shrunk"])
    (copy / "config.json").write_text(json.dumps(config))
    return copy


UP = "model.layers.0.mlp.up_proj"


def test_a_shape_the_checkpoint_does_not_hold_is_refused_before_anything_is_built(saved: Path, tmp_path: Path) -> None:
    """[20000, 20000] (1.6 GB of float32): refused from the safetensors header, with no such allocation."""
    for which in ("one", "shards"):
        path = edited(saved, tmp_path, lambda r: r["shapes"].update({f"{UP}.weight": [20000, 20000]}), which)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with pytest.raises(ValueError, match=rf"load_shrunk: the 'funcprune_shrunk' record in "
                           rf"'{re.escape(str(path / 'config.json'))}' gives '{UP}.weight' the shape \[20000, 20000\], "
                           rf"but '{re.escape(str(path))}/model[-0-9of]*\.safetensors' holds it with the shape \[32, 32\]"):  # fmt: skip
            fp.load_shrunk(path)
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 400_000  # KiB: nothing near 1.6 GB


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        # attributes that are no size shrink changes
        (lambda r: r["attributes"].update({"model.layers.0.self_attn": {"scaling": 10.0}}),
         r"sets 'scaling' of the module 'model.layers.0.self_attn'; a record sets only the size attributes"),
        (lambda r: r["attributes"][UP].update(weight=3), r"sets 'weight' of the module"),
        # values that are no sizes
        (lambda r: r["attributes"][UP].update(out_features=True), r"to True; expected an int >= 0"),
        (lambda r: r["attributes"][UP].update(out_features=32.0), r"to 32.0; expected an int >= 0"),
        (lambda r: r["attributes"][UP].update(out_features="32"), r"to '32'; expected an int >= 0"),
        (lambda r: r["attributes"][UP].update(out_features=-1), r"to -1; expected an int >= 0"),
        (lambda r: r["shapes"].update({f"{UP}.weight": [True, 32]}), r"the shape \[True, 32\]; expected a list"),
        (lambda r: r["shapes"].update({f"{UP}.weight": [32.5, 32]}), r"the shape \[32.5, 32\]; expected a list"),
        # modules, tensors and attributes the model lacks, or sizes larger than it has
        (lambda r: r["attributes"].update({"model.layers.9.mlp.up_proj": {"out_features": 3}}),
         r"names the module 'model.layers.9.mlp.up_proj', which the model built from the config lacks"),
        (lambda r: r["attributes"].update({"model.layers.0.mlp": {"num_heads": 3}}),
         r"sets 'num_heads' of the module 'model.layers.0.mlp' \(LlamaMLP\) to 3, but the model built from the "
         r"config has None there"),
        (lambda r: r["attributes"][UP].update(out_features=10**6),
         r"to 1000000, but the model built from the config has 48 there; shrink only makes a size smaller"),
        (lambda r: r["attributes"][UP].update(out_features=[32]), r"to \[32\], but the model built from the config has 48"),
        (lambda r: r["attributes"].update({"model.norm": {"normalized_shape": [64]}}),
         r"'normalized_shape' of the module 'model.norm'"),
        (lambda r: r["shapes"].update({"model.layers.9.mlp.up_proj.weight": [3, 32]}),
         r"resizes 'model.layers.9.mlp.up_proj.weight', which the model built from the config lacks"),
        (lambda r: r["shapes"].update({"lm_head.weight": [64, 32, 1]}),
         r"gives 'lm_head.weight' the shape \[64, 32, 1\], but '.*model.safetensors' holds it with the shape \[64, 32\]"),
        # a record of another form
        (lambda r: r.update(extra={}), r"must hold 'shapes'"),
        (lambda r: r.update(attributes=[]), r"must hold 'shapes'"),
    ],
)
def test_a_record_that_does_not_fit_is_refused_naming_the_file(
    saved: Path, tmp_path: Path, edit: Callable[[Record], object], message: str
) -> None:
    path = edited(saved, tmp_path, edit)
    config = re.escape(str(path / "config.json"))
    with pytest.raises(ValueError, match=rf"load_shrunk: the 'funcprune_shrunk' record in '{config}' .*{message}"):
        fp.load_shrunk(path)


def test_the_record_s_attributes_are_the_size_attributes_shrink_changes(saved: Path) -> None:
    """What the writer recorded is what the reader accepts (one list, in ``_resize.py``)."""
    from funcprune._payoff._resize import SIZE_ATTRIBUTES

    record = json.loads((saved / "one" / "config.json").read_text())["funcprune_shrunk"]
    written = {attr for attrs in record["attributes"].values() for attr in attrs}
    assert written == {"in_features", "out_features"} and written <= SIZE_ATTRIBUTES
    assert {"scaling", "head_dim", "layer_idx", "hidden_size"}.isdisjoint(SIZE_ATTRIBUTES)


@pytest.mark.parametrize("shape", [[64, 32, 1], [64, 33], [20000, 20000]])
def test_a_tensor_the_checkpoint_holds_otherwise_is_checked_against_the_model_the_config_builds(
    saved: Path, tmp_path: Path, shape: list[int]
) -> None:
    """A checkpoint may name a tensor otherwise (transformers converts MoE experts as it saves) or leave it
    out (a tied one): the record's shape must then fit the model the config builds (as many dims, none larger)."""
    from safetensors.torch import load_file, save_file

    path = edited(saved, tmp_path, lambda r: r["shapes"].update({"lm_head.weight": shape}))
    tensors = load_file(path / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = re.escape(str(path / "config.json"))
    with pytest.raises(ValueError, match=rf"load_shrunk: the 'funcprune_shrunk' record in '{config}' gives "
                       rf"'lm_head.weight' the shape {re.escape(str(shape))}, but the model built from the config has "
                       r"\[64, 32\]; shrink only makes a tensor smaller, keeping its dims"):  # fmt: skip
        fp.load_shrunk(path)
