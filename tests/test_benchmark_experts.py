"""The pure helpers of ``benchmarks/experts.py`` (``benchmarks/_reap_reference.py``): reap's saliency and llm-compressor's choice.

The benchmark's reference row is only as good as these: REAP's saliency as
reap's ``update_pruning_state`` computes it (gate from the full softmax,
optionally renormalised over the routed experts, routed tokens only,
padding out, batches combined by token counts), checked here against values
worked out by hand, and the experts llm-compressor 0.14 keeps.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch


def _load() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "_reap_reference.py"
    spec = importlib.util.spec_from_file_location("_reap_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


ref = _load()


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """3 experts, 2 tokens, top-2; expert j's output on token t has norm 1 + j + 10 t."""
    norms = torch.tensor([[1.0, 11.0], [2.0, 12.0], [3.0, 13.0]])
    activations = torch.stack([norms, torch.zeros(3, 2)], dim=-1)  # (experts, tokens, hidden=2)
    selected = torch.tensor([[0, 1], [1, 2]])
    logits = torch.tensor([[0.0, math.log(2.0), math.log(5.0)], [math.log(3.0), 0.0, math.log(6.0)]], dtype=torch.float64)
    return activations, selected, logits


def test_saliency_by_hand() -> None:
    # gates: token 0 (1, 2, 5) / 8, token 1 (3, 1, 6) / 10; expert 0 sees token 0, expert 1 both, expert 2 token 1
    state = ref.State(3)
    ref.update(state, *_batch(), renormalize=False)
    expected = [1 * 1 / 8, (2 * 2 / 8 + 12 * 1 / 10) / 2, 13 * 6 / 10]
    torch.testing.assert_close(state.mean, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)
    assert state.count.tolist() == [1.0, 2.0, 1.0]


def test_renormalized_over_the_routed_experts() -> None:
    # token 0 routed to 0, 1: gates / (3 / 8); token 1 routed to 1, 2: gates / (7 / 10)
    state = ref.State(3)
    ref.update(state, *_batch(), renormalize=True)
    expected = [1 * 1 / 3, (2 * 2 / 3 + 12 * 1 / 7) / 2, 13 * 6 / 7]
    torch.testing.assert_close(state.mean, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)


def test_padding_left_out_and_batches_weighted_by_tokens() -> None:
    activations, selected, logits = _batch()
    one = ref.State(3)
    ref.update(one, activations, selected, logits, renormalize=False, valid=torch.tensor([1, 0]))
    assert one.count.tolist() == [1.0, 1.0, 0.0]
    assert one.mean[2] == 0  # no token reached it: 0, as in reap
    two = ref.State(3)
    ref.update(two, activations[:, :1], selected[:1], logits[:1], renormalize=False)
    ref.update(two, activations[:, 1:], selected[1:], logits[1:], renormalize=False)
    both = ref.State(3)
    ref.update(both, activations, selected, logits, renormalize=False)
    torch.testing.assert_close(two.mean, both.mean, rtol=1e-12, atol=0)  # the mean over every routed token


@pytest.mark.parametrize(
    ("saliency", "drop", "kept"),
    [([0.3, 0.1, 0.4, 0.2], 2, [0, 2]), ([5.0, 1.0, 3.0], 1, [0, 2]), ([0.0, 2.0, 1.0, 0.5], 3, [1])],
)
def test_retained_drops_the_lowest(saliency: list[float], drop: int, kept: list[int]) -> None:
    assert ref.retained(torch.tensor(saliency, dtype=torch.float64), drop) == kept
