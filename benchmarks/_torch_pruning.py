"""Torch-Pruning 1.6.1 on a transformers ``LlamaForCausalLM``: the comparison row.

:func:`torch_pruning_llama` prunes in place with ``tp.pruner.BasePruner`` and
``tp.importance.GroupMagnitudeImportance(p=2, group_reduction="mean")``, the
settings of Torch-Pruning's ``examples/LLMs/prune_llm.py``, except:

* the hidden size is kept by listing ``embed_tokens`` (and ``lm_head``) in
  ``ignored_layers``: a group is skipped when any layer it would shrink on the
  output side is ignored, and the residual-stream group contains the
  embedding. The example itself prunes the hidden size by ``pruning_ratio``;
* the MLP channels get their own ranking scope through ``pruning_ratio_dict``
  (key: the tuple of every ``gate_proj`` and ``up_proj``), global across
  layers when ``global_pruning`` is true, per layer otherwise;
* the trace runs with ``use_cache=False`` (a dict of example inputs): with
  the cache's ``torch.cat`` in the graph, Torch-Pruning's group search never
  ends on transformers 5.x, even without GQA;
* ``round_to`` is left out, so the ratios are met exactly.

Heads: with GQA (``num_key_value_heads < num_attention_heads``) Torch-Pruning
1.6.1 never removes KV heads (its GQA branch empties the k/v indices and
removes query heads inside each KV group), and on transformers 5.x its group
search for a ``k_proj``/``q_proj`` loops endlessly (RoPE's slice/cat). Every
attention projection is then ignored and ``kv_ratio`` is not applied; a
short, time-limited probe records whether the loop still happens. Without
GQA, whole heads are removed (``prune_num_heads=True``,
``prune_head_dims=False``), one KV group being one head.
"""

from __future__ import annotations

import importlib
import signal
import tempfile
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

# Seconds the GQA probe lets Torch-Pruning search one attention group.
_GQA_PROBE_S = 5.0


class _ProbeTimeout(Exception):
    pass


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0][:200] if text else ''}"
    if exc.__cause__ is not None:  # e.g. a config validator's own error
        line += f" ({_first_line(exc.__cause__)})"
    return line


def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(ids, use_cache=False).logits
    return out


def _gqa_probe(tp: Any, model: Any, example: dict[str, Any]) -> str:
    """Whether Torch-Pruning's group search for layer 0's ``k_proj`` ends."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "setitimer"
    ):
        return "probe not run (needs SIGALRM in the main thread)"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Unwrapped parameters")
            graph = tp.DependencyGraph().build_dependency(
                model, example_inputs=example, output_transform=lambda o: o.logits
            )
    except Exception as exc:  # noqa: BLE001 - a stage's failure is reported
        return f"dependency graph failed: {_first_line(exc)}"
    k_proj = model.model.layers[0].self_attn.k_proj

    def _alarm(signum: int, frame: object) -> None:
        raise _ProbeTimeout

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, _GQA_PROBE_S)
    try:
        group = graph.get_pruning_group(
            k_proj, tp.prune_linear_out_channels, list(range(k_proj.out_features))
        )
        return f"group search for k_proj ended ({len(group)} dependencies)"
    except _ProbeTimeout:
        return (
            f"group search for k_proj did not end in {_GQA_PROBE_S:g} s "
            "(endless loop in DependencyGraph.get_pruning_group)"
        )
    except Exception as exc:  # noqa: BLE001 - a stage's failure is reported
        return f"group search for k_proj failed: {_first_line(exc)}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _reload(model: Any, ids: torch.Tensor, logits: torch.Tensor) -> str:
    hf_logging: Any = importlib.import_module("transformers.utils.logging")
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    stage = "save_pretrained"
    try:
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d)
            stage = "from_pretrained"
            loaded = type(model).from_pretrained(d).eval()
            diff = (_logits(loaded, ids) - logits).abs().max().item()
    except Exception as exc:  # noqa: BLE001 - a stage's failure is reported
        return f"{stage} raised {_first_line(exc)}"
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    if diff == 0.0:
        return "plain from_pretrained: equal outputs"
    return f"loads but outputs differ (max diff {diff:.3g})"


def torch_pruning_llama(
    model: LlamaForCausalLM,
    ids: torch.Tensor,
    *,
    kv_ratio: float = 0.25,
    mlp_ratio: float = 0.3,
    global_pruning: bool = True,
) -> dict[str, object]:
    """Prune ``model`` in place with Torch-Pruning; report what happened.

    Keys: ``seconds`` (building the pruner and ``pruner.step()``),
    ``params_before``, ``params_after``, ``removed``, ``forward_ok``,
    ``reload``, ``notes``. Failures of a stage are reported, not raised.
    """
    notes: list[str] = []
    result: dict[str, object] = {
        "seconds": None,
        "params_before": _n_params(model),
        "params_after": None,
        "removed": "nothing",
        "forward_ok": False,
        "reload": "not run",
        "notes": notes,
    }
    try:
        tp: Any = importlib.import_module("torch_pruning")
    except Exception as exc:  # noqa: BLE001 - a stage's failure is reported
        notes.append(f"import torch_pruning: {_first_line(exc)}")
        return result

    m: Any = model
    cfg = m.config
    layers = list(m.model.layers)
    n_heads: int = cfg.num_attention_heads
    n_kv: int = cfg.num_key_value_heads
    head_dim: int = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    mlp_before = [layer.mlp.gate_proj.out_features for layer in layers]
    gqa = n_kv != n_heads
    prune_heads = kv_ratio > 0 and not gqa
    example = {"input_ids": ids, "use_cache": False}

    ignored: list[torch.nn.Module] = [m.lm_head, m.model.embed_tokens]
    num_heads: dict[torch.nn.Module, int] = {}
    for layer in layers:
        attn = layer.self_attn
        if prune_heads:
            num_heads[attn.q_proj] = n_heads
            num_heads[attn.k_proj] = n_kv
            num_heads[attn.v_proj] = n_kv
        else:
            ignored += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj]
    if gqa and kv_ratio > 0:
        notes.append(
            f"GQA ({n_heads} query heads, {n_kv} KV heads): Torch-Pruning 1.6.1 "
            "cannot remove KV heads (it only removes query heads inside each KV "
            "group), so attention was left whole and kv_ratio not applied; "
            f"probe: {_gqa_probe(tp, m, example)}"
        )
    mlp_scope = tuple(
        proj for layer in layers for proj in (layer.mlp.gate_proj, layer.mlp.up_proj)
    )

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Unwrapped parameters")
            start = time.perf_counter()
            pruner = tp.pruner.BasePruner(
                m,
                example_inputs=example,
                importance=tp.importance.GroupMagnitudeImportance(
                    p=2, group_reduction="mean"
                ),
                global_pruning=global_pruning,
                output_transform=lambda o: o.logits,
                # The default scope holds only attention groups (or nothing);
                # a positive ratio there is what lets head pruning run.
                pruning_ratio=kv_ratio if prune_heads else 0.0,
                pruning_ratio_dict={mlp_scope: mlp_ratio},
                ignored_layers=ignored,
                num_heads=num_heads,
                prune_num_heads=prune_heads,
                prune_head_dims=False,
                head_pruning_ratio=kv_ratio if prune_heads else 0.0,
                # Fresh dicts: BasePruner mutates its shared mutable defaults.
                in_channel_groups={},
                out_channel_groups={},
            )
            pruner.step()
            result["seconds"] = time.perf_counter() - start
        del pruner
    except Exception as exc:  # noqa: BLE001 - a stage's failure is reported
        notes.append(f"pruning: {_first_line(exc)}")
    result["params_after"] = _n_params(model)

    # Hand fixes: per-layer attributes, and the config where one value fits.
    mlp_after = [layer.mlp.gate_proj.out_features for layer in layers]
    q_after = [layer.self_attn.q_proj.out_features // head_dim for layer in layers]
    kv_after = [layer.self_attn.k_proj.out_features // head_dim for layer in layers]
    fixes: list[str] = []
    for layer, width, q, kv in zip(layers, mlp_after, q_after, kv_after):
        layer.mlp.intermediate_size = width
        if kv and layer.self_attn.num_key_value_groups != q // kv:
            layer.self_attn.num_key_value_groups = q // kv
            fixes.append("self_attn.num_key_value_groups")
    if mlp_after != mlp_before:
        fixes.append("mlp.intermediate_size")
    if len(set(mlp_after)) == 1:
        if cfg.intermediate_size != mlp_after[0]:
            cfg.intermediate_size = mlp_after[0]
            fixes.append("config.intermediate_size")
    else:
        notes.append("MLP widths differ per layer: no LlamaConfig can describe them")
    if len(set(q_after)) == 1 and len(set(kv_after)) == 1:
        heads = (q_after[0], kv_after[0])
        if (cfg.num_attention_heads, cfg.num_key_value_heads) != heads:
            cfg.num_attention_heads, cfg.num_key_value_heads = heads
            # Kept explicit, or it is derived as hidden_size // num_attention_heads.
            cfg.head_dim = head_dim
            fixes.append("config.num_attention_heads/num_key_value_heads/head_dim")
    else:
        notes.append("head counts differ per layer: no LlamaConfig can describe them")
    if fixes:
        notes.append("hand fixes: " + ", ".join(dict.fromkeys(fixes)))
    result["removed"] = (
        f"MLP channels per layer: {[b - a for b, a in zip(mlp_before, mlp_after)]} "
        f"of {mlp_before[0]}; KV heads per layer: {[n_kv - k for k in kv_after]} "
        f"of {n_kv}; query heads per layer: {[n_heads - q for q in q_after]} of {n_heads}"
    )

    m.eval()
    try:
        logits = _logits(m, ids)
        result["forward_ok"] = bool(torch.isfinite(logits).all())
    except Exception as exc:  # noqa: BLE001 - a stage's failure is reported
        notes.append(f"forward: {_first_line(exc)}")
        return result
    result["reload"] = _reload(m, ids, logits)
    return result
