"""LoGRA as a torch optimizer (logra/optimizer.py) and in TRL's GRPOTrainer (logra/trl_grpo.py).

Invariants, one test each:
1. A few GRPOTrainer steps with LoGRA on the CPU: every step's loss is finite; each sketched
   weight's change has rank <= r within a basis window (steps {1}, {2..T}, {T+1..}: new bases
   reach steps 1, 2, T + 1, logra/logra.py) and > r across one (sensitivity); the optimizer
   state, read through torch's `optimizer.state`, is r·(min + 2·max) floats per sketched
   weight plus two moments per dense parameter, as LoGRA claims (`state_bytes()`); the peak
   memory of an update step (logra/memory.py's meter) is below TRL's default AdamW's on the
   same rollouts; with TRL's default max_grad_norm = 1.0 the trainer's clipping acts on the
   sketches and dense gradients together: after it, their joint norm is min(logged grad_norm,
   1.0) (relative 1e-4; torch's clip leaves max_norm·‖g‖/(‖g‖ + 1e-6)).
2. clip_grad_norm_ returns sqrt(Σ‖QᵀG‖² + Σ‖G_dense‖²) of the full gradients of a plain copy
   of the model, sketched independently with the optimizer's bases, and scales the sketches by
   min(1, c / norm) (fp32: relative 1e-4).
3. A GRPOTrainer without LoGRATrainerMixin, whose clipping and logged norm would leave out the
   sketched weights, stops with an error naming `max_grad_norm`.
4. fp16's GradScaler is refused with an error naming fp16; bf16 autocast trains.
5. Torch API: an LR scheduler drives both groups (lr 0 changes no weight), and state_dict /
   load_state_dict resume to the same weights as an uninterrupted run.
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

import pytest
import torch
from transformers import TrainerCallback

from logra import sketch as S
from logra.memory import tensor_bytes
from logra.modeling import load, n_params
from logra.optimizer import LoGRAOptimizer, logra_optimizer
from logra.tasks import ArithmeticTask

SKETCHED_NAME = re.compile(r"\.(q|k|v|o|gate|up|down)_proj\.weight$")  # independent of the code
RANK, REFRESH, STEPS = 2, 3, 4
GRPO = dict(steps=STEPS, lr=1e-3, prompts_per_step=2, group_size=4, micro_batch_size=4,
            max_new_tokens=8, seed=0)


class DigitShare(ArithmeticTask):
    """Arithmetic prompts; reward: the share of digits in the completion's first line."""
    name = "digit_share"

    def reward(self, completion, example):
        line = completion.split("\n")[0]
        return sum(c.isdigit() for c in line) / max(len(line), 1)


class Record(TrainerCallback):
    """Snapshots of the sketched weights after every step, and the joint norm of the sketches
    and dense gradients right before each optimizer step (after the trainer's clipping)."""

    def __init__(self, model):
        self.weights = {n: p for n, p in model.named_parameters() if SKETCHED_NAME.search(n)}
        self.snapshots, self.clipped_norms = [], []

    def _snap(self):
        self.snapshots.append({n: p.detach().clone() for n, p in self.weights.items()})

    def on_train_begin(self, args, state, control, **kwargs):
        self._snap()

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        rule = logra_optimizer(optimizer).rule
        parts = [st.s for st in rule.sketched] + [p.grad for _, p in rule.dense.named
                                                  if p.grad is not None]
        self.clipped_norms.append(math.sqrt(sum(t.double().square().sum().item()
                                                for t in parts)))

    def on_step_end(self, args, state, control, **kwargs):
        self._snap()


@pytest.fixture(scope="module")
def task_rows():
    task = DigitShare()
    return task, task.splits(0, 64, 8)["train"]


@pytest.fixture(scope="module")
def runs(tiny_dir, task_rows):
    from logra.trl_grpo import train_grpo
    task, rows = task_rows
    out = {}
    for method in ("logra", "adamw"):
        model, tokenizer = load(tiny_dir)
        record = Record(model)
        out[method] = train_grpo(model, tokenizer, task, rows,
                                 logra=dict(rank=RANK, refresh_every=REFRESH)
                                 if method == "logra" else None,
                                 callbacks=[record] if method == "logra" else [], **GRPO)
        out[method] |= {"model": model, "record": record}
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
    windows = [(0, 1), (1, REFRESH), (REFRESH, STEPS)]  # (before, after): one basis each
    for name in record.weights:
        for k in range(1, STEPS + 1):
            rank = _rank(snaps[k][name] - snaps[k - 1][name])
            assert 1 <= rank <= RANK, f"{name} step {k}: rank {rank}"
        for a, b in windows:
            assert _rank(snaps[b][name] - snaps[a][name]) <= RANK, f"{name} steps {a + 1}..{b}"
        # sensitivity: steps 2..T+1 straddle a refresh
        assert _rank(snaps[REFRESH + 1][name] - snaps[1][name]) > RANK, name

    opt = run["optimizer"]
    expected = sum(4 * RANK * (min(p.shape) + 2 * max(p.shape)) if SKETCHED_NAME.search(n)
                   else 2 * 4 * p.numel() for n, p in run["model"].named_parameters())
    held = tensor_bytes(t for s in opt.state.values() for t in s.values())
    assert held == expected == opt.state_bytes()

    logra_peak, adamw_peak = run["memory"].peak_bytes, runs["adamw"]["memory"].peak_bytes
    assert logra_peak < adamw_peak, (run["memory"].by_category,
                                     runs["adamw"]["memory"].by_category)

    max_norm = run["trainer"].args.max_grad_norm
    assert max_norm == 1.0  # TRL's default
    logged = [r["grad_norm"] for r in logs]
    assert any(n > max_norm for n in logged), f"no step clipped: {logged}"
    for n, after in zip(logged, record.clipped_norms, strict=True):
        assert after == pytest.approx(min(n, max_norm), rel=1e-4), (logged,
                                                                    record.clipped_norms)


def test_clip_grad_norm_is_the_norm_of_the_sketches_and_dense_gradients(tiny_dir):
    model, _ = load(tiny_dir)
    opt = LoGRAOptimizer(model, lr=1e-3, rank=RANK, refresh_every=REFRESH)
    gen = torch.Generator().manual_seed(0)
    batch = [torch.randint(3, 98, (2, 12), generator=gen) for _ in range(3)]
    model(input_ids=batch[0], labels=batch[0]).loss.backward()
    opt.step()  # every sketched weight has a basis now
    plain, _ = load(tiny_dir)  # no hooks: full gradients
    plain.load_state_dict(model.state_dict())
    for ids in batch[1:]:  # two micro-batches
        model(input_ids=ids, labels=ids).loss.backward()
        plain(input_ids=ids, labels=ids).loss.backward()
    grads = dict(plain.named_parameters())
    sketches = {st.name: S.sketch(grads[st.name].grad, st.q, st.side)
                for st in opt.rule.sketched}
    dense = [grads[n].grad for n, _ in opt.rule.dense.named]
    norm = math.sqrt(sum(t.double().square().sum().item()
                         for t in [*sketches.values(), *dense]))
    assert opt.clip_grad_norm_(math.inf).item() == pytest.approx(norm, rel=1e-4)
    max_norm = norm / 4
    assert opt.clip_grad_norm_(max_norm).item() == pytest.approx(norm, rel=1e-4)
    for st in opt.rule.sketched:
        torch.testing.assert_close(st.s, sketches[st.name] * max_norm / norm,
                                   rtol=1e-4, atol=1e-6 * norm)
    opt.step()  # its own clipping is no outside change of .grad


def test_trainer_without_the_mixin_stops_naming_max_grad_norm(tiny_dir, task_rows):
    from trl import GRPOTrainer

    from logra.trl_grpo import grpo_config, prompt_dataset, reward_function
    task, rows = task_rows
    model, tokenizer = load(tiny_dir)
    opt = LoGRAOptimizer(model, lr=1e-3, rank=RANK)
    args = grpo_config(str(tiny_dir.parent / "plain"), **{k: v for k, v in GRPO.items()
                                                          if k != "steps"}, steps=1)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args,
                          reward_funcs=reward_function(task), train_dataset=prompt_dataset(rows),
                          optimizers=(opt, None))
    with pytest.raises(RuntimeError, match="max_grad_norm") as err:
        trainer.train()
    assert "LoGRATrainerMixin" in str(err.value)


def test_fp16_grad_scaler_is_refused_and_bf16_autocast_trains(tiny_dir):
    model, _ = load(tiny_dir)
    opt = LoGRAOptimizer(model, lr=1e-3, rank=RANK)
    ids = torch.randint(3, 98, (2, 12))
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(model(input_ids=ids, labels=ids).loss).backward()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="fp16"):
        scaler.step(opt)
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))

    model, _ = load(tiny_dir)
    opt = LoGRAOptimizer(model, lr=1e-3, rank=RANK)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert math.isfinite(opt.rule.grad_norm) and opt.rule.grad_norm > 0
    assert not any(torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_scheduler_drives_both_groups_and_state_dict_resumes(tiny_dir):
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(3, 98, (2, 12), generator=gen) for _ in range(4)]

    def build():
        model, _ = load(tiny_dir)
        torch.manual_seed(7)  # the range finder's Ω
        return model, LoGRAOptimizer(model, lr=1e-3, dense_lr=1e-3, rank=RANK,
                                     refresh_every=2)

    def train(model, opt, ids, sched=None):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
        if sched:
            sched.step()

    model, opt = build()
    frozen = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.0)
    before = [p.detach().clone() for p in model.parameters()]
    train(model, opt, batches[0], frozen)
    assert [g["lr"] for g in opt.param_groups] == [0.0, 0.0]
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))

    model, opt = build()  # uninterrupted: 4 steps
    for ids in batches:
        train(model, opt, ids)
    resumed, opt2 = build()  # 2 steps, state_dict, a fresh optimizer on a copy, 2 steps
    for ids in batches[:2]:
        train(resumed, opt2, ids)
    state = copy.deepcopy(opt2.state_dict())
    copied, _ = load(tiny_dir)
    copied.load_state_dict(resumed.state_dict())
    opt3 = LoGRAOptimizer(copied, lr=1e-3, rank=RANK, refresh_every=2)
    opt3.load_state_dict(state)
    for ids in batches[2:]:
        train(copied, opt3, ids)
    for (n, p), q in zip(model.named_parameters(), copied.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=0, msg=n)



def test_example_writes_peak_memory_and_reward_of_both_methods(tiny_dir, tmp_path):
    example = runpy.run_path(str(Path(__file__).resolve().parents[1] /
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
