"""structure's trials on a copy with fewer blocks (issue 42): a deep transformers model's trials (a unit of each
group, whole blocks, a hidden channel) run on the copy its meta-device shadow would be, sharing its tensors, and
say what the trials on the model say: the same structure, in the same order, with the same warnings, word for
word, on every model of the transformers matrix."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from _hf import ARCHITECTURES, MATRIX, MOE, inputs, tiny

import funcprune as fp
from funcprune import _graph as graph
from funcprune._payoff import hidden_of
from funcprune._structure import _find, _read, _shadow
from funcprune._targets import output_parameters

#: Deep enough that the copy keeps at most half of the blocks (the first two of each kind, and the last).
LAYERS = {"gemma2": 12, "gemma3": 12}
#: Where a group spans blocks (T5's heads, tied by the position bias of its first block), the trials stay on
#: the model: the copy's group is not the model's.
ON_THE_MODEL = {"t5"}
FAST = ("llama",)


def _structure_of(model: Any, x: Any, on_copy: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[fp.Structure, list[tuple[str, str]], bool]:
    monkeypatch.setattr(_find, "_SHALLOW_TRIALS", on_copy)
    used: list[bool] = []
    real = _find._on_copy

    def spy(*args: Any) -> Any:
        result = real(*args)
        used.append(result is not None)
        return result

    monkeypatch.setattr(_find, "_on_copy", spy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = fp.structure(model, x)
    said = sorted((w.category.__name__, str(w.message)) for w in caught)
    return s, said, any(used)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=() if n in FAST else pytest.mark.ci) for n in dict.fromkeys((*MATRIX, *ARCHITECTURES, *MOE))]
)
def test_trials_on_the_copy_say_what_trials_on_the_model_say(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    t = tiny(name, layers=LAYERS.get(name, 8))
    x = inputs(t)
    on_model, said_on_model, _ = _structure_of(t.model, x, False, monkeypatch)
    on_copy, said_on_copy, used = _structure_of(t.model, x, True, monkeypatch)
    assert used == (name not in ON_THE_MODEL)
    assert on_copy == on_model and list(on_copy) == list(on_model) and dict(on_copy.left_out) == dict(on_model.left_out)
    assert said_on_copy == said_on_model


def test_a_shallow_model_is_tried_on_itself() -> None:
    """Where the copy would keep more than half of the blocks, there is none: its analysis would cost about what
    the trials save."""
    assert _shadow.shallow_copy("test", tiny("llama", layers=4).model) is None  # keeps 0, 1 and 3
    copy = _shadow.shallow_copy("test", tiny("llama", layers=6).model)  # keeps 0, 1 and 5
    assert copy is not None
    small: Any = copy.model
    assert len(small.model.layers) == 3 and small.config.num_hidden_layers == 3
    assert copy.to_copy("model.layers.5.mlp.up_proj.weight") == "model.layers.2.mlp.up_proj.weight"
    assert copy.to_copy("model.layers.3.mlp") is None and copy.to_copy("lm_head.weight") == "lm_head.weight"


def test_the_copy_shares_the_model_tensors() -> None:
    model = tiny("llama", layers=6).model
    copy = _shadow.shallow_copy("test", model)
    assert copy is not None
    params = {id(p) for p in model.parameters()}
    assert all(id(p) in params for p in copy.model.parameters())


def _found_as_structure_does(model: Any, x: Any) -> tuple[Any, Any, list[str]]:
    analysis = graph.analyze("test", model, graph.as_inputs("test", model, x))
    heads = output_parameters(model)
    excluded = {name for name, p in model.named_parameters() if id(p) in heads}
    found = _read.found_units(analysis, {name: tuple(p.shape) for name, p in model.named_parameters()}, excluded)
    return analysis, found, list(dict.fromkeys(_shadow.standing_for(model, list(found.groups)).values()))


def test_the_copy_is_not_taken_where_its_groups_or_hidden_size_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    t = tiny("llama", layers=8)
    analysis, found, representatives = _found_as_structure_does(t.model, inputs(t))
    assert _find._on_copy("test", t.model, analysis, found, representatives, False) is not None
    name = next(n for n in representatives if found.groups[n][0].kind == "channels" and n.startswith("model.layers.7."))
    group, units = found.groups[name]
    for changed in (
        fp.UnitGroup(group.kind, group.size, group.members[:-1], group.least, group.parts),  # a member fewer
        fp.UnitGroup(group.kind, group.size, group.members, group.least + 1, group.parts),
    ):
        other = _read.Found({**found.groups, name: (changed, units)}, found.left_out)
        assert _find._on_copy("test", t.model, analysis, other, representatives, False) is None
    real = hidden_of
    monkeypatch.setattr(_find, "hidden_of", lambda a, shapes: None if a is not analysis else real(a, shapes))
    assert _find._on_copy("test", t.model, analysis, found, representatives, False) is None

    def fewer(a: Any, shapes: Any) -> Any:  # the copy's hidden channels in a tensor fewer
        found = real(a, shapes)
        return found if a is analysis or found is None else type(found)(found.members[:-1], found.size)

    monkeypatch.setattr(_find, "hidden_of", fewer)
    assert _find._on_copy("test", t.model, analysis, found, representatives, False) is None


def test_what_the_copy_says_names_the_model_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial's text names blocks as the copy has them (its last block is the copy's third); the structure's
    warning names them as the model has them."""
    t = tiny("llama", layers=8)
    monkeypatch.setattr(_find, "removable", lambda model, analysis, trial: {n: f"raised in {n}" for n in trial if n.startswith("model.layers.2.")})
    monkeypatch.setattr(_find, "layer_groups", lambda fn, model, inputs, excluded: ({}, {"model.layers": "blocks like model.layers.2: said"}))
    with pytest.warns(fp.UnitsLeftOutWarning) as caught:
        s = fp.structure(t.model, inputs(t))
    text = " ".join(str(w.message) for w in caught)
    assert "raised in model.layers.7.mlp" in text and "blocks like model.layers.7: said" in text
    assert "model.layers.2" not in text  # nothing of the copy's third block: the model's third goes with its kind
    assert "model.layers.7.mlp" not in s and "model.layers.3.mlp" in s
