"""A checkpoint pruned one block in memory at a time (``fp.oneshot_checkpoint``) beside ``fp.oneshot`` in memory.

Writes a LlamaForCausalLM of random weights (seeded; float32; ``--layers``
blocks of hidden size 1024 and MLP 4096, vocabulary 8192, untied LM head:
about 0.6 GB) into ``--where`` with ``save_pretrained`` in shards of 100 MB,
then runs each contender in a fresh process, on the same calibration
batches (``--batches`` of 2 sequences of 128 random token ids), with
``--method`` (Wanda, or SparseGPT) at 50% per output row, ``--rounds``
times (streamed, then in memory, in each):

- ``streamed``: ``fp.oneshot_checkpoint(model_dir, out_dir, batches, ...)``;
- ``in-memory``: ``from_pretrained``, ``fp.oneshot``, ``fp.bake`` and
  ``save_pretrained`` (the same job, written the same way).

Each process reports its resident memory once torch, transformers and
funcprune are imported (``VmRSS``) and its peak during the job (``VmHWM``,
reset just before it), and the job's wall time. The two outputs are
compared tensor by tensor (they must be equal). Run::

    python benchmarks/oneshot_streamed.py [--layers 8] [--where /tmp/streamed-bench]
"""

from __future__ import annotations

from typing import Any

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = textwrap.dedent("""
    import json, re, sys, time, types
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    import torch, transformers, funcprune as fp
    transformers.LlamaForCausalLM

    def status(key):
        with open("/proc/self/status") as f:
            return int(re.search(key + r":\\s+(\\d+)", f.read()).group(1))

    mode, source, out, count, method = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 8192, (2, 128), generator=g) for _ in range(count)]
    spec = fp.PerSlice(fp.L1Unstructured(0.5), dim=0)
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    start = time.perf_counter()
    if mode == "streamed":
        fp.oneshot_checkpoint(source, out, batches, method=method, spec=spec, max_shard_size="100MB")
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(source).eval()
        params, masks = fp.oneshot(model, batches, method=method, spec=spec)
        model.load_state_dict({**model.state_dict(), **params})  # SparseGPT's new weights (Wanda's are the same)
        fp.bake(model, masks).save_pretrained(out, max_shard_size="100MB")
    seconds = time.perf_counter() - start
    print(json.dumps({"before": before, "peak": status("VmHWM"), "seconds": seconds}))
""")


def _write(where: str, layers: int) -> int:
    import torch
    import transformers

    config = transformers.LlamaConfig(vocab_size=8192, hidden_size=1024, intermediate_size=4096,
                                      num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=16,
                                      max_position_embeddings=256, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    model: Any = transformers.LlamaForCausalLM(config)
    model.train(False)
    model.save_pretrained(where, max_shard_size="100MB")
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _run(mode: str, source: str, out: str, batches: int, method: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1"}
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([sys.executable, "-c", _CHILD, mode, source, out, str(batches), method], env=env,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        sys.exit(f"{mode} failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--where", default="/tmp/streamed-bench")
    parser.add_argument("--method", choices=["wanda", "sparsegpt"], default="wanda")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    sys.modules.setdefault("torchvision._meta_registrations", type(sys)("torchvision._meta_registrations"))
    shutil.rmtree(args.where, ignore_errors=True)
    os.makedirs(args.where)
    source = os.path.join(args.where, "model")
    size = _write(source, args.layers)
    print(f"model: {args.layers} blocks, {size / 2**20:.0f} MiB of float32 weights")
    outs = {}
    for r in range(args.rounds):
        for mode in ("streamed", "in-memory"):
            outs[mode] = os.path.join(args.where, mode)
            got = _run(mode, source, outs[mode], args.batches, args.method)
            above = (got["peak"] - got["before"]) / 1024
            print(f"round {r + 1}, {args.method}, {mode:>9}: {got['seconds']:6.1f} s, peak RSS "
                  f"{got['peak'] / 1024:6.0f} MiB, {above:6.0f} MiB above the {got['before'] / 1024:.0f} MiB after "
                  "imports")  # fmt: skip
    import torch
    import transformers

    a = transformers.AutoModelForCausalLM.from_pretrained(outs["streamed"]).state_dict()
    b = transformers.AutoModelForCausalLM.from_pretrained(outs["in-memory"]).state_dict()
    same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    print("outputs equal:", same)
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
