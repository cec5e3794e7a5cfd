"""End to end: the real Snakefile on the smoke config (every stage, real lm-eval)."""
import json
import subprocess
import sys

import pandas as pd

from conftest import ROOT

SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
             "--configfile", str(ROOT / "tests/data/smoke.yaml")]


def test_lint_is_clean(tmp_path):
    out = subprocess.run(SNAKEMAKE + ["--lint", "--directory", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Lints for" not in out.stdout + out.stderr, out.stdout + out.stderr


def test_smoke_run_end_to_end(tmp_path):
    out = subprocess.run(SNAKEMAKE + ["--cores", "2", "--directory", str(tmp_path)],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = pd.read_csv(tmp_path / "results/summary.csv")
    assert len(summary) == 2 * 1 * 2  # tasks x methods x seeds
    assert (summary["status"] == "ok").all()
    assert summary["eval_accuracy"].between(0, 1).all()
    assert (summary["peak_mem_bytes"] > summary["pred_weights"]).all()
    acc = pd.read_csv(tmp_path / "results/accuracy.csv")
    assert set(acc["task"]) == {"arithmetic", "countdown"}
    run = tmp_path / "results/runs/countdown/dense_adam/seed1"
    metrics = pd.read_csv(run / "metrics.csv")
    assert list(metrics["step"]) == [1, 2, 3]
    s = json.loads((run / "summary.json").read_text())
    assert s["mem_check"]["agree"], s["mem_check"]
    assert s["mem_breakdown"]["optimizer"] == s["optimizer_state_bytes"]
    assert (run / "model/config.json").exists()
    ev = json.loads((tmp_path / "results/eval/countdown/dense_adam/seed1.json").read_text())
    assert ev["n"] == 6
    for ext in ("png", "pdf"):
        assert (tmp_path / f"figures/reward_curves.{ext}").stat().st_size > 1000
