"""Memory planner: predicted per-GPU bytes of one GRPO update, phase by phase, from an HF config.

    plan(hf_config, rule, options, micro_batch=8, seq_len=512, policy="bf16", gpus=8,
         sharding="fsdp", rollout_share=0.3, gpu_bytes=80e9, kl_control=True)
    plan(..., policy="fp32", compute="bf16")  # fp32 storage, bf16 compute (LoGRA's authors)

Everything here is a *prediction*, computed from tensor shapes; the memory sweep measures the
same update (its peak and each phase's, `MemoryMeter.phase`) and reports the error, and
`figures/stability_27b` shows the two side by side. The model is built on the meta device (no
memory, any size). Bytes per GPU by category (weights, master, optimizer, grads, activations,
probe, fsdp, rollout) and by phase (`PHASES`); `total` is the largest phase and `peak_phase`
names it; what each category holds for a rule is the rule's own prediction (its `planned`).

Derivation and details (categories, phases, `offload`, `logits="full"`, `probe`): docs/planner.md.
"""
from __future__ import annotations

import math
import re

import torch

from logra import rules
from logra.common import POLICIES, delta_bytes
from logra.measure.activations import activation_bytes_estimate
from logra.optim.chunked import CHUNK_TOKENS
from logra.optim.rule import DEFAULT_MODULES, Geometry, low_rank_linears

SHARDINGS = ("none", "fsdp")
NON_TARGET = ("frozen", "adamw")
LOGITS = ("chunked", "full")
PROBES = ("project", "authors")


_SHAPES: dict[tuple[str, str], tuple] = {}  # shapes' results, by (config's JSON, modules)


def shapes(hf_config, modules: str = DEFAULT_MODULES):
    """(all parameter shapes, low-rank weight shapes, largest decoder-layer parameter count)
    of the model `hf_config` describes, built on the meta device once per config and modules
    in a process (a 27B model's build takes about a second; a planner table asks for each
    model's shapes once per method and phase)."""
    key = (hf_config.to_json_string(), modules)
    if key not in _SHAPES:
        _SHAPES[key] = _shapes(hf_config, modules)
    params, low_rank, layer = _SHAPES[key]
    return dict(params), list(low_rank), layer


def _shapes(hf_config, modules: str):
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
         chunk_tokens: int | None = None, rollout_share: float = 0.0,
         gpu_bytes: float | None = None, checkpointing: bool = False,
         attention_mask: bool = True, attn_implementation: str = "sdpa",
         compute: str | None = None, logits: str = "chunked", offload: bool = False,
         probe_len: int | None = None, non_target: str = "frozen",
         probe: str = "project") -> dict:
    """Predicted per-GPU bytes by category and by phase (docs/planner.md): the
    categories, `phase_<name>` for each phase that runs, `total` (the largest) and
    `peak_phase`. `completion_len` (default `seq_len`) sizes the probe's tokens; `probe_len`
    (default `seq_len`) the probe's sequences, its completion the same prompt shorter (an
    update whose probe sequences are shorter than its longest micro-batch). `non_target`:
    "adamw" trains the weights a frozen-base rule leaves out (LoGRA's: embeddings, output
    layer, norms) by AdamW, as LoGRA's port runs it (NVIDIA-NeMo/RL research/logra,
    freeze_non_target: false): their fp32 gradients and two moments (sharded) and the output
    layer's weight gradient as backward forms it. `logits`:
    "chunked", this project's (`logra.rl.loss.token_logprobs`, the JVP probe's kept
    positions), or "full", as LoGRA's authors form them (docs/planner.md). `probe`:
    LoGRA's JVP probe as this project runs it ("project", `logra.optim.kl_control`) or as its
    authors' code does ("authors", `authors_probe_transient`).
    `offload`: FSDP's CPU offload, adding `host` and `pcie` (per micro-batch and GPU)."""
    options = dict(options or {})
    _check_setting(policy, compute, sharding, logits, probe, rollout_share, gpu_bytes)
    if offload and sharding != "fsdp":
        raise ValueError("offload: FSDP's CPU offload shards the weights (sharding='fsdp')")
    geo, layer_numel = geometry(hf_config, options, rule)
    b, c, f = POLICIES[policy], POLICIES[compute or policy], 4  # storage, compute, float32
    shard = gpus if sharding == "fsdp" else 1
    vocab, hidden = hf_config.vocab_size, hf_config.hidden_size
    rule_plan = rules.rule_class(rule).planned(geo, options, b)
    if non_target not in NON_TARGET:
        raise ValueError(f"non_target: unknown {non_target!r}; known: {NON_TARGET}")
    head = 0 if rule_plan["frozen_base"] else vocab * hidden * b  # the output layer's gradient
    rest = geo.n_all - geo.n_low if non_target == "adamw" and rule_plan["frozen_base"] else 0
    if rest:  # trained by AdamW beside the rule: fp32 gradients and two moments, sharded
        head = vocab * hidden * b
    # LoGRA's own control predicts by a forward-mode JVP (`jvp_control`), without the base
    jvp = kl_control and rule_plan.get("jvp_control", False)
    # the base covers the whole probe with KL control, else its held-out half only
    base_seqs = probe_size if kl_control and not jvp else probe_size - probe_size // 2
    probe_len = probe_len or seq_len
    probe_c = probe_len - (seq_len - (completion_len or seq_len))  # the probe's completion
    if not 0 < probe_c <= probe_len <= seq_len:
        raise ValueError(f"probe_len: {probe_len} leaves no completion after the prompt of "
                         f"{seq_len - (completion_len or seq_len)} tokens, or exceeds seq_len "
                         f"{seq_len}")
    probe_tokens = base_seqs * probe_c
    base = 0 if not probe_size else (  # probe_size 0: no realized-KL probe, no base kept
        probe_tokens * hidden * c + (0 if rule_plan["frozen_base"] and not rest
                                     else vocab * hidden * b))
    chunk = min(chunk_tokens or CHUNK_TOKENS,
                math.ceil(probe_size / 2) * probe_c)
    chunks = 3 * chunk * vocab * f
    loss_chunk = min(chunk_tokens or CHUNK_TOKENS, micro_batch * seq_len) * vocab * (
        f + (c if c < f else 0))
    if logits == "full":  # the fp32 logits the forward returns and, in backward, their gradient
        loss_chunk = 2 * micro_batch * seq_len * vocab * f
    # autocast on one device casts every weight a matmul uses, and backward keeps the cast for
    # the input's gradient, frozen or not (under FSDP the gathered layers are cast: `fsdp`)
    autocast = geo.n_all * c if c < b and shard == 1 else 0
    # per GPU: sharded under FSDP, but what the rule keeps whole on every rank (LoGRA's state)
    per_gpu = {k: rule_plan[k] // (1 if k in rule_plan.get("replicated", ()) else shard)
               for k in ("weights", "master", "grads", "optimizer", "step", "perturbed_copy",
                         "after_apply")}
    per_gpu["grads"] += rest * 4 // shard
    per_gpu["optimizer"] += 2 * rest * 4 // shard
    out = {k: per_gpu[k] for k in ("weights", "master", "grads", "optimizer")}
    if offload:  # the shards live in host memory; the GPU sees them in transit
        out["host"] = sum(out.values()) * shard
        out["pcie"] = 2 * per_gpu["weights"] + per_gpu["grads"]
        # the probe's no-grad forwards gather every layer too: the base and the realized KL's
        out["pcie_probe"] = 2 * per_gpu["weights"] if probe_size else 0
        out |= dict.fromkeys(("weights", "master", "grads", "optimizer"), 0)
    out |= {
        "activations": activation_bytes_estimate(
            hf_config, batch=micro_batch, seq_len=seq_len, dtype_bytes=c,
            checkpointing=checkpointing, attention_mask=attention_mask,
            attn_implementation=attn_implementation, frozen=rule_plan["frozen_base"],
            sketch_rank=rule_plan.get("sketch_rank", 0),
            loss="chunked" if logits == "chunked" else "hf")
        + loss_chunk + head + autocast,
        "probe": base + chunks,
        # two layers' weights all-gathered; one layer's unsharded grads (a frozen base: none);
        # the root group (what no decoder layer holds: embeddings, final norm, output layer),
        # gathered for the whole forward and backward (the root is not resharded after forward)
        "fsdp": (2 * layer_numel * c + (0 if rule_plan["frozen_base"] else layer_numel * c)
                 + root_numel(geo) * c
                 + (2 * layer_numel * b // shard if offload else 0) if shard > 1 else 0),
        "rollout": int(rollout_share * gpu_bytes) if rollout_share else 0,
    }
    # a no-grad probe forward's largest transient: one MLP's gate activation, up and their
    # product over the probe's tokens
    probe_forward = base_seqs * 3 * probe_len * hf_config.intermediate_size * c
    # backward's largest transient: one MLP's gradients w.r.t. its gate, up and product over
    # the micro-batch (beside the activations still saved for the layers below)
    backward_transient = 3 * micro_batch * seq_len * hf_config.intermediate_size * c
    kl_pass = max(probe_forward, chunks)  # the chunks are formed after the last MLP has freed
    if jvp:
        jvp_pass = (authors_probe_transient(hf_config, probe_len, probe_c, c)
                    if probe == "authors" else
                    _jvp_transient(hf_config, rule_plan["jvp_responses"], probe_len, probe_c,
                                   chunk_tokens or CHUNK_TOKENS, b, c))
    alive = out["weights"] + out["master"] + out["optimizer"] + out["rollout"] + out["fsdp"]
    proposed = out["grads"] + base + per_gpu["step"]  # from propose until apply
    phases = {
        "rollout": alive - out["fsdp"],
        "forward_backward": alive + out["grads"] + out["activations"] + backward_transient,
        "propose": alive + proposed + max(probe_forward, rule_plan["transient"]),
        "kl_control": (None if not kl_control else alive + proposed + jvp_pass if jvp else
                       alive + proposed + per_gpu["perturbed_copy"] + kl_pass),
        "apply": alive + max(proposed, per_gpu["after_apply"] + base + kl_pass),
    }
    out.update({f"phase_{name}": v for name, v in phases.items() if v is not None})
    out["peak_phase"] = max((v, name) for name, v in phases.items() if v is not None)[1]
    out["total"] = phases[out["peak_phase"]]
    return out


def _check_setting(policy, compute, sharding, logits, probe, rollout_share, gpu_bytes) -> None:
    if logits not in LOGITS:
        raise ValueError(f"logits: unknown {logits!r}; known: {LOGITS}")
    if probe not in PROBES:
        raise ValueError(f"probe: unknown {probe!r}; known: {PROBES}")
    for key, value in (("policy", policy), ("compute", compute or policy)):
        if value not in POLICIES:
            raise ValueError(f"{key}: unknown {value!r}; known: {sorted(POLICIES)}")
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding: unknown {sharding!r}; known: {SHARDINGS}")
    if rollout_share and not gpu_bytes:
        raise ValueError("rollout_share needs gpu_bytes (the GPU's memory)")


def _jvp_transient(hf_config, responses: int, seq_len: int, c_len: int, chunk_tokens: int,
                   b: int, c: int) -> int:
    """The largest transient of this project's forward-mode JVP probe: the dual (x2) forward of
    the sequences that share one (their kept logits within chunk_tokens; one MLP's gate, up and
    product); the output layer's dual forward (its kept logits and their tangent beside the
    zero tangent forward-mode AD forms for its weight, vocab x hidden, and autocast's cast of
    it); or the kept logits and their tangent with the float64 work on 64 of one sequence's
    positions at a time (4 (64, vocab) tensors)."""
    vocab, hidden = hf_config.vocab_size, hf_config.hidden_size
    shared = min(responses, max(1, chunk_tokens // c_len))
    kept = 2 * shared * c_len * vocab * c  # the kept logits and their tangent
    output_dual = vocab * hidden * (c + (c if c < b else 0)) + kept
    return max(2 * shared * 3 * seq_len * hf_config.intermediate_size * c, output_dual,
               kept + 4 * min(64, c_len) * vocab * 8)


def authors_probe_transient(hf_config, seq_len: int, c_len: int, c: int) -> int:
    """The largest transient of LoGRA's JVP probe as its authors' code runs it
    (skzhang1/RL, nemo_rl/models/automodel/logra_probe.py, `predict_batch_kl`, l. 67-124):
    one sequence at a time over its first `seq_len` positions (l. 100-105: min(its length,
    probe_max_tokens)), the model in eval mode with eager attention (l. 93-94) under forward-mode
    AD (l. 98, every tensor a primal and its tangent) and autocast to the compute dtype (`c`
    bytes; l. 106), its weights gathered by FSDP's mixed precision in that dtype (so no autocast
    cast of a weight). The largest of:
    - eager attention's scores (transformers, models/qwen2/modeling_qwen2.py,
      `eager_attention_forward`), heads x seq_len² elements: the masked scores and their tangent
      in the compute dtype, alive while `softmax(dtype=float32)` runs; for a narrower compute
      dtype its float32 copy and the copy's tangent (ATen `softmax` casts the input first); the
      float32 result; and its tangent's two temporaries (torch derivatives.yaml `_softmax`:
      result · (self_t − logsumexp_jvp), whose exp-normalised copy is freed before them), plus
      the causal mask (seq_len², compute dtype);
    - one MLP's dual gate activation, up and product (3 x seq_len x intermediate, x2);
    - the logits' cast by FSDP's output dtype (float32): the compute-dtype logits and tangent
      beside their float32 copies (for a float32 compute, the float32 pair alone);
    - the float64 KL (nemo_rl/models/automodel/logra.py `predicted_kl`) on 64 completion
      positions at a time (l. 117-123): the float32 logits and tangent of the whole sequence,
      the chunk's float32 copies of both (advanced indexing) and five float64 tensors alive at
      its last product (probabilities, direction, centered, its square, their product).
    tests/measure/test_planner.py checks it against the live tensor bytes of that procedure
    on a small model."""
    vocab, f = hf_config.vocab_size, 4
    heads = hf_config.num_attention_heads
    narrow = c < f
    scores = heads * seq_len**2 * (2 * c + (2 * f if narrow else 0) + 3 * f) + seq_len**2 * c
    mlp = 2 * 3 * seq_len * hf_config.intermediate_size * c
    cast = 2 * seq_len * vocab * (c + (f if narrow else 0))
    chunk = min(64, c_len)
    kl = 2 * seq_len * vocab * f + chunk * vocab * (2 * f + 5 * 8)
    return max(scores, mlp, cast, kl)


def node_setting(planner: dict) -> dict:
    """The `planner:` section's node (GPUs, sharding, policy, sequence, rollout share), as
    `predict` takes it."""
    return {k: planner.get(k) for k in ("micro_batch", "seq_len", "completion_len", "policy",
                                         "gpus", "sharding", "checkpointing", "rollout_share",
                                         "gpu_gb")}


def predict(hf_config, spec: dict, setting: dict, grpo: dict) -> dict:
    """One row of a prediction table: `plan` for the method `spec` ({rule, options,
    kl_control}) in `setting` (plan's keyword arguments, `gpu_gb` for `gpu_bytes`), the
    probe and chunk sizes from `grpo` unless the setting gives them, whether it fits, and
    the sync columns (`sync_columns`) in the engine's dtype (`engine`, default the policy's:
    an offloaded trainer's float32 shards still reach a bf16 engine in bf16)."""
    options, setting = spec.get("options", {}), dict(setting)
    gpu_gb = setting.pop("gpu_gb", None)
    engine = setting.pop("engine", None) or setting.get("policy", "fp32")
    setting.setdefault("probe_size", grpo["probe_size"])
    setting.setdefault("chunk_tokens", grpo.get("chunk_tokens"))
    bytes_ = plan(hf_config, spec["rule"], options, gpu_bytes=gpu_gb and gpu_gb * 1e9,
                  kl_control=bool(spec.get("kl_control"))
                  or rules.rule_class(spec["rule"]).has_control(options), **setting)
    return {**bytes_, "fits": bytes_["total"] <= gpu_gb * 1e9 if gpu_gb else None,
            **sync_columns(hf_config, spec["rule"], options, engine),
            "offload": bool(setting.get("offload")), "kind": "prediction"}


def mean_over_updates(hf_config, spec: dict, setting: dict, grpo: dict, lengths: list[int],
                      probe_lengths: list[int] | None = None) -> float:
    """The mean over updates of each update's predicted peak (`predict`'s `total`, the largest
    of its phases): update i at its own longest sequence `lengths[i]` (the micro-batch the
    peak is set by, prompt included; its completion the setting's prompt shorter) and its
    probe's sequences at `probe_lengths[i]` (default: the same). This is the statistic LoGRA's
    authors report (PAPER.md: each training GPU's peak allocated memory during the training
    call, reset before it and read after it, averaged over updates; skzhang1/RL,
    nemo_rl/models/policy/workers/dtensor_policy_worker_v2.py `train`), where one update at the
    setting's longest sequence bounds it from above."""
    prompt = setting["seq_len"] - (setting.get("completion_len") or setting["seq_len"])
    peaks = [predict(hf_config, spec, setting | {"seq_len": n, "completion_len": n - prompt,
                                                 "probe_len": p}, grpo)["total"]
             for n, p in zip(lengths, probe_lengths or lengths, strict=True)]
    return sum(peaks) / len(peaks)


def root_numel(geo: Geometry) -> int:
    """Parameters FSDP's root group holds (logra/rl/fsdp.py shards each decoder layer, then the
    model): every parameter outside the decoder layers."""
    return sum(math.prod(shape) for name, shape in geo.params
               if not re.search(r"\.layers\.\d+\.", name))


def geometry(hf_config, options: dict, rule=None) -> tuple[Geometry, int]:
    """The model's `methods.Geometry` for the rule's low-rank modules
    (`UpdateRule.modules(options)`), and its largest decoder layer's parameter count."""
    modules = (rules.rule_class(rule).modules(options) if rule
               else options.get("modules", DEFAULT_MODULES))
    params, low_rank, layer_numel = shapes(hf_config, modules)
    sizes = [math.prod(s) for s in params.values()]
    head_dim = (getattr(hf_config, "head_dim", None)
                or hf_config.hidden_size // hf_config.num_attention_heads)
    return Geometry(sum(sizes), tuple(low_rank), max(sizes), tuple(params.items()),
                            head_dim), layer_numel


def sync_bytes(hf_config, rule: str, options: dict | None = None, policy: str = "fp32",
               transport: str = "auto", changed_fraction: float | None = None) -> int | None:
    """Predicted bytes of one policy sync by `transport` (`logra.common.TRANSPORTS`, or `auto`:
    the rule's own), the engine in the `policy` dtype: the rule's own transport is its
    `planned_sync`; `full` every trained word (`planned_trained`); `delta` the
    `changed_fraction` of them (`delta_bytes`; a parameter, required). None where the
    transport does not apply to the rule."""
    options = dict(options or {})
    return _sync_bytes(rules.rule_class(rule), geometry(hf_config, options, rule)[0], options,
                       POLICIES[policy], transport, changed_fraction)


def sync_columns(hf_config, rule: str, options: dict | None = None,
                 policy: str = "fp32") -> dict:
    """planner.csv's sync columns (one model built): `sync_bytes` (the rule's own transport),
    `sync_bytes_full`, `sync_bytes_low_rank` (None where it does not apply) and
    `sync_trained_words`, from which `delta_bytes` predicts delta at any changed fraction."""
    options, cls = dict(options or {}), rules.rule_class(rule)
    geo, b = geometry(hf_config, options, rule)[0], POLICIES[policy]
    return {"sync_bytes": _sync_bytes(cls, geo, options, b, "auto"),
            **{f"sync_bytes_{t}": _sync_bytes(cls, geo, options, b, t)
               for t in ("full", "low_rank")},
            "sync_trained_words": cls.planned_trained(geo, options)}


def _sync_bytes(cls, geo, options: dict, b: int, transport: str,
                changed_fraction: float | None = None) -> int | None:
    if transport != "auto" and transport not in cls.transports:
        return None
    if transport in ("auto", cls.transports[0]):
        return cls.planned_sync(geo, options, b)
    words = cls.planned_trained(geo, options)
    if transport == "full":
        return words * b
    if changed_fraction is None:
        raise ValueError("sync_bytes: the delta transport needs changed_fraction")
    return delta_bytes(words, changed_fraction, b)
