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
from logra.sync import SYNC_METRICS

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
        for key in ("sync_bytes_per_step", "sync_full_bytes", "sync_lowrank_fraction",
                    "sync_transport", "rollout_dtype", *(f"{k}_per_step" for k in SYNC_METRICS[1:]),
                    "logp_mismatch_mean", "logp_mismatch_max"):
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
    `chosen`: per task and method, the one lr with the best mean validation accuracy among
    the lrs whose every seed finished ok (the smaller lr on a tie; none if no lr qualifies),
    `budget`: the method's number of lrs, and `on_edge`: the choice is its grid's smallest or
    largest lr (the optimum may lie outside; the grid is not extended for one method).
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
    grids = pd.DataFrame(sweep.values(), columns=["method", "lr"]).groupby("method")["lr"]
    out["budget"] = out["method"].map(grids.size())
    out["on_edge"] = out["chosen"] & (out["lr"].eq(out["method"].map(grids.min()))
                                      | out["lr"].eq(out["method"].map(grids.max())))
    return out


def memory_sweep_table(points: dict[tuple[str, str], dict], reference: str) -> pd.DataFrame:
    """One row per (size, method) sweep point (logra/memory_sweep.py): measured peak, planner
    prediction and error, times, state and sync bytes, and ratios vs the `reference` method at
    that size (NaN where it has no point)."""
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
    dense = df[df["method"] == reference].set_index("size")
    for col in ("peak_mem_bytes", "update_time_s", "sync_bytes_per_step"):
        df[col] = pd.to_numeric(df[col])  # None (an oom point) -> NaN
        df[f"{col}_vs_reference"] = (df[col] / df["size"].map(pd.to_numeric(dense[col]))
                                 if len(dense) else float("nan"))
    return df.reset_index(drop=True)


def scale_label(summary: pd.DataFrame) -> str:
    """'cpu, 1.36M params (tiny), 50 GRPO steps, 3 seeds' from the runs in `summary`."""
    def join(values, fmt=str):
        return "/".join(fmt(v) for v in sorted(set(values)))
    return (f"{join(summary['device'])}, {join(summary['n_params'], lambda n: f'{n / 1e6:.2f}M')}"
            f" params ({join(summary['model'])}), {join(summary['steps'])} GRPO steps, "
            f"{summary['seed'].nunique()} seeds")


def time_ledger(benchmarks: list[str | Path]) -> pd.DataFrame:
    """Wall seconds per stage from Snakemake benchmark files `.../benchmarks/{stage}/...tsv`
    (column `s`, one row per repeat): stage, jobs, seconds, share of the total; stages in the
    order they first appear."""
    rows = [{"stage": Path(b).parts[Path(b).parts.index("benchmarks") + 1],
             "seconds": pd.read_csv(b, sep="\t")["s"].sum()} for b in benchmarks]
    if not rows:
        raise ValueError("time ledger: no benchmark files")
    df = pd.DataFrame(rows)
    out = df.groupby("stage", sort=False).agg(jobs=("seconds", "size"),
                                              seconds=("seconds", "sum")).reset_index()
    out["share"] = out["seconds"] / out["seconds"].sum()
    return out


def markdown_table(df: pd.DataFrame) -> str:
    """A GitHub-markdown table of `df`'s cells as they are (format them first)."""
    lines = ["| " + " | ".join(map(str, df.columns)) + " |",
             "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _fmt(values, spec: str = ".3f", scale: float = 1.0) -> list[str]:
    """Each value / scale formatted with `spec`; a missing value as "n/a"."""
    return ["n/a" if v is None or pd.isna(v) else format(v / scale, spec) for v in values]


def _pm(means, sds) -> list[str]:
    return [f"{m} ± {s}" for m, s in zip(_fmt(means), _fmt(sds))]


def _section(title: str, source: str, intro: str, table: dict) -> list[str]:
    return ["", f"## {title} (`{source}`)", "", intro, "", markdown_table(pd.DataFrame(table))]


def _machines(runs: list[dict]) -> str:
    seen = dict.fromkeys(
        f"{m['cpu_model']} ({m['cpu_vendor']}; torch {m['torch']} at {m['torch_capability']}, "
        f"transformers {m['transformers']}; pinned CPU path: "
        f"{'yes' if m['reproducible'] else 'no'})"
        for m in (r.get("machine") for r in runs) if m)
    return "; ".join(seen) or "not recorded"


def report_markdown(summary: pd.DataFrame, accuracy: pd.DataFrame, runs: list[dict],
                    long_runs: list[dict], ledger: pd.DataFrame,
                    verdicts: pd.DataFrame | None = None, sweep: pd.DataFrame | None = None,
                    planner: pd.DataFrame | None = None,
                    lr_sweep: pd.DataFrame | None = None,
                    stability: tuple[pd.DataFrame, pd.DataFrame] | None = None,
                    trl: list[dict] | None = None) -> str:
    """results/REPORT.md from the workflow's tables; `runs` and `long_runs` are the summary.json
    contents of the grid's runs and of the stability runs, `stability` their metrics and
    summary as `logra.figures.factor_effects` takes them; a table that is None (its stage is
    not in the config, or the lr sweep has not run) is left out."""
    from logra.figures import factor_effects
    ok = summary[summary["status"] == "ok"]
    seeds = ", ".join(map(str, sorted(set(summary["seed"]))))
    out = ["# Results", "",
           "Written by the workflow (rule `report`) from the files named in each section; "
           "every number is formatted from them.", "",
           f"- Runs: {scale_label(summary)} ({seeds}); {len(ok)} of {len(summary)} runs "
           "finished ok.",
           f"- Machine: {_machines(runs + long_runs)}."]
    if long_runs:
        steps = "/".join(str(s) for s in sorted({r["steps"] for r in long_runs}))
        out.append(f"- Stability runs: {len(long_runs)} runs of "
                   f"{', '.join(sorted({r['method'] for r in long_runs}))}, {steps} steps.")
    bases = accuracy.groupby("task", as_index=False)["base_accuracy"].first()
    out += _section("SFT bases", "results/accuracy.csv", "lm-eval accuracy of each task's SFT "
                    "base, mean over seeds.",
                    {"task": bases["task"], "base accuracy": _fmt(bases["base_accuracy"])})
    out += _section("Accuracy", "results/accuracy.csv", "lm-eval accuracy after GRPO per task "
                    "and method: mean ± sd over the seeds whose run finished ok.",
                    {"task": accuracy["task"], "method": accuracy["method"],
                     "accuracy": _pm(accuracy["accuracy_mean"], accuracy["accuracy_sd"]),
                     "gain over base": _fmt(accuracy["gain_mean"], "+.3f"),
                     "seeds": accuracy["n_seeds"]})
    if verdicts is not None:
        v = verdicts
        out += _section("Verdicts", "results/verdicts.csv", "Accuracy minus the reference's, "
                        "paired by task and seed, with its 95% interval (logra/verdict.py says "
                        "how each row is computed).",
                        {"task": v["task"], "method": v["method"], "reference": v["reference"],
                         "statistic": v["statistic"],
                         "difference [95% interval]": [
                             f"{m} [{lo}, {hi}]" for m, lo, hi in zip(
                                 *(_fmt(v[c], "+.3f") for c in ("diff_mean", "diff_lo",
                                                                "diff_hi")))],
                         "margin": v["margin"], "call": v["call"]})
    if sweep is not None:
        out += _section("Memory sweep", "results/memory/sweep.csv", "One GRPO step per method "
                        "and model size, measured; the planner's prediction beside it (error = "
                        "predicted / measured - 1).",
                        {"size": sweep["size"], "parameters": sweep["n_params"],
                         "method": sweep["method"], "status": sweep["status"],
                         "peak (MiB)": _fmt(sweep["peak_mem_bytes"], ".1f", 2**20),
                         "vs reference": _fmt(sweep["peak_mem_bytes_vs_reference"]),
                         "peak phase": sweep["peak_phase"],
                         "planner error": _fmt(sweep["planned_error"], "+.1%"),
                         "planner's peak phase": sweep["planned_peak_phase"]})
    if planner is not None:
        out += _section("Planner predictions", "results/memory/planner.csv", "Predicted, not "
                        "measured: bytes per GPU by the planner (logra/planner.py).",
                        {"model": planner["model"], "method": planner["method"],
                         "GPUs": planner["gpus"], "policy": planner["policy"],
                         "GB per GPU": _fmt(planner["total"], ".1f", 1e9),
                         "peak phase": planner["peak_phase"],
                         "GPU GB": _fmt(planner["gpu_bytes"], ".0f", 1e9),
                         "fits": planner["fits"],
                         "sync GB": _fmt(planner["sync_bytes"], ".3g", 1e9)})
    columns = [f"kl_{eta}_{k}" for eta in ("eta_1", "eta_below_1")
               for k in ("steps", "median", "p10", "p90")]
    steps = ok.reindex(columns=[c for c in columns if c.endswith("_steps")]).apply(pd.to_numeric)
    calibrated = ok[(steps.fillna(0) > 0).any(axis=1)]  # runs with KL control
    if len(calibrated):
        cal = calibrated[["task", "method"]].join(
            calibrated.reindex(columns=columns).apply(pd.to_numeric)).groupby(
            ["task", "method"], as_index=False).median()
        out += _section("KL calibration", "results/summary.csv", "Realized KL on the probe's "
                        "held-out half / the KL predicted on its other half (logra/kl_control.py)"
                        ", at steps with η = 1 (the prediction is K₁) and η < 1 (η²·K₁): per run "
                        "the median [p10, p90] over its steps; shown, the median over seeds.",
                        {"task": cal["task"], "method": cal["method"], **{
                            f"{label}: steps": cal[f"kl_{eta}_steps"].fillna(0).astype(int)
                            for eta, label in (("eta_1", "η = 1"), ("eta_below_1", "η < 1"))},
                         **{f"{label}: ratio": [f"{m} [{lo}, {hi}]" for m, lo, hi in zip(
                             *(_fmt(cal[f"kl_{eta}_{k}"], ".2f") for k in ("median", "p10",
                                                                          "p90")))]
                            for eta, label in (("eta_1", "η = 1"), ("eta_below_1", "η < 1"))}})
    if stability is not None:
        out += ["", "## Stability (`figures/stability_27b`)", "",
                factor_effects(*stability)["caption"] + "."]
    sync = ok.groupby("method", as_index=False).agg(
        per_step=("sync_bytes_per_step", "mean"), full=("sync_full_bytes", "mean"))
    out += _section("Sync bytes", "results/summary.csv", "Bytes sent to the rollout engine per "
                    "step (mean over the runs that finished ok), and as a share of the whole "
                    "model's bytes, which a dense sync sends.",
                    {"method": sync["method"],
                     "MiB per step": _fmt(sync["per_step"], ".3f", 2**20),
                     "model MiB": _fmt(sync["full"], ".2f", 2**20),
                     "share of dense": _fmt(sync["per_step"] / sync["full"], ".1%")})
    if lr_sweep is not None:
        chosen = lr_sweep[lr_sweep["chosen"]]
        out += _section("lr sweep", "results/lr_sweep.csv", "The lr with the best mean "
                        "validation accuracy per task and method, out of `budget` lrs (the "
                        "method's grid); `edge`: the choice is the grid's smallest or largest lr.",
                        {"task": chosen["task"], "method": chosen["method"],
                         "lr": _fmt(chosen["lr"], "g"), "budget": chosen["budget"],
                         "edge": chosen["on_edge"].map({True: "yes", False: ""}),
                         "validation accuracy": _pm(chosen["val_accuracy_mean"],
                                                    chosen["val_accuracy_sd"]),
                         "seeds": chosen["n_seeds"]})
    else:
        out += ["", "The lr sweep has not run (`snakemake lr_sweep` writes "
                "`results/lr_sweep.csv`; the next report includes it)."]
    if trl:
        rows = [(r, m) for r in trl for m in ("logra", "adamw")]
        out += _section("LoGRA in TRL", "results/trl/", "TRL's GRPOTrainer (generation by the "
                        "training model, no vLLM) from each task's seed-0 SFT base, with "
                        "`logra.LoGRAOptimizer` and with TRL's default AdamW (logra/trl_grpo.py)"
                        ": the measured peak of one update step (a step without generation), "
                        "and the mean reward of the rollouts of the first and the last steps.",
                        {"task": [r["task"] for r, _ in rows], "method": [m for _, m in rows],
                         "device": [r["device"] for r, _ in rows],
                         "parameters": [r["model"]["n_params"] for r, _ in rows],
                         "steps": [r["steps"] for r, _ in rows],
                         "peak (MiB)": _fmt([r[m]["peak_mem_bytes"] for r, m in rows], ".2f",
                                            2**20),
                         "vs AdamW": _fmt([r[m]["peak_mem_bytes"] / r["adamw"]["peak_mem_bytes"]
                                           for r, m in rows]),
                         "optimizer state (MiB)": _fmt([r[m]["optimizer_state_bytes"]
                                                        for r, m in rows], ".3f", 2**20),
                         "reward, first / last steps": [
                             f"{a} / {b} ({r['reward_window_steps']})" for (r, m), a, b in zip(
                                 rows, _fmt([r[m]["reward_first"] for r, m in rows]),
                                 _fmt([r[m]["reward_last"] for r, m in rows]))]})
    else:
        out += ["", "LoGRA in TRL has not run (`snakemake trl` writes `results/trl/*.json`; the "
                "next report includes them)."]
    total = pd.concat([ledger, pd.DataFrame([{"stage": "total", "jobs": ledger["jobs"].sum(),
                                              "seconds": ledger["seconds"].sum(),
                                              "share": 1.0}])])
    out += _section("Time ledger", "results/benchmarks/", "Wall seconds of every job of the "
                    "default target (Snakemake's `benchmark:` files), summed per stage; jobs that "
                    "ran side by side each count in full, and this report's own job is not in it.",
                    {"stage": total["stage"], "jobs": total["jobs"],
                     "seconds": _fmt(total["seconds"], ".1f"),
                     "share": _fmt(total["share"], ".1%")})
    return "\n".join(out) + "\n"


def write_csv(df: pd.DataFrame, path: str | Path) -> None:
    """Atomic CSV write (temp file + rename)."""
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)
