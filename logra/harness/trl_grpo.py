"""TRL's GRPOTrainer on this project's tasks and models, with LoGRA or TRL's default AdamW.

`train_grpo(model, tokenizer, task, rows, logra=...)` runs TRL's own GRPO loop (generation
with the training model's `generate`, no vLLM) for a few steps on the CPU and returns what it
measured. Its pieces are what a TRL user needs: `reward_function(task)`, `prompt_dataset(rows)`
and LoGRA passed as `optimizers=(LoGRAOptimizer(model, ...), scheduler)` to a GRPOTrainer with
`LoGRATrainerMixin` (logra/optim/optimizer.py). `StepMemory` measures one optimizer step with
the project's meter (logra/measure/memory.py); rollouts are made for `ROLLOUT_STEPS` optimizer
steps at once, so that the measured step generates nothing. Deviation from the harness's loop,
stated: those steps train on rollouts of the policy one update older (TRL's clipped importance
ratio corrects for it), where the harness generates afresh for every update.

What the mixin does and what the step's measurement covers: docs/optimizer.md, "In TRL's
GRPOTrainer".
"""
from __future__ import annotations

import math
import statistics
import tempfile
import time
from pathlib import Path

from logra.noise import quiet

quiet()  # before TRL, which imports peft (and with it torchao, bitsandbytes)

import datasets
import torch
import transformers
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from logra.harness.config import task_options
from logra.measure.memory import MemoryMeter, optimizer_state_bytes
from logra.optim.optimizer import LoGRAOptimizer, LoGRATrainerMixin
from logra.rl.loss import GRPO, estimator
from logra.rl.models import load, n_params
from logra.rl.settings import Grpo
from logra.tracking import Trackers

METHODS = ("logra", "adamw")  # compare()'s two runs: LoGRAOptimizer, TRL's default AdamW
ROLLOUT_STEPS = 2  # optimizer steps served by one generation (steps_per_generation / accum)
REWARD_WINDOW = 10  # steps: reward_first / reward_last average the rollouts of the first / last


class LoGRAGRPOTrainer(LoGRATrainerMixin, GRPOTrainer):
    """TRL's GRPOTrainer whose clipping and logged grad_norm see LoGRA's sketches."""


def reward_function(task):
    """`task.reward` with TRL's reward-function signature: one float per completion; the
    example's fields come as the dataset's columns (`prompt_dataset`)."""
    def reward(completions, prompts=None, **columns):
        fields = [k for k in columns if k not in TRL_REWARD_KWARGS]
        return [task.reward(text, {k: columns[k][i] for k in fields})
                for i, text in enumerate(completions)]
    reward.__name__ = task.name  # TRL logs rewards/<name>/mean
    return reward


# what GRPOTrainer passes a reward function besides the dataset's columns
TRL_REWARD_KWARGS = ("completion_ids", "trainer_state", "log_extra", "log_metric",
                     "environments")


def prompt_dataset(rows: list[dict]) -> datasets.Dataset:
    """A task's examples (each with its `prompt`, logra/rl/tasks/) as TRL's prompt dataset."""
    return datasets.Dataset.from_list(rows)


class StepMemory(TrainerCallback):
    """Peak memory of optimizer step `step` (1-based), from `on_step_begin` to `on_step_end`
    (`MemoryMeter`, CPU). `labels` names tensors for the meter's breakdown."""

    def __init__(self, step: int, labels: dict | None = None):
        self.step, self.labels, self.meter, self.report = step, labels, None, None

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            self.meter = MemoryMeter("cpu", labels=self.labels).__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        if self.meter is not None:
            self.meter.__exit__(None, None, None)
            self.report, self.meter = self.meter.report, None


class ControlLog(TrainerCallback):
    """LoGRA's controller per optimizer step: α, its predicted KL, the budget, the mismatch
    EMA and whether α is at alpha_max (`LoGRAOptimizer.last_control`)."""

    def __init__(self):
        self.rows = []

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        last = logra_or_torch(optimizer).last_control
        if last:
            self.rows.append(dict(last))


class Tracked(TrainerCallback):
    """TRL's log rows (loss, reward, grad_norm, ...) to the run's trackers (logra/tracking.py)
    at the trainer's step, as the harness's own loop logs its metrics."""

    def __init__(self, trackers):
        self.trackers = trackers

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.trackers.log(state.global_step, logs or {})


def grpo_config(out_dir: str, *, steps: int, prompts_per_step: int, group_size: int,
                micro_batch_size: int, max_new_tokens: int, lr: float, seed: int,
                max_grad_norm: float = 1.0, bf16: bool = False) -> GRPOConfig:
    """GRPO on the CPU with TRL's generation (no vLLM), the harness's loss settings (DAPO
    aggregation, clip 0.2 / 0.28, no KL penalty), a constant lr, one log row per step."""
    completions = prompts_per_step * group_size
    if completions % micro_batch_size:
        raise ValueError(f"prompts_per_step x group_size = {completions} is not a multiple of "
                         f"micro_batch_size={micro_batch_size}")
    accumulation = completions // micro_batch_size
    return GRPOConfig(
        output_dir=out_dir, use_cpu=True, use_vllm=False, bf16=bf16, fp16=False,
        gradient_checkpointing=False, report_to="none", save_strategy="no",
        logging_steps=1, max_steps=steps, seed=seed, data_seed=seed,
        per_device_train_batch_size=micro_batch_size, gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation * ROLLOUT_STEPS, num_generations=group_size,
        max_completion_length=max_new_tokens, temperature=1.0, beta=0.0, loss_type="dapo",
        epsilon=0.2, epsilon_high=0.28, learning_rate=lr, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=max_grad_norm,
        dataloader_num_workers=0)


def train_grpo(model, tokenizer, task, rows: list[dict], *, steps: int, lr: float,
               logra: dict | None = None, prompts_per_step: int = 8,
               group_size: int = 8, micro_batch_size: int = 8, max_new_tokens: int = 12,
               seed: int = 0, max_grad_norm: float = 1.0, profile_step: int = 2,
               callbacks: list | None = None) -> dict:
    """Train `model` in place with TRL's GRPOTrainer for `steps` optimizer steps.

    With `logra` (LoGRAOptimizer's options, {} for its defaults): `LoGRAOptimizer(model,
    **logra)` (its step is update_ratio·‖W‖ times its controller's α: `lr` is not used) with
    the schedule TRL would build from the config; without: TRL's default optimizer (torch
    AdamW) at `lr`. Returns the trainer, the optimizer, the log rows, the peak memory of step
    `profile_step` (a MemoryReport), the mean reward of the rollouts of the first and the last
    REWARD_WINDOW steps and, with LoGRA, its controller's record of every step
    (`LoGRAOptimizer.last_control`)."""
    if profile_step % ROLLOUT_STEPS:
        raise ValueError(f"profile_step={profile_step}: steps that are not multiples of "
                         f"{ROLLOUT_STEPS} generate rollouts; the update is measured alone")
    transformers.set_seed(seed)
    with tempfile.TemporaryDirectory() as out:
        args = grpo_config(out, steps=steps, prompts_per_step=prompts_per_step,
                           group_size=group_size, micro_batch_size=micro_batch_size,
                           max_new_tokens=max_new_tokens, lr=lr, seed=seed,
                           max_grad_norm=max_grad_norm)
        memory, controls = StepMemory(profile_step), ControlLog()
        common = dict(model=model, processing_class=tokenizer, args=args,
                      reward_funcs=reward_function(task), train_dataset=prompt_dataset(rows),
                      callbacks=[memory, *(callbacks or [])])
        if logra is not None:
            optimizer = LoGRAOptimizer(model, **logra)
            memory.labels = {"optimizer": optimizer.rule.state_tensors(),
                             "grads": optimizer.rule.grad_buffers()}
            scheduler = transformers.get_scheduler(args.lr_scheduler_type, optimizer,
                                                   num_training_steps=steps)
            common["callbacks"].append(controls)
            trainer = LoGRAGRPOTrainer(optimizers=(optimizer, scheduler), **common)
        else:
            trainer = GRPOTrainer(**common)
        trainer.train()
    logs = [row for row in trainer.state.log_history if "loss" in row]
    # a step that generated logs the mean reward of its rollouts (ROLLOUT_STEPS steps' worth)
    rewards = [row["reward"] for row in logs if "reward" in row]
    window = max(1, REWARD_WINDOW // ROLLOUT_STEPS)
    return {"trainer": trainer, "optimizer": logra_or_torch(trainer.optimizer), "logs": logs,
            "memory": memory.report, "profile_step": profile_step, "controls": controls.rows,
            "reward_first": statistics.mean(rewards[:window]) if rewards else math.nan,
            "reward_last": statistics.mean(rewards[-window:]) if rewards else math.nan}


def logra_or_torch(optimizer):
    """The optimizer inside accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


def config_options(config: dict, task: str) -> dict:
    """compare()'s options from the workflow's config: LoGRA's options on `task` (method
    `logra`), AdamW's lr (method `dense_adam`'s) and the `grpo` batch sizes; TRL's GRPO
    only (its groups of two or more)."""
    g = config["grpo"]  # validated (`resolve`)
    if not isinstance(estimator(Grpo.from_dict(g)), GRPO) or g["group_size"] < 2:
        raise ValueError(f"trl: TRL's GRPOTrainer runs GRPO with groups of two or more; this "
                         f"config's grpo.estimator is {g['estimator']!r}, grpo.group_size "
                         f"{g['group_size']}")
    return dict(logra=task_options(config["methods"]["logra"]["options"], task),
                adamw_lr=task_options(config["methods"]["dense_adam"]["options"], task)["lr"],
                prompts_per_step=g["prompts_per_step"], group_size=g["group_size"],
                micro_batch_size=g["micro_batch_size"], max_new_tokens=g["max_new_tokens"])


def compare(base_dir, task, rows: list[dict], *, steps: int, logra: dict, adamw_lr: float,
            seed: int = 0, tracking: dict | None = None, track_dir: str | Path | None = None,
            **grpo) -> dict:
    """`steps` GRPOTrainer steps from the model in `base_dir`, once with LoGRA (`logra`:
    LoGRAOptimizer's options) and once with TRL's AdamW at `adamw_lr`, on the
    same rollouts at step 1; `grpo`: train_grpo's batch sizes. Returns what each measured: the
    peak memory of the profiled update step, its breakdown, the optimizer state, the mean
    reward of the first and last steps' rollouts, the last loss and the wall time. With
    `track_dir`, each method's log rows also go to the trackers `tracking` asks for (config
    `tracking`), in `track_dir/<method>`."""
    logra = {k: v for k, v in logra.items() if k != "seed"} | {"seed": seed}
    lrs = {"logra": None, "adamw": adamw_lr}
    out = {"task": task.name, "device": "cpu", "steps": steps, "seed": seed,
           "reward_window_steps": REWARD_WINDOW, "trl": _version("trl"),
           "transformers": transformers.__version__, "torch": torch.__version__}
    for method, options in zip(METHODS, (logra, None)):
        model, tokenizer = load(base_dir)
        config = model.config
        out["model"] = {"n_params": n_params(model), "architecture": config.model_type,
                        "hidden_size": config.hidden_size,
                        "num_hidden_layers": config.num_hidden_layers,
                        "vocab_size": config.vocab_size}
        t0 = time.time()
        with Trackers(tracking if track_dir else None, Path(track_dir or "."), f"{task.name}/"
                      f"{method}", f"trl/{task.name}") as trackers:
            run = train_grpo(model, tokenizer, task, rows, steps=steps, lr=lrs[method] or 1.0,
                             logra=options, seed=seed, callbacks=[Tracked(trackers)], **grpo)
        opt, memory = run["optimizer"], run["memory"]
        out["profile_step"] = run["profile_step"]
        out[method] = {
            "lr": lrs[method], "options": options or {},
            "peak_mem_bytes": memory.peak_bytes, "mem_breakdown": memory.by_category,
            "optimizer_state_bytes": (opt.state_bytes() if isinstance(opt, LoGRAOptimizer)
                                      else optimizer_state_bytes(opt)),
            "reward_first": run["reward_first"], "reward_last": run["reward_last"],
            "loss_last": run["logs"][-1]["loss"], "wall_s": time.time() - t0}
        if run["controls"]:  # LoGRA's controller: mean α, the share of steps at alpha_max
            out[method] |= {
                "alpha_mean": statistics.mean(c["alpha"] for c in run["controls"]),
                "steps_at_alpha_max_share": statistics.mean(
                    float(c["at_alpha_max"]) for c in run["controls"])}
    out["peak_ratio"] = out["logra"]["peak_mem_bytes"] / out["adamw"]["peak_mem_bytes"]
    return out


def _version(package: str) -> str:
    from importlib.metadata import version
    return version(package)
