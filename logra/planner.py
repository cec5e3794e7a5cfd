"""Memory planner: predicted per-GPU bytes of one GRPO update, phase by phase, from an HF config.

    plan(hf_config, rule, options, micro_batch=8, seq_len=512, policy="bf16", gpus=8,
         sharding="fsdp", rollout_share=0.3, gpu_bytes=80e9, kl_control=True)

Everything here is a *prediction*, computed from tensor shapes; the memory sweep measures the
same update (its peak and each phase's, `MemoryMeter.phase`) and reports the error, and
`figures/stability_27b` shows the two side by side. The model is built on the meta device (no
memory, any size), and the weights a rule treats as low rank are chosen by the same `modules`
regex the rules use (`logra.logra.low_rank_linears`).

Categories (bytes per GPU; `/ gpus` under FSDP, ZeRO-3):
- weights: every weight in the policy dtype (fp32; or bf16 for `policy="bf16"`);
- master: fp32 master copy of the trained weights (`policy="bf16"` only);
- optimizer: Adam moments in fp32. dense_adam: 2 per weight. logra: per sketched weight
  2·r·max(m, n) (moments of the sketch) + r·min(m, n) (basis). galore: per projected weight
  2·r·max(m, n) + min(m, n)² (galore-torch keeps the projection as a slice of the full SVD
  factor; GaLore's paper formula has r·min(m, n)). lora: 2 per adapter weight, adapters kept in
  fp32 (as PeftModel's autocast does; peft's bare injection keeps the base dtype);
- grads: gradients alive at the end of backward, fp32 (FSDP reduces in fp32). dense_adam,
  galore: every trained weight's. logra: unsketched weights' + the largest sketched weight's
  (freed in its hook) + the sketch accumulators r·max(m, n) + the range finder's accumulators
  Y, min(m, n)·min(r + p, max(m, n)) (basis "range"). lora: the adapters';
- activations: saved for backward by one micro-batch (`logra.memory.activation_bytes_estimate`,
  derived for Llama/Qwen2 decoders; for other architectures, e.g. Gemma-3, an approximation),
  plus the loss's vocabulary-sized tensors in flight at the start of its backward: besides the
  saved logits / temperature (in the estimate), the gradients of logsumexp and of gather,
  their sum, and the slice's zero-padded gradient: 3 more micro_batch·seq_len·vocab fp32;
- probe (logra/kl_control.py): the base kept across the update, the output layer's input per
  probe token (base_seqs·completion_len·hidden; base_seqs = probe_size with KL control, else
  the held-out half's ⌈probe_size/2⌉) and a copy of the output layer's weights when
  trained (vocab·hidden, whole under FSDP too), plus the chunked KL's three
  min(kl_chunk_tokens, ⌈probe_size/2⌉·completion_len)·vocab fp32 tensors;
- fsdp: under FSDP, the all-gathered weights of two decoder layers (current + prefetched, policy
  dtype) and one layer's unsharded gradients before reduce-scatter;
- rollout: a colocated rollout engine's share of the GPU (vLLM's gpu_memory_utilization),
  rollout_share·gpu_bytes, held through every phase.

Phases (`PHASES`, as `logra.train.update_step` runs them; each alive with weights, master,
optimizer, rollout and, but in rollout, fsdp):
- rollout: nothing else (the engine's share is its whole cost);
- forward_backward: grads + activations;
- propose: grads + the base probe + the rule's step beyond the gradient buffers (dense Adam
  writes it into them; logra: its coefficients r·max(m, n) per sketched weight; galore: two
  tensors of the largest weight's size, formed inside GaLoreAdamW.step) + the base
  forward's largest transient (a no-grad forward: one MLP's gate activation, up and product,
  3·base_seqs·seq_len·intermediate);
- kl_control (methods with KL control): propose's tensors + the saved copy of the dense
  parameters that `perturbed` restores (dense_adam, lora: every trained one; logra: the
  unsketched ones), in fp32 + the larger of the probe forward's transient and the chunked KL;
- apply: the larger of what is alive when it starts (propose's tensors) and what survives it
  (logra: its sketch and Y buffers and the applied coefficients kept for the sync; the others
  free their gradients) + the base probe + the realized KL's forward or chunks.
`total` is the largest phase and `peak_phase` names it.

`sync_bytes` predicts one policy sync: every trained weight in the policy dtype (dense_adam,
galore), the merged adapted weights (lora), or the unsketched weights plus the fp32 low-rank
coefficients r·max(m, n) per sketched weight and its basis r·min(m, n) once per refresh (logra).
"""
from __future__ import annotations

import math
import re

import torch

from logra.kl_control import CHUNK_TOKENS
from logra.logra import DEFAULT_MODULES, low_rank_linears
from logra.memory import activation_bytes_estimate

POLICIES = {"fp32": 4, "bf16": 2}
SHARDINGS = ("none", "fsdp")
RULES = ("dense_adam", "logra", "galore", "lora")
PHASES = ("rollout", "forward_backward", "propose", "kl_control", "apply")


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
         completion_len: int | None = None, kl_control: bool = False,
         kl_chunk_tokens: int | None = None, rollout_share: float = 0.0,
         gpu_bytes: float | None = None, checkpointing: bool = False,
         attention_mask: bool = True, attn_implementation: str = "sdpa") -> dict:
    """Predicted per-GPU bytes by category and by phase (see the module docstring): the
    categories, `phase_<name>` for each phase that runs, `total` (the largest) and
    `peak_phase`. `completion_len` (default `seq_len`) sizes the probe's tokens."""
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
    vocab, hidden = hf_config.vocab_size, hf_config.hidden_size
    coefs = sum(r * max(m, n) for m, n in low_rank)  # logra's step: one r x max(m, n) per weight
    transient = 0  # formed and freed inside propose (galore)

    if rule == "lora":
        adapters = sum(r * (m + n) for m, n in low_rank)
        weights = n_all * b + adapters * f  # frozen base in the policy dtype, fp32 adapters
        master, grads, optimizer = 0, adapters * f, 2 * adapters * f
        step, perturbed_copy, after_apply = 0, adapters * f, 0
    else:
        weights = n_all * b
        master = n_all * f if policy == "bf16" else 0
        if rule == "logra":
            k = r + options.get("oversample", 8)
            ys = (sum(min(m, n) * min(k, max(m, n)) for m, n in low_rank)
                  if options.get("basis", "range") == "range" else 0)
            grads = ((n_all - n_low) + max(m * n for m, n in low_rank) + coefs + ys) * f
            optimizer = (2 * (n_all - n_low) + 2 * coefs
                         + sum(r * min(m, n) for m, n in low_rank)) * f
            step, perturbed_copy = coefs * f // shard, (n_all - n_low) * f
            after_apply = (2 * coefs + ys) * f  # S and Y buffers, the applied coefficients
        elif rule == "galore":
            grads = n_all * f
            optimizer = (2 * (n_all - n_low)
                         + sum(2 * r * max(m, n) + min(m, n) ** 2 for m, n in low_rank)) * f
            # GaLoreAdamW.step forms two full-size tensors per weight (denominator and update;
            # a projected weight's update projected back, then scaled): the largest weight's,
            # whole on every rank under FSDP
            largest = max(max(math.prod(s) for s in params.values()),
                          max(m * n for m, n in low_rank))
            step, perturbed_copy, after_apply, transient = 0, 0, 0, 2 * largest * f
        else:
            grads, optimizer = n_all * f, 2 * n_all * f
            step, perturbed_copy, after_apply = 0, n_all * f, 0
    head_trained = rule != "lora"
    # the base covers the whole probe with KL control, else its held-out half only
    base_seqs = probe_size if kl_control else probe_size - probe_size // 2
    probe_tokens = base_seqs * (completion_len or seq_len)
    base = probe_tokens * hidden * b + (vocab * hidden * b if head_trained else 0)
    chunk = min(kl_chunk_tokens or CHUNK_TOKENS,
                math.ceil(probe_size / 2) * (completion_len or seq_len))
    chunks = 3 * chunk * vocab * f
    out = {
        "weights": weights // shard, "master": master // shard, "grads": grads // shard,
        "optimizer": optimizer // shard,
        "activations": activation_bytes_estimate(
            hf_config, batch=micro_batch, seq_len=seq_len, dtype_bytes=b,
            checkpointing=checkpointing, attention_mask=attention_mask,
            attn_implementation=attn_implementation, frozen=rule == "lora")
        + 3 * micro_batch * seq_len * vocab * f,
        "probe": base + chunks,
        # two layers' weights all-gathered; one layer's unsharded grads (LoRA: adapters only)
        "fsdp": (2 * layer_numel * b + (layer_numel * b if rule != "lora" else 0)
                 if shard > 1 else 0),
        "rollout": int(rollout_share * gpu_bytes) if rollout_share else 0,
    }
    # a no-grad probe forward's largest transient: one MLP's gate activation, up and their
    # product over the probe's tokens
    probe_forward = 3 * base_seqs * seq_len * hf_config.intermediate_size * b
    kl_pass = max(probe_forward, chunks)  # the chunks are formed after the last MLP has freed
    alive = out["weights"] + out["master"] + out["optimizer"] + out["rollout"] + out["fsdp"]
    proposed = out["grads"] + base + step  # from propose until apply frees it
    phases = {
        "rollout": alive - out["fsdp"],
        "forward_backward": alive + out["grads"] + out["activations"],
        "propose": alive + proposed + max(probe_forward, transient),
        "kl_control": (alive + proposed + perturbed_copy // shard + kl_pass
                       if kl_control else None),
        "apply": alive + max(proposed, after_apply // shard + base + kl_pass),
    }
    out.update({f"phase_{name}": v for name, v in phases.items() if v is not None})
    out["peak_phase"] = max((v, name) for name, v in phases.items() if v is not None)[1]
    out["total"] = phases[out["peak_phase"]]
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
