"""Aggregation: per-run summaries and lm-eval results -> tidy tables (pandas).

`results/summary.csv` has one row per run: the scalar fields of its summary.json, the measured
memory by category (`mem_<category>`), the analytic prediction (`pred_<category>`), and the
lm-eval accuracy of its final checkpoint beside its task's SFT base (`eval_accuracy`,
`base_accuracy`). summary.json keeps `eval_accuracy: null`: evaluation runs after training, so
the table is where the two meet. `results/accuracy.csv` has one row per (task, method): base
accuracy and the mean ± sd over the seeds whose run finished with status ok.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from logra.io import atomic_path

SCALARS = ["status", "diverged_at_step", "task", "method", "seed", "model", "n_params", "device", "dtype", "steps",
           "wall_s", "peak_mem_bytes", "mem_rss_peak_bytes", "optimizer_state_bytes",
           "final_reward", "mem_measure"]


def summary_table(run_jsons: list[str | Path], eval_jsons: list[str | Path],
                  base_jsons: dict[str, str | Path]) -> pd.DataFrame:
    """One row per run; `eval_jsons[i]` belongs to `run_jsons[i]`, base_jsons by task."""
    base = {task: json.loads(Path(p).read_text())["accuracy"] for task, p in base_jsons.items()}
    rows = []
    for run_path, eval_path in zip(run_jsons, eval_jsons, strict=True):
        s = json.loads(Path(run_path).read_text())
        row = {k: s.get(k) for k in SCALARS}
        row.update({f"mem_{k}": v for k, v in (s.get("mem_breakdown") or {}).items()})
        row.update({f"pred_{k}": v for k, v in (s.get("mem_analytic") or {}).items()})
        row["mean_step_time_s"] = s.get("mean_step_time_s")
        for key in ("sync_bytes_per_step", "sync_full_bytes", "sync_lowrank_fraction"):
            row[key] = s.get(key)
        kl_ratio = (s.get("kl") or {}).get("median_real_over_pred")
        row["kl_median_real_over_pred"] = kl_ratio
        row["eval_accuracy"] = json.loads(Path(eval_path).read_text())["accuracy"]
        row["base_accuracy"] = base.get(s["task"])
        rows.append(row)
    return pd.DataFrame(rows)


def accuracy_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Base vs after-GRPO lm-eval accuracy per (task, method), mean ± sd over seeds."""
    g = summary[summary["status"] == "ok"].groupby(["task", "method"])
    out = g.agg(base_accuracy=("base_accuracy", "first"), accuracy_mean=("eval_accuracy", "mean"),
                accuracy_sd=("eval_accuracy", "std"), n_seeds=("seed", "nunique"),
                peak_mem_bytes_mean=("peak_mem_bytes", "mean")).reset_index()
    out["gain_mean"] = out["accuracy_mean"] - out["base_accuracy"]
    return out


def write_csv(df: pd.DataFrame, path: str | Path) -> None:
    """Atomic CSV write (temp file + rename)."""
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)
