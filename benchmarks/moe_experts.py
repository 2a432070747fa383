"""Pruning one MoE layer's stacked experts: a loop over the experts against torch.func.vmap.

The shapes are those of a ~100M-parameter Mixtral-like model (hidden 512,
expert intermediate 1408, 8 experts, 6 layers: 8 * (2816 * 512 + 512 * 1408)
= 17.3M expert parameters per layer, 104M in the experts of 6 layers). What
is timed is the pruning of one layer's experts: ``gate_up_proj`` (8, 2816,
512) and ``down_proj`` (8, 512, 1408), with each expert's statistics
(norms, or Hessians of 256 random tokens), by ``fp.Method.prune_experts``
(what ``fp.oneshot`` runs: ``prune`` once per expert) against the same
under ``torch.func.vmap`` (Wanda: vmap of ``prune`` over the experts;
SparseGPT: ``fp.sparsegpt`` on the stacks, which vmaps its pass).
Interleaved, after a warm-up round; the median of the per-repetition
ratios; 1 thread and the default threads. The masks (and SparseGPT's
weights, to 1e-4) of both must be equal.

    PYTHONPATH=. python benchmarks/moe_experts.py [--repeats 5]

Measured on this project's shared 2-core CPU machine (torch 2.13.0+cpu),
``--repeats 1``, ms per layer (loop / vmap; masks equal in every row):

| case | threads | loop | vmap | loop / vmap |
|---|---|---|---|---|
| wanda 50% per row | 1 | 92 | 1359 | 0.07 |
| wanda 2:4 | 1 | 94 | 236 | 0.40 |
| sparsegpt 2:4 | 1 | 4539 | 5399 | 0.84 |
| wanda 50% per row | 2 | 438 | 1547 | 0.28 |
| wanda 2:4 | 2 | 931 | 915 | 1.02 |
| sparsegpt 2:4 | 2 | 168117 | 50278 | 3.34 |

The 2-thread rows ran while other developers' jobs shared the 2 cores (the
loop's SparseGPT took 37x its 1-thread time): they say little. At 1 thread
the loop wins every case, so ``fp.oneshot`` loops; a GPU, where vmap saves
kernel launches, was not measured.
"""

from __future__ import annotations

import argparse
import functools

import _timing  # noqa: F401 (first: torchvision's stub)
import torch
from _timing import HEADER, Contender, Row, interleaved

import funcprune as fp

E, H, I, TOKENS = 8, 512, 1408, 256


def stacks() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    weights = {"gate_up": torch.randn(E, 2 * I, H, generator=g), "down": torch.randn(E, H, I, generator=g)}
    xs = {"gate_up": torch.randn(E, TOKENS, H, generator=g), "down": torch.randn(E, TOKENS, I, generator=g)}
    norms = {n: x.square().sum(dim=1).sqrt() for n, x in xs.items()}
    hessians = {n: x.transpose(1, 2) @ x for n, x in xs.items()}
    return weights, norms, hessians


def vmapped(
    method: fp.Method, weights: dict[str, torch.Tensor], stats: dict[str, torch.Tensor], specs: dict[str, fp.Spec],
    dims: dict[str, int],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``method.prune`` on every expert at once: SparseGPT's own vmap, or vmap over the experts."""
    if isinstance(method, fp.SparseGPT):
        return method.prune(weights, stats, specs, {n: d + 1 for n, d in dims.items()})
    new, masks = torch.func.vmap(lambda w, s: method.prune(w, s, specs, dims))(weights, stats)
    return dict(new), dict(masks)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    weights, norms, hessians = stacks()
    dims = dict.fromkeys(weights, 1)
    cases = {
        "wanda 50% per row": (fp.Wanda(), norms, fp.PerSlice(fp.L1Unstructured(0.5), dim=0)),
        "wanda 2:4": (fp.Wanda(), norms, fp.NM(2, 4)),
        "sparsegpt 2:4": (fp.SparseGPT(), hessians, fp.NM(2, 4)),
    }
    rows = []
    for threads in (1, torch.get_num_threads()):
        torch.set_num_threads(threads)
        for case, (method, stats, spec) in cases.items():
            specs = dict.fromkeys(weights, spec)
            looped = fp.Method.prune_experts(method, weights, stats, specs, dims)
            batched = vmapped(method, weights, stats, specs, dims)
            same = all(torch.equal(looped[1][n], batched[1][n]) for n in weights) and all(
                torch.allclose(looped[0][n], batched[0][n], atol=1e-4, rtol=1e-4) for n in looped[0]
            )
            times = interleaved(
                {
                    "loop": Contender(functools.partial(fp.Method.prune_experts, method, weights, stats, specs, dims)),
                    "vmap": Contender(functools.partial(vmapped, method, weights, stats, specs, dims)),
                },
                args.repeats,
            )
            rows.append((threads, Row(case, "loop", "vmap", times, None, masks="masks equal" if same else "**differ**")))
    print(HEADER)
    for threads, row in rows:
        print(row.line(threads))


if __name__ == "__main__":
    main()
