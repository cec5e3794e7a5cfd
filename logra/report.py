"""Aggregation: per-run summaries and lm-eval results -> tidy tables (pandas).

`results/summary.csv` has one row per run: the scalar fields of its summary.json, the measured
memory by category (`mem_<category>`), the analytic prediction (`pred_<category>`), and the
lm-eval accuracy of its final checkpoint beside its seed's SFT base (`eval_accuracy`,
`base_accuracy`). summary.json keeps `eval_accuracy: null`: evaluation runs after training, so
the table is where the two meet. `results/accuracy.csv` has one row per (task, method): the
bases' mean accuracy and the mean ± sd over the seeds whose run finished with status ok.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from logra.io import atomic_path

SCALARS = ["status", "diverged_at_step", "oom_needed_bytes", "memory_budget_bytes", "task",
           "method", "seed", "model", "n_params", "device", "dtype", "steps", "wall_s",
           "peak_mem_bytes", "mem_rss_peak_bytes", "optimizer_state_bytes", "final_reward",
           "mem_measure"]


def base_evals(paths: list[str | Path]) -> dict[tuple[str, int], str | Path]:
    """(task, seed) -> evaluation JSON of that seed's SFT base, from the workflow's paths
    `results/eval/{task}/base_seed{seed}.json`."""
    return {(Path(p).parent.name, int(Path(p).stem.removeprefix("base_seed"))): p for p in paths}


def summary_table(run_jsons: list[str | Path], eval_jsons: list[str | Path],
                  base_jsons: dict[tuple[str, int], str | Path]) -> pd.DataFrame:
    """One row per run; `eval_jsons[i]` belongs to `run_jsons[i]`; `base_jsons` by (task, seed):
    a run's base is its seed's."""
    base = {key: json.loads(Path(p).read_text())["accuracy"] for key, p in base_jsons.items()}
    rows = []
    for run_path, eval_path in zip(run_jsons, eval_jsons, strict=True):
        s = json.loads(Path(run_path).read_text())
        row = {k: s.get(k) for k in SCALARS}
        row.update({f"mem_{k}": v for k, v in (s.get("mem_breakdown") or {}).items()})
        row.update({f"pred_{k}": v for k, v in (s.get("mem_analytic") or {}).items()})
        row["mean_step_time_s"] = s.get("mean_step_time_s")
        for key in ("sync_bytes_per_step", "sync_full_bytes", "sync_lowrank_fraction"):
            row[key] = s.get(key)
        for eta, stats in ((s.get("kl") or {}).get("calibration") or {}).items():
            row.update({f"kl_{eta}_{k}": v for k, v in stats.items()})  # realized / predicted
        row["eval_accuracy"] = json.loads(Path(eval_path).read_text())["accuracy"]
        row["base_accuracy"] = base.get((s["task"], s["seed"]))
        rows.append(row)
    return pd.DataFrame(rows)


def accuracy_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Base vs after-GRPO lm-eval accuracy per (task, method), mean ± sd over seeds."""
    g = summary[summary["status"] == "ok"].groupby(["task", "method"])
    out = g.agg(base_accuracy=("base_accuracy", "mean"), accuracy_mean=("eval_accuracy", "mean"),
                accuracy_sd=("eval_accuracy", "std"), n_seeds=("seed", "nunique"),
                peak_mem_bytes_mean=("peak_mem_bytes", "mean"),
                step_time_s_mean=("mean_step_time_s", "mean"),
                sync_bytes_per_step_mean=("sync_bytes_per_step", "mean")).reset_index()
    out["gain_mean"] = out["accuracy_mean"] - out["base_accuracy"]
    return out


def lr_sweep_table(run_jsons: list[str | Path], val_jsons: list[str | Path],
                   sweep: dict[str, tuple[str, float]]) -> pd.DataFrame:
    """One row per (task, method, lr): lm-eval accuracy on the task's validation split and final
    training reward (mean of the last 10 steps), mean ± sd over the seeds whose run finished ok,
    and `chosen`: per task and method, the one lr with the best mean validation accuracy among
    the lrs whose every seed finished ok (the smaller lr on a tie; none if no lr qualifies).
    `val_jsons[i]` evaluates the run of `run_jsons[i]`. The test split is never used."""
    rows = []
    for run, val in zip(run_jsons, val_jsons, strict=True):
        s, v = json.loads(Path(run).read_text()), json.loads(Path(val).read_text())
        if Path(v["model_dir"]) != Path(run).parent / "model":
            raise ValueError(f"{val} evaluates {v['model_dir']}, not the model of {run}")
        method, lr = sweep[s["method"]]
        ok = s["status"] == "ok"
        rows.append({"task": s["task"], "method": method, "lr": lr, "seed": s["seed"],
                     "status": s["status"], "val_accuracy": v["accuracy"] if ok else float("nan"),
                     "final_reward": s["final_reward"] if ok else float("nan")})
    out = pd.DataFrame(rows).groupby(["task", "method", "lr"]).agg(
        val_accuracy_mean=("val_accuracy", "mean"), val_accuracy_sd=("val_accuracy", "std"),
        final_reward_mean=("final_reward", "mean"), final_reward_sd=("final_reward", "std"),
        n_ok=("val_accuracy", "count"), n_seeds=("seed", "nunique")).reset_index()
    complete = out[out["n_ok"] == out["n_seeds"]]
    best = complete.groupby(["task", "method"])["val_accuracy_mean"].idxmax()
    out["chosen"] = out.index.isin(best)
    return out


def memory_sweep_table(points: dict[tuple[str, str], dict]) -> pd.DataFrame:
    """One row per (size, method) sweep point (logra/memory_sweep.py): measured peak, planner
    prediction and error, times, state and sync bytes, and ratios vs dense_adam at that size."""
    rows = []
    for (size, method), p in points.items():
        rows.append({
            "size": size, "method": method, "rule": p["rule"], "n_params": p["n_params"],
            "vocab_size": p.get("vocab_size"), "peak_phase": p.get("peak_phase"),
            "device": p["device"], "threads": p.get("threads"), "batch": p["batch"],
            "micro_batch": p["micro_batch"], "seq_len": p["seq_len"], "status": p["status"],
            "peak_mem_bytes": p["peak_mem_bytes"],
            **{f"mem_{k}": v for k, v in (p.get("mem_breakdown") or {}).items()},
            **{f"phase_{k}": v for k, v in (p.get("phase_peaks") or {}).items()},
            "planned_total": p["planned"]["total"],
            **{f"planned_{k}": v for k, v in p["planned"].items() if k != "total"},
            "planned_error": p.get("planned_error"),
            "optimizer_state_bytes": p.get("optimizer_state_bytes"),
            "update_time_s": p.get("update_time_s"), "rollout_time_s": p.get("rollout_time_s"),
            "sync_bytes_per_step": p.get("sync_bytes_per_step"),
            "oom_needed_bytes": p.get("oom_needed_bytes")})
    df = pd.DataFrame(rows).sort_values(["n_params", "method"], kind="stable")
    dense = df[df["method"] == "dense_adam"].set_index("size")
    for col in ("peak_mem_bytes", "update_time_s", "sync_bytes_per_step"):
        df[col] = pd.to_numeric(df[col])  # None (an oom point) -> NaN
        df[f"{col}_vs_dense"] = (df[col] / df["size"].map(pd.to_numeric(dense[col]))
                                 if len(dense) else float("nan"))
    return df.reset_index(drop=True)


def write_csv(df: pd.DataFrame, path: str | Path) -> None:
    """Atomic CSV write (temp file + rename)."""
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)
