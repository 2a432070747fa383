"""Wanda and input norms whatever the weight's layout (issue 23, item 6): Conv1D stores its weight (in, out).

The reference of a Conv1D is the Linear that computes the same, its weight
transposed: every score of the Conv1D is that Linear's, transposed.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import funcprune as fp
from _models import Conv1D, MiniGPT, as_linear

Tensor = torch.Tensor


def randn(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def linear_twin(model: MiniGPT) -> nn.Module:
    """``model`` with each Conv1D replaced by the Linear that computes the same (the same names)."""
    twin = MiniGPT()
    twin.load_state_dict(model.state_dict())
    twin.c_fc, twin.c_proj = as_linear(model.c_fc), as_linear(model.c_proj)  # type: ignore[assignment]
    return twin


def batches(seed: int = 1) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 16, (3, 5), generator=g) for _ in range(2)]


NAMES = ["c_fc.weight", "c_proj.weight"]


# --- input_norms --------------------------------------------------------------------


def test_input_norms_of_a_conv1d_are_its_linear_twins_as_a_column() -> None:
    model = MiniGPT()
    twin = linear_twin(model)
    x = torch.randint(0, 16, (2, 3))
    assert torch.allclose(model(x), twin(x), atol=1e-5)  # the twin computes the same
    norms, linear = fp.input_norms(model, batches(), NAMES), fp.input_norms(twin, batches(), NAMES)
    for name in NAMES:
        assert norms[name].shape == (model.get_parameter(name).shape[0], 1)  # (in, 1): along dim 0
        assert linear[name].shape == (twin.get_parameter(name).shape[1],)
        torch.testing.assert_close(norms[name].flatten(), linear[name])


def test_input_norms_of_a_conv1d_check_its_input() -> None:
    layer = Conv1D(3, 4)
    with pytest.raises(ValueError, match=r"^input_norms: the module itself received an input of shape "
                       r"\(2, 3\); expected its 4 input features in dim -1"):  # fmt: skip
        fp.input_norms(layer, [randn(2, 3)], ["weight"])
    with pytest.raises(ValueError, match=r"'bias' belongs to the module itself, of type Conv1D; input_norms "
                       r"supports the weight of nn.Linear .* and of transformers' Conv1D"):  # fmt: skip
        fp.input_norms(layer, [randn(2, 4)], ["bias"])


# --- wanda --------------------------------------------------------------------------


def test_wanda_of_a_square_conv1d_is_wanda_of_its_linear_twin_transposed() -> None:
    model = MiniGPT()
    assert model.c_fc.weight.shape == (8, 8)  # square: the shape cannot tell the layout
    twin = linear_twin(model)
    params = {n: p.detach() for n, p in model.named_parameters()}
    expected = fp.wanda(dict(twin.named_parameters()), fp.input_norms(twin, batches(), NAMES))
    norms = fp.input_norms(model, batches(), NAMES)
    flat = {n: v.flatten() for n, v in norms.items()}
    for scores in (
        fp.wanda(params, norms),  # the norms as input_norms gives them: no more argument
        fp.wanda(params, flat, input_dims=fp.input_dims(model)),  # 1-D norms, and the layout
        fp.wanda(params, norms, input_dims=fp.input_dims(model)),  # both, agreeing
    ):
        assert list(scores) == NAMES
        for name in NAMES:
            torch.testing.assert_close(scores[name], expected[name].T)
            assert not torch.allclose(scores[name], expected[name])  # the other dim would differ


def test_one_d_norms_without_input_dims_scale_dim_1_as_documented() -> None:
    """The documented convention: 1-D norms are a Linear's; a non-square Conv1D weight is refused, never guessed."""
    w, n = randn(4, 4), randn(4, seed=1).abs()
    torch.testing.assert_close(fp.wanda({"w": w}, {"w": n})["w"], w.abs() * n[None, :])
    with pytest.raises(ValueError, match=re.escape(
        "wanda: input_norms['c.weight'] has shape (6,) but the parameter has 3 input features (shape (6, 3), "
        "dim 1); expected a 1-D tensor of 3 norms (1-D norms scale dim 1, the input dim of a Linear or Conv "
        "weight; a weight stored (in, out), as transformers' Conv1D stores it, reads its inputs along dim 0: "
        "pass input_dims=fp.input_dims(model), or its norms shaped (in, 1) as fp.input_norms returns them)"
    )):  # fmt: skip
        fp.wanda({"c.weight": randn(6, 3)}, {"c.weight": randn(6)})


def test_norms_shaped_to_broadcast_say_their_dim_for_any_rank() -> None:
    w = randn(3, 4, 2, 2)
    for dim in range(4):
        shape = [1] * 4
        shape[dim] = w.shape[dim]
        n = randn(w.shape[dim], seed=dim).abs()
        expected = w.abs() * n.reshape(shape)
        torch.testing.assert_close(fp.wanda({"w": w}, {"w": n.reshape(shape)})["w"], expected)
        torch.testing.assert_close(fp.wanda({"w": w}, {"w": n}, input_dims={"w": dim})["w"], expected)


def test_wanda_of_conv1d_norms_under_vmap_batched_or_shared() -> None:
    weights = randn(3, 5, 5)  # 3 stacked (in, out) weights
    norms = randn(3, 5, 1, seed=1).abs()
    batched = torch.func.vmap(fp.wanda)({"w": weights}, {"w": norms})["w"]
    shared = torch.func.vmap(fp.wanda, in_dims=(0, None))({"w": weights}, {"w": norms[0]})["w"]
    for i in range(3):
        torch.testing.assert_close(batched[i], weights[i].abs() * norms[i])
        torch.testing.assert_close(shared[i], weights[i].abs() * norms[0])


def test_wanda_layout_errors() -> None:
    params = {"c.weight": torch.ones(3, 2), "b": torch.ones(2)}
    with pytest.raises(TypeError, match=r"^wanda: input_dims must be a mapping of parameter names to ints or "
                       r"None, got list; fp.input_dims\(model\) makes one"):  # fmt: skip
        fp.wanda(params, {"c.weight": torch.ones(3)}, input_dims=[0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^wanda: input_dims must map parameter names \(str\) to ints, got "
                       r"'c.weight': True"):  # fmt: skip
        fp.wanda(params, {"c.weight": torch.ones(3)}, input_dims={"c.weight": True})
    with pytest.raises(ValueError, match=r"^wanda: input_dims\['c.weight'\] is 2 but the parameter has shape "
                       r"\(3, 2\); expected a dim in \[0, 2\)"):  # fmt: skip
        fp.wanda(params, {"c.weight": torch.ones(3)}, input_dims={"c.weight": 2})
    with pytest.raises(ValueError, match=r"^wanda: input_norms\['c.weight'\] has shape \(3, 1\), which does not "
                       r"fit the parameter's shape \(3, 2\): expected 1-D norms, or norms of 2 dims all of size 1 "
                       r"but the input features of dim 1 \(input_dims\), such as \(1, 2\)"):  # fmt: skip
        fp.wanda(params, {"c.weight": torch.ones(3, 1)}, input_dims={"c.weight": 1})  # they disagree
    with pytest.raises(ValueError, match=r"^wanda: input_norms\['c.weight'\] has shape \(3,\) but the parameter "
                       r"has 2 input features \(shape \(3, 2\), dim 1\); expected a 1-D tensor of 2 norms "
                       r"\(input_dims\['c.weight'\]\)$"):  # fmt: skip
        fp.wanda(params, {"c.weight": torch.ones(3)}, input_dims={"c.weight": 1})
    with pytest.raises(ValueError, match=r"has shape \(3, 2\), which does not fit"):
        fp.wanda(params, {"c.weight": torch.ones(3, 2)})  # not a norm per input feature
    assert fp.wanda(params, {"c.weight": torch.ones(3)}, input_dims={"c.weight": 0, "elsewhere": 5}).keys() == {
        "c.weight"
    }  # names not scored are ignored


# --- DTensor: each process scales its block along the input dim ----------------------------

needs_gloo = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed with gloo"
)


@needs_gloo
@pytest.mark.parametrize("shard", [0, 1, None])
def test_wanda_of_a_dtensor_conv1d_weight_is_the_plain_one(mesh: Any, shard: int | None) -> None:
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    w, n = randn(6, 4), randn(6, 1, seed=1).abs()
    dw = distribute_tensor(w, mesh, [Replicate() if shard is None else Shard(shard)])
    for norms, dims in (({"w": n}, None), ({"w": n.flatten()}, {"w": 0})):
        score = fp.wanda({"w": dw}, norms, input_dims=dims)["w"]
        assert isinstance(score, DTensor) and score.placements == dw.placements
        torch.testing.assert_close(score.full_tensor(), w.abs() * n)


@needs_gloo
def test_input_norms_across_a_process_group_keep_the_conv1d_column(mesh: Any) -> None:
    """``across=``: the sums of squares travel flat in one all_reduce; the column shape comes back."""
    model = MiniGPT()
    alone = fp.input_norms(model, batches(), NAMES)
    together = fp.input_norms(model, batches(), NAMES, across=dist.group.WORLD)  # the mesh's group of 1
    for name in NAMES:
        assert together[name].shape == alone[name].shape == (model.get_parameter(name).shape[0], 1)
        torch.testing.assert_close(together[name], alone[name])


# --- GPT-2 --------------------------------------------------------------------------


def _tiny(name: str) -> Any:
    return pytest.importorskip("_hf", reason="needs transformers (the hf extra)").tiny(name)


def test_input_norms_and_wanda_on_gpt2_are_those_of_its_linear_twin() -> None:
    gpt2 = _tiny("gpt2")
    model = gpt2.model
    names = [f"{path}.weight" for path, m in model.named_modules() if type(m).__name__ == "Conv1D"]
    assert len(names) == 8
    captured: dict[str, list[Tensor]] = {name: [] for name in names}
    hooks = [
        model.get_submodule(name.rpartition(".")[0]).register_forward_pre_hook(
            lambda m, args, name=name: captured[name].append(args[0].reshape(-1, args[0].shape[-1]))
        )
        for name in names
    ]
    calibration = [gpt2.args[0], gpt2.args[0].flip(0)]
    with torch.no_grad():
        for ids in calibration:
            model(ids, use_cache=False)
    for hook in hooks:
        hook.remove()
    norms = fp.input_norms(model, [{"input_ids": ids, "use_cache": False} for ids in calibration], names)
    params = {n: p.detach() for n, p in model.named_parameters()}
    scores = fp.wanda(params, norms)
    squares = 0
    for name in names:
        expected = torch.linalg.vector_norm(torch.cat(captured[name]), dim=0)
        assert norms[name].shape == (params[name].shape[0], 1)
        torch.testing.assert_close(norms[name].flatten(), expected)
        linear = params[name].T  # (out, in): the Linear twin's weight
        torch.testing.assert_close(scores[name], fp.wanda({name: linear}, {name: expected})[name].T)
        squares += params[name].shape[0] == params[name].shape[1]
    assert squares == 2  # attn.c_proj: square, where the wrong dim would pass unnoticed
