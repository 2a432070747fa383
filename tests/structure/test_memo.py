"""``fp.shrink(..., structure=s)`` takes back the analysis ``fp.structure`` made, only while it is still valid (issue 42).

``structure`` → ``structured`` → ``shrink`` traces the model once: the
analysis is not made again (counted here), and the shrunk model is the one
a fresh analysis gives (every tensor equal, the same outputs). Anything the
analysis was made from that changed since makes ``shrink`` analyze again,
with the result of a fresh call: a weight or a buffer written in place, a
parameter replaced, a submodule swapped, a module setting changed, other
example inputs (even equal ones), a structure unpickled or built by hand,
or another model's structure. A structure of any other type is refused by
name.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import funcprune as fp
from funcprune._graph import _memo, analyze


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.act: nn.Module = nn.ReLU()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.bn(self.conv(x))).mean((2, 3))
        out: torch.Tensor = self.fc2(self.act(self.fc1(y)))
        return out


def setup() -> tuple[Net, torch.Tensor, fp.Structure, fp.Masks]:
    torch.manual_seed(0)
    model = Net().eval()
    with torch.no_grad():
        model.bn.get_buffer("running_var").uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 6, 6)
    s = fp.structure(model, x)
    masks = fp.structured(s, fp.LnStructured(0.5, n=2), scope="group")(dict(model.named_parameters()))
    return model, x, s, masks


def analyses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one each time a model is analyzed anew for ``shrink``."""
    made: list[int] = []
    real = analyze

    def counted(*args: Any) -> Any:
        made.append(1)
        return real(*args)

    monkeypatch.setattr(_memo, "analyze", counted)
    return made


def same(a: nn.Module, b: nn.Module, x: torch.Tensor) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    with torch.no_grad():
        assert torch.equal(a(x), b(x))


def test_shrink_takes_the_analysis_back_and_gives_the_model_a_fresh_one_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    model, x, s, masks = setup()
    made = analyses(monkeypatch)
    small = fp.shrink(model, masks, x, structure=s)
    assert made == []  # traced once, by structure
    fresh = fp.shrink(model, masks, x)
    same(small, fresh, x)
    assert small.fc1.out_features == 8 and small.conv.out_channels == 4


def _no_grad_update(m: Net, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        m.conv.weight.add_(0.1)
    return x


def _buffer_in_place(m: Net, x: torch.Tensor) -> torch.Tensor:
    m.bn.get_buffer("running_mean").add_(1.0)
    return x


def _buffer_through_data(m: Net, x: torch.Tensor) -> torch.Tensor:
    m.bn.get_buffer("running_var").data.mul_(4.0)
    return x


def _parameter_replaced(m: Net, x: torch.Tensor) -> torch.Tensor:
    m.fc2.bias = nn.Parameter(torch.ones(4))
    return x


def _submodule_swapped(m: Net, x: torch.Tensor) -> torch.Tensor:
    m.act = nn.GELU()
    return x


def _setting_changed(m: Net, x: torch.Tensor) -> torch.Tensor:
    m.bn.eps = 0.5
    return x


CHANGES: dict[str, Callable[[Net, torch.Tensor], torch.Tensor]] = {
    "a weight updated under no_grad": _no_grad_update,
    "a buffer written in place": _buffer_in_place,
    "a buffer written through .data": _buffer_through_data,
    "a parameter replaced": _parameter_replaced,
    "a submodule swapped": _submodule_swapped,
    "a setting changed": _setting_changed,
    "equal inputs, another tensor": lambda m, x: x.clone(),
    "inputs written in place": lambda m, x: x.mul_(3.0),
}


@pytest.mark.parametrize("change", CHANGES)
def test_anything_changed_since_analyzes_again_with_a_fresh_call_s_result(
    change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, x, s, masks = setup()
    x = CHANGES[change](model, x)
    made = analyses(monkeypatch)
    small = fp.shrink(model, masks, x, structure=s)
    assert made == [1]
    same(small, fp.shrink(model, masks, x), x)


def test_a_weight_written_through_data_is_read_as_it_is_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """No version counter sees it, but the analysis holds the module's own parameters: the checks read the new
    values, and the result is a fresh call's."""
    model, x, s, masks = setup()
    model.fc1.weight.data.mul_(-3.0)
    made = analyses(monkeypatch)
    small = fp.shrink(model, masks, x, structure=s)
    assert made == []
    same(small, fp.shrink(model, masks, x), x)


def test_an_unpickled_structure_or_one_of_another_model_analyzes_again(monkeypatch: pytest.MonkeyPatch) -> None:
    model, x, s, masks = setup()
    other, _, t, _ = setup()
    made = analyses(monkeypatch)
    again = pickle.loads(pickle.dumps(s))
    assert again == s  # the analysis is never pickled, nor compared
    same(fp.shrink(model, masks, x, structure=again), fp.shrink(model, masks, x), x)
    same(fp.shrink(model, masks, x, structure=t), fp.shrink(other, masks, x), x)
    assert made == [1, 1, 1, 1]


def test_a_structure_of_another_type_is_refused_by_name() -> None:
    model, x, _, masks = setup()
    with pytest.raises(TypeError, match=r"^shrink: structure must be the fp.structure of the module .* got dict$"):
        fp.shrink(model, masks, x, structure={})  # type: ignore[arg-type]


def test_the_analysis_holds_the_module_s_own_parameters_not_a_copy() -> None:
    model, _, s, _ = setup()
    memo = s._analyzed
    assert isinstance(memo, _memo.Analyzed)
    kept = dict(memo.analysis.model.named_parameters())
    assert all(kept[n] is p for n, p in model.named_parameters())
    buffers = dict(memo.analysis.model.named_buffers())
    assert all(buffers[n] is not b for n, b in model.named_buffers())  # a forward may write those: its own
