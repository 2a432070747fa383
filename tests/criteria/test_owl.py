"""OWL's layerwise sparsities (funcprune._criteria._owl): OWL's own steps, properties, grouping, errors.

The reference follows ``prune_wanda_outlier`` and ``check_outlier_mean`` of
luuyin/OWL's ``lib/prune_all.py`` step by step, with OWL's statistic
(``scaler_row``, the mean squared norm per calibration sample) in place of
the norms, in ``float64``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from hypothesis import assume, given
from hypothesis import strategies as st
from torch import nn

import funcprune as fp

Tensor = torch.Tensor
Layer = tuple[str, Tensor, Tensor]  # name, weight as stored, norms as fp.input_norms gives them
NSAMPLES = 4  # OWL's scaler_row is ||X_j||^2 / nsamples; a power of 2 keeps sqrt(scaler_row) = norm / 2 exact

SEED = st.integers(0, 2**31 - 1)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def model_layers(seed: int, n_blocks: int, per_block: int) -> list[list[Layer]]:
    """Blocks of weights with heavy tails of block-dependent weight: outlier ratios that differ.

    Every third weight is stored as transformers' Conv1D, ``(in, out)``, with a column of norms.
    """
    g = gen(seed)
    blocks: list[list[Layer]] = []
    for b in range(n_blocks):
        tail = float(torch.rand((), generator=g)) * 2.0
        layers: list[Layer] = []
        prefix = f"transformer.h.{b}" if b % 2 else f"model.layers.{b}"
        for k in range(per_block):
            out, inp = (int(x) for x in torch.randint(2, 9, (2,), generator=g))
            w = torch.randn(out, inp, generator=g, dtype=torch.float64)
            w = w * torch.exp(tail * torch.randn(out, inp, generator=g, dtype=torch.float64))
            norms = torch.rand(inp, generator=g, dtype=torch.float64) * 3
            if (b + k) % 3 == 2:
                layers.append((f"{prefix}.sub{k}.c_attn.weight", w.T.contiguous(), norms.reshape(-1, 1)))
            else:
                layers.append((f"{prefix}.sub{k}.proj.weight", w.to(torch.float32), norms.to(torch.float32)))
        blocks.append(layers)
    return blocks


def as_dicts(blocks: list[list[Layer]]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    layers = [layer for block in blocks for layer in block]
    return {n: w for n, w, _ in layers}, {n: x for n, _, x in layers}


def linear_view(weight: Tensor, norms: Tensor) -> Tensor:
    """The weight as ``(out, in)``, as OWL's Linear layers hold it."""
    return weight.T if norms.dim() == 2 else weight


def owl_ratio(block: list[Layer], m: float) -> float:
    """OWL's outlier ratio of one decoder block (prune_all.py lines 915-951 and 139-154)."""
    layer_wmetric = []
    for _, weight, norms in block:
        scaler_row = (norms.flatten().to(torch.float64) ** 2) / NSAMPLES
        w = linear_view(weight, norms).to(torch.float64)
        layer_wmetric.append(torch.abs(w) * torch.sqrt(scaler_row.reshape((1, -1))))
    flat = torch.cat([torch.flatten(x) for x in layer_wmetric])
    max_shred = torch.mean(flat) * m
    count = (flat > max_shred).sum().item()
    return float(count) / flat.numel() * 100


def owl_reference(blocks: list[list[Layer]], sparsity: float, lam: float, m: float) -> list[float]:
    """Each block's sparsity as OWL computes it (lines 962-966, then 1054: ``1 - all_layer_ratio[i]``)."""
    all_layer_ratio = torch.tensor([owl_ratio(block, m) for block in blocks], dtype=torch.float64)
    all_layer_ratio = (all_layer_ratio - all_layer_ratio.min()) * (
        1 / (all_layer_ratio.max() - all_layer_ratio.min()) * lam * 2
    )
    all_layer_ratio = all_layer_ratio - torch.mean(all_layer_ratio) + (1 - sparsity)
    return [1 - float(r) for r in all_layer_ratio]


def per_block(blocks: list[list[Layer]], found: dict[str, float]) -> list[float]:
    """The target of each block, after checking that its tensors share it."""
    targets = []
    for block in blocks:
        shared = {found[name] for name, _, _ in block}
        assert len(shared) == 1, shared
        targets.append(shared.pop())
    return targets


# --- OWL's code -----------------------------------------------------------------------------


@given(SEED, st.integers(2, 5), st.integers(1, 3), st.sampled_from([2.0, 3, 5]),
       st.floats(0.3, 0.7), st.floats(0.0, 0.07))  # fmt: skip
def test_owl_sparsity_is_owls_code(seed: int, n: int, k: int, m: float, s: float, lam: float) -> None:
    blocks = model_layers(seed, n, k)
    ratios = [owl_ratio(block, m) for block in blocks]
    assume(max(ratios) > min(ratios))  # else OWL divides 0 by 0 (tested below)
    params, norms = as_dicts(blocks)
    found = fp.owl_sparsity(params, norms, s, lam=lam, m=m)
    assert list(found) == list(params) and all(type(t) is float for t in found.values())
    for ours, theirs in zip(per_block(blocks, found), owl_reference(blocks, s, lam, m), strict=True):
        assert abs(ours - theirs) <= 1e-12


def test_the_default_m_and_lam_are_owls_scripts() -> None:
    blocks = model_layers(7, 4, 2)
    params, norms = as_dicts(blocks)
    ratios = [owl_ratio(block, 5) for block in blocks]
    assert max(ratios) > min(ratios)
    ours = per_block(blocks, fp.owl_sparsity(params, norms, 0.7))
    assert ours == pytest.approx(owl_reference(blocks, 0.7, 0.08, 5), abs=1e-12)


# --- properties -----------------------------------------------------------------------------


@given(SEED, st.integers(1, 6), st.integers(1, 3), st.sampled_from([2.0, 3, 5]),
       st.floats(0.0, 1.0), st.floats(0.0, 0.25))  # fmt: skip
def test_targets_average_to_sparsity_span_2_lam_and_fall_as_outliers_rise(
    seed: int, n: int, k: int, m: float, s: float, lam: float
) -> None:
    blocks = model_layers(seed, n, k)
    params, norms = as_dicts(blocks)
    try:
        found = fp.owl_sparsity(params, norms, s, lam=lam, m=m)
    except ValueError as e:  # the only refusal of valid inputs: a target out of [0, 1], where OWL clips
        assert "outside [0, 1]" in str(e) and 2 * lam > min(s, 1 - s)
        theirs = owl_reference(blocks, s, lam, m)
        assert min(theirs) < 0.0 or max(theirs) > 1.0
        return
    targets, ratios = per_block(blocks, found), [owl_ratio(block, m) for block in blocks]
    assert all(0.0 <= t <= 1.0 for t in targets)
    assert abs(sum(targets) / n - s) <= 1e-12  # the unweighted mean over the blocks
    if lam == 0.0 or max(ratios) == min(ratios):
        assert targets == [s] * n
        return
    assert abs(max(targets) - min(targets) - 2 * lam) <= 1e-12
    assert all(s - 2 * lam - 1e-12 <= t <= s + 2 * lam + 1e-12 for t in targets)
    assert min(targets) - 1e-12 <= s <= max(targets) + 1e-12
    for i in range(n):
        for j in range(n):
            if ratios[i] > ratios[j]:
                assert targets[i] <= targets[j]  # more outliers, more kept
            if ratios[i] == ratios[j]:
                assert targets[i] == targets[j]


def spiky(outliers: int, numel: int = 20) -> Tensor:
    """A ``(1, numel)`` weight of ones with ``outliers`` entries of 1000: above 5x the mean while few."""
    w = torch.ones(1, numel)
    w[0, :outliers] = 1000.0
    return w


def test_targets_are_not_centred_on_sparsity_as_owls_code_shifts_by_the_mean() -> None:
    """One block with outliers, two without: it gets s - 4 lam / 3, beyond the paper's [S - lam, S + lam]."""
    params = {f"layers.{i}.fc.weight": spiky(o) for i, o in enumerate([1, 0, 0])}
    norms = {name: torch.ones(20) for name in params}
    found = list(fp.owl_sparsity(params, norms, 0.5, lam=0.09).values())
    assert found == pytest.approx([0.5 - 0.12, 0.56, 0.56], abs=1e-12)


def test_uniform_with_one_group_equal_ratios_or_lam_0() -> None:
    one = {"model.layers.0.q.weight": spiky(1), "model.layers.0.k.weight": spiky(0)}
    norms = {name: torch.ones(20) for name in one}
    assert fp.owl_sparsity(one, norms, 0.3) == dict.fromkeys(one, 0.3)
    equal = {f"layers.{i}.fc.weight": spiky(1) for i in range(3)}
    norms = {name: torch.ones(20) for name in equal}
    assert fp.owl_sparsity(equal, norms, 0.3) == dict.fromkeys(equal, 0.3)
    differ = {f"layers.{i}.fc.weight": spiky(i) for i in range(3)}
    norms = {name: torch.ones(20) for name in differ}
    assert fp.owl_sparsity(differ, norms, 0.3, lam=0.0) == dict.fromkeys(differ, 0.3)
    assert fp.owl_sparsity({}, {}, 0.3) == {}


def test_inputs_are_left_alone_and_norms_may_be_scaled() -> None:
    params, norms = as_dicts(model_layers(3, 3, 2))
    before = {n: t.clone() for n, t in params.items()}
    found = fp.owl_sparsity(params, norms, 0.5, m=3)
    assert all(torch.equal(params[n], before[n]) for n in params)
    assert fp.owl_sparsity(params, {n: x * 8 for n, x in norms.items()}, 0.5, m=3) == found


# --- groups ---------------------------------------------------------------------------------


def test_the_default_group_is_the_prefix_through_the_last_numeric_component() -> None:
    params = {
        "model.layers.10.self_attn.q_proj.weight": spiky(2),
        "model.layers.10.mlp.up_proj.weight": spiky(0),
        "model.layers.2.self_attn.q_proj.weight": spiky(0),
        "transformer.h.2.attn.c_attn.weight": spiky(1).T.contiguous(),  # a Conv1D: (in, out)
        "lm_head.weight": spiky(0),
    }
    norms = {name: torch.ones(20) for name in params}
    norms["transformer.h.2.attn.c_attn.weight"] = torch.ones(20, 1)
    keys = {
        "model.layers.10.self_attn.q_proj.weight": "model.layers.10",
        "model.layers.10.mlp.up_proj.weight": "model.layers.10",
        "model.layers.2.self_attn.q_proj.weight": "model.layers.2",
        "transformer.h.2.attn.c_attn.weight": "transformer.h.2",
        "lm_head.weight": "lm_head.weight",
    }
    found = fp.owl_sparsity(params, norms, 0.5, lam=0.04)
    assert found == fp.owl_sparsity(params, norms, 0.5, lam=0.04, blocks=keys.__getitem__)
    # ratios in percent: 5 (2 of 40), 0, 5 (1 of 20), 0: scaled to 0.08, 0, 0.08, 0 around the mean 0.04
    assert list(found.values()) == pytest.approx([0.46, 0.46, 0.54, 0.46, 0.54], abs=1e-12)


def test_blocks_groups_as_told() -> None:
    params = {f"model.layers.{i}.fc.weight": spiky(o) for i, o in enumerate([2, 0, 0, 0])}
    norms = {name: torch.ones(20) for name in params}
    by_pairs = fp.owl_sparsity(params, norms, 0.5, lam=0.05, blocks=lambda n: str(int(n.split(".")[2]) // 2))
    assert list(by_pairs.values()) == pytest.approx([0.45, 0.45, 0.55, 0.55], abs=1e-12)
    alone = fp.owl_sparsity(params, norms, 0.5, lam=0.05, blocks=lambda n: "all")
    assert alone == dict.fromkeys(params, 0.5)


def test_on_a_model_with_input_norms() -> None:
    torch.manual_seed(0)
    linears = [nn.Linear(6, 6) for _ in range(3)]
    model = nn.Sequential(*(nn.Sequential(linear, nn.ReLU()) for linear in linears))
    with torch.no_grad():
        for linear in linears:
            nn.init.ones_(linear.weight)
        linears[1].weight[0, 0] = 50.0  # an outlier weight in block 1, an outlier feature into block 2
    params: dict[str, Tensor] = {n: p for n, p in model.named_parameters() if n.endswith("weight")}
    norms = fp.input_norms(model, [torch.randn(8, 6)], list(params))
    found = fp.owl_sparsity(params, norms, 0.5, m=3)
    assert list(found) == ["0.0.weight", "1.0.weight", "2.0.weight"]
    blocks = [[(name, params[name], norms[name])] for name in params]
    assert list(found.values()) == pytest.approx(owl_reference(blocks, 0.5, 0.08, 3), abs=1e-12)
    assert found["2.0.weight"] < found["1.0.weight"] < found["0.0.weight"]  # 6, 1 and 0 outliers of 36


# --- errors ---------------------------------------------------------------------------------

W = {"layers.0.fc.weight": torch.ones(3, 4)}
N = {"layers.0.fc.weight": torch.ones(4)}


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((nn.Linear(2, 2), N, 0.5), {}, TypeError, "params must be a mapping of names to tensors, got a module"),
        (({"a": 1.0}, N, 0.5), {}, TypeError, r"params\['a'\] must be a tensor, got float"),
        ((W, [1.0], 0.5), {}, TypeError, "input_norms must be a mapping of names to tensors, got list"),
        ((W, N, "0.5"), {}, TypeError, "sparsity must be a float in"),
        ((W, N, 1.5), {}, ValueError, r"sparsity must be a float in \[0, 1\], got 1.5"),
        ((W, N, 0.5), {"lam": True}, TypeError, "lam must be a real number >= 0, got True"),
        ((W, N, 0.5), {"lam": -0.1}, ValueError, "lam must be a finite real number >= 0, got -0.1"),
        ((W, N, 0.5), {"lam": float("nan")}, ValueError, "lam must be a finite real number >= 0, got nan"),
        ((W, N, 0.5), {"m": "5"}, TypeError, "m must be a real number > 0, got '5'"),
        ((W, N, 0.5), {"m": 0}, ValueError, "m must be a finite real number > 0, got 0"),
        ((W, N, 0.5), {"blocks": "layers"}, TypeError, "blocks must be a callable name -> str or None, got 'layers'"),
        ((W, N, 0.5), {"blocks": len}, TypeError, r"blocks\('layers.0.fc.weight'\) must return a str, got 18"),
        ((W | {"b.weight": torch.ones(2, 2)}, N, 0.5), {}, ValueError,
         r"input_norms has no norms for 1 name\(s\) of params: 'b.weight'"),
        ((W, {"layers.0.fc.weight": torch.ones(3)}, 0.5), {}, ValueError,
         r"input_norms\['layers.0.fc.weight'\] has shape \(3,\) but the parameter has 4 input features"),
        ((W, {"layers.0.fc.weight": torch.ones(4, 2)}, 0.5), {}, ValueError, "does not fit the parameter's shape"),
        ((W, {"layers.0.fc.weight": torch.ones(4, dtype=torch.int64)}, 0.5), {}, TypeError,
         "has dtype torch.int64; scores need floating-point tensors"),
        ((W, {"layers.0.fc.weight": torch.ones(4, device="meta")}, 0.5), {}, ValueError, "is on meta"),
        (({"b": torch.ones(4)}, {"b": torch.ones(4)}, 0.5), {}, ValueError, r"the parameter 'b' has shape \(4,\)"),
        (({"b": torch.full((2, 2), float("nan"))}, {"b": torch.ones(2)}, 0.5), {}, ValueError,
         "the parameter 'b' holds NaN or inf; expected finite weights"),
        ((W, {"layers.0.fc.weight": torch.tensor([1.0, -1.0, 1.0, 1.0])}, 0.5), {}, ValueError,
         r"input_norms\['layers.0.fc.weight'\] holds NaN, inf or negative values"),
        ((W, {"layers.0.fc.weight": torch.full((4,), float("inf"))}, 0.5), {}, ValueError,
         "holds NaN, inf or negative values; expected finite norms >= 0"),
        (({"b": torch.ones(0, 2)}, {"b": torch.ones(2)}, 0.5), {}, ValueError,
         "the group 'b' has no entries"),
    ],
)  # fmt: skip
def test_errors(args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=f"^owl_sparsity: .*{match}"):
        fp.owl_sparsity(*args, **kwargs)


@pytest.mark.parametrize(
    ("s", "lam", "outliers"),
    [(0.95, 0.08, [0, 1]), (0.05, 0.08, [0, 1]), (0.5, 0.4, [1, 0, 0])],  # the last: [s - lam, s + lam] fits
)
def test_a_target_out_of_0_1_is_refused_not_clipped(s: float, lam: float, outliers: list[int]) -> None:
    params = {f"layers.{i}.fc.weight": spiky(o) for i, o in enumerate(outliers)}
    norms = {name: torch.ones(20) for name in params}
    with pytest.raises(ValueError, match=r"owl_sparsity: the group 'layers\.[0-2]' gets sparsity -?[0-9.]+, outside \[0, 1\]"):
        fp.owl_sparsity(params, norms, s, lam=lam)
    assert all(0.0 <= t <= 1.0 for t in fp.owl_sparsity(params, norms, s, lam=min(s, 1 - s) / 2).values())


def test_a_target_at_0_or_1_up_to_rounding_is_kept() -> None:
    params = {f"layers.{i}.fc.weight": spiky(o) for i, o in enumerate([0, 1])}
    norms = {name: torch.ones(20) for name in params}
    for s in (0.1, 0.3, 0.7, 0.9):
        lam = min(s, 1 - s)
        found = sorted(fp.owl_sparsity(params, norms, s, lam=lam).values())
        assert found == pytest.approx([s - lam, s + lam], abs=1e-12) and 0.0 <= found[0] and found[1] <= 1.0


needs_gloo = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed with gloo"
)


@needs_gloo
def test_a_dtensor_is_refused(mesh: Any) -> None:
    from torch.distributed.tensor import Replicate, distribute_tensor

    dw = distribute_tensor(torch.ones(3, 4), mesh, [Replicate()])
    with pytest.raises(TypeError, match=r"owl_sparsity: params\['w'\] or its norms is a DTensor"):
        fp.owl_sparsity({"w": dw}, {"w": torch.ones(4)}, 0.5)
