"""Structure and shrink on a Llama of about 1B parameters, and Torch-Pruning on the same model.

Run from the repository root (after installing the package with the ``hf``
extra; Torch-Pruning's row needs ``pip install -c constraints.txt
torch-pruning==1.6.1``)::

    python benchmarks/llama.py                # 1.1B parameters (TinyLlama's shape), random weights
    python benchmarks/llama.py --layers 2     # the same widths, 2 layers: a smoke run

The model is ``LlamaForCausalLM`` with TinyLlama-1.1B's config (hidden
2048, MLP 5632, 22 layers, 32 query heads in 4 KV groups, vocabulary
32000), random weights, float32, CPU. funcprune removes 25% of the KV groups
and 30% of the MLP channels, each ranked globally by L2 norm (so every layer
keeps its own share), then saves and reloads the model with
``fp.load_shrunk``. Timed: ``fp.structure`` and ``fp.shrink`` (given
``structure=``: its analysis taken back; one call each, wall clock), then
``fp.shrink(..., check=False)`` (no masked model made or run: the price of
the check, after the checked call) and its model compared with the checked
one bit for bit, and
the forward pass of the dense and the shrunk model
on the same tokens, interleaved (dense, shrunk, dense, ...) after a
warm-up, at 1 thread and at the default thread count: the median and the
minimum of the per-repetition ratios dense / shrunk. The floor of a forward
pass is its matmul flops (``2 * tokens * weights``, embeddings excluded).
Checked: the shrunk model's logits against the masked model's
(``fp.functional_call_masked`` on the closure), and the reloaded model's
against the shrunk one's. Last (after Torch-Pruning, which prunes a copy),
``fp.shrink(..., inplace=True)`` cuts the model itself, timed and compared
with the checked copy bit for bit: the time a user who does not need the
dense model pays, as Torch-Pruning's user does. The script exits with
status 1 if anything differs.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

import funcprune as fp
from _timing import Contender, calls_for, interleaved

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def llama(layers: int) -> Any:
    """TinyLlama-1.1B's shape with ``layers`` layers, random weights (seeded), eval mode."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
    )  # fmt: skip
    torch.manual_seed(0)
    model: Any = transformers.LlamaForCausalLM(config)
    return model.eval()


def matmul_weights(model: Any) -> int:
    """The entries of the weights a forward pass multiplies by (every Linear, the LM head included)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out: torch.Tensor = model(ids, use_cache=False).logits
    return out


def bit_for_bit(a: Any, b: Any) -> bool:
    """Whether two models hold the same state dict, names and bits."""
    mine, theirs = a.state_dict(), b.state_dict()
    return mine.keys() == theirs.keys() and all(
        torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(mine.values(), theirs.values(), strict=True)
    )


def forward_ratio(dense: Any, small: Any, ids: torch.Tensor, repeats: int) -> tuple[float, float, float, float]:
    """Median seconds per forward of each, and the median and min of the per-repetition ratios dense / shrunk."""
    runs = {"dense": Contender(lambda: logits(dense, ids)), "shrunk": Contender(lambda: logits(small, ids))}
    runs = {name: Contender(c.run, calls=calls_for(c.run, 0.5)) for name, c in runs.items()}
    times = interleaved(runs, repeats)
    ratios = [a / b for a, b in zip(times["dense"], times["shrunk"], strict=True)]
    return statistics.median(times["dense"]), statistics.median(times["shrunk"]), statistics.median(ratios), min(ratios)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--tokens", type=int, default=128, help="tokens per forward pass timed")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-torch-pruning", action="store_true")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads by default, {os.cpu_count()} cores")
    start = time.perf_counter()
    model = llama(args.layers)
    params = dict(model.named_parameters())
    dense_params = sum(p.numel() for p in model.parameters())
    print(f"built {dense_params / 1e9:.3f}B parameters in {time.perf_counter() - start:.1f} s")
    g = torch.Generator().manual_seed(1)
    example = torch.randint(0, 32000, (1, 32), generator=g)
    ids = torch.randint(0, 32000, (1, args.tokens), generator=g)

    start = time.perf_counter()
    structure = fp.structure(model, example)
    t_structure = time.perf_counter() - start
    plan = fp.compose(
        fp.structured(structure, fp.LnStructured(0.25, n=2), kinds="kv_groups"),
        fp.structured(structure, fp.LnStructured(0.3, n=2), kinds="channels"),
    )
    start = time.perf_counter()
    masks = plan(params)
    t_plan = time.perf_counter() - start
    start = time.perf_counter()
    small: Any = fp.shrink(model, masks, example, structure=structure)  # its analysis taken back
    t_shrink = time.perf_counter() - start
    start = time.perf_counter()
    unchecked: Any = fp.shrink(model, masks, example, structure=structure, check=False)  # no masked model made or run
    t_unchecked = time.perf_counter() - start
    same = bit_for_bit(small, unchecked)
    del unchecked
    small_params = sum(p.numel() for p in small.parameters())
    kv = [layer.self_attn.k_proj.out_features // 64 for layer in small.model.layers]
    mlp = [layer.mlp.up_proj.out_features for layer in small.model.layers]
    print(f"structure {t_structure:.1f} s ({len(structure)} groups), plan {t_plan:.2f} s, shrink {t_shrink:.1f} s, "
          f"shrink(check=False) {t_unchecked:.1f} s ({'the same model, bit for bit' if same else 'ANOTHER MODEL'})")  # fmt: skip
    print(f"parameters {dense_params:,} -> {small_params:,} ({small_params / dense_params:.3f}); "
          f"KV groups per layer {kv}; MLP channels per layer {mlp}")  # fmt: skip

    with torch.inference_mode():
        reference = fp.functional_call_masked(model, params, masks, (example,), {"use_cache": False}).logits
    diff = (logits(small, example) - reference).abs().max().item()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        small.save_pretrained(d)
        again = fp.load_shrunk(d).eval()
    t_reload = time.perf_counter() - start
    reload_diff = (logits(again, example) - logits(small, example)).abs().max().item()
    del again
    print(f"shrunk vs masked: max abs diff {diff:.1e}; save + load_shrunk {t_reload:.1f} s, max abs diff {reload_diff:.1e}")

    default = torch.get_num_threads()
    for threads in dict.fromkeys((1, default)):
        torch.set_num_threads(threads)
        dense_s, small_s, ratio, low = forward_ratio(model, small, ids, args.repeats)
        floor = {name: 2 * args.tokens * matmul_weights(m) for name, m in (("dense", model), ("shrunk", small))}
        print(f"forward, {args.tokens} tokens, {threads} thread(s): dense {dense_s * 1e3:.0f} ms "
              f"({floor['dense'] / dense_s / 1e9:.0f} GFLOP/s), shrunk {small_s * 1e3:.0f} ms "
              f"({floor['shrunk'] / small_s / 1e9:.0f} GFLOP/s); dense / shrunk median {ratio:.2f}x, min {low:.2f}x")  # fmt: skip
    torch.set_num_threads(default)

    if not args.no_torch_pruning:
        try:
            from _torch_pruning import torch_pruning_llama
        except ImportError as e:  # torch-pruning not installed
            print(f"Torch-Pruning: skipped ({e})")
        else:
            result = torch_pruning_llama(copy.deepcopy(model), example)
            print("Torch-Pruning 1.6.1 (the same model, the same 32 tokens):")
            for key, value in result.items():
                print(f"  {key}: {value}")
    start = time.perf_counter()
    consumed: Any = fp.shrink(model, masks, example, structure=structure, inplace=True)  # the model itself, cut
    t_inplace = time.perf_counter() - start
    same_inplace = consumed is model and bit_for_bit(small, model)
    print(f"shrink(inplace=True) {t_inplace:.1f} s ({'the checked model, bit for bit' if same_inplace else 'ANOTHER MODEL'}); "
          f"structure + shrink(inplace=True) {t_structure + t_inplace:.1f} s")  # fmt: skip
    ok = diff < 1e-3 and reload_diff == 0.0 and same and same_inplace
    print("checked: outputs equal" if ok else "FAILED: outputs differ")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
