"""The masked model of a trial, made block by block: the bits of the whole model's copy, and the model left as it was."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from funcprune._graph import Inputs, as_inputs
from funcprune._payoff import _smaller
from funcprune._payoff._smaller import masked_run, masked_tensors, zeroed

Tensor = torch.Tensor


def _whole_copy(module: nn.Module, masks: Mapping[str, Tensor], inputs: Inputs, dropped: Any) -> Any:
    """The masked model as it was made before the blocks were: every tensor's copy made up front."""
    baked = masked_tensors(module, masks, dropped)
    with torch.no_grad():
        return torch.func.functional_call(module, baked, tuple(inputs.args), dict(inputs.kwargs))


def _hidden_dropped(model: nn.Module, channels: Sequence[int]) -> dict[str, dict[int, list[int]]]:
    """``channels`` of a Llama's hidden size zeroed in every tensor that holds them (as the hidden trial does)."""
    out: dict[str, dict[int, list[int]]] = {}
    for name, p in model.named_parameters():
        if p.dim() == 1:
            out[name] = {0: list(channels)}
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            out[name] = {0: list(channels)}
        elif "embed_tokens" in name:
            out[name] = {1: list(channels)}
        else:
            out[name] = {1: list(channels)}
    return out


def _state(model: nn.Module) -> list[tuple[str, int, int]]:
    return [(n, id(p), p._version) for n, p in model.named_parameters(remove_duplicate=False)]


def _values(model: nn.Module) -> list[bytes]:
    """Every parameter's bytes."""
    return [p.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes() for p in model.parameters()]


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


@pytest.mark.parametrize("tied", [False, True])
def test_a_trial_s_masked_model_made_block_by_block_is_the_whole_copy_bit_for_bit(tied: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hidden channel zeroed in every layer (the hidden trial's masked model), a mask on top of one block's
    weight, a tied head: the blocks' copies made as each block runs give the logits of the copies made up front,
    bit for bit; only the tensors outside the blocks (embedding, head, final norm) were copied up front, and each
    block's copies were written into the memory of the block before; and the model holds its own tensors after, not
    written, with no hook left."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    inputs = as_inputs("test", model, ids)
    dropped = _hidden_dropped(model, [5, 31])
    mask = torch.rand(48, 32, generator=torch.Generator().manual_seed(2)) > 0.3
    masks = {"model.layers.1.mlp.up_proj.weight": mask}
    up_front: list[str] = []
    real = _smaller.masked_tensors

    def recorded(module: nn.Module, m: Mapping[str, Tensor], d: Any = None) -> dict[str, Tensor]:
        out = real(module, m, d)
        up_front.extend(out)
        return out

    seen: list[set[int]] = []  # the memory each layer's tensors were bound in as it ran

    def bound(layer: nn.Module, args: Any) -> None:
        seen.append({p.data_ptr() for p in layer.parameters()})

    before, hooks, values = _state(model), _hooks(model), _values(model)
    spies = [layer.register_forward_pre_hook(bound) for layer in model.model.layers]
    monkeypatch.setattr(_smaller, "masked_tensors", recorded)
    mine = masked_run(model, masks, inputs, dropped=dropped, write=False).logits  # every zero in a copy
    for spy in spies:
        spy.remove()
    assert len(seen) == 3 and seen[0] == seen[1] == seen[2]  # each block's copies in the memory the first one's held
    monkeypatch.setattr(_smaller, "masked_tensors", real)
    theirs = _whole_copy(model, masks, inputs, dropped).logits
    assert torch.equal(mine.view(torch.int32), theirs.view(torch.int32))
    assert up_front and not any(".layers." in n for n in up_front)  # the blocks': made as each ran (a mask's too)
    assert _state(model) == before and _hooks(model) == hooks and _values(model) == values
    up_front.clear()
    monkeypatch.setattr(_smaller, "masked_tensors", recorded)
    written = masked_run(model, masks, inputs, dropped=dropped).logits  # the zeros written into the model's tensors
    assert torch.equal(written.view(torch.int32), theirs.view(torch.int32))
    assert up_front == []  # nothing copied up front: the embedding, the head, the final norm written for the run
    assert _state(model) == before and _values(model) == values  # put back bit for bit, no version moved
    dense = masked_run(model, {}, inputs).logits  # and the zeros were there: the masked model is another model
    assert not torch.equal(dense, mine)


class _Failing(RuntimeError):
    pass


def test_a_block_that_fails_leaves_the_model_as_it_was() -> None:
    """A block that raises while its copies are bound (or the zeros are written into the model's tensors): the error
    reaches the caller, and every parameter of the model is its own again, its values put back bit for bit, with no
    hook of the trial left."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    inputs = as_inputs("test", model, torch.randint(0, 64, (1, 8)))

    def fail(module: nn.Module, args: Any) -> None:
        raise _Failing("block 1")

    handle = model.model.layers[1].mlp.register_forward_pre_hook(fail)
    before, hooks, values = _state(model), _hooks(model), _values(model)
    for write in (True, False):  # the zeros written into the model's tensors for the run, or copies
        with pytest.raises(_Failing):
            masked_run(model, {}, inputs, dropped=_hidden_dropped(model, [3]), write=write)
        assert _state(model) == before and _hooks(model) == hooks and _values(model) == values
    handle.remove()


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return torch.tanh(self.lin(x)), self.lin.weight[0]  # a view of its weight, read after later blocks ran


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Block() for _ in range(3)])

    def forward(self, x: Tensor) -> Tensor:
        rows = []
        for block in self.blocks:
            x, row = block(x)
            rows.append(row)
        return x + torch.stack(rows).sum(0)


def test_a_copy_the_block_s_output_holds_is_not_written_again() -> None:
    """A block whose output is a view of its weight: the next block of that shape gets a new copy, not that one,
    so the output read after the later blocks ran is the masked weight's; and zeros written into the weights for the
    run are not what it returns (the values are put back: the run is made again with copies)."""
    torch.manual_seed(0)
    model = _Stack().eval()
    x = torch.randn(2, 4)
    inputs = Inputs((x,))
    dropped = {f"blocks.{i}.lin.weight": {1: [i]} for i in range(3)}
    assert torch.equal(masked_run(model, {}, inputs, dropped=dropped), _whole_copy(model, {}, inputs, dropped))


@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_shrink_s_masked_model_without_the_closure_is_the_closure_s_bit_for_bit(family: str) -> None:
    """shrink's check runs the masked model of the masks with the indices that go zeroed on top (no closure of the
    model's size made), block by block: the logits of the closure's masked model, bit for bit (routed experts too:
    the routers' masks are closed, so that removed experts are never routed to)."""
    import funcprune as fp
    from funcprune._graph import closure, kept_indices, plan_removal
    from funcprune._payoff._smaller import checking, masked_outputs, tensor_shapes
    from _hf import inputs as hf_inputs
    from _hf import tiny

    t = tiny(family, layers=3)
    x = hf_inputs(t)
    s = fp.structure(t.model, x)
    second = fp.structured(s, fp.LnStructured(0.4, n=1), kinds="experts" if family == "mixtral" else "channels")
    plan = fp.compose(fp.structured(s, fp.LnStructured(0.5, n=2), kinds="kv_groups"), second)
    masks = plan(dict(t.model.named_parameters()))
    analysis = s._analyzed.analysis  # type: ignore[attr-defined]
    sizes = tensor_shapes(t.model)
    removed = sorted(plan_removal("test", analysis, masks, sizes).removed)
    assert removed
    keep = kept_indices(analysis, removed, sizes)
    closed = closure(masks, keep, dict(analysis.model.named_parameters()))
    mine = masked_outputs(analysis, *checking(analysis, masks, keep)).logits
    theirs = masked_outputs(analysis, closed).logits
    assert torch.equal(mine.view(torch.int32), theirs.view(torch.int32))


_SPECIAL = [float("nan"), -0.0, 0.0, float("-inf"), float("inf"), 1e-45, -1e-310, 65504.0, -3.0]


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
    rows=st.integers(1, 9), cols=st.integers(1, 11), chunk=st.sampled_from([1, 5, 64, 1 << 18]),
    layout=st.sampled_from(["contiguous", "transposed", "out"]), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_zeroed_gives_torch_where_s_bits(dtype: torch.dtype, rows: int, cols: int, chunk: int, layout: str, seed: int) -> None:
    """``zeroed`` (the entries' bits ANDed with the mask's bytes made 0 or all ones, a chunk at a time) is
    ``torch.where(mask, tensor, 0.0)`` bit for bit: ``+0.0`` where pruned (over ``nan``, ``-0.0``, ``-inf``,
    subnormals), the entry's own bits where kept, in every float type, across chunk boundaries, into ``out``,
    and on the tensors it leaves to ``torch.where`` (not contiguous)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_smaller, "_CHUNK_ENTRIES", chunk)
        _zeroed_against_where(dtype, rows, cols, layout, seed)


def _zeroed_against_where(dtype: torch.dtype, rows: int, cols: int, layout: str, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    specials = torch.tensor(_SPECIAL, dtype=torch.float64)
    picks = torch.randint(0, rows * cols, (min(rows * cols, 6),), generator=g)
    w.view(-1)[picks] = specials[torch.randint(0, len(_SPECIAL), (len(picks),), generator=g)]
    w = w.to(dtype)
    mask = torch.rand(rows, cols, generator=g) > 0.4
    if layout == "transposed":
        w, mask = w.mT, mask.mT
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[w.element_size()]
    want = torch.where(mask, w, torch.zeros((), dtype=dtype))
    out = torch.full_like(w, float("nan")) if layout == "out" else None
    got = zeroed(w, mask, out=out)
    assert got.shape == w.shape and (out is None or got is out)
    assert torch.equal(got.contiguous().view(bits), want.contiguous().view(bits))
