"""LoGRA as a torch optimizer (logra/optim/optimizer.py) and in TRL's GRPOTrainer
(logra/harness/trl_grpo.py).

Invariants, one test each:
1. A few GRPOTrainer steps with LoGRA on the CPU, its predicted-KL controller on: every step's
   loss is finite; each target weight's change in a step has rank <= r (W −= F·A) and, over
   two steps, > r (a new projection every update: sensitivity); nothing else changes;
   ‖ΔW‖ / ‖W‖ over all targets is α·update_ratio in every step (the factor's bf16 rounding:
   relative 1e-2), α the controller's: at most alpha_max, and below it the predicted KL at α
   is the step's budget (α = √(budget / K)); the mixin gave the controller the step's first
   micro-batch at the trainer's temperature; the
   optimizer state, read through torch's `optimizer.state`, is A (r x in) and v (out) per
   target, as `state_bytes()` says; the trainer counted the completion tokens (T > 1); the
   logged grad_norm is ‖S‖ and the trainer's max_grad_norm clips nothing; the peak memory of an
   update step is below TRL's default AdamW's on the same rollouts.
2. The sketch: S equals G·Aᵀ of a plain copy's dense gradients over two micro-batches (fp32:
   relative 1e-5), and clip_grad_norm_ returns ‖S‖ and leaves S as it is.
3. A GRPOTrainer without LoGRATrainerMixin, which would not count T, stops with an error
   naming the mixin.
4. fp16's GradScaler is refused with an error naming fp16; bf16 autocast trains.
5. Torch API: state_dict / load_state_dict resume to the same weights and mismatch EMA as an
   uninterrupted run (exactly), the controller on and fed a mismatch; a state saved with
   other options, or between prepare_update and step, is refused; step() without a probe
   (the controller on) is refused before anything is consumed, and controller=False applies
   α = 1; step(alpha=0) leaves the weights and, as the authors' optimizer, advances the count
   and the projections.
6. examples/trl_grpo_logra.py (the config's batch sizes, 2 steps from a given base) writes,
   for LoGRA and AdamW, a measured peak and the rewards, with the device and model size.

The GRPO runs use a fixed seed (a trainer run is slow to repeat); a random tiny model's
completions rarely hold a right answer, so the task's reward is a partial credit (the share of
digits in the answer line) that differs within every group.
"""
from __future__ import annotations

import copy
import json
import math
import re
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import TrainerCallback

from logra.optim.optimizer import LoGRAOptimizer, logra_optimizer
from logra.optim.rule import tensor_bytes
from logra.rl.models import load, n_params
from logra.rl.tasks import ArithmeticTask
from logra.tracking import Trackers, tensorboard_scalars

TARGET_NAME = re.compile(r"\.(q|k|v|o|gate|up|down)_proj\.weight$")  # independent of the code
RANK, RATIO, STEPS = 2, 1e-2, 4
GRPO = dict(steps=STEPS, lr=1e-3, prompts_per_step=2, group_size=4, micro_batch_size=4,
            max_new_tokens=8, seed=0)


class DigitShare(ArithmeticTask):
    """Arithmetic prompts; reward: the share of digits in the completion's first line."""
    name = "digit_share"

    def reward(self, completion, example):
        line = completion.split("\n")[0]
        return sum(c.isdigit() for c in line) / max(len(line), 1)


class Record(TrainerCallback):
    """Snapshots of every parameter after every step; before each optimizer step (after the
    trainer's clipping) ‖S‖ and the counted T."""

    def __init__(self, model):
        self.params = dict(model.named_parameters())
        self.snapshots, self.norms, self.tokens, self.controls, self.probes = [], [], [], [], []

    def _snap(self):
        self.snapshots.append({n: p.detach().clone() for n, p in self.params.items()})

    def on_train_begin(self, args, state, control, **kwargs):
        self._snap()

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        opt = logra_optimizer(optimizer)
        self.norms.append(math.sqrt(sum(t.s.double().square().sum().item()
                                        for t in opt.rule.targets)))
        self.tokens.append(opt.normalization_tokens)
        self.probes.append((opt.probe, opt.temperature))

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        self._snap()
        self.controls.append(dict(logra_optimizer(optimizer).last_control))


@pytest.fixture(scope="module")
def task_rows():
    task = DigitShare()
    return task, task.splits(0, 64, 8)["train"]


@pytest.fixture(scope="module")
def runs(tiny_dir, task_rows, tmp_path_factory):
    from logra.harness.trl_grpo import Tracked, train_grpo
    task, rows = task_rows
    out = {}
    for method in ("logra", "adamw"):
        model, tokenizer = load(tiny_dir)
        record = Record(model)
        track = tmp_path_factory.mktemp(f"trl_{method}")
        with Trackers({"tensorboard": True}, track, method, "trl") as trackers:
            out[method] = train_grpo(model, tokenizer, task, rows,
                                     logra=dict(rank=RANK, update_ratio=RATIO)
                                     if method == "logra" else None,
                                     callbacks=[Tracked(trackers)] + (
                                         [record] if method == "logra" else []), **GRPO)
        out[method] |= {"model": model, "record": record, "scalars": tensorboard_scalars(track)}
    return out


def _rank(delta: torch.Tensor) -> int:
    sv = torch.linalg.svdvals(delta.double())
    return int((sv > 1e-4 * sv[0]).sum())  # fp32 rounding of ΔW is ~1e-6 σ_max


def test_grpo_trainer_with_logra(runs):
    run, record = runs["logra"], runs["logra"]["record"]
    logs = run["logs"]
    assert [r["step"] for r in logs] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["loss"]) for r in logs), [r["loss"] for r in logs]

    snaps = record.snapshots  # snaps[k]: after step k
    targets = [n for n in record.params if TARGET_NAME.search(n)]
    assert targets and len(targets) < len(record.params)
    for k in range(1, STEPS + 1):
        for name in record.params:
            delta = snaps[k][name] - snaps[k - 1][name]
            if name not in targets:
                assert not delta.any(), f"{name} changed in step {k}"
                continue
            assert 1 <= _rank(delta) <= RANK, f"{name} step {k}"
        change = math.sqrt(sum((snaps[k][n] - snaps[k - 1][n]).double().square().sum()
                               for n in targets))
        norm = math.sqrt(sum(snaps[k - 1][n].double().square().sum() for n in targets))
        c = record.controls[k - 1]
        assert 0 < c["alpha"] <= 3.0, c  # alpha_max, the authors' default
        assert change / norm == pytest.approx(c["alpha"] * RATIO, rel=1e-2), f"step {k}"
        if not c["at_alpha_max"]:
            assert c["predicted_kl"] == pytest.approx(c["kl_budget"], rel=1e-9), c
    assert not all(c["at_alpha_max"] for c in record.controls), record.controls
    for (ids, attn, loss_mask), temperature in record.probes:  # the step's first micro-batch
        assert ids.shape[0] == GRPO["micro_batch_size"] and temperature == 1.0
        assert loss_mask.shape == (ids.shape[0], ids.shape[1] - 1)
        assert 0 < loss_mask.sum() and (loss_mask <= attn[:, 1:]).all()
    for name in targets:  # sensitivity: two steps, two projections
        assert _rank(snaps[2][name] - snaps[0][name]) > RANK, name

    opt = run["optimizer"]
    expected = sum(4 * (RANK * p.shape[1] + p.shape[0]) for n, p in run["model"].named_parameters()
                   if TARGET_NAME.search(n))
    held = tensor_bytes(t for s in opt.state.values() for t in s.values())
    assert held == expected == opt.state_bytes()

    assert all(t > 1 for t in record.tokens), record.tokens  # the mixin counted T
    assert run["trainer"].args.max_grad_norm == 1.0  # TRL's default: it clips nothing here
    logged = [r["grad_norm"] for r in logs]
    assert any(n > 1.0 for n in logged), logged
    assert logged == pytest.approx(record.norms, rel=1e-5)
    for key in ("loss", "grad_norm", "reward"):  # TRL's log rows, in the run's TensorBoard
        assert run["scalars"][key] == {r["step"]: np.float32(r[key]) for r in logs if key in r}

    logra_peak, adamw_peak = run["memory"].peak_bytes, runs["adamw"]["memory"].peak_bytes
    assert logra_peak < adamw_peak, (run["memory"].by_category,
                                     runs["adamw"]["memory"].by_category)


def test_sketch_is_the_dense_gradient_times_the_projection(tiny_dir):
    model, _ = load(tiny_dir)
    opt = LoGRAOptimizer(model, rank=RANK, update_ratio=RATIO)
    plain, _ = load(tiny_dir)  # no hooks: full gradients
    gen = torch.Generator().manual_seed(0)
    for ids in [torch.randint(3, 98, (2, 12), generator=gen) for _ in range(2)]:
        model(input_ids=ids, labels=ids).loss.backward()
        plain(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is None for p in model.parameters())  # no weight gradient anywhere
    grads = dict(plain.named_parameters())
    for t in opt.rule.targets:
        torch.testing.assert_close(t.s, grads[f"{t.name}.weight"].grad @ t.a.T, rtol=1e-5,
                                   atol=1e-7)
    before = [t.s.clone() for t in opt.rule.targets]
    norm = math.sqrt(sum(t.double().square().sum().item() for t in before))
    assert opt.clip_grad_norm_(norm / 4).item() == pytest.approx(norm, rel=1e-6)
    assert all(torch.equal(a, t.s) for a, t in zip(before, opt.rule.targets))  # not clipped


def test_trainer_without_the_mixin_stops_naming_it(tiny_dir, task_rows):
    from trl import GRPOTrainer

    from logra.harness.trl_grpo import grpo_config, prompt_dataset, reward_function
    task, rows = task_rows
    model, tokenizer = load(tiny_dir)
    opt = LoGRAOptimizer(model, rank=RANK)
    args = grpo_config(str(tiny_dir.parent / "plain"), **{k: v for k, v in GRPO.items()
                                                          if k != "steps"}, steps=1)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args,
                          reward_funcs=reward_function(task), train_dataset=prompt_dataset(rows),
                          optimizers=(opt, None))
    with pytest.raises(RuntimeError, match="normalization_tokens") as err:
        trainer.train()
    assert "LoGRATrainerMixin" in str(err.value)


def test_fp16_grad_scaler_is_refused_and_bf16_autocast_trains(tiny_dir):
    model, _ = load(tiny_dir)
    opt = LoGRAOptimizer(model, rank=RANK)
    ids = torch.randint(3, 98, (2, 12))
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(model(input_ids=ids, labels=ids).loss).backward()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="fp16"):
        scaler.step(opt)
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))

    model, _ = load(tiny_dir)
    opt = LoGRAOptimizer(model, rank=RANK)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.normalization_tokens = ids.numel()
    opt.set_probe(ids)  # a plain loop's probe: every position scores its next token
    opt.step()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert math.isfinite(opt.rule.grad_norm) and opt.rule.grad_norm > 0
    changed = {n for (n, p), b in zip(model.named_parameters(), before) if not torch.equal(b, p)}
    assert changed == {n for n, _ in model.named_parameters() if TARGET_NAME.search(n)}


def test_state_dict_resumes_exactly_and_refuses_other_options(tiny_dir):
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(3, 98, (2, 12), generator=gen) for _ in range(4)]

    def train(model, opt, ids):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.normalization_tokens = ids.numel()
        opt.set_probe(ids, mismatch=1e-5 * opt.update_count)  # the EMA moves from update 1
        opt.step()
        opt.zero_grad()

    model, _ = load(tiny_dir)  # uninterrupted: 4 steps
    opt = LoGRAOptimizer(model, rank=RANK, seed=7)
    for ids in batches:
        train(model, opt, ids)
    resumed, _ = load(tiny_dir)  # 2 steps, state_dict, a fresh optimizer on a copy, 2 steps
    opt2 = LoGRAOptimizer(resumed, rank=RANK, seed=7)
    for ids in batches[:2]:
        train(resumed, opt2, ids)
    state = copy.deepcopy(opt2.state_dict())
    assert state["logra"]["count"] == 2 == opt2.update_count
    copied, _ = load(tiny_dir)
    copied.load_state_dict(resumed.state_dict())
    with pytest.raises(ValueError, match=r"other options \(seed: 7 saved, 8 now\)"):
        LoGRAOptimizer(load(tiny_dir)[0], rank=RANK, seed=8).load_state_dict(state)
    opt3 = LoGRAOptimizer(copied, rank=RANK, seed=7)
    opt3.load_state_dict(state)
    for ids in batches[2:]:
        train(copied, opt3, ids)
    for (n, p), q in zip(model.named_parameters(), copied.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=0, msg=n)
    assert state["logra"]["control"]["mismatch"] > 0  # the EMA is in the state and resumes
    assert opt3.mismatch == opt.mismatch > state["logra"]["control"]["mismatch"]

    # the controller on, no probe: refused before anything is consumed; then it steps
    copied(input_ids=batches[0], labels=batches[0]).loss.backward()
    opt3.normalization_tokens = batches[0].numel()
    sketches = [t.s.clone() for t in opt3.rule.targets]
    with pytest.raises(RuntimeError, match="set_probe"):
        opt3.step()
    assert all(torch.equal(a, t.s) for a, t in zip(sketches, opt3.rule.targets))
    opt3.set_probe(batches[0])
    opt3.step()
    assert opt3.last_control["alpha"] > 0
    opt3.zero_grad()
    # controller=False: α = 1 without a probe, ‖ΔW‖ = update_ratio·‖W‖
    plain, _ = load(tiny_dir)
    fixed = LoGRAOptimizer(plain, rank=RANK, update_ratio=RATIO, controller=False)
    before = {n: p.detach().clone() for n, p in fixed.rule.named}
    plain(input_ids=batches[0], labels=batches[0]).loss.backward()
    fixed.normalization_tokens = batches[0].numel()
    fixed.step()
    change = math.sqrt(sum((p - before[n]).double().square().sum() for n, p in fixed.rule.named))
    norm = math.sqrt(sum(b.double().square().sum() for b in before.values()))
    assert change / norm == pytest.approx(RATIO, rel=1e-2)

    # two phases: prepared, a state cannot be saved
    copied(input_ids=batches[0], labels=batches[0]).loss.backward()
    assert opt3.prepare_update(batches[0].numel()) > 0
    with pytest.raises(RuntimeError, match="has not been applied"):
        opt3.state_dict()
    before = [p.detach().clone() for p in copied.parameters()]
    count, a = opt3.update_count, [t.a.clone() for t in opt3.rule.targets]
    opt3.step(alpha=0.0)  # as the authors' optimizer: the weights stay, the count advances
    assert all(torch.equal(b, p) for b, p in zip(before, copied.parameters()))
    assert opt3.update_count == count + 1
    assert not any(torch.equal(x, t.a) for x, t in zip(a, opt3.rule.targets))


@pytest.mark.e2e  # the example end to end, as a user runs it: TRL trains both methods
def test_example_writes_peak_memory_and_reward_of_both_methods(tiny_dir, tmp_path):
    example = runpy.run_path(str(Path(__file__).resolve().parents[2] /
                                 "examples/trl_grpo_logra.py"))
    out = tmp_path / "arithmetic.json"
    example["main"](["--task", "arithmetic", "--base", str(tiny_dir), "--steps", "2",
                     "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["steps"] == 2 and result["profile_step"] == 2
    assert result["model"]["n_params"] == n_params(load(tiny_dir)[0])
    for method in ("logra", "adamw"):
        r = result[method]
        assert r["peak_mem_bytes"] == sum(r["mem_breakdown"].values()) > 0, method
        assert 0 <= r["reward_first"] <= 1 and 0 <= r["reward_last"] <= 1, method
    assert result["peak_ratio"] == result["logra"]["peak_mem_bytes"] / \
        result["adamw"]["peak_mem_bytes"]
