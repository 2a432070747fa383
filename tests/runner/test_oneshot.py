"""fp.oneshot on the transformers matrix: exact counts, the block-by-block definition, OWL, the model untouched.

The reference for the runner is its definition, computed the slow way with
the public functions: block ``i``'s masks (and SparseGPT's weights) are
what magnitude, Wanda or SparseGPT give on block ``i``'s weights when the
whole model, with blocks ``0..i-1`` already pruned (baked into a copy),
runs on the calibration batches (``fp.input_norms`` / ``fp.hessians`` over
the full forward).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import funcprune as fp

sys.path.insert(0, str(Path(__file__).parents[1]))
import _hf  # noqa: E402

Tensor = torch.Tensor
SPECS: dict[str, fp.Spec] = {
    "unstructured": fp.L1Unstructured(0.5),
    "per_row": fp.PerSlice(fp.L1Unstructured(0.5), dim=0),
    "2:4": fp.NM(2, 4),
}


def batches_of(tiny: _hf.Tiny, count: int = 2) -> list[dict[str, Any]]:
    """``count`` calibration batches for ``tiny``'s model: its inputs, shifted."""
    out = []
    for k in range(count):
        if tiny.name == "vit":
            out.append({"pixel_values": tiny.args[0] + 0.1 * k})
        else:
            out.append({"input_ids": (tiny.args[0] + k) % _hf.VOCAB, **tiny.kwargs})
    return out


def state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def block_names(names: list[str]) -> list[list[str]]:
    """Names grouped by block index (the number after the layers' path), in order."""
    groups: dict[str, list[str]] = {}
    for name in names:
        parts = name.split(".")
        i = next(j for j, p in enumerate(parts) if p.isdigit())
        groups.setdefault(".".join(parts[: i + 1]), []).append(name)
    return list(groups.values())


def by_definition(
    tiny: _hf.Tiny, batches: list[dict[str, Any]], method: str, spec: fp.Spec
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Each block pruned on the inputs of the whole model with the earlier blocks pruned: the slow way."""
    model, dims = copy.deepcopy(tiny.model), fp.input_dims(tiny.model)
    weights: dict[str, Tensor] = {}
    masks: dict[str, Tensor] = {}
    names = fp.oneshot(tiny.model, batches, method="magnitude", spec=spec)[1]  # the default names
    for group in block_names(list(names)):
        params = dict(model.named_parameters())
        here = {n: params[n].detach() for n in group}
        if method == "wanda":
            norms = fp.input_norms(model, batches, group)
            got = fp.Plan(dict.fromkeys(group, spec), input_dims=dims)(here, scores=fp.wanda(here, norms, input_dims=dims))
            new = {n: t.clone() for n, t in here.items()}
        else:
            new, got = fp.sparsegpt(here, fp.hessians(model, batches, group), spec, input_dims=dims)
        masks.update(got)
        weights.update(new)
        with torch.no_grad():  # prune the block in the copy before calibrating the next
            for n in group:
                params[n].copy_(new[n] * got[n])
    return weights, masks


#: Every model with every method; the specs rotate so that each model meets each spec once (a full cross is 3x slower).
MATRIX_CASES = [
    (name, method, list(SPECS)[(i + j) % 3])
    for i, name in enumerate(_hf.MATRIX)
    for j, method in enumerate(["magnitude", "wanda", "sparsegpt"])
]


@pytest.mark.parametrize(("name", "method", "shape"), MATRIX_CASES)
def test_every_model_of_the_matrix_is_pruned_with_exact_counts(name: str, method: str, shape: str) -> None:
    spec = SPECS[shape]
    tiny = _hf.tiny(name)
    before = state(tiny.model)
    params, masks = fp.oneshot(tiny.model, batches_of(tiny), method=method, spec=spec)
    dims = fp.input_dims(tiny.model)
    every = dict(tiny.model.named_parameters())
    assert set(params) == set(every)
    inside = [n for n in fp.prunable(tiny.model, experts=True) if ".layers." in n or ".h." in n or ".layer." in n]
    assert list(masks) == inside  # the experts' stacked weights too (Mixtral's), each expert's slice counted apart
    for n, mask in masks.items():
        assert mask.dtype == torch.bool and mask.shape == every[n].shape
        for view in mask if mask.dim() == 3 else [mask.T if dims[n] == 0 else mask]:  # (out, in)
            if isinstance(spec, fp.NM):
                assert torch.all(view.reshape(view.shape[0], -1, 4).sum(dim=-1) == 2)
            elif isinstance(spec, fp.PerSlice):
                assert torch.all((~view).sum(dim=1) == round(0.5 * view.shape[1]))
            else:  # sparsegpt: of every block of 128 columns, here one block
                assert int((~view).sum()) == round(0.5 * view.numel())
        assert torch.all(params[n][~mask] == 0) if method == "sparsegpt" else params[n] is every[n]
    # the model is untouched: same values, no hooks left; and the pruned model runs
    after = state(tiny.model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in tiny.model.modules())
    out = fp.functional_call_masked(tiny.model, params, masks, (), batches_of(tiny, 1)[0])
    assert torch.isfinite(out.logits).all()


@pytest.mark.parametrize(
    ("name", "method", "shape"),
    [("gpt2", "wanda", "2:4"), ("gpt2", "sparsegpt", "per_row"), ("llama", "wanda", "per_row"),
     ("llama", "sparsegpt", "2:4"), ("qwen3", "sparsegpt", "unstructured"), ("bert", "sparsegpt", "2:4")],
)  # fmt: skip
def test_each_block_is_pruned_on_what_the_pruned_blocks_before_it_compute(name: str, method: str, shape: str) -> None:
    spec = SPECS[shape]
    tiny = _hf.tiny(name, layers=3)
    batches = batches_of(tiny, 3)
    params, masks = fp.oneshot(tiny.model, batches, method=method, spec=spec)
    weights, want = by_definition(tiny, batches, method, spec)
    assert list(masks) == list(want)
    for n in want:
        assert torch.equal(masks[n], want[n]), n
        torch.testing.assert_close(params[n], weights[n], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "name",
    ["llama", "deepseek_v3", *(pytest.param(n, marks=pytest.mark.ci) for n in ("gemma2", "phi3", "falcon", "granitemoe"))],
)
def test_padding_is_left_out_of_the_statistics(name: str) -> None:
    tiny = _hf.tiny(name)  # DeepSeek-V3's MLA projects its (batch, 1, tokens, features) keys: the padding is found
    ids = tiny.args[0]
    padded = torch.cat([ids, torch.zeros(2, 3, dtype=ids.dtype)], dim=1)  # right padding
    mask = torch.cat([torch.ones_like(ids), torch.zeros(2, 3, dtype=ids.dtype)], dim=1)
    plain = fp.oneshot(tiny.model, [{"input_ids": ids}], method="sparsegpt", spec=SPECS["2:4"])
    pad = fp.oneshot(tiny.model, [{"input_ids": padded, "attention_mask": mask}], method="sparsegpt", spec=SPECS["2:4"])
    for n in plain[1]:
        assert torch.equal(plain[1][n], pad[1][n])
        torch.testing.assert_close(plain[0][n], pad[0][n], rtol=1e-4, atol=1e-5)


def test_owl_sets_per_block_sparsities_that_average_the_target() -> None:
    tiny = _hf.tiny("llama", layers=4)
    batches = batches_of(tiny, 2)
    params, masks = fp.oneshot(tiny.model, batches, method="wanda", spec=fp.PerSlice(fp.L1Unstructured(0.7), dim=0),
                               allocation="owl")  # fmt: skip
    groups = block_names(list(masks))
    sparsities = [float(sum((~masks[n]).sum() for n in g) / sum(masks[n].numel() for n in g)) for g in groups]
    norms = fp.input_norms(tiny.model, batches, list(masks))
    targets = fp.owl_sparsity({n: params[n] for n in masks}, norms, 0.7)
    for g, s in zip(groups, sparsities, strict=True):
        assert s == pytest.approx(targets[g[0]], abs=0.02)  # per row: round(target * in) of each row
    assert sum(sparsities) / len(sparsities) == pytest.approx(0.7, abs=0.02)
    assert len({round(s, 3) for s in sparsities}) > 1


def test_an_allocation_mapping_sets_each_weight() -> None:
    tiny = _hf.tiny("gpt2")
    names = fp.oneshot(tiny.model, [], method="magnitude", spec=SPECS["unstructured"])[1]
    allocation = {n: 0.25 * (i % 3) for i, n in enumerate(names)}
    _, masks = fp.oneshot(tiny.model, batches_of(tiny), method="sparsegpt", spec=fp.L1Unstructured(0.5),
                          allocation=allocation)  # fmt: skip
    for n, mask in masks.items():
        assert int((~mask).sum()) == round(allocation[n] * mask.numel())


def test_named_weights_outside_the_blocks_are_pruned_last() -> None:
    tiny = _hf.tiny("llama")  # its head is not tied to the embedding
    names = [*fp.prunable(tiny.model), "lm_head.weight"]
    for method in ("wanda", "sparsegpt"):
        params, masks = fp.oneshot(tiny.model, batches_of(tiny), method=method, spec=SPECS["per_row"], names=names)
        assert set(masks) == set(names)
        assert torch.all((~masks["lm_head.weight"]).sum(dim=1) == 16)


def test_explicit_device_gives_the_same_result() -> None:
    tiny = _hf.tiny("mistral")
    batches = batches_of(tiny)
    a = fp.oneshot(tiny.model, batches, method="sparsegpt", spec=SPECS["2:4"])
    b = fp.oneshot(tiny.model, batches, method="sparsegpt", spec=SPECS["2:4"], device="cpu")
    for n in a[1]:
        assert torch.equal(a[1][n], b[1][n]) and torch.equal(a[0][n], b[0][n])


@pytest.mark.parametrize("name", ["llama", "mixtral"])
@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_inplace_writes_the_pure_call_s_weights_into_the_model(name: str, method: str) -> None:
    """Issue 42: ``inplace=True`` gives the pure call's params and masks bit for bit, the params being the model's own
    tensors, SparseGPT's new weights written into them (the head too, named outside the blocks); through ``device=``
    as well. The pure call leaves the model as it was."""
    tiny = _hf.tiny(name)
    if name in _hf.MOE:
        tiny_model: Any = tiny.model
        tiny_model.config._experts_implementation = "eager"
    names = [*fp.prunable(tiny.model, experts=True), *(["lm_head.weight"] if name == "llama" else [])]
    before = state(tiny.model)
    pure, pure_masks = fp.oneshot(tiny.model, batches_of(tiny), method=method, spec=SPECS["2:4"], names=names)
    assert all(torch.equal(v, before[k]) for k, v in tiny.model.state_dict().items())
    for device in (None, "cpu"):
        model = copy.deepcopy(tiny.model)
        params, masks = fp.oneshot(model, batches_of(tiny), method=method, spec=SPECS["2:4"], names=names,
                                   device=device, inplace=True)  # fmt: skip
        own = dict(model.named_parameters())
        assert list(masks) == list(pure_masks)
        for n in masks:
            assert torch.equal(masks[n], pure_masks[n]) and torch.equal(own[n], pure[n]), (device, n)
            assert params[n] is own[n]
        changed = [n for n in masks if not torch.equal(before[n], own[n])]
        assert bool(changed) == (method == "sparsegpt")


class _Shared(nn.Module):
    """A block whose two Linear layers share one weight (a tied pair)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8, bias=False)
        self.b = nn.Linear(8, 8, bias=False)
        self.b.weight = self.a.weight

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = x + self.b(torch.relu(self.a(x)))
        return out


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Shared(), _Shared()])

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        assert isinstance(x, Tensor)
        return x


def test_inplace_refuses_a_tied_weight_and_a_non_bool() -> None:
    torch.manual_seed(0)
    model = _Stack()
    batches = [torch.randn(4, 8)]
    with pytest.raises(ValueError, match=r"^oneshot: inplace=True would write 'layers.0.a.weight', which is tied to "
                                         r"'layers.0.b.weight' \(one tensor\)"):  # fmt: skip
        fp.oneshot(model, batches, method="sparsegpt", spec=SPECS["2:4"], inplace=True)
    params, _ = fp.oneshot(model, batches, method="sparsegpt", spec=SPECS["2:4"])  # the pure call: a new tensor
    assert params["layers.0.a.weight"] is not model.get_parameter("layers.0.a.weight")
    with pytest.raises(TypeError, match=r"^oneshot: inplace must be a bool, got 1$"):
        fp.oneshot(model, batches, method="wanda", spec=SPECS["2:4"], inplace=1)  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_blocks_match_cpu() -> None:
    tiny = _hf.tiny("llama")
    batches = batches_of(tiny)
    a = fp.oneshot(tiny.model, batches, method="sparsegpt", spec=SPECS["2:4"])
    b = fp.oneshot(tiny.model, batches, method="sparsegpt", spec=SPECS["2:4"], device="cuda")
    for n in a[1]:
        assert b[1][n].device.type == "cpu"
        assert (a[1][n] != b[1][n]).float().mean() < 0.01
        torch.testing.assert_close(a[0][n], b[0][n], rtol=1e-3, atol=1e-3)


def test_a_model_without_repeated_blocks_and_other_errors_are_refused_before_calibration() -> None:
    tiny = _hf.tiny("llama")
    consumed = []

    def batches() -> Any:
        consumed.append(True)
        yield {"input_ids": tiny.args[0]}

    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"method": "obs", "spec": SPECS["2:4"]}, ValueError, "method must be one of"),
        ({"method": "wanda", "spec": 0.5}, TypeError, "spec must be a funcprune spec"),
        ({"method": "sparsegpt", "spec": fp.RandomUnstructured(0.5)}, ValueError, "spec must be"),
        ({"method": "wanda", "spec": SPECS["2:4"], "names": ["nope.weight"]}, fp.UnknownNameError, "nope"),
        ({"method": "wanda", "spec": SPECS["2:4"], "names": ["model.embed_tokens.weight"]}, ValueError, "Linear"),
        ({"method": "wanda", "spec": SPECS["2:4"], "names": "model.layers.0.mlp.up_proj.weight"}, TypeError, "list"),
        ({"method": "wanda", "spec": SPECS["2:4"], "allocation": "owl"}, ValueError, "L1Unstructured"),
        ({"method": "wanda", "spec": SPECS["per_row"], "allocation": "erk"}, TypeError, "allocation must be"),
        ({"method": "wanda", "spec": SPECS["per_row"], "allocation": {}}, ValueError, "no sparsity for"),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            fp.oneshot(tiny.model, batches(), **kwargs)
    assert not consumed
    with pytest.raises(ValueError, match="no repeated blocks"):
        fp.oneshot(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)), [], method="wanda", spec=SPECS["2:4"])
    with pytest.raises(ValueError, match="no batches"):
        fp.oneshot(tiny.model, [], method="wanda", spec=SPECS["2:4"])


def test_any_model_with_a_module_list_of_blocks_works() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)

        def forward(self, x: Tensor, scale: Tensor) -> Tensor:
            out: Tensor = x + self.fc2(torch.relu(self.fc1(x))) * scale
            return out

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp, self.blocks, self.out = nn.Linear(4, 8), nn.ModuleList([Block() for _ in range(3)]), nn.Linear(8, 2)

        def forward(self, x: Tensor) -> Tensor:
            h = self.inp(x)
            for block in self.blocks:
                h = block(h, scale=torch.tensor(0.5))
            out: Tensor = self.out(h)
            return out

    torch.manual_seed(0)
    net = Net()
    x = torch.randn(16, 4)
    params, masks = fp.oneshot(net, [x], method="wanda", spec=SPECS["per_row"])
    assert list(masks) == [f"blocks.{i}.fc{j}.weight" for i in range(3) for j in (1, 2)]
    # block 1's scores come from what pruned block 0 computes
    inputs: list[Tensor] = []
    second = net.blocks[1]
    assert isinstance(second, Block)
    handle = second.fc1.register_forward_pre_hook(lambda m, a: inputs.append(a[0]))
    fp.functional_call_masked(net, params, {n: m for n, m in masks.items() if n.startswith("blocks.0.")}, (x,))
    handle.remove()
    norms = inputs[0].square().sum(dim=0).sqrt()
    w = second.fc1.weight.detach()
    want = fp.PerSlice(fp.L1Unstructured(0.5), dim=0).compute_mask(w.abs() * norms)
    assert torch.equal(masks["blocks.1.fc1.weight"], want)


def test_refusals_added_by_review_come_before_calibration() -> None:
    tiny = _hf.tiny("llama")
    consumed = []

    def batches() -> Any:
        consumed.append(True)
        yield {"input_ids": tiny.args[0]}

    names = fp.oneshot(tiny.model, [], method="magnitude", spec=SPECS["per_row"])[1]
    with pytest.raises(ValueError, match="allocation has a sparsity for 'lm_head.weight'"):
        fp.oneshot(tiny.model, batches(), method="wanda", spec=SPECS["per_row"],
                   allocation={**dict.fromkeys(names, 0.5), "lm_head.weight": 0.5})  # fmt: skip
    with pytest.raises(ValueError, match="no weight named is inside the blocks"):
        fp.oneshot(tiny.model, batches(), method="wanda", spec=SPECS["per_row"], names=["lm_head.weight"],
                   allocation="owl")  # fmt: skip
    with pytest.raises(ValueError, match=r"'model.layers.0.mlp.down_proj.weight' has 48 inputs, not a multiple of"):
        fp.oneshot(tiny.model, batches(), method="sparsegpt", spec=fp.NM(2, 32))
    assert not consumed
    assert fp.oneshot(tiny.model, batches(), method="wanda", spec=SPECS["2:4"], names=[])[1] == {}
    tied = _hf.tiny("gpt2").model  # its head is tied to the token embedding
    with pytest.raises(fp.UnknownNameError, match="the same Parameter as 'transformer.wte.weight'"):
        fp.oneshot(tied, batches(), method="magnitude", spec=SPECS["2:4"], names=["lm_head.weight"])


def test_the_blocks_run_once_for_statistics_and_once_to_advance_and_come_back_whole() -> None:
    tiny = _hf.tiny("llama", layers=4)
    runs = [0] * 4
    layers: Any = tiny.model.get_submodule("model.layers")
    handles = [b.register_forward_pre_hook(lambda m, a, i=i: runs.__setitem__(i, runs[i] + 1))
               for i, b in enumerate(layers)]  # fmt: skip
    try:
        fp.oneshot(tiny.model, batches_of(tiny, 1), method="wanda", spec=SPECS["2:4"])
    finally:
        for handle in handles:
            handle.remove()
    assert runs == [3, 3, 3, 2]  # the capture (block 0 computes, the others pass through), statistics, advancing
    assert not any("forward" in vars(b) for b in layers)


def test_a_module_list_that_is_not_a_chain_or_of_mixed_classes_is_refused() -> None:
    class Parallel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])

        def forward(self, x: Tensor) -> Tensor:
            return torch.stack([head(x) for head in self.heads]).sum(dim=0)

    with pytest.raises(ValueError, match="not a chain of blocks"):
        fp.oneshot(Parallel(), [torch.randn(4, 8)], method="wanda", spec=SPECS["per_row"])

    class Hybrid(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 8))])

        def forward(self, x: Tensor) -> Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    with pytest.raises(ValueError, match="holds layers of several classes"):
        fp.oneshot(Hybrid(), [torch.randn(4, 8)], method="wanda", spec=SPECS["per_row"])


# --- blocks that change their inputs in place ---------------------------------------------------


class InPlaceBlock(nn.Module):
    """A residual block that changes its input in place: ``fc2`` sees the tensor ``fc1`` saw, changed since."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        x += self.fc1(x)
        x.relu_()
        x += self.fc2(x)
        return x


class InPlaceNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(4, 8), nn.Linear(8, 3)
        self.blocks = nn.ModuleList([InPlaceBlock() for _ in range(3)])

    def forward(self, x: Tensor) -> Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        h.relu_()  # the head's input, changed in place after the last block's fc2 saw it
        out: Tensor = self.out(h)
        return out


def cloned_inputs(model: nn.Module, names: list[str], batches: list[Tensor]) -> dict[str, Tensor]:
    """The inputs reaching each named weight's layer, as ``(tokens, features)`` rows cloned by a hook of ours."""
    seen: dict[str, list[Tensor]] = {n: [] for n in names}
    handles = [model.get_submodule(n.rpartition(".")[0]).register_forward_pre_hook(
        lambda m, args, n=n: seen[n].append(args[0].detach().clone().reshape(-1, args[0].shape[-1])))
        for n in names]  # fmt: skip
    try:
        with torch.no_grad():
            for batch in batches:
                model(batch.clone())
    finally:
        for handle in handles:
            handle.remove()
    return {n: torch.cat(rows) for n, rows in seen.items()}


def in_place_by_definition(
    net: nn.Module, batches: list[Tensor], method: str, specs: dict[str, fp.Spec]
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Each block, then the head, pruned on what the model pruned so far feeds it: inputs cloned, no fp statistics."""
    model = copy.deepcopy(net)
    weights: dict[str, Tensor] = {}
    masks: dict[str, Tensor] = {}
    for group in [*block_names([n for n in specs if n.startswith("blocks.")]), ["out.weight"]]:
        params = dict(model.named_parameters())
        here = {n: params[n].detach().clone() for n in group}
        inputs = cloned_inputs(model, group, batches)
        if method == "wanda":
            norms = {n: inputs[n].square().sum(dim=0).sqrt() for n in group}
            got = fp.Plan({n: specs[n] for n in group})(here, scores=fp.wanda(here, norms))
            new = here
        else:
            new, got = fp.sparsegpt(here, {n: inputs[n].T @ inputs[n] for n in group}, specs[group[0]])
        masks.update(got)
        weights.update(new)
        with torch.no_grad():
            for n in group:
                params[n].copy_(new[n] * got[n])
    return weights, masks


@pytest.mark.parametrize("method", ["wanda", "sparsegpt", "wanda with owl"])
def test_blocks_and_a_head_fed_tensors_changed_in_place_are_calibrated_on_what_they_received(method: str) -> None:
    """Each layer's statistic is of its own input, though the blocks add to theirs in place (and the head's is too)."""
    torch.manual_seed(0)
    net = InPlaceNet().double().eval()
    batches = [torch.randn(6, 4, dtype=torch.float64), torch.randn(2, 5, 4, dtype=torch.float64)]
    before = [b.clone() for b in batches]
    names = [*(f"blocks.{i}.fc{j}.weight" for i in range(3) for j in (1, 2)), "out.weight"]
    spec = SPECS["per_row"]
    owl = method == "wanda with owl"
    specs: dict[str, fp.Spec] = dict.fromkeys(names, spec)
    if owl:  # OWL's targets from the dense model's norms, inputs cloned
        inputs = cloned_inputs(net, names[:-1], batches)
        dense = {n: p.detach() for n, p in net.named_parameters() if n in names[:-1]}
        norms = {n: x.square().sum(dim=0).sqrt() for n, x in inputs.items()}
        targets = fp.owl_sparsity(dense, norms, 0.5)
        specs.update({n: fp.PerSlice(fp.L1Unstructured(t), dim=0) for n, t in targets.items()})
    run = "wanda" if owl else method
    params, masks = fp.oneshot(net, batches, method=run, spec=spec, names=names, allocation="owl" if owl else None)
    weights, want = in_place_by_definition(net, batches, run, specs)
    assert list(masks) == names
    for n in names:
        assert torch.equal(masks[n], want[n]), n
        torch.testing.assert_close(params[n], weights[n], rtol=1e-9, atol=1e-12)
    assert all(torch.equal(b, a) for b, a in zip(batches, before, strict=True))  # the caller's batches untouched
