"""Memory planner: predicted per-GPU bytes of one GRPO update, by category, from an HF config.

    plan(hf_config, rule, options, micro_batch=8, seq_len=512, policy="bf16", gpus=8,
         sharding="fsdp", rollout_share=0.3, gpu_bytes=80e9)

Everything here is a *prediction*, computed from tensor shapes; `benchmarks`/the memory sweep
measure the same update and `figures/stability_27b` (c) shows the two side by side. The model
is built on the meta device (no memory, any size), and the weights a rule treats as low rank
are chosen by the same `modules` regex the rules use (`logra.logra.low_rank_linears`).

Categories (bytes per GPU):
- weights: every weight in the policy dtype (fp32; or bf16 for `policy="bf16"`), / gpus under
  FSDP (ZeRO-3);
- master: fp32 master copy of the trained weights (`policy="bf16"` only), / gpus;
- grads: gradients alive at the end of backward, fp32 (FSDP reduces in fp32), / gpus.
  dense_adam, galore: every trained weight's. logra: unsketched weights' + the largest sketched
  weight's (freed in its hook) + the sketch accumulators r·max(m, n) + the range finder's
  accumulators Y, min(m, n)·min(r + p, max(m, n)) (basis "range"). lora: the adapters';
- optimizer: Adam moments in fp32, / gpus. dense_adam: 2 per weight. logra: per sketched
  weight 2·r·max(m, n) (moments of the sketch) + r·min(m, n) (basis). galore: per projected
  weight 2·r·max(m, n) + min(m, n)² (galore-torch keeps the projection as a slice of the full
  SVD factor; GaLore's paper formula has r·min(m, n)). lora: 2 per adapter weight, adapters
  kept in fp32 (as PeftModel's autocast does; peft's bare injection keeps the base dtype);
- activations: saved for backward by one micro-batch (`logra.memory.activation_bytes_estimate`,
  derived for Llama/Qwen2 decoders; for other architectures, e.g. Gemma-3, an approximation);
- probe: the KL probe's full-vocabulary log-probs kept across the update (every method logs
  realized KL), probe_size·seq_len·vocab fp32;
- fsdp: under FSDP, the all-gathered weights of two decoder layers (current + prefetched, policy
  dtype) and one layer's unsharded gradients before reduce-scatter;
- rollout: a colocated rollout engine's share of the GPU (vLLM's gpu_memory_utilization),
  rollout_share·gpu_bytes.

`sync_bytes` predicts one policy sync: every trained weight in the policy dtype (dense_adam,
galore), the merged adapted weights (lora), or the unsketched weights plus the fp32 low-rank
coefficients r·max(m, n) per sketched weight and its basis r·min(m, n) once per refresh (logra).

Total = the sum: it is how the measured CPU peak decomposes at the tiny scale (the summaries'
`mem_check`), and for the larger sweep points the error is reported by the memory sweep.
"""
from __future__ import annotations

import math
import re

import torch

from logra.logra import DEFAULT_MODULES, low_rank_linears
from logra.memory import activation_bytes_estimate

POLICIES = {"fp32": 4, "bf16": 2}
SHARDINGS = ("none", "fsdp")
RULES = ("dense_adam", "logra", "galore", "lora")


def shapes(hf_config, modules: str = DEFAULT_MODULES):
    """(all parameter shapes, low-rank weight shapes, largest decoder-layer parameter count)
    of the model `hf_config` describes, built on the meta device."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    params = {n: tuple(p.shape) for n, p in model.named_parameters()}
    low_rank = [tuple(m.weight.shape) for _, m in low_rank_linears(model, modules)]
    layer = re.compile(r"\.layers\.(\d+)\.")
    per_layer: dict[str, int] = {}
    for n, s in params.items():
        if (hit := layer.search(n)):
            per_layer[hit.group(1)] = per_layer.get(hit.group(1), 0) + math.prod(s)
    return params, low_rank, max(per_layer.values(), default=0)


def plan(hf_config, rule: str, options: dict | None = None, *, micro_batch: int, seq_len: int,
         policy: str = "fp32", gpus: int = 1, sharding: str = "none", probe_size: int = 8,
         rollout_share: float = 0.0, gpu_bytes: float | None = None,
         checkpointing: bool = False, attention_mask: bool = True,
         attn_implementation: str = "sdpa") -> dict[str, int]:
    """Predicted per-GPU bytes by category (see the module docstring) and their `total`."""
    options = dict(options or {})
    if rule not in RULES:
        raise ValueError(f"rule: unknown {rule!r}; known: {RULES}")
    if policy not in POLICIES:
        raise ValueError(f"policy: unknown {policy!r}; known: {sorted(POLICIES)}")
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding: unknown {sharding!r}; known: {SHARDINGS}")
    if rollout_share and not gpu_bytes:
        raise ValueError("rollout_share needs gpu_bytes (the GPU's memory)")
    params, low_rank, layer_numel = shapes(hf_config, options.get("modules", DEFAULT_MODULES))
    b, f = POLICIES[policy], 4
    shard = gpus if sharding == "fsdp" else 1
    n_all = sum(math.prod(s) for s in params.values())
    n_low = sum(m * n for m, n in low_rank)
    r = options.get("rank", 8)

    if rule == "lora":
        adapters = sum(r * (m + n) for m, n in low_rank)
        weights = n_all * b + adapters * f  # frozen base in the policy dtype, fp32 adapters
        master, grads, optimizer = 0, adapters * f, 2 * adapters * f
    else:
        weights = n_all * b
        master = n_all * f if policy == "bf16" else 0
        if rule == "logra":
            sketches = sum(r * max(m, n) for m, n in low_rank)
            k = r + options.get("oversample", 8)
            ys = (sum(min(m, n) * min(k, max(m, n)) for m, n in low_rank)
                  if options.get("basis", "range") == "range" else 0)
            grads = ((n_all - n_low) + max(m * n for m, n in low_rank) + sketches + ys) * f
            optimizer = (2 * (n_all - n_low) + 2 * sketches
                         + sum(r * min(m, n) for m, n in low_rank)) * f
        elif rule == "galore":
            grads = n_all * f
            optimizer = (2 * (n_all - n_low)
                         + sum(2 * r * max(m, n) + min(m, n) ** 2 for m, n in low_rank)) * f
        else:
            grads, optimizer = n_all * f, 2 * n_all * f
    out = {
        "weights": weights // shard, "master": master // shard, "grads": grads // shard,
        "optimizer": optimizer // shard,
        "activations": activation_bytes_estimate(
            hf_config, batch=micro_batch, seq_len=seq_len, dtype_bytes=b,
            checkpointing=checkpointing, attention_mask=attention_mask,
            attn_implementation=attn_implementation),
        "probe": probe_size * seq_len * hf_config.vocab_size * f,
        # two layers' weights all-gathered; one layer's unsharded grads (LoRA: adapters only)
        "fsdp": (2 * layer_numel * b + (layer_numel * b if rule != "lora" else 0)
                 if shard > 1 else 0),
        "rollout": int(rollout_share * gpu_bytes) if rollout_share else 0,
    }
    out["total"] = sum(out.values())
    return out


def sync_bytes(hf_config, rule: str, options: dict | None = None, policy: str = "fp32") -> int:
    """Predicted bytes of one policy sync (the basis amortized over `refresh_every` steps)."""
    options = dict(options or {})
    params, low_rank, _ = shapes(hf_config, options.get("modules", DEFAULT_MODULES))
    b, f, r = POLICIES[policy], 4, options.get("rank", 8)
    n_all = sum(math.prod(s) for s in params.values())
    n_low = sum(m * n for m, n in low_rank)
    if rule == "lora":
        return n_low * b
    if rule == "logra":
        return ((n_all - n_low) * b + sum(r * max(m, n) for m, n in low_rank) * f
                + sum(r * min(m, n) for m, n in low_rank) * f // options.get("refresh_every", 50))
    return n_all * b
