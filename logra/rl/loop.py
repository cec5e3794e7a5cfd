"""The GRPO loop: rollouts -> rewards -> advantages -> loss -> update rule -> sync.

One run = one (task, method, seed). The loop knows nothing about the method: it asks the update
rule (`logra/optim/rule.py`) to propose a step and applies it, then ships the rule's sync payload
to the rollout engine, which holds its own copy of the weights in another process. `train` runs
the phases, each a function: `setup` (seeds, model, rule) and `restore` (a checkpoint); per step
`sample` (rollouts, rewards, advantages), `update` (logra/rl/step.py), `stopped` (out of memory,
divergence: logra/rl/guards.py), `sync`, `record`, `save_snapshot`, `save_checkpoint`; then
`save_model` and `summarise` (metrics.csv and summary.json: logra/rl/summary.py). Under FSDP
(`grpo.nproc_per_node` > 1) torchrun starts `main` on every rank. docs/loop.md says what each
step measures and logs, how a run resumes, diverges or runs out of memory.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random
import shutil
import time
from pathlib import Path

import torch

from logra import rules
from logra.common import warmup_cosine
from logra.files import read_jsonl, save_pretrained, ticker, write_json
from logra.measure.memory import MemoryMeter, MemoryReport
from logra.optim import collectives
from logra.optim.kl_control import KLControl
from logra.optim.rule import tensor_bytes
from logra.rl import checkpoint, fsdp
from logra.rl.engines import make_engine
from logra.rl.guards import divergence, diverged, sync_drift, weight_norm
from logra.rl.loss import estimator
from logra.rl.models import load, median_abs_weight
from logra.rl.rollout import EngineError
from logra.rl.settings import Grpo, RunSettings
from logra.rl.step import batch_kl, cap_cuda_memory, compute_context, cuda_oom, update_step
from logra.rl.summary import save_model, summarise
from logra.rl.tasks import get_task
from logra.rl.weight_sync import EngineSync, payload_bytes
from logra.tracking import Trackers

def pad_batch(rollouts, pad_id: int):
    """Left-pad prompts and right-pad completions into (input_ids, attention_mask, loss_mask,
    engine_logp), where loss_mask (B, T-1) marks the positions whose *next* token is a
    completion token and engine_logp (B, T-1, float32) holds there the engine's log-prob of
    that token (`Rollout.logprobs`), aligned with `token_logprobs`' output; 0 elsewhere."""
    p_len = max(len(r.prompt_ids) for r in rollouts)
    c_len = max(max(len(r.completion_ids) for r in rollouts), 1)
    ids = torch.full((len(rollouts), p_len + c_len), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    engine_logp = torch.zeros(len(rollouts), p_len + c_len - 1)
    for i, r in enumerate(rollouts):
        p, c = r.prompt_ids, r.completion_ids
        ids[i, p_len - len(p):p_len] = torch.tensor(p)
        ids[i, p_len:p_len + len(c)] = torch.tensor(c, dtype=torch.long)
        attn[i, p_len - len(p):p_len + len(c)] = 1
        engine_logp[i, p_len - 1:p_len - 1 + len(c)] = torch.tensor(r.logprobs)
    loss_mask = attn[:, 1:].clone()
    loss_mask[:, :p_len - 1] = 0
    return ids, attn, loss_mask, engine_logp


@dataclasses.dataclass
class Run:
    """What one run is made of, built once by `setup`: its config, device, data, model (and
    reference model), update rule and control, random generators and checkpoint path. `grpo`
    is `cfg.grpo`; `sharded` says the run is under FSDP (torchrun, `grpo.nproc_per_node`)."""
    cfg: RunSettings
    base_dir: Path
    out_dir: Path
    device: torch.device
    mesh: object
    rank: int
    task: object
    rows: list[dict]
    model: torch.nn.Module
    tokenizer: object
    ref_model: torch.nn.Module | None
    autocast: object
    rule: object
    kl_control: KLControl | None
    rng: random.Random  # the prompts of each step
    shuffle_gen: torch.Generator  # each step's order of its rollouts
    eos: set[int]  # the ids a completed response ends with
    ckpt_path: Path | None
    base_norm: float  # ‖θ_base‖, the divergence bound's reference (LoRA: adapters too)
    base_median_w: float | None
    param_bytes: int
    profiled: set[int]  # the steps measured with the MemoryMeter
    estimator: object  # grpo.estimator's (logra.rl.loss.estimator): advantages, loss, signal

    @property
    def grpo(self) -> Grpo:
        return self.cfg.grpo

    @property
    def sharded(self) -> bool:
        return self.mesh is not None


def setup(cfg: RunSettings | dict, base_dir, train_jsonl, out_dir, checkpoint_dir=None) -> Run:
    """Seeds, device (and the process group under torchrun), data, model, rule. Everything a
    rule draws at random (LoGRA's first projections) follows `torch.manual_seed(seed)`, in
    this order, so that a run's bits depend on its seed alone. `cfg`: the run's settings (a
    dict: the resolved run config, `RunSettings.from_dict`)."""
    cfg = cfg if isinstance(cfg, RunSettings) else RunSettings.from_dict(cfg)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    grpo, seed = cfg.grpo, cfg.seed
    random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(cfg.threads)
    mesh, device = fsdp.init(torch.device(cfg.device))
    sharded = mesh is not None
    compute_dtype = getattr(torch, grpo.compute_dtype)
    task = get_task(cfg.task.type, **cfg.task.options)
    rows = read_jsonl(train_jsonl, required=("prompt", "answer"))

    def load_model():  # weights stored in grpo.param_dtype (bf16: no float32 copy)
        if not sharded:
            return load(base_dir, dtype=getattr(torch, grpo.param_dtype), device=str(device))
        return fsdp.load_sharded(base_dir, mesh, device, compute_dtype)

    model, tokenizer = load_model()
    # the scale of the weights it starts from (lr / |w| decides how many bf16 words a step
    # changes: the sync regime); not measured on sharded parameters
    base_median_w = median_abs_weight(model) if not sharded else None
    model.train()
    if grpo.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    ref_model = None
    if grpo.beta > 0:
        ref_model = load_model()[0]
        ref_model.eval().requires_grad_(False)
    autocast = compute_context(device, compute_dtype if not sharded else torch.float32)
    rule = rules.build(cfg.method.rule, model, cfg.method.options)
    kl_control = KLControl(**cfg.method.kl_control) if cfg.method.kl_control else None
    shuffle_gen = torch.Generator().manual_seed(seed)
    # the tokenizer's eos and the model's generation config's (a hub model may list several,
    # as vLLM stops on them all)
    ids = getattr(model.generation_config, "eos_token_id", None)
    eos = {tokenizer.eos_token_id, *(ids if isinstance(ids, list) else [] if ids is None
                                     else [ids])}
    rng = random.Random(seed)
    param_bytes = tensor_bytes(model.parameters())  # LoRA: adapters included
    ckpt_path = (checkpoint.path(checkpoint_dir, cfg.to_dict()) if checkpoint_dir and not sharded
                 else None)
    # CPU + FSDP: the profiler's memory timeline cannot follow FSDP's storage resizes (it fails
    # its own version checks), so sharded CPU runs are not measured; CUDA uses the allocator
    # grpo.measure_memory: false skips it, unless a budget is checked by the measured peak
    measure = grpo.measure_memory or bool(cfg.memory_budget_bytes)
    profiled = (set() if (sharded and device.type == "cpu") or not measure
                else {1, grpo.profile_step})
    return Run(cfg, Path(base_dir), out_dir, device, mesh, collectives.rank(), task, rows,
               model, tokenizer, ref_model, autocast, rule, kl_control, rng, shuffle_gen, eos,
               ckpt_path, weight_norm(model), base_median_w, param_bytes, profiled,
               estimator(grpo))


@dataclasses.dataclass
class Progress:
    """The loop's state besides the weights and the rule's, checkpointed with them
    (`dataclasses.asdict`: plain data)."""
    step: int = 0
    metrics: list[dict] = dataclasses.field(default_factory=list)  # metrics.csv's rows
    memory: dict[int, MemoryReport] = dataclasses.field(default_factory=dict)  # by profiled step
    memory_seq_len: dict[int, int] = dataclasses.field(default_factory=dict)  # by profiled step
    diagnostic_s: float = 0.0  # the last step's batch-KL forward, left out of its step_time_s
    baseline: float = 0.0  # the estimator's running baseline (reinforce_baseline's)
    lowrank_bytes: int = 0  # low-rank sync bytes ...
    lowrank_full: int = 0  # ... and what those weights take in full
    wall_s: float = 0.0
    resumed_from: list[int] = dataclasses.field(default_factory=list)
    zero_grad_steps: int = 0  # consecutive steps without a gradient while rewards varied
    steps_at_cap: int = 0  # steps whose scale the control set at its cap
    weight_ratio_max: float = 1.0  # the largest ‖θ‖ / ‖θ_base‖ after a step
    update_cosine: dict | None = None  # {step, cosine} of grpo.cosine_step

    @classmethod
    def from_state(cls, state: dict) -> Progress:
        """The progress a checkpoint holds (`dataclasses.asdict` of one)."""
        return cls(**state | {"memory": {s: MemoryReport(**r)
                                         for s, r in state["memory"].items()}})


def restore(run: Run) -> tuple[dict, dict | None, list[str]]:
    """(progress, the engine's weights or None, checkpoints set aside) from this run's
    checkpoint, verified (logra/rl/checkpoint.py), the model, rule and generators restored from
    it; a fresh start without one. A corrupt one is set aside and the run starts from its base
    (`grpo.on_bad_checkpoint: set_aside`), else the error stops the run, naming the file and
    what to do."""
    ckpt = run.ckpt_path
    state = None
    if ckpt is not None and ckpt.exists():
        try:
            state = checkpoint.load(ckpt, run.cfg.to_dict(), run.model, run.rule.checkpoint_classes)
        except checkpoint.CorruptCheckpoint as e:
            if run.grpo.on_bad_checkpoint == "stop":
                raise checkpoint.CorruptCheckpoint(
                    f"{e}. Move it aside (or delete it) to start the run from its base, or set "
                    "grpo.on_bad_checkpoint: set_aside") from None
            state = checkpoint.set_aside(ckpt)
            print(f"{e}; set aside as {state}: the run starts from its base")
    if not isinstance(state, dict) and run.rank == 0:  # from the base: no earlier snapshot holds
        for earlier in ("snapshots", "tb"):  # nor an earlier start's events (logra/tracking.py)
            shutil.rmtree(run.out_dir / earlier, ignore_errors=True)
    if isinstance(state, Path):  # corrupt, set aside: the run starts from its base
        return Progress(), None, [str(state)]
    if state is None:
        return Progress(), None, []
    run.model.load_state_dict(state["model"])
    run.rule.load_state_dict(state["rule"])
    checkpoint.set_rng_states(state["rng"], run.rng, run.shuffle_gen)
    progress = Progress.from_state(state["run"])
    progress.resumed_from.append(progress.step)
    print(f"resumed from {ckpt} at step {progress.step}")
    return progress, state["engine"], []


@dataclasses.dataclass
class Batch:
    """One step's rollouts as the update takes them: rewards (in the engine's order), the
    padded tensors and advantages (shuffled), the engine's log-probs, which responses
    completed, and the probe (the first `grpo.probe_size` sequences)."""
    rewards: torch.Tensor
    tensors: tuple[torch.Tensor, ...]  # ids, attention mask, loss mask, advantages
    engine_logp: torch.Tensor
    completed: torch.Tensor
    probe: tuple[torch.Tensor, ...]


def sample(run: Run, engine, step: int, progress: Progress) -> Batch:
    """The step's prompts, their rollouts (rank 0's engine, broadcast), rewards and advantages
    (GRPO's, or REINFORCE's against `progress.baseline`, which it moves on); shuffled, so
    that each micro-batch (and the probe) mixes prompts instead of being one prompt's group
    (the loss does not depend on the order)."""
    grpo, group = run.grpo, run.grpo.group_size
    examples = run.rng.sample(run.rows, grpo.prompts_per_step)
    rollouts = collectives.broadcast(engine.generate(
        [ex["prompt"] for ex in examples], group, grpo.max_new_tokens, grpo.temperature,
        run.cfg.seed * 1_000_003 + step) if engine else None)
    rewards = torch.tensor([run.task.reward(r.text, examples[i // group])
                            for i, r in enumerate(rollouts)])
    adv, progress.baseline = run.estimator.advantages(  # a running baseline is checkpointed
        rewards, torch.tensor([len(r.completion_ids) for r in rollouts]), progress.baseline,
        grpo)
    perm = torch.randperm(len(rollouts), generator=run.shuffle_gen)
    ids, attn, mask, engine_logp = (t[perm].to(run.device)
                                    for t in pad_batch(rollouts, run.tokenizer.pad_token_id))
    completed = torch.tensor([bool(r.completion_ids) and r.completion_ids[-1] in run.eos
                              for r in rollouts])[perm]
    n = grpo.probe_size
    return Batch(rewards, (ids, attn, mask, adv[perm].to(run.device)), engine_logp, completed,
                 (ids[:n], attn[:n], mask[:n]))


def update(run: Run, batch: Batch, step: int, progress: Progress) -> tuple:
    """The step's update (logra.rl.step.update_step), measured by the MemoryMeter on the
    profiled steps (the report kept in `progress`), then the batch KL of what it changed
    (logra.rl.step.batch_kl, one forward outside the measured window, its seconds left out of
    the step's time: `progress.diagnostic_s`): (loss, η, predicted KL, realized KL, mismatch
    metrics and "kl_batch"). Raises FloatingPointError (a control's prediction was not
    finite) and torch.OutOfMemoryError."""
    grpo, rule = run.grpo, run.rule
    ids, attn, mask, _ = batch.tensors
    old_logp = torch.zeros(ids.shape[0], ids.shape[1] - 1, device=ids.device)
    meter = (MemoryMeter(run.device, labels={"optimizer": rule.state_tensors(),
                                             "grads": rule.grad_buffers(),
                                             "weights": [*run.model.parameters(), *(
                                                 run.ref_model.parameters() if run.ref_model
                                                 else ())]})
             if step in run.profiled else contextlib.nullcontext())
    with meter, run.autocast:
        out = update_step(
            run.model, run.ref_model, rule, run.kl_control, batch.tensors, batch.probe, grpo,
            max_scale=scheduled_scale(step, grpo),
            phase=getattr(meter, "phase", None), engine_logp=batch.engine_logp,
            completed=batch.completed, cosine=step == grpo.cosine_step,
            estimator=run.estimator, old_logp=old_logp)
    if step in run.profiled:
        progress.memory[step] = meter.report
        progress.memory_seq_len[step] = ids.shape[1]
    start = time.time()
    with run.autocast:  # after the measured window: a diagnostic, not part of the update
        out[4]["kl_batch"] = batch_kl(run.model, ids, attn, mask, old_logp, grpo)
    progress.diagnostic_s = time.time() - start  # left out of the step's time
    return out


def scheduled_scale(step: int, grpo: Grpo) -> float:
    """The step scale's schedule at update `step` (from 1), the largest scale the step's
    control may take: `warmup_cosine` over grpo.warmup_steps, grpo.decay_steps and
    grpo.decay_final (1 without either)."""
    return warmup_cosine(step, grpo.warmup_steps, grpo.decay_steps,
                         grpo.decay_final)


def stopped(run: Run, batch: Batch, step: int, progress: Progress, loss: float,
            kl_real: float) -> dict | None:
    """After the update: why the run stops here, as summary fields, or None. Out of memory on
    CPU (the larger profiled peak above `memory_budget_bytes`, after the last profiled step)
    or a divergence (`divergence`)."""
    budget = run.cfg.memory_budget_bytes
    if step == max(run.profiled, default=None):
        peak = collectives.all_reduce(  # the largest rank's: every rank decides alike
            torch.tensor(max(r.peak_bytes for r in progress.memory.values()),
                         device=run.device), op="max").item()
        if budget and peak > budget:
            return {"status": "oom", "oom_at_step": step, "oom_check": (
                "measured peak vs budget, after the step (the larger of the profiled "
                "steps' peaks)"), "oom_needed_bytes": peak}
    varied = run.estimator.has_signal(batch.rewards, batch.tensors[3], run.grpo)
    progress.zero_grad_steps = (progress.zero_grad_steps + 1
                                   if run.rule.grad_norm == 0 and varied else 0)
    ratio = weight_norm(run.model) / run.base_norm
    progress.weight_ratio_max = max(progress.weight_ratio_max, ratio)
    why = divergence(loss, run.rule.grad_norm, kl_real, ratio, progress.zero_grad_steps,
                     run.grpo)
    return diverged(step, why) if why else None


def sync(run: Run, syncer: EngineSync, engine, step: int, progress: Progress) -> dict:
    """Send the step to the engine (the run's transport; every rank takes part under FSDP) and
    every `rollout.full_sync_every` steps the full weights, with the drift found before it:
    the step's sync metrics."""
    metrics = syncer.step(engine)
    params = dict(run.model.named_parameters())
    progress.lowrank_bytes += payload_bytes({"lowrank": syncer.lowrank})
    progress.lowrank_full += sum(params[n].numel() * params[n].element_size()
                                    for n in syncer.lowrank)
    metrics["sync_drift"] = math.nan
    every = run.cfg.rollout.full_sync_every
    if every and step % every == 0:
        weights = run.rule.engine_weights()
        if engine:
            metrics["sync_drift"] = sync_drift(engine.state_dict(), weights)
            metrics["sync_bytes"] += syncer.resync(engine)
    return metrics


def record(run: Run, progress: Progress, step: int, batch: Batch, measured: dict) -> None:
    """The step's row of metrics.csv (METRIC_COLUMNS) into `progress`, and what the summary
    keeps of it: the steps at the control's cap and the update-cosine diagnostic."""
    memory = progress.memory
    row = {"step": step, "reward_mean": batch.rewards.mean().item(),
           "reward_std": batch.rewards.std().item(), "grad_norm": run.rule.grad_norm,
           "response_tokens_mean": batch.tensors[2].sum(dim=1).double().mean().item(),
           "peak_mem_bytes": memory[step].peak_bytes if step in run.profiled else math.nan,
           **measured}
    progress.steps_at_cap += row.pop("step_at_cap")
    if "update_cosine" in row:  # the diagnostic step's (grpo.cosine_step)
        progress.update_cosine = {"step": step, "cosine": row.pop("update_cosine")}
    progress.metrics.append(row)
    progress.step = step


def save_checkpoint(run: Run, engine, step: int, progress: Progress) -> None:
    """Every `grpo.checkpoint_every` steps before the last (single-process runs)."""
    every = run.grpo.checkpoint_every
    if run.ckpt_path and every and step % every == 0 and step < run.grpo.steps:
        checkpoint.save(run.ckpt_path, {
            "cfg": run.cfg.to_dict(), "model": run.model.state_dict(),
            "rule": run.rule.state_dict(), "engine": engine.state_dict(),
            "rng": checkpoint.rng_states(run.rng, run.shuffle_gen),
            "run": dataclasses.asdict(progress)})


def save_snapshot(run: Run, engine, step: int) -> None:
    """Every `grpo.snapshot_every` steps before the last: the rollout policy as the engine holds
    it (merged, whole, in the engine's dtype, for every rule), saved as a model of the base's
    architecture under `snapshots/step<N>` for held-out evaluation (the stability runs'). A
    resumed run keeps the snapshots written before its checkpoint."""
    every = run.grpo.snapshot_every
    if engine and every and step % every == 0 and step < run.grpo.steps:
        with torch.random.fork_rng(devices=[]):  # the run's draws stay as without snapshots
            model = load(run.base_dir, dtype=getattr(torch, run.cfg.rollout.dtype))[0]
        model.load_state_dict(engine.state_dict())
        save_pretrained(model, run.tokenizer, run.out_dir / "snapshots" / f"step{step}")


def train(cfg: RunSettings | dict, base_dir: str | Path, train_jsonl: str | Path,
          out_dir: str | Path, checkpoint_dir: str | Path | None = None,
          tracking: dict | None = None) -> dict:
    """Run GRPO with the run's settings `cfg` (logra/rl/settings.py; a dict is the resolved run
    config, logra/harness/config.py `run_config`); returns the summary. Writes
    `out_dir/metrics.csv` and `out_dir/model`; resumes from `checkpoint_dir` if it holds a
    checkpoint of this run. The phases: setup, restore, then per step sample,
    update, stopped?, sync, record, save_checkpoint; then save_model and summarise. Each
    step's row of metrics.csv also goes to the trackers `tracking` asks for (config
    `tracking`, logra/tracking.py), which are no part of the run's settings or results."""
    run = setup(cfg, base_dir, train_jsonl, out_dir, checkpoint_dir)
    cfg = run.cfg
    progress, engine_weights, set_aside = restore(run)
    trackers = Trackers(tracking if run.rank == 0 else None, run.out_dir, cfg.run_id,
                        f"{cfg.task_name}/{cfg.method_name}",
                        purge_step=progress.step + 1 if progress.step else None)
    trackers.text("config", "<pre>" + json.dumps(cfg.to_dict(), indent=1) + "</pre>")
    end = {"status": "ok", "diverged_at_step": None, "diverged_because": None}
    cap_cuda_memory(cfg.memory_budget_bytes, run.device)
    t_start = time.time() - progress.wall_s
    step, engine = progress.step, None
    try:
        engine = make_engine(cfg.rollout.engine, str(base_dir),
                             dtype=cfg.rollout.dtype, threads=cfg.threads,
                             timeout_s=cfg.rollout.timeout_s,
                             timeout_factor=cfg.rollout.timeout_factor,
                             **cfg.rollout.options) if run.rank == 0 else None
        syncer = EngineSync(run.rule, cfg.rollout.sync, getattr(torch, cfg.rollout.dtype),
                            has_engine=engine is not None,
                            engine_path=engine.sync_path() if engine else None)
        if engine_weights is None and run.grpo.param_dtype != "float32" and engine:
            engine_weights = run.rule.engine_weights()  # the base as the trainer stores it
        if engine_weights is not None:  # the engine starts from the base weights: restore its own
            engine.sync({"dense": engine_weights})
            del engine_weights
        tick = ticker(f"train {cfg.run_id}", run.grpo.steps) if run.rank == 0 else None
        for step in range(progress.step + 1, run.grpo.steps + 1):
            t0 = time.time()
            batch = sample(run, engine, step, progress)
            try:
                loss, eta, kl_pred, kl_real, mismatch = update(run, batch, step, progress)
            except FloatingPointError as e:  # a control's prediction was not finite
                end |= diverged(step, str(e))
                break
            except torch.OutOfMemoryError as e:
                oom = {"oom_at_step": step, **cuda_oom(e, run.device)}
                end |= {"status": "oom", **oom}
                if run.sharded:  # the other ranks wait in a collective: stop them all
                    write_json(run.out_dir / f"oom.rank{run.rank}.json", oom)
                    raise
                break
            stop = stopped(run, batch, step, progress, loss, kl_real)
            if stop:
                end |= stop
                break
            synced = sync(run, syncer, engine, step, progress)
            record(run, progress, step, batch, synced | mismatch | {
                "loss": loss, "kl_pred": kl_pred, "kl_real": kl_real, "step_scale": eta,
                "step_time_s": time.time() - t0 - progress.diagnostic_s})
            progress.wall_s = time.time() - t_start
            trackers.log(step, {k: v for k, v in progress.metrics[-1].items() if k != "step"})
            if tick:
                tick(step, reward=progress.metrics[-1]["reward_mean"])
            save_snapshot(run, engine, step)  # first: a checkpoint never outlives its snapshot
            save_checkpoint(run, engine, step, progress)
    except EngineError as e:  # the checkpoint stays: a rerun resumes from it
        raise EngineError(f"{cfg.run_id} at step {step}: {e}; a rerun resumes from the "
                          f"last checkpoint ({run.ckpt_path or 'none: checkpoint_every is 0'})"
                          ) from None
    finally:
        if engine:
            engine.close()
        trackers.close()
    model_step, fingerprint = save_model(run, end["status"], progress.metrics)
    return summarise(run, progress, end, syncer, model_step, fingerprint, set_aside,
                     time.time() - t_start)


def main(argv: list[str] | None = None) -> None:
    """`python -m logra.rl.loop RUN_JSON BASE TRAIN_JSONL OUT_DIR [CHECKPOINT_DIR] [--tracking
    JSON]`, the command torchrun starts on every rank: train with the run config in RUN_JSON;
    rank 0 writes OUT_DIR/summary.json and logs to the trackers."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m logra.rl.loop", description=main.__doc__)
    for name in ("run_json", "base", "train_jsonl", "out_dir"):
        parser.add_argument(name)
    parser.add_argument("checkpoint_dir", nargs="?")
    parser.add_argument("--tracking", type=json.loads, help="config `tracking`, as JSON")
    args = parser.parse_args(argv)
    cfg = json.loads(Path(args.run_json).read_text())
    summary = train(cfg, args.base, args.train_jsonl, args.out_dir, args.checkpoint_dir,
                    args.tracking)
    if collectives.rank() == 0:
        write_json(Path(args.out_dir) / "summary.json", summary)
    if torch.distributed.is_initialized():  # every rank waits for rank 0's files, then leaves
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
