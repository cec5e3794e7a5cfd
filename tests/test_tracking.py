"""Run trackers (logra/tracking.py): TensorBoard and W&B (offline) get the scalars given them,
the finite ones, at their steps; a tracker that fails is named once and left out, and the run
it tracks finishes as without it."""
import glob
import json
import math
import struct
import time

import pandas as pd
import pytest
from conftest import ROOT

from logra import tracking
from logra.rl.loop import train
from logra.rl.summary import METRIC_COLUMNS
from logra.tracking import Trackers, evaluated_run, tensorboard_scalars
from runs import make_run


def wandb_history(run_dir, wait_s: float = 60.0) -> dict[int, dict]:
    """{step: scalars} from the W&B offline run under `run_dir/wandb`: its .wandb file is a
    log of protobuf records in LevelDB's log format (a 7-byte header, then 32 KiB blocks of
    records, each a 7-byte header: CRC, length, type: full, first, middle or last part). W&B's
    service, a process of its own, writes the file, and can finish it after `finish()` has
    returned (a CI run under load read no history record from it): read it again until the
    run's last record (`exit`) is there, up to `wait_s`; a record still being written reads as
    none yet."""
    from google.protobuf.message import DecodeError
    [path] = glob.glob(str(run_dir / "wandb/offline-run-*/run-*.wandb"))
    deadline = time.monotonic() + wait_s
    while True:
        try:
            history, kinds = _wandb_records(open(path, "rb").read())
        except (struct.error, DecodeError):
            history, kinds = {}, []
        if "exit" in kinds or time.monotonic() > deadline:
            assert "exit" in kinds, f"{path}: no exit record after {wait_s:g} s ({kinds})"
            return history
        time.sleep(0.5)


def _wandb_records(data: bytes) -> tuple[dict[int, dict], list[str]]:
    """({step: scalars} of the history records, every record's type) of a .wandb file."""
    from wandb.proto import wandb_internal_pb2 as pb
    assert data[:4] == b":W&B"
    pos, history, part, kinds = 7, {}, b"", []
    while pos < len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header: padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        part = chunk if kind in (1, 2) else part + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(part)
            kinds.append(record.WhichOneof("record_type"))
            if kinds[-1] == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                         for i in record.history.item}
                history[items.pop("_step")] = {k: v for k, v in items.items()
                                               if not k.startswith("_")}
    return history, kinds


def test_each_backend_gets_the_finite_scalars_at_their_steps(tmp_path):
    run_dir = tmp_path / "results/runs/t/m/seed0"
    with Trackers({"tensorboard": True, "wandb": {"project": "p", "mode": "offline"}}, run_dir,
                  "t/m/seed0", "t/m") as trackers:
        trackers.text("config", "<pre>{}</pre>")
        trackers.log(1, {"loss": 0.5, "peak_mem_bytes": math.nan, "n": 3, "flag": True})
        trackers.log(2, {"loss": -1.25, "peak_mem_bytes": 2.0**40})
    assert tensorboard_scalars(run_dir) == {"loss": {1: 0.5, 2: -1.25}, "n": {1: 3.0},
                                            "peak_mem_bytes": {2: 2.0**40}}
    assert wandb_history(run_dir) == {1: {"loss": 0.5, "n": 3.0},
                                      2: {"loss": -1.25, "peak_mem_bytes": 2.0**40}}
    assert (run_dir / "wandb_id").read_text()  # an evaluation logs to the same W&B run


def test_a_checkpoint_is_placed_at_its_runs_step(tmp_path):
    run = tmp_path / "results/runs/t/m/seed3"
    (run / "model").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"model_step": 7}))
    assert evaluated_run(run / "model") == (run, 7)
    assert evaluated_run(run / "snapshots/step4") == (run, 4)
    assert evaluated_run(tmp_path / "results/base/t/seed0/model") is None


def test_a_failing_tracker_is_named_once_and_the_run_finishes_as_without_it(
        tmp_path, tiny_dir, monkeypatch, capsys):
    cfg, train_jsonl = make_run(tmp_path, "dense_adam")
    reference = train(cfg, tiny_dir, train_jsonl, tmp_path / "reference")

    def broken(self, step, scalars):
        if step >= 3:
            raise OSError("disk full")
    monkeypatch.setattr(tracking.TensorBoard, "log", broken)
    summary = train(cfg, tiny_dir, train_jsonl, tmp_path / "run",
                    tracking={"tensorboard": True, "wandb": None})
    err = capsys.readouterr().err
    assert err.count("tracking: TensorBoard left out of this run after OSError: disk full") == 1
    assert summary["status"] == "ok" and summary["fingerprint"] == reference["fingerprint"]
    exact = [c for c in METRIC_COLUMNS if c not in ("step_time_s", "peak_mem_bytes",
                                                    "sync_seconds", "control_seconds")]
    got, ref = (pd.read_csv(d / "metrics.csv")[exact] for d in (tmp_path / "run",
                                                                tmp_path / "reference"))
    pd.testing.assert_frame_equal(got, ref)


def test_a_resumed_run_shows_each_step_once_at_its_new_value(tmp_path):
    """A run killed after logging step 3 and resumed from its step-1 checkpoint: TensorBoard
    drops the interrupted process's steps from 2 on (the writer's purge_step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    with Trackers({"tensorboard": True}, tmp_path, "r", "g") as first:
        for step in (1, 2, 3):
            first.log(step, {"step_time_s": 1.0 * step})
    with Trackers({"tensorboard": True}, tmp_path, "r", "g", purge_step=2) as resumed:
        for step in (2, 3, 4):
            resumed.log(step, {"step_time_s": 10.0 * step})
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("step_time_s")] == [
        (1, 1.0), (2, 20.0), (3, 30.0), (4, 40.0)]
