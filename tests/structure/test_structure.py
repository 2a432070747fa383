"""``fp.structure``: the units of hand-built models and of the transformers matrix, and its errors."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import funcprune as fp

Tensor = torch.Tensor


def members(group: fp.UnitGroup) -> list[tuple[str, int, int, int]]:
    return [(m.name, m.dim, m.width, m.start) for m in group.members]


class Attention(nn.Module):
    """Self-attention with ``heads`` query heads of 4 and ``kv`` key/value heads (GQA when fewer)."""

    def __init__(self, heads: int = 4, kv: int = 4, dim: int = 16) -> None:
        super().__init__()
        self.heads, self.kv = heads, kv
        self.q = nn.Linear(dim, heads * 4)
        self.k = nn.Linear(dim, kv * 4)
        self.v = nn.Linear(dim, kv * 4)
        self.o = nn.Linear(heads * 4, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, -1, 4).transpose(1, 2)
        k = self.k(x).view(b, s, -1, 4).transpose(1, 2)
        v = self.v(x).view(b, s, -1, 4).transpose(1, 2)
        if self.kv < self.heads:
            k = k.repeat_interleave(self.heads // self.kv, dim=1)
            v = v.repeat_interleave(self.heads // self.kv, dim=1)
        h = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: Tensor = self.o(h.transpose(1, 2).reshape(b, s, -1))
        return x + out


def test_a_plain_mlp_has_one_group_of_channels_per_hidden_layer() -> None:
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.GELU(), nn.Linear(16, 4))
    s = fp.structure(model, torch.randn(2, 8))
    assert {n: (g.kind, g.size) for n, g in s.items()} == {"0": ("channels", 32), "2": ("channels", 16)}
    assert members(s["2"]) == [("2.weight", 0, 1, 0), ("2.bias", 0, 1, 0), ("4.weight", 1, 1, 0)]


def test_conv_channels_carry_their_norms_and_the_next_layer_columns() -> None:
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(8, 5),
    ).eval()  # fmt: skip
    s = fp.structure(model, torch.randn(2, 3, 8, 8))
    assert members(s["0"]) == [
        ("0.weight", 0, 1, 0), ("0.bias", 0, 1, 0), ("1.weight", 0, 1, 0), ("1.bias", 0, 1, 0), ("5.weight", 1, 1, 0),
    ]  # fmt: skip


def test_heads_and_kv_groups_come_from_the_attention_op() -> None:
    mha = fp.structure(Attention(4, 4), torch.randn(2, 5, 16))
    assert {n: (g.kind, g.size) for n, g in mha.items()} == {"q": ("heads", 4)}  # the model: named by the first
    (heads,) = mha.values()
    assert members(heads) == [
        ("q.weight", 0, 4, 0), ("q.bias", 0, 4, 0), ("k.weight", 0, 4, 0), ("k.bias", 0, 4, 0),
        ("v.weight", 0, 4, 0), ("v.bias", 0, 4, 0), ("o.weight", 1, 4, 0),
    ]  # fmt: skip
    gqa = fp.structure(Attention(4, 2), torch.randn(2, 5, 16))
    (groups,) = gqa.values()
    assert (groups.kind, groups.size) == ("kv_groups", 2)
    assert members(groups)[0] == ("q.weight", 0, 8, 0) and members(groups)[2] == ("k.weight", 0, 4, 0)


def test_query_heads_sharing_one_kv_head_are_left_out_with_why_when_the_code_cannot_lose_one() -> None:
    # multi-query attention: the one key/value head is read by every head, so each query head could go alone,
    # but this module repeats the key for `self.heads`, a count shrink does not know, so removing one fails
    with pytest.warns(fp.UnitsLeftOutWarning, match=r"'q' \(heads\): removing one changes what the model computes "
                      r"\(RuntimeError: The size of tensor a \(3\) must match"):  # fmt: skip
        assert len(fp.structure(Attention(4, 1), torch.randn(2, 5, 16))) == 0


class MultiQuery(nn.Module):
    """Multi-query attention whose forward reads its head count from ``num_heads`` (an attribute shrink updates)."""

    def __init__(self, heads: int = 4, dim: int = 16) -> None:
        super().__init__()
        self.num_heads = heads
        self.q, self.kv, self.o = nn.Linear(dim, heads * 4), nn.Linear(dim, 8), nn.Linear(heads * 4, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.num_heads, 4).transpose(1, 2)
        k, v = self.kv(x).view(b, 1, s, 8).split(4, dim=-1)
        h = F.scaled_dot_product_attention(q, k.expand(-1, self.num_heads, -1, -1), v.expand(-1, self.num_heads, -1, -1))
        out: Tensor = self.o(h.transpose(1, 2).reshape(b, s, -1))
        return x + out


def test_query_heads_sharing_one_kv_head_go_one_by_one_and_the_shared_head_stays() -> None:
    model, x = MultiQuery().eval(), torch.randn(2, 5, 16)
    s = fp.structure(model, x)
    assert {n: (g.kind, g.size) for n, g in s.items()} == {"q": ("heads", 4)}
    assert [m.name for m in s["q"].members] == ["q.weight", "q.bias", "o.weight"]  # the key/value rows are shared
    masks = fp.structured(s, fp.LnStructured(2, n=2))(dict(model.named_parameters()))
    small = fp.shrink(model, masks, x)
    assert (small.num_heads, small.q.out_features, small.kv.out_features) == (2, 8, 8)
    torch.testing.assert_close(small(x), fp.functional_call_masked(model, dict(model.named_parameters()), masks, x))


def test_what_an_unknown_op_reads_and_the_outputs_are_left_out() -> None:
    class Unknown(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 6)
            self.b = nn.Linear(6, 6)
            self.c = nn.Linear(6, 2)

        def forward(self, x: Tensor) -> Tensor:
            out: Tensor = self.c(F.relu(self.b(torch.special.bessel_j0(self.a(x)))))
            return out

    s = fp.structure(Unknown(), torch.randn(2, 4))
    assert list(s) == ["b"]  # a's channels go through an op without a rule (refused), c's are the outputs


def test_errors_name_the_argument() -> None:
    with pytest.raises(TypeError, match="structure: model must be a torch.nn.Module, got str"):
        fp.structure("model", torch.randn(1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="structure: example_inputs must be a tensor"):
        fp.structure(nn.Linear(2, 2), [torch.randn(1, 2)])
    with pytest.raises(ValueError, match=r"structure: the model failed on example_inputs .*mat1 and mat2"):
        fp.structure(nn.Linear(2, 2), torch.randn(1, 3))
    hooked = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    torch.nn.utils.prune.l1_unstructured(hooked[0], "weight", 0.5)
    with pytest.raises(ValueError, match="structure: module is pruned in hook mode"):
        fp.structure(hooked, torch.randn(1, 2))


def test_a_repeated_block_with_no_unit_says_which_op_stopped_the_analysis() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down, self.norm = nn.Linear(8, 16), nn.Linear(16, 8), nn.LayerNorm(8)

        def forward(self, x: Tensor) -> Tensor:
            out: Tensor = self.norm(x + self.down(torch.special.bessel_j0(self.up(x))))
            return out

    model = nn.Sequential(nn.Linear(4, 8), Block(), Block(), nn.Linear(8, 2))
    with pytest.warns(fp.UnitsLeftOutWarning, match=r"no unit in '1': .*node 'special_bessel_j0' \(aten.special_bessel_j0."
                      r"default in '1'\) reads them, and funcprune cannot tell how; no unit in '2'"):  # fmt: skip
        s = fp.structure(model, torch.randn(3, 4))
    assert len(s) == 0


def test_a_residual_conv_beside_a_depthwise_conv_on_the_input_is_left_out_not_listed() -> None:
    # issue 36 item 5: the residual 1x1 conv's outputs are added to the depthwise conv's, whose channels are the
    # model's input: they cannot go, and structure no longer lists them
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dw, self.pw = nn.Conv2d(3, 3, 3, padding=1, groups=3), nn.Conv2d(3, 3, 1)
            self.head = nn.Conv2d(3, 5, 1)

        def forward(self, x: Tensor) -> Tensor:
            out: Tensor = self.head(F.relu(self.dw(x) + self.pw(x))).mean((2, 3))
            return out

    model, x = Net().eval(), torch.randn(2, 3, 6, 6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = fp.structure(model, x)
    assert "pw" not in s and not any("pw.weight" in m.name for g in s.values() for m in g.members), s
    masks = {"pw.weight": torch.ones(3, 3, 1, 1, dtype=torch.bool)}
    masks["pw.weight"][1] = False
    with pytest.warns(fp.KeptChannelsWarning):  # and shrink keeps them, saying why
        small = fp.shrink(model, masks, x)
    assert small.pw.out_channels == 3
    del caught
