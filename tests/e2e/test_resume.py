"""Reliability of a run: kill -9 and resume, divergence, checkpoints that are not this run's.

The runs use the tiny random model and a task whose reward is the fraction of digits in the
completion, so a random policy already gets varied rewards (non-zero advantages, real updates).
"""
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import ROOT
from safetensors.torch import load_file

from logra.rl import checkpoint
from logra.rl.checkpoint import CheckpointError
from logra.rl.loop import train
from logra.rl.models import build_tiny, load
from logra.rl.rollout import EngineError
from logra.rl.summary import METRIC_COLUMNS
from logra.rules import RULES
from runs import METHODS, CoinFlip, DigitFraction, engine_pids, make_run, weights

pytestmark = pytest.mark.e2e  # README: `pytest -m "not e2e"` leaves these out


# watches for the run's first checkpoint from a process of its own, then kills the run's group:
# a thread of the test's process would share its GIL with the reference run beside it, whose
# torch.compile (the 8-bit AdamW's) can hold it through the killed run's every checkpoint
WATCH = """import glob, os, signal, sys, time
ckpt, pid, deadline = sys.argv[1], int(sys.argv[2]), time.time() + 300
while not glob.glob(os.path.join(ckpt, "*", "state.pt")):
    if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
        sys.exit("the run finished before a checkpoint was seen")
    if time.time() > deadline:
        sys.exit("no checkpoint within 300 s")
    time.sleep(0.05)
os.killpg(pid, signal.SIGKILL)
"""


def killed_run(cfg, base, train_jsonl, out, ckpt):
    """Start the run in its own process group; SIGKILL the group once a checkpoint exists
    (`WATCH`, in a process of its own)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import runs; "
            "from logra.rl.loop import train; "
            "train(json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6])")
    proc = subprocess.Popen([sys.executable, "-c", code, str(ROOT / "tests"), json.dumps(cfg),
                             str(base), str(train_jsonl), str(out), str(ckpt)],
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    watch = subprocess.run([sys.executable, "-c", WATCH, str(ckpt), str(proc.pid)],
                           capture_output=True, text=True, timeout=330)
    proc.wait()
    assert watch.returncode == 0, watch.stderr + proc.stderr.read()[-3000:]
    assert proc.returncode == -signal.SIGKILL  # it was killed mid-run, not finished
    assert not (out / "model").exists()


def test_every_registered_rule_is_resumed():
    assert {m["rule"] for m in METHODS.values()} == set(RULES)


@pytest.mark.parametrize("method", list(METHODS))
def test_killed_run_resumes_to_the_same_weights_and_metrics(tmp_path, tiny_dir, method):
    cfg, train_jsonl = make_run(tmp_path, method)
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    # the run to be killed, in its own process, beside the reference in this one: each
    # computes on one thread (logra.repro.PIN), so the two take both cores
    with ThreadPoolExecutor(1) as pool:
        killed = pool.submit(killed_run, cfg, tiny_dir, train_jsonl, out, ckpt)
        reference = train(cfg, tiny_dir, train_jsonl, tmp_path / "reference")
        killed.result()
    summary = train(cfg, tiny_dir, train_jsonl, out, ckpt)

    assert summary["resumed_from_steps"] in ([2], [4])
    assert summary["status"] == reference["status"] == "ok"
    assert not ckpt.exists()  # a finished run removes its checkpoint
    ref_w, got_w = weights(tmp_path / "reference"), weights(out)
    assert ref_w.keys() == got_w.keys()
    changed = [n for n in ref_w if not torch.equal(ref_w[n], load_file(
        tiny_dir / "model.safetensors")[n])]
    assert changed  # the runs trained something
    for n in ref_w:
        assert torch.equal(ref_w[n], got_w[n]), n
    # timings differ, a memory peak measured twice differs by allocator noise (< 1%), and the
    # first sync after the resume also carries LoGRA's bases or LoRA's base weights (the new
    # engine has none)
    got, ref = pd.read_csv(out / "metrics.csv"), pd.read_csv(tmp_path / "reference/metrics.csv")
    # (sync_bytes_low_rank too, whichever transport is applied)
    exact = [c for c in METRIC_COLUMNS if c not in ("step_time_s", "peak_mem_bytes", "sync_bytes",
                                                    "sync_bytes_low_rank", "sync_seconds",
                                                    "control_seconds")]
    pd.testing.assert_frame_equal(got[exact], ref[exact])
    first = summary["resumed_from_steps"][0]  # rows before it are the first step's index
    for col in ("sync_bytes", "sync_bytes_low_rank"):
        resync = got[col] != ref[col]
        assert (got[col].fillna(0) >= ref[col].fillna(0)).all(), col
        assert set(got[resync & got[col].notna()].index) <= {first}, col
    resync = got["sync_bytes"] != ref["sync_bytes"]
    # only LoGRA's and LoRA's can differ: the first sync after the resume carries what the new
    # engine, restored with the checkpoint's weights, lacks: LoGRA's bases (which the
    # reference's carried as well when that step began a new basis window), the base weights
    # under LoRA's adapters
    assert method in ("logra", "lora") or not resync.any()
    assert summary["steps"] == 6
    assert summary["peak_mem_bytes"] == pytest.approx(reference["peak_mem_bytes"], rel=0.01)
    for key in ("final_reward", "optimizer_state_bytes", "kl"):
        assert summary[key] == reference[key], key
    if method == "logra":  # realized (held-out half) / predicted, at η = 1 and at η < 1
        ok = ref[ref["kl_pred"] > 0]
        for key, part in (("eta_1", ok[ok["step_scale"] == 1]),
                          ("eta_below_1", ok[ok["step_scale"] < 1])):
            assert summary["kl"]["calibration"][key]["steps"] == len(part)
            if len(part):
                assert summary["kl"]["calibration"][key]["median"] == pytest.approx(
                    (part["kl_real"] / part["kl_pred"]).median())


def test_divergence_stops_with_status_and_keeps_last_good_checkpoint(tmp_path, tiny_dir):
    # the reward turns NaN from step 4 on (8 rewards per step)
    cfg, train_jsonl = make_run(tmp_path, "dense_adam", nan_after=3 * 8)
    ckpt = tmp_path / "ckpt"
    summary = train(cfg, tiny_dir, train_jsonl, tmp_path / "run", ckpt)
    assert summary["status"] == "diverged" and summary["diverged_at_step"] == 4
    ckpt_path = checkpoint.path(ckpt, cfg)
    assert summary["checkpoint"] == str(ckpt_path) and summary["model_step"] == 2
    state = checkpoint.read(ckpt_path)
    assert state["run"]["step"] == 2
    saved = weights(tmp_path / "run")  # the model saved is the last good checkpoint's
    for n, w in saved.items():
        assert torch.isfinite(w).all() and torch.equal(w, state["model"][n]), n
    assert list(pd.read_csv(tmp_path / "run/metrics.csv")["step"]) == [1, 2, 3]

    other = json.loads(json.dumps(cfg))
    other["method"]["options"]["lr"] = 2.0e-3
    assert checkpoint.path(ckpt, other) != ckpt_path  # an edited config starts fresh
    model, _ = load(tiny_dir)
    with pytest.raises(CheckpointError, match=r"different run config: method\.options\.lr is "
                                              r"0\.001 in the checkpoint and 0\.002 now"):
        checkpoint.load(ckpt_path, other, model)

    wider = build_tiny(tmp_path / "wider", hidden_size=96, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4)
    with pytest.raises(CheckpointError, match=r"different architecture: parameter "
                                              r"'model\.embed_tokens\.weight' has shape "
                                              r"\(\d+, 64\) in the checkpoint and \(\d+, 96\)"):
        train(cfg, wider, train_jsonl, tmp_path / "other", ckpt)
    assert ckpt_path.exists()  # refusing to resume loses nothing


def test_run_over_its_memory_budget_records_oom(tmp_path, tiny_dir):
    cfg, train_jsonl = make_run(tmp_path, "dense_adam")
    cfg["memory_budget_bytes"] = 10**6  # far below what the profiled step (step 3) needs
    summary = train(cfg, tiny_dir, train_jsonl, tmp_path / "run", tmp_path / "ckpt")
    assert summary["status"] == "oom" and summary["oom_at_step"] == 3
    assert summary["oom_needed_bytes"] > 10**6 and "after the step" in summary["oom_check"]
    assert summary["steps"] == 2 and (tmp_path / "run/model/config.json").exists()
    # kept like a divergence: the model is the last good checkpoint's (step 2)
    state = checkpoint.read(checkpoint.path(tmp_path / "ckpt", cfg))
    for n, w in weights(tmp_path / "run").items():
        assert torch.equal(w, state["model"][n]), n


# -- hardening: checkpoints verified before they are trusted, divergence beyond NaN, a hung engine


class Evil:
    """Unpickling it would run a command (touch a marker file)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def genuine(tmp_path_factory, tiny_dir):
    """A run killed after a checkpoint, its checkpoint, and the uninterrupted run's weights."""
    tmp_path = tmp_path_factory.mktemp("genuine")
    cfg, train_jsonl = make_run(tmp_path, "dense_adam")
    ckpt = tmp_path / "ckpt"
    with ThreadPoolExecutor(1) as pool:  # on both cores, as in the test above
        killed = pool.submit(killed_run, cfg, tiny_dir, train_jsonl, tmp_path / "killed", ckpt)
        train(cfg, tiny_dir, train_jsonl, tmp_path / "reference")
        killed.result()
    return cfg, train_jsonl, checkpoint.path(ckpt, cfg), weights(tmp_path / "reference")


def _flip(path):
    data = bytearray(path.read_bytes())
    for i in (len(data) // 2, len(data) // 2 + 1):  # inside the weights' tensor records
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])


def _truncate_with_its_digest(path):  # the digest rewritten too: the load itself must refuse
    _truncate(path)
    checkpoint.digest_path(path).write_text(f"{checkpoint._sha256(path)}  state.pt\n")


@pytest.mark.parametrize("corrupt, message", [
    (_flip, "its SHA-256 does not match state.pt.sha256"),
    (_truncate, "its SHA-256 does not match state.pt.sha256"),
    (_truncate_with_its_digest, "refused by the weights-only load"),
])
def test_a_corrupt_checkpoint_is_never_resumed(tmp_path, tiny_dir, genuine, corrupt, message):
    """Corrupted or cut short: with on_bad_checkpoint stop the run stops naming the file; by
    default it is set aside (kept, as state.pt.bad) and the run starts from its base, ending as
    an uninterrupted run does."""
    cfg, train_jsonl, source, reference = genuine
    ckpt = tmp_path / "checkpoints/t/m/seed0"
    path = checkpoint.path(ckpt, cfg)
    path.parent.mkdir(parents=True)
    for f in (source, checkpoint.digest_path(source)):
        (path.parent / f.name).write_bytes(f.read_bytes())
    corrupt(path)

    stop = json.loads(json.dumps(cfg))
    stop["grpo"]["on_bad_checkpoint"] = "stop"
    with pytest.raises(CheckpointError, match=rf"{path}: {message}.*Move it aside"):
        train(stop, tiny_dir, train_jsonl, tmp_path / "stopped", ckpt)
    assert path.exists()  # untouched
    summary = train(cfg, tiny_dir, train_jsonl, tmp_path / "run", ckpt)
    assert summary["status"] == "ok" and summary["resumed_from_steps"] == []
    assert summary["checkpoints_set_aside"] == [f"{path}.bad"]
    assert Path(f"{path}.bad").exists()  # evidence kept
    got = weights(tmp_path / "run")
    assert all(torch.equal(got[n], reference[n]) for n in reference)


def test_a_checkpoint_whose_unpickling_runs_code_is_refused_and_nothing_runs(tmp_path, tiny_dir,
                                                                             genuine):
    """Even with a matching digest (whoever wrote the file could write that too)."""
    cfg, train_jsonl, _, _ = genuine
    marker, ckpt = tmp_path / "ran", tmp_path / "ckpt"
    path = checkpoint.path(ckpt, cfg)
    checkpoint.save(path, {"cfg": cfg, "model": Evil(marker)})
    model, _ = load(tiny_dir)
    with pytest.raises(CheckpointError, match=rf"{path}: refused by the weights-only load"):
        checkpoint.load(path, cfg, model)
    summary = train(cfg, tiny_dir, train_jsonl, tmp_path / "run", ckpt)
    assert summary["status"] == "ok" and summary["checkpoints_set_aside"] == [f"{path}.bad"]
    assert not marker.exists()


def test_a_finished_run_leaves_no_empty_checkpoint_folders(tmp_path, tiny_dir, genuine):
    cfg, train_jsonl, source, _ = genuine
    root = tmp_path / "checkpoints"
    ckpt = root / "arithmetic/dense_adam/seed0"
    path = checkpoint.path(ckpt, cfg)
    path.parent.mkdir(parents=True)
    for f in (source, checkpoint.digest_path(source)):
        (path.parent / f.name).write_bytes(f.read_bytes())
    assert train(cfg, tiny_dir, train_jsonl, tmp_path / "run", ckpt)["resumed_from_steps"]
    assert list(root.iterdir()) == []


def test_a_huge_lr_is_divergence_not_a_finished_run(tmp_path, tiny_dir):
    """Dense Adam at lr 1e6: the weight norm explodes at the first step with a gradient (the
    random model's first rollouts may all score 0), its realized KL finite."""
    cfg, train_jsonl = make_run(tmp_path, "dense_adam")
    cfg["method"]["options"]["lr"] = 1.0e6
    summary = train(cfg, tiny_dir, train_jsonl, tmp_path / "run", tmp_path / "ckpt")
    assert summary["status"] == "diverged"
    before = pd.read_csv(tmp_path / "run/metrics.csv")
    assert len(before) == summary["diverged_at_step"] - 1 and (before["grad_norm"] == 0).all()
    assert summary["diverged_because"].startswith("weight norm")
    assert "grpo.max_weight_norm_ratio 2" in summary["diverged_because"]
    assert summary["model_step"] == 0  # scored on the base model
    base = load_file(tiny_dir / "model.safetensors")
    assert all(torch.equal(w, base[n]) for n, w in weights(tmp_path / "run").items())


def test_a_step_over_the_kl_bound_is_divergence(tmp_path, tiny_dir):
    cfg, train_jsonl = make_run(tmp_path, "dense_adam")
    cfg["grpo"]["max_kl_per_step"] = 1e-12
    summary = train(cfg, tiny_dir, train_jsonl, tmp_path / "run")
    assert summary["status"] == "diverged"  # at the first step that moved the policy
    before = pd.read_csv(tmp_path / "run/metrics.csv")
    assert len(before) == summary["diverged_at_step"] - 1 and (before["kl_real"] == 0).all()
    assert summary["diverged_because"].startswith("realized KL")


def test_zero_gradients_while_rewards_vary_are_divergence(tmp_path, tiny_dir):
    """A saturated policy (lr 1e6, the norm bound lifted): every sampled token has probability
    1, so the gradient is exactly zero although every group's rewards differ."""
    cfg, train_jsonl = make_run(tmp_path, "dense_adam", max_zero_grad_steps=3,
                                max_weight_norm_ratio=1e30, max_kl_per_step=1e30)
    cfg["method"]["options"]["lr"] = 1.0e6
    cfg["task"] = {"type": CoinFlip.name, "options": {"digits": 1}}
    summary = train(cfg, tiny_dir, train_jsonl, tmp_path / "run")
    metrics = pd.read_csv(tmp_path / "run/metrics.csv")
    assert summary["status"] == "diverged", metrics[["step", "grad_norm"]]
    assert "zero gradient for 3 steps in a row" in summary["diverged_because"]
    zero = metrics["grad_norm"] == 0
    assert zero.iloc[-2:].all() and summary["diverged_at_step"] == len(metrics) + 1


def test_a_stopped_engine_cannot_hang_the_trainer(tmp_path, tiny_dir):
    """SIGSTOP of the engine during step 3: the next call to it times out after
    rollout.timeout_s (which must cover the engine's start-up, inside its first call: ~10 s
    here), naming the engine and the step; the rerun resumes from step 2."""
    cfg, train_jsonl = make_run(tmp_path, "dense_adam")
    cfg["rollout"]["timeout_s"] = 30

    def stop_engine(calls):  # the first reward of step 3 (8 rollouts per step)
        if calls == 2 * 8 + 1:
            for pid in engine_pids():
                os.kill(pid, signal.SIGSTOP)
    start = time.time()
    DigitFraction.on_call = staticmethod(stop_engine)
    try:
        with pytest.raises(EngineError, match=r"digits/dense_adam/seed0 at step 3: rollout "
                                              r"engine hf \(pid \d+\) did not answer 'sync' "
                                              r"within 30 s.*a rerun resumes from the last "
                                              r"checkpoint"):
            train(cfg, tiny_dir, train_jsonl, tmp_path / "run", tmp_path / "ckpt")
    finally:
        DigitFraction.on_call = None
    assert time.time() - start < 120 and not engine_pids()  # killed, not left behind
    cfg["rollout"]["timeout_s"] = 600  # how a run is supervised is not part of its identity
    summary = train(cfg, tiny_dir, train_jsonl, tmp_path / "run", tmp_path / "ckpt")
    assert summary["status"] == "ok" and summary["resumed_from_steps"] == [2]
