"""A run's outputs: its model and `metrics.csv` (`save_model`; columns `METRIC_COLUMNS`) and
`summary.json` (`summarise`: how the run ended, what it is, its memory, time, sync, rewards,
KL, step control and step size, the machine and the fingerprint; a sharded run stopped by
out-of-memory: `oom_result`). `run` and `progress` are the loop's
(logra.rl.loop `Run`, `Progress`)."""
from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from logra import repro, rules
from logra.common import SYNC_METRICS
from logra.files import atomic_path, save_pretrained
from logra.measure.activations import activation_bytes_estimate, analytic_breakdown
from logra.optim import collectives
from logra.optim.kl_control import calibration as kl_calibration
from logra.rl import checkpoint
from logra.rl.models import load, n_params
from logra.rl.settings import RunSettings
from logra.rl.step import cap_cuda_memory
from logra.rl.weight_sync import EngineSync


# Measured peak vs analytic breakdown: the analytic side leaves out gradients of activations
# and allocator slack during backward (a few percent, see docs/memory.md).
MEM_TOLERANCE = 0.15


METRIC_COLUMNS = ["step", "reward_mean", "reward_std", "loss", "kl_pred", "kl_real",
                  "step_scale", "grad_norm", "step_time_s", "sync_bytes", "peak_mem_bytes",
                  "sync_drift", *SYNC_METRICS[1:], "logp_mismatch_mean", "logp_mismatch_max",
                  "logp_mismatch_signed", "kl_budget", "mismatch_ema", "control_seconds",
                  "token_entropy", "response_tokens_mean", "kl_batch"]


def save_model(run, status: str, metrics: list[dict]) -> tuple[int, dict | None]:
    """Write metrics.csv and the model (rank 0), and remove the checkpoint of a finished run:
    (the step whose weights were saved, the fingerprint). A diverged or out-of-memory run
    keeps the last good weights (and the checkpoint holding them), else the base model."""
    model, rule = run.model, run.rule
    model_step = len(metrics)
    if status != "ok":
        model.zero_grad(set_to_none=True)
        cap_cuda_memory(None, run.device)  # lift the budget cap: saving must not fail for it
        model_step = 0
        if run.ckpt_path and run.ckpt_path.exists():  # before unwrap: LoRA's names match then
            state = checkpoint.load(run.ckpt_path, run.cfg.to_dict(), model,
                                    rule.checkpoint_classes)
            model.load_state_dict(state["model"])
            model_step = state["run"]["step"]
            del state
    rule.unwrap()
    saved = model
    if model_step == 0 and status != "ok":  # the base model has the unwrapped names
        saved = load(run.base_dir)[0] if run.rank == 0 else None
    elif run.sharded:  # gathered on rank 0's CPU, into a plain model
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                     cpu_offload=True))
        if run.rank == 0:
            saved = load(run.base_dir)[0]
            saved.load_state_dict(state)
        del state
    fingerprint = None
    if run.rank == 0:
        write_metrics(run.out_dir / "metrics.csv", metrics)
        save_pretrained(saved, run.tokenizer, run.out_dir / "model")
        fingerprint = {"weights": repro.model_digest(run.out_dir / "model"),
                       "metrics": repro.metrics_digest(metrics)}
    if run.ckpt_path and status == "ok":  # and <task>/<method>/seed<k>/<hash>/ when empty
        checkpoint.remove(run.ckpt_path)
    return model_step, fingerprint


def memory_summary(run, progress) -> dict:
    """The run's memory: the profiled step with the larger peak (step 1 or grpo.profile_step),
    its breakdown, and the analytic breakdown beside it (single-process runs; under FSDP the
    planner models the sharded categories)."""
    memory = progress.memory
    step = max(memory, key=lambda s: memory[s].peak_bytes, default=None)
    report = memory.get(step)
    analytic = check = None
    if report and not run.sharded:
        grpo, config = run.grpo, run.model.config
        analytic = analytic_breakdown(
            param_bytes=run.param_bytes, grad_bytes_at_peak=run.rule.peak_grad_bytes(),
            optimizer_bytes=run.rule.state_bytes(),
            activation_bytes=activation_bytes_estimate(
                config, batch=grpo.micro_batch_size, seq_len=progress.memory_seq_len[step],
                checkpointing=grpo.gradient_checkpointing, attention_mask=True,
                attn_implementation=config._attn_implementation, loss="chunked"))
        ratio = report.peak_bytes / analytic["total"]
        check = {"measured_over_analytic": ratio, "tolerance": MEM_TOLERANCE,
                 "agree": abs(ratio - 1) <= MEM_TOLERANCE}
    return {
        "peak_mem_bytes": report.peak_bytes if report else None,
        "peak_mem_step": step,
        "peak_mem_bytes_by_step": {str(s): r.peak_bytes for s, r in sorted(memory.items())},
        "mem_breakdown": report.by_category if report else None,
        "mem_measure": (report.method if report else None if run.profiled else
                        "not measured (FSDP on CPU)" if run.sharded else
                        "not measured (grpo.measure_memory: false)"),
        "mem_rss_peak_bytes": report.rss_peak_bytes if report else None,
        "mem_analytic": analytic, "mem_check": check}


def _mean(values):
    """The mean of the values that are there (None, nan: not measured), or None."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    return sum(values) / len(values) if values else None


def summarise(run, progress, end: dict, syncer: EngineSync, model_step: int,
              fingerprint: dict | None, set_aside: list[str], wall_s: float) -> dict:
    """summary.json: how the run ended, what it is, its memory, time, sync, rewards, KL, step
    control and step size, the machine and the fingerprint."""
    cfg, grpo, rule, model = run.cfg, run.grpo, run.rule, run.model
    metrics, ckpt = progress.metrics, run.ckpt_path
    timed = [m for m in metrics if m["step"] not in (1, grpo.profile_step)]  # unprofiled
    kl_real = [m["kl_real"] for m in metrics]
    kl_batch = [m["kl_batch"] for m in metrics  # finite ones: older checkpoints lack it
                if math.isfinite(m.get("kl_batch", math.nan))]
    control = rule.control or run.kl_control
    return {
        "status": end["status"], "diverged_at_step": end["diverged_at_step"],
        "diverged_because": end["diverged_because"],
        # what the divergence bounds watch (grpo.max_*): the largest weight norm over the base's
        "weight_norm_ratio_max": progress.weight_ratio_max,
        "memory_budget_bytes": cfg.memory_budget_bytes,
        **{k: v for k, v in end.items() if k.startswith("oom_")},
        # corrupt checkpoints found at the start, set aside (grpo.on_bad_checkpoint)
        "checkpoints_set_aside": set_aside,
        "model_step": model_step,  # the step whose weights were saved (0 = the base model)
        "checkpoint": str(ckpt) if ckpt and ckpt.exists() else None,
        "resumed_from_steps": progress.resumed_from,
        "task": cfg.task_name, "method": cfg.method_name, "seed": cfg.seed,
        "model": cfg.model_name, "n_params": n_params(model), "device": str(run.device),
        "nproc_per_node": collectives.world_size(), "compute_dtype": grpo.compute_dtype,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "steps": len(metrics), "wall_s": wall_s,
        **memory_summary(run, progress),
        # the profiled steps run under the profiler (several times slower): left out
        "mean_step_time_s": _mean(m["step_time_s"] for m in timed),
        "sync_bytes_per_step": _mean(m["sync_bytes"] for m in metrics),
        # per-step means of the sync metrics (logra/rl/weight_sync.py): the applied transport
        # and the bytes of each that applies; the engine's dtype; trainer-vs-engine mismatch
        "sync_transport": syncer.transport, "rollout_dtype": cfg.rollout.dtype,
        # the engine, and how it takes payloads: in place, or reloaded from its host copy of the
        # trained weights (vLLM where its layout is not the checkpoint's: logra/rl/rollout.py)
        "rollout_engine": cfg.rollout.engine,
        "engine_sync_path": (syncer.engine_path or {}).get("path"),
        "engine_host_copy_bytes": (syncer.engine_path or {}).get("host_copy_bytes"),
        "base_median_abs_weight": run.base_median_w,
        **{f"{k}_per_step": _mean(m[k] for m in metrics) for k in SYNC_METRICS[1:]},
        **{k: _mean(m[k] for m in metrics) for k in ("logp_mismatch_mean", "logp_mismatch_max")},
        # the whole model's bytes (a sharded parameter's numel is its full size); parameters()
        # lists a tied weight once
        "sync_full_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "sync_lowrank_fraction": (progress.lowrank_bytes / progress.lowrank_full
                                  if progress.lowrank_full else None),
        "optimizer_state_bytes": rule.state_bytes(),  # on one rank under FSDP
        "final_reward": _mean(m["reward_mean"] for m in metrics[-10:]),
        # the policy's per-token entropy on its own samples, mean over the steps (an estimate:
        # logra/rl/step.py `accumulate_gradients`)
        "token_entropy_mean": _mean(m["token_entropy"] for m in metrics),
        # per step: on the probe's held-out half (kl_real), on the whole batch (kl_batch)
        "kl": {"median_real": statistics.median(kl_real) if kl_real else None,
               "max_real": max(kl_real, default=None),
               "median_batch": statistics.median(kl_batch) if kl_batch else None,
               "max_batch": max(kl_batch, default=None),
               "calibration": kl_calibration(metrics)},
        # the step's control (the rule's own, else the config's kl_control): the share of steps
        # at its cap (LoGRA: alpha_max) and its mean seconds per step
        "control": None if control is None else {
            "kind": type(control).__name__,
            "steps_at_cap_share": progress.steps_at_cap / len(metrics) if metrics else None,
            "mean_seconds": _mean(m["control_seconds"] for m in timed)},
        # cos(applied step, −dense gradient of its batch) at grpo.cosine_step (nan: the rule
        # cannot keep the gradient), or None
        "update_cosine": progress.update_cosine,
        # the rule's step size: its option (lr; LoGRA's update_ratio) and value
        "step_size": {"option": rule.step_size_option,
                      "value": rules.step_size(type(rule), cfg.method.options)},
        "eval_accuracy": None, "config": cfg.to_dict(),
        # what the bits depend on, and the bits: weights and metrics without machine columns
        "machine": repro.machine(), "fingerprint": fingerprint}


def write_metrics(path: Path, rows: list[dict]) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=METRIC_COLUMNS)
        w.writeheader()
        w.writerows(rows)


def oom_result(cfg: RunSettings | dict, base_dir, out_dir, oom: dict) -> dict:
    """Outputs of a sharded run stopped by a rank's out-of-memory error (it raises, so torchrun
    stops every rank; the rank leaves `oom.rank{r}.json`): the base model saved as the run's
    model, a metrics.csv header (the steps before it are not kept) and the summary."""
    out_dir = Path(out_dir)
    cfg = cfg if isinstance(cfg, RunSettings) else RunSettings.from_dict(cfg)
    model, tokenizer = load(base_dir)
    write_metrics(out_dir / "metrics.csv", [])
    save_pretrained(model, tokenizer, out_dir / "model")
    return {"status": "oom", **oom, "model_step": 0, "task": cfg.task_name,
            "method": cfg.method_name, "seed": cfg.seed, "model": cfg.model_name,
            "n_params": n_params(model), "nproc_per_node": cfg.grpo.nproc_per_node,
            "steps": 0, "peak_mem_bytes": None, "final_reward": None, "eval_accuracy": None,
            "config": cfg.to_dict()}
