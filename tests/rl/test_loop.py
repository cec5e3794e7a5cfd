"""The loop's phases (logra/rl/loop.py), each on its own, on the tiny model with the real HF
engine: setup, restore, sample, update, stopped, sync, record, save_checkpoint, save_snapshot,
save_model and summarise. tests/e2e/test_resume.py runs them together, killed and resumed."""
import dataclasses
import math

import pytest
import torch
from runs import CoinFlip, make_run

from logra.common import warmup_cosine
from logra.harness.config import grpo_settings
from logra.rl import checkpoint, guards, loop
from logra.rl.engines import make_engine
from logra.rl.models import load
from logra.rl.summary import METRIC_COLUMNS, memory_summary, save_model, summarise


def engine_for(run):
    r = run.cfg.rollout
    return make_engine(r.engine, str(run.base_dir), dtype=r.dtype, threads=run.cfg.threads,
                       timeout_s=r.timeout_s, timeout_factor=r.timeout_factor)


def steps(run, engine, syncer, progress, n):
    """n steps through the phases, as `train` runs them; the last step's batch."""
    for step in range(progress.step + 1, progress.step + n + 1):
        batch = loop.sample(run, engine, step, progress)
        loss, eta, kl_pred, kl_real, mismatch = loop.update(run, batch, step, progress)
        assert loop.stopped(run, batch, step, progress, loss, kl_real) is None
        synced = loop.sync(run, syncer, engine, step, progress)
        loop.record(run, progress, step, batch, synced | mismatch | {
            "loss": loss, "kl_pred": kl_pred, "kl_real": kl_real, "step_scale": eta,
            "step_time_s": 0.0})
        loop.save_checkpoint(run, engine, step, progress)
    return batch


def start(tmp_path, tiny_dir, measure_memory, **grpo):
    """A LoGRA run set up, its engine and syncer, with a fresh progress."""
    cfg, train_jsonl = make_run(tmp_path, "logra", measure_memory=measure_memory, **grpo)
    run = loop.setup(cfg, tiny_dir, train_jsonl, tmp_path / "out", tmp_path / "ckpt")
    engine = engine_for(run)
    syncer = loop.EngineSync(run.rule, "auto", getattr(torch, cfg["rollout"]["dtype"]),
                             has_engine=True)
    yield run, engine, syncer, loop.Progress()
    engine.close()


@pytest.fixture
def started(tmp_path, tiny_dir):
    """`start`, its memory not measured (grpo.measure_memory: false): a profiled step takes
    seconds on CPU, and these phases do not read it."""
    yield from start(tmp_path, tiny_dir, False)


@pytest.fixture
def measured(tmp_path, tiny_dir):
    """`start`, measuring memory at step 1 and grpo.profile_step (3)."""
    yield from start(tmp_path, tiny_dir, True)


def test_setup_draws_what_is_random_from_the_run_seed(tmp_path, tiny_dir):
    """LoRA's adapters are drawn in setup: the same seed draws the same, another seed others;
    one process is not sharded and profiles step 1 and grpo.profile_step."""
    cfg, train_jsonl = make_run(tmp_path, "lora")

    def adapters(seed):
        run = loop.setup(cfg | {"seed": seed}, tiny_dir, train_jsonl, tmp_path / "out")
        return run, {n: p.detach().clone() for n, p in run.model.named_parameters()
                     if "lora_A" in n}
    run, first = adapters(0)
    again, other = adapters(0)[1], adapters(1)[1]
    assert first and all(torch.equal(first[n], again[n]) for n in first)
    assert not any(torch.equal(first[n], other[n]) for n in first)
    assert not run.sharded and run.profiled == {1, cfg["grpo"]["profile_step"]}
    assert run.ckpt_path is None  # no checkpoint_dir given
    assert run.base_norm > 0 and run.param_bytes > 0


def test_sample_shuffles_groups_and_takes_the_probe_from_the_front(started):
    run, engine, _, progress = started
    batch = loop.sample(run, engine, 1, progress)
    ids, attn, mask, adv = batch.tensors
    grpo = run.grpo
    assert len(batch.rewards) == len(ids) == grpo.prompts_per_step * grpo.group_size
    assert abs(adv.sum().item()) < 1e-4  # each group's advantages sum to zero
    assert torch.equal(batch.probe[0], ids[:grpo.probe_size])
    assert batch.completed.dtype == torch.bool and len(batch.completed) == len(ids)
    assert (mask.sum(1) > 0).any() and mask.shape == (len(ids), ids.shape[1] - 1)


def test_update_measures_only_the_profiled_steps(measured):
    run, engine, _, progress = measured
    for step in (1, 2):
        loss, eta, kl_pred, kl_real, mismatch = loop.update(
            run, loop.sample(run, engine, step, progress), step, progress)
        assert math.isfinite(loss) and math.isfinite(kl_real) and "step_at_cap" in mismatch
    assert set(progress.memory) == {1} and progress.memory[1].peak_bytes > 0
    summary = memory_summary(run, progress)
    assert summary["peak_mem_step"] == 1 and summary["peak_mem_bytes_by_step"] == {
        "1": progress.memory[1].peak_bytes}


def test_a_run_that_measures_no_memory_profiles_no_step(started, tmp_path, tiny_dir):
    run, engine, _, progress = started
    assert run.profiled == set()
    loop.update(run, loop.sample(run, engine, 1, progress), 1, progress)
    assert progress.memory == {}
    # unless a memory budget is set: the CPU checks it by the measured peak
    budgeted = loop.setup(run.cfg.replace(memory_budget_bytes=2**30), tiny_dir,
                          tmp_path / "train.jsonl", tmp_path / "out")
    assert budgeted.profiled == {1, run.grpo.profile_step}


def test_stopped_names_a_divergence_and_counts_zero_gradients(started):
    run, engine, _, progress = started
    batch = loop.sample(run, engine, 2, progress)  # step 2: no memory check
    loop.update(run, batch, 2, progress)
    assert loop.stopped(run, batch, 2, progress, 0.1, 0.01) is None
    too_far = loop.stopped(run, batch, 2, progress, 0.1, run.grpo.max_kl_per_step * 2)
    assert too_far["status"] == "diverged" and "max_kl_per_step" in too_far["diverged_because"]
    assert "non-finite" in loop.stopped(run, batch, 2, progress, math.nan, 0.01)[
        "diverged_because"]
    ratio = guards.weight_norm(run.model) / run.base_norm
    assert progress.weight_ratio_max == max(1.0, ratio) and progress.zero_grad_steps == 0


def test_stopped_on_cpu_compares_the_profiled_peak_with_the_budget(measured):
    run, engine, _, progress = measured
    run.cfg = run.cfg.replace(memory_budget_bytes=1)  # every step needs more
    last = max(run.profiled)
    batch = loop.sample(run, engine, last, progress)
    loop.update(run, batch, last, progress)
    stop = loop.stopped(run, batch, last, progress, 0.1, 0.01)
    assert stop["status"] == "oom" and stop["oom_needed_bytes"] == progress.memory[
        last].peak_bytes


def test_sync_and_record_leave_the_engine_at_the_trainers_weights(started):
    run, engine, syncer, progress = started
    run.cfg = run.cfg.replace(rollout=dataclasses.replace(run.cfg.rollout, full_sync_every=2))
    batch = steps(run, engine, syncer, progress, 2)
    rows = progress.metrics
    assert [r["step"] for r in rows] == [1, 2] and progress.step == 2
    assert set(rows[-1]) == set(METRIC_COLUMNS)  # step_at_cap went to the summary's count
    lengths = batch.tensors[2].sum(dim=1)  # tests/rl/test_sync.py: a completion's tokens
    assert rows[-1]["response_tokens_mean"] == lengths.double().mean().item() > 0
    assert rows[-1]["token_entropy"] > 0
    assert math.isnan(rows[0]["sync_drift"]) and rows[1]["sync_drift"] == 0.0
    assert guards.sync_drift(engine.state_dict(), run.rule.engine_weights()) == 0.0
    assert rows[0]["sync_bytes_low_rank"] == rows[0]["sync_bytes"]  # LoGRA's own transport


def test_restore_resumes_what_save_checkpoint_wrote(started, tmp_path, tiny_dir):
    run, engine, syncer, progress = started
    assert loop.restore(run) == (loop.Progress(), None, [])  # nothing saved yet
    steps(run, engine, syncer, progress, 2)  # checkpoint_every 2: saved after step 2
    assert checkpoint.path(tmp_path / "ckpt", run.cfg.to_dict()).exists()
    again = loop.setup(run.cfg, tiny_dir, tmp_path / "train.jsonl", tmp_path / "out",
                       tmp_path / "ckpt")
    restored, engine_weights, set_aside = loop.restore(again)
    assert restored.step == 2 and restored.resumed_from == [2] and set_aside == []
    assert [r["step"] for r in restored.metrics] == [1, 2]
    # the progress comes back whole (repr: a nan equals a nan)
    assert repr(dataclasses.replace(restored, resumed_from=[])) == repr(progress)
    assert all(torch.equal(p, q) for p, q in zip(run.model.parameters(),
                                                 again.model.parameters()))
    held = engine.state_dict()
    assert set(engine_weights) == set(held)
    assert all(torch.equal(engine_weights[n], w) for n, w in held.items())
    assert again.rng.getstate() == run.rng.getstate()


def test_a_snapshot_is_the_policy_the_engine_samples_and_draws_nothing(started):
    """Every grpo.snapshot_every steps before the last, the engine's weights are saved as a
    model of the base's architecture, without a draw from the run's generators; the last
    step's point is the saved model (no snapshot); a run that starts from its base removes an
    earlier run's snapshots."""
    run, engine, syncer, progress = started
    run.cfg = run.cfg.replace(grpo=dataclasses.replace(run.grpo, snapshot_every=1))
    steps(run, engine, syncer, progress, 1)
    before = torch.get_rng_state(), run.rng.getstate()
    loop.save_snapshot(run, engine, 1)
    assert torch.equal(torch.get_rng_state(), before[0]) and run.rng.getstate() == before[1]
    saved = load(run.out_dir / "snapshots" / "step1")[0].state_dict()
    assert all(torch.equal(saved[n], w) for n, w in engine.state_dict().items())
    trained = run.rule.engine_weights()  # and the trainer's, which the engine holds
    assert trained and all(torch.equal(saved[n], w) for n, w in trained.items())
    loop.save_snapshot(run, engine, run.grpo.steps)
    assert [p.name for p in (run.out_dir / "snapshots").iterdir()] == ["step1"]
    assert loop.restore(run)[0] == loop.Progress()  # no checkpoint yet: from the base
    assert not (run.out_dir / "snapshots").exists()


def test_save_model_keeps_the_last_good_weights_of_a_stopped_run(started):
    run, engine, syncer, progress = started
    steps(run, engine, syncer, progress, 2)  # checkpointed at step 2
    at_two = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    steps(run, engine, syncer, progress, 1)
    model_step, fingerprint = save_model(run, "diverged", progress.metrics)
    assert model_step == 2 and run.ckpt_path.exists()  # kept for a look, and a rerun
    assert all(torch.equal(p, at_two[n]) for n, p in run.model.named_parameters())
    assert fingerprint["weights"] and (run.out_dir / "metrics.csv").exists()


def test_save_model_of_a_finished_run_removes_its_checkpoint(started):
    run, engine, syncer, progress = started
    steps(run, engine, syncer, progress, 2)
    model_step, _ = save_model(run, "ok", progress.metrics)
    assert model_step == 2 and not run.ckpt_path.exists()
    end = {"status": "ok", "diverged_at_step": None, "diverged_because": None}
    summary = summarise(run, progress, end, syncer, model_step, None, [], 1.0)
    assert summary["steps"] == 2 and summary["status"] == "ok" and summary["checkpoint"] is None
    assert summary["control"]["kind"] == "BudgetControl"
    assert summary["peak_mem_bytes"] is None and "measure_memory" in summary["mem_measure"]
    assert summary["step_size"] == {"option": "update_ratio", "value": 1.0e-2}


def test_reinforce_answers_each_prompt_once_against_the_baseline_of_earlier_steps(
        tmp_path, tiny_dir):
    """grpo.estimator reinforce_baseline: one response per prompt; each step's advantages are
    its binarised rewards (1, else −0.01) minus the running baseline of the steps before it,
    which then takes 0.1 of the step's mean; the checkpoint keeps the baseline."""
    runs = start(tmp_path, tiny_dir, False, estimator="reinforce_baseline", group_size=1,
                 prompts_per_step=8)
    run, engine, syncer, progress = next(runs)
    run.task = CoinFlip(digits=1)  # rewards 0 and 1 in turn: both outcomes in every step
    baseline = 0.0
    for step in (1, 2):
        batch = loop.sample(run, engine, step, progress)
        assert len(batch.rewards) == run.grpo.prompts_per_step
        outcomes = torch.where(batch.rewards >= 1, 1.0, -0.01)
        assert sorted(batch.tensors[3].tolist()) == pytest.approx(
            sorted((outcomes - baseline).tolist()))
        baseline = 0.9 * baseline + 0.1 * outcomes.mean().item()
        assert progress.baseline == pytest.approx(baseline)
        loss, eta, kl_pred, kl_real, mismatch = loop.update(run, batch, step, progress)
        assert math.isfinite(loss) and loop.stopped(run, batch, step, progress, loss,
                                                    kl_real) is None
        loop.record(run, progress, step, batch, loop.sync(run, syncer, engine, step, progress)
                    | mismatch | {"loss": loss, "kl_pred": kl_pred, "kl_real": kl_real,
                                  "step_scale": eta, "step_time_s": 0.0})
        loop.save_checkpoint(run, engine, step, progress)  # after step 2 (checkpoint_every 2)
    again = loop.setup(run.cfg, tiny_dir, tmp_path / "train.jsonl", tmp_path / "out",
                       tmp_path / "ckpt")
    assert loop.restore(again)[0].baseline == progress.baseline
    next(runs, None)  # closes the engine


def test_the_step_scale_warms_up_then_decays_as_the_authors_dense_schedule():
    """research/logra/schedule.py's factor at update index i (from 0): (i + 1)/W for i < W,
    then f + (1 − f)(1 + cos πp)/2 with p = min((i − W + 1)/(D − W), 1); W 9, D 300, f 0.1."""
    g = grpo_settings({"warmup_steps": 9, "decay_steps": 300, "decay_final": 0.1})
    for i in range(320):
        p = min((i - 9 + 1) / (300 - 9), 1.0)
        want = (i + 1) / 9 if i < 9 else 0.1 + 0.9 * (1 + math.cos(math.pi * p)) / 2
        assert loop.scheduled_scale(i + 1, g) == pytest.approx(want, rel=1e-12)
    assert loop.scheduled_scale(300, g) == pytest.approx(0.1)
    assert warmup_cosine(5, 10, 0, 0.1) == 0.5
    assert warmup_cosine(11, 10, 0, 0.1) == 1.0
    assert warmup_cosine(1, 0, 0, 0.1) == 1.0
    assert warmup_cosine(20, 0, 20, 0.0) == 0.0  # SFT's cosine to 0 at its last step
