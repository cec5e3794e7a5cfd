"""Runs for the tests: a 6-step config on the tiny model checkpointing every 2 (`make_run`),
one method per registered rule (`METHODS`), and test tasks whose rewards vary (registered on
import, so a subprocess that imports this module can run them)."""
import math
import os
from pathlib import Path

import yaml
from conftest import ROOT
from safetensors.torch import load_file

from logra.files import write_jsonl
from logra.harness.config import run_config, validate_file
from logra.rl.tasks import TASKS, ArithmeticTask, register_task


class CoinFlip(ArithmeticTask):
    """Reward 1 on every other call, whatever the completion: rewards vary within every group,
    so a zero gradient is never explained by equal rewards."""
    name = "coin-flip-test"

    def __init__(self, **options):
        super().__init__(**options)
        self.calls = 0

    def reward(self, completion, example):
        self.calls += 1
        return float(self.calls % 2)


def engine_pids() -> list[int]:
    """Rollout engine processes started by this process."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmd = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"logra.rl.rollout" in cmd:
            pids.append(int(stat.parent.name))
    return pids


class DigitFraction(ArithmeticTask):
    """Reward = fraction of digits in the completion; NaN from reward call `nan_after` on."""
    name = "digit-fraction-test"

    def __init__(self, *, nan_after: int = 0, **options):
        super().__init__(**options)
        self.nan_after, self.calls = nan_after, 0

    on_call = None  # a test's fault injection: called with the count of reward calls

    def reward(self, completion, example):
        self.calls += 1
        if self.on_call:
            self.on_call(self.calls)
        if self.nan_after and self.calls > self.nan_after:
            return math.nan
        return sum(c.isdigit() for c in completion) / max(len(completion), 1)


for _task in (DigitFraction, CoinFlip):
    if _task.name not in TASKS:
        register_task(_task)

METHODS = {
    "dense_adam": {"rule": "dense_adam", "options": {"lr": 1.0e-3}},
    # its own controller, its mismatch EMA and count checkpointed; a new projection each step
    "logra": {"rule": "logra", "options": {"rank": 2, "update_ratio": 1.0e-2,
                                           "probe_responses": 2}},
    # refresh every 3 steps (checkpoints every 2): a resume between refreshes must still send
    # the engine its bases; KL control on
    "sketch_adam": {"rule": "sketch_adam", "options": {"lr": 1.0e-2, "rank": 2,
                                                       "refresh_every": 3},
                    "kl_control": {"target": 1.0e-2}},
    "galore": {"rule": "galore", "options": {"lr": 1.0e-3, "rank": 2, "update_proj_gap": 3}},
    "lora": {"rule": "lora", "options": {"lr": 1.0e-2, "rank": 2},
             "kl_control": {"target": 1.0e-2}},
    "apollo_mini": {"rule": "apollo", "options": {"lr": 1.0e-3, "rank": 1, "scale_type": "tensor",
                                                  "scale": 128, "update_proj_gap": 3}},
    "adam_mini": {"rule": "adam_mini", "options": {"lr": 1.0e-3}},
    "adamw_8bit": {"rule": "adamw_8bit", "options": {"lr": 1.0e-3}},
    # weights stored in bf16, rounded stochastically: the generator's state is resumed too
    "adamw_8bit_bf16": {"rule": "adamw_8bit", "options": {"lr": 1.0e-3,
                                                          "bf16_stochastic_round": True},
                        "grpo": {"param_dtype": "bfloat16"}},
    "muon": {"rule": "muon", "options": {"lr": 1.0e-3}},
}


def make_run(tmp_path, method, nan_after=0, **grpo):
    """(config path, resolved run config, train JSONL) of a 6-step run checkpointing every 2."""
    config = yaml.safe_load((ROOT / "tests/data/smoke.yaml").read_text())
    config["tasks"] = {"digits": {"type": "arithmetic", "options": {"digits": 1}}}
    for section in ("memory_sweep", "planner", "stability", "lr_sweep"):  # name other tasks
        del config[section]
    config["grpo"].update(steps=6, checkpoint_every=2, profile_step=3, **grpo)
    config["rollout"] = {"full_sync_every": 5}
    config["methods"], config["run_methods"] = {method: METHODS[method]}, [method]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cfg = run_config(validate_file(path), "digits", method, 0)
    cfg["task"] = {"type": DigitFraction.name, "options": {"digits": 1, "nan_after": nan_after}}
    train_jsonl = tmp_path / "train.jsonl"
    write_jsonl(train_jsonl, DigitFraction(digits=1).splits(0, 40, 0)["train"])
    return cfg, train_jsonl


def weights(run_dir):
    return load_file(run_dir / "model" / "model.safetensors")


def assert_tensorboard_holds_metrics(run_dir) -> dict:
    """The run's TensorBoard events hold every metrics.csv column with its finite values at
    their steps, as float32 (config tracking, on by default); returns every scalar by tag."""
    import numpy as np
    import pandas as pd

    from logra.tracking import tensorboard_scalars
    # pandas' default float parser may miss a value's last bit, enough to move its float32
    metrics = pd.read_csv(Path(run_dir) / "metrics.csv", float_precision="round_trip")
    scalars = tensorboard_scalars(run_dir)
    for column in metrics.columns.drop("step"):
        logged = {int(k): v for k, v in zip(metrics["step"], metrics[column]) if np.isfinite(v)}
        assert scalars.get(column, {}) == {k: np.float32(v) for k, v in logged.items()}, column
    return scalars
