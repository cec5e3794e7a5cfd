"""Aggregation: per-run summaries, lm-eval results and memory points -> tidy tables (pandas).

`results/summary.csv` has one row per run: the scalar fields of its summary.json, the measured
memory by category (`mem_<category>`), the analytic prediction (`pred_<category>`), and the
lm-eval accuracy of its final checkpoint beside its seed's SFT base (`eval_accuracy`,
`base_accuracy`). summary.json keeps `eval_accuracy: null`: evaluation runs after training, so
the table is where the two meet. `results/accuracy.csv` has one row per (task, method): the
bases' mean accuracy and the mean ± sd over the seeds whose run finished with status ok. The
other tables here (memory points, sync, cost, the paper setting, the time ledger) are what the
scripts write and `logra.analysis.report` formats.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pandas as pd

from logra.common import SYNC_METRICS, TRANSPORTS

SCALARS = ["status", "diverged_at_step", "oom_needed_bytes", "memory_budget_bytes", "task",
           "method", "seed", "model", "n_params", "device", "dtype", "steps", "wall_s",
           "peak_mem_bytes", "mem_rss_peak_bytes", "optimizer_state_bytes", "final_reward",
           "token_entropy_mean", "mem_measure"]


# a run's sync means (summary.json, logra/rl/loop.py): the applied transport, the engine's dtype,
# every transport's bytes, sync seconds, changed fraction and trainer-vs-engine mismatch
SYNC_FIELDS = ("sync_transport", "rollout_engine", "rollout_dtype", "engine_sync_path",
               "engine_host_copy_bytes", *(f"{k}_per_step" for k in SYNC_METRICS[1:]),
               "logp_mismatch_mean", "logp_mismatch_max")


def base_evals(paths: list[str | Path]) -> dict[tuple[str, int], str | Path]:
    """(task, seed) -> evaluation JSON of that seed's SFT base, from the workflow's paths
    `results/eval/{task}/base_seed{seed}.json`."""
    return {(Path(p).parent.name, int(Path(p).stem.removeprefix("base_seed"))): p for p in paths}


def eval_columns(eval_json: str | Path, prefix: str) -> dict:
    """An evaluation's accuracies as table columns: `<prefix>_accuracy` (the primary metric's),
    `<prefix>_metric` (its protocol), `<prefix>_<protocol>` per protocol and
    `<prefix>_<protocol>_pass<k>` (pass@k) per sampled one (logra/harness/evaluate.py)."""
    e = json.loads(Path(eval_json).read_text())
    out = {f"{prefix}_accuracy": e["accuracy"], f"{prefix}_metric": e["primary"]}
    for protocol, m in e["metrics"].items():
        out[f"{prefix}_{protocol}"] = m["accuracy"]
        if m["samples"] > 1:
            out[f"{prefix}_{protocol}_pass{m['samples']}"] = m["pass_at_k"]
    return out


def summary_table(run_jsons: list[str | Path], eval_jsons: list[str | Path],
                  base_jsons: dict[tuple[str, int], str | Path]) -> pd.DataFrame:
    """One row per run; `eval_jsons[i]` belongs to `run_jsons[i]`; `base_jsons` by (task, seed):
    a run's base is its seed's. Accuracies are the primary metric's, with every protocol's
    beside them (`eval_columns`)."""
    base = {key: eval_columns(p, "base") for key, p in base_jsons.items()}
    rows = []
    for run_path, eval_path in zip(run_jsons, eval_jsons, strict=True):
        s = json.loads(Path(run_path).read_text())
        row = {k: s.get(k) for k in SCALARS}
        row.update({f"mem_{k}": v for k, v in (s.get("mem_breakdown") or {}).items()})
        row.update({f"pred_{k}": v for k, v in (s.get("mem_analytic") or {}).items()})
        row["mean_step_time_s"] = s.get("mean_step_time_s")
        for key in ("sync_bytes_per_step", "sync_full_bytes", "sync_lowrank_fraction",
                    *SYNC_FIELDS):
            row[key] = s.get(key)
        for eta, stats in ((s.get("kl") or {}).get("calibration") or {}).items():
            row.update({f"kl_{eta}_{k}": v for k, v in stats.items()})  # realized / predicted
        control = s.get("control") or {}  # the step's control, if any (logra/rl/loop.py)
        row.update({"control": control.get("kind"),
                    "steps_at_cap_share": control.get("steps_at_cap_share"),
                    "control_seconds": control.get("mean_seconds")})
        cosine = s.get("update_cosine") or {}  # grpo.cosine_step's diagnostic, if it ran
        row.update({"cosine_step": cosine.get("step"), "update_cosine": cosine.get("cosine")})
        row.update(eval_columns(eval_path, "eval"))
        row.update(base.get((s["task"], s["seed"]), {"base_accuracy": None}))
        rows.append(row)
    return pd.DataFrame(rows)


def read_summary(path: str | Path, run_jsons: list[str | Path]) -> pd.DataFrame:
    """A summary table (`summary_table`'s, as the workflow wrote it at `path`) read back and
    checked against the runs it was made from: every row whole, one row per run with the run's
    task, method, seed, status and steps, none missing, none extra. A table that was cut,
    edited or left from another grid raises a ValueError naming the file and the row or run
    (removing the file makes the workflow write it again)."""
    fix = "remove it and rerun snakemake, which writes it again from the runs"
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    if not lines:
        raise ValueError(f"{path}: empty; {fix}")
    for n, fields in enumerate(lines[1:], start=2):
        if len(fields) != len(lines[0]):
            raise ValueError(f"{path}, line {n}: {len(fields)} fields where the header has "
                             f"{len(lines[0])} (cut or malformed); {fix}")
    table = pd.read_csv(path)
    key = ("task", "method", "seed")
    have = {tuple(r[k] for k in key): r for r in table.to_dict("records")}
    if len(have) < len(table):
        raise ValueError(f"{path}: a run has more than one row; {fix}")
    for run in run_jsons:
        s = json.loads(Path(run).read_text())
        row = have.pop(tuple(s[k] for k in key), None)
        if row is None:
            raise ValueError(f"{path}: no row for the run {run}; {fix}")
        for field in ("status", "steps"):
            if row[field] != s[field]:
                raise ValueError(f"{path}: the row of {run} has {field} {row[field]!r}, the run "
                                 f"{s[field]!r}; {fix}")
    if have:
        raise ValueError(f"{path}: rows of runs not in this grid: "
                         f"{', '.join('/'.join(map(str, k)) for k in have)}; {fix}")
    return table


def accuracy_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Base vs after-GRPO lm-eval accuracy per (task, method), mean ± sd over seeds: the
    primary metric (`metric`), and every protocol's mean beside it (`eval_<protocol>`,
    `base_<protocol>`, pass@k); the runs' mean token entropy on their own samples."""
    g = summary[summary["status"] == "ok"].groupby(["task", "method"])
    others = [c for c in summary.columns if c.startswith(("eval_", "base_"))
              and c not in ("eval_accuracy", "base_accuracy", "eval_metric", "base_metric")]
    out = g.agg(metric=("eval_metric", "first"), base_accuracy=("base_accuracy", "mean"),
                accuracy_mean=("eval_accuracy", "mean"),
                accuracy_sd=("eval_accuracy", "std"), n_seeds=("seed", "nunique"),
                **{c: (c, "mean") for c in others},
                peak_mem_bytes_mean=("peak_mem_bytes", "mean"),
                token_entropy=("token_entropy_mean", "mean"),
                step_time_s_mean=("mean_step_time_s", "mean"),
                sync_bytes_per_step_mean=("sync_bytes_per_step", "mean")).reset_index()
    out["gain_mean"] = out["accuracy_mean"] - out["base_accuracy"]
    return out


def memory_sweep_table(points: dict[tuple[str, str], dict], reference: str) -> pd.DataFrame:
    """One row per (size, method) sweep point (logra/harness/memory_point.py): measured peak,
    planner prediction and error, times, state and sync bytes, the authors' statistic (CUDA:
    the mean over updates of the update's allocator peak; NaN elsewhere), and ratios vs the
    `reference` method at that size (NaN where it has no point)."""
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
            "train_peak_mean_bytes": p.get("train_peak_mean_bytes"),
            "oom_needed_bytes": p.get("oom_needed_bytes")})
    df = pd.DataFrame(rows).sort_values(["n_params", "method"], kind="stable")
    dense = df[df["method"] == reference].set_index("size")
    for col in ("peak_mem_bytes", "update_time_s", "sync_bytes_per_step",
                "train_peak_mean_bytes"):
        df[col] = pd.to_numeric(df[col])  # None (an oom point) -> NaN
        df[f"{col}_vs_reference"] = (df[col] / df["size"].map(pd.to_numeric(dense[col]))
                                 if len(dense) else float("nan"))
    return df.reset_index(drop=True)


def sync_table(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per method and transport that applies to it, over the method's runs that
    finished ok: `bytes_per_step` (mean of the runs' per-step means), `applied` (the runs' own
    transport), and of the applied transport only (the engine it synced): `sync_seconds`,
    `logp_mismatch_mean`, `logp_mismatch_max`; `changed_fraction` (engine words changed per
    step: the trajectory's, whatever the transport), `engine_dtype`, `runs`."""
    rows = []
    for method, d in summary[summary["status"] == "ok"].groupby("method", sort=False):
        for t in TRANSPORTS:
            sent = pd.to_numeric(d[f"sync_bytes_{t}_per_step"])
            if sent.isna().all():
                continue  # the transport does not apply to the method's rule
            applied = bool((d["sync_transport"] == t).all())

            def of_applied(col):
                return pd.to_numeric(d[col]).mean() if applied else float("nan")
            rows.append({"method": method, "transport": t, "applied": applied,
                         "engine_dtype": "/".join(sorted(set(d["rollout_dtype"]))),
                         "bytes_per_step": sent.mean(),
                         "sync_seconds": of_applied("sync_seconds_per_step"),
                         "changed_fraction": pd.to_numeric(
                             d["sync_changed_fraction_per_step"]).mean(),
                         "logp_mismatch_mean": of_applied("logp_mismatch_mean"),
                         "logp_mismatch_max": of_applied("logp_mismatch_max"), "runs": len(d)})
    return pd.DataFrame(rows)


def low_rank_vs_delta(summary: pd.DataFrame, reference: str | None) -> pd.DataFrame:
    """Per method whose runs apply `low_rank`: its bytes per step over the delta bytes of the
    `reference` method's run of the same task and seed (`vs`: the reference), and over the
    delta bytes of its own updates in the same run (`vs`: "own updates"); `ratio` the mean over
    the (task, seed) pairs, `lo`, `hi` their min and max, `n` their count (runs that finished
    ok on both sides)."""
    ok = summary[summary["status"] == "ok"]
    ref = (ok[ok["method"] == reference].set_index(["task", "seed"])["sync_bytes_delta_per_step"]
           if reference else pd.Series(dtype=float))
    rows = []
    for method, d in ok[ok["sync_transport"] == "low_rank"].groupby("method", sort=False):
        d = d.set_index(["task", "seed"])
        low = pd.to_numeric(d["sync_bytes_low_rank_per_step"])
        for vs, delta in ((reference, ref.reindex(d.index)),
                          ("own updates", d["sync_bytes_delta_per_step"])):
            ratio = (low / pd.to_numeric(delta)).dropna()
            if len(ratio):
                rows.append({"method": method, "vs": vs, "ratio": ratio.mean(),
                             "lo": ratio.min(), "hi": ratio.max(), "n": len(ratio),
                             "engine_dtype": "/".join(sorted(set(d["rollout_dtype"])))})
    return pd.DataFrame(rows, columns=["method", "vs", "ratio", "lo", "hi", "n", "engine_dtype"])


def sync_regime_table(run_jsons: list[str | Path], regimes: dict[str, list[str]]) -> pd.DataFrame:
    """results/sync_regime.csv: one row per run of `snakemake sync_regime` (`regimes`: regime
    -> its methods): regime, status, task, method, seed, its step size (`step_size_option`:
    lr, or LoGRA's update_ratio, already relative to |W|; `step_size`; `dense_lr`), the median
    |w| of the weights it started from and lr / that median (lr-based rules), and its sync
    means (`SYNC_FIELDS`)."""
    regime_of = {m: r for r, ms in regimes.items() for m in ms}
    rows = []
    for path in run_jsons:
        s = json.loads(Path(path).read_text())
        options, size = s["config"]["method"]["options"], s["step_size"]
        lr = size["value"] if size["option"] == "lr" else None
        rows.append({"regime": regime_of[s["method"]],
                     **{k: s.get(k) for k in ("status", "task", "method", "seed")},
                     "step_size_option": size["option"], "step_size": size["value"],
                     "dense_lr": options.get("dense_lr"),
                     "base_median_abs_weight": s.get("base_median_abs_weight"),
                     "lr_over_w": (lr / s["base_median_abs_weight"]
                                   if lr and s.get("base_median_abs_weight") else None),
                     **{k: s.get(k) for k in SYNC_FIELDS}})
    return pd.DataFrame(rows)


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


def cost_table(summary: pd.DataFrame, reference: str | None) -> pd.DataFrame:
    """Per task and method, means over the runs that finished ok: measured peak memory of the
    update (`peak_mem_bytes`) and its ratio to `reference`'s on the same task, optimizer state
    bytes, seconds per step (the unprofiled steps) and sync bytes per step (the applied
    transport)."""
    ok = summary[summary["status"] == "ok"]
    t = ok.groupby(["task", "method"], sort=False).agg(
        peak=("peak_mem_bytes", "mean"), state=("optimizer_state_bytes", "mean"),
        step_s=("mean_step_time_s", "mean"), sync=("sync_bytes_per_step", "mean"),
        runs=("seed", "size")).reset_index()
    ref = t[t["method"] == reference].set_index("task")["peak"]
    return t.assign(peak_vs_reference=t["peak"] / t["task"].map(ref))


def accuracy_memory_table(accuracy: pd.DataFrame, reference: str | None,
                          planner: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per task and method (`accuracy_table`'s rows): the primary metric's mean with its 95%
    t-interval over the seeds that finished (df = seeds − 1), the update's measured peak and its
    ratio to `reference`'s on the task, and, where the planner ran, its predicted bytes per GPU
    at each of its models (`predicted <model>`; a prediction, not a measurement; the method's
    own row, not its +offload one)."""
    from logra.analysis.verdict import t_quantile
    a = accuracy
    n = a["n_seeds"].astype(float)
    half = [t_quantile(0.975, int(k) - 1) * sd / k ** 0.5 if k > 1 else float("nan")
            for k, sd in zip(n, a["accuracy_sd"])]
    ref = a[a["method"] == reference].set_index("task")["peak_mem_bytes_mean"]
    out = pd.DataFrame({"task": a["task"], "method": a["method"], "metric": a["metric"],
                        "accuracy": a["accuracy_mean"], "accuracy_lo": a["accuracy_mean"] - half,
                        "accuracy_hi": a["accuracy_mean"] + half, "seeds": a["n_seeds"],
                        "peak_mem_bytes": a["peak_mem_bytes_mean"],
                        "peak_vs_reference": a["peak_mem_bytes_mean"] / a["task"].map(ref)})
    if planner is not None:
        for model, rows in planner.groupby("model", sort=False):
            total = rows.drop_duplicates("method").set_index("method")["total"]
            out[f"predicted {model}"] = out["method"].map(total)
    return out


def paper_setting_table(predicted: pd.DataFrame) -> pd.DataFrame:
    """One row per setting, logits (as this project or the authors form them) and method other
    than the setting's first (the reference): the
    predicted GiB per training GPU of both, the reduction, the method's peak phase and its
    reduction were its peak phase left out (the largest other phase), what AdamW on the
    weights it leaves out would add (gradient and two moments, 12 bytes each, per GPU; nan
    where the setting trains them, non_target adamw, and the prediction counts them), and
    the published numbers (GiB per method, or the reduction alone)."""
    rows = []
    if "statistic" in predicted:  # the one-update rows (the curve's: paper_setting_curve)
        predicted = predicted[predicted["statistic"] == "one update"]
    for (setting, logits), d in predicted.groupby(["setting", "logits"], sort=False):
        ref, others = d.iloc[0], d.iloc[1:]
        for _, m in others.iterrows():
            phases = {c: m[c] for c in m.index if c.startswith("phase_") and pd.notna(m[c])}
            rest = max(v for c, v in phases.items() if c != f"phase_{m['peak_phase']}")
            published = _published_reduction(ref, m)
            rows.append({
                "setting": setting, "logits": logits, "method": m["method"],
                "reference": ref["method"],
                "seq_len": m["seq_len"], "gpus": m["gpus"],
                "reference_gib": ref["total"] / 2**30, "method_gib": m["total"] / 2**30,
                "reduction": 1 - m["total"] / ref["total"], "peak_phase": m["peak_phase"],
                "reduction_without_peak_phase": 1 - rest / ref["total"],
                "frozen_adamw_gib": (math.nan if m.get("non_target") == "adamw" else  # counted
                                     12 * (m["n_params"] - m["low_rank_params"]) / m["gpus"]
                                     / 2**30),
                "published_reference_gib": ref["published_gib"],
                "published_method_gib": m["published_gib"],
                "published_reduction": published, "source": m["published_source"]})
    return pd.DataFrame(rows)


def _published_reduction(ref: pd.Series, m: pd.Series) -> float:
    """The published reduction of method row `m` against reference row `ref`: from their
    published GiB where both have one, else the setting's published reduction (or nan)."""
    if pd.notna(ref["published_gib"]) and pd.notna(m["published_gib"]):
        return 1 - m["published_gib"] / ref["published_gib"]
    return m["published_reduction"]


def paper_setting_curve(predicted: pd.DataFrame) -> pd.DataFrame:
    """The authors' statistic as a curve: one row per setting, logits and method other than
    the reference, and longest sequence length (`longest_len`, every update's; the setting's
    seq_len is its one-update row): the predicted reduction of the mean over updates, the
    published reduction, and `published_at`, the length at which the curve meets it (linear
    between neighbouring lengths; nan where it does not within them)."""
    rows = []
    for (setting, logits), d in predicted.groupby(["setting", "logits"], sort=False):
        ref = d["method"].iloc[0]
        total = d.set_index(["method", "longest_len"])["total"]
        lengths = sorted(d["longest_len"].unique())
        for method in list(dict.fromkeys(d["method"]))[1:]:
            reduction = [1 - total[(method, n)] / total[(ref, n)] for n in lengths]
            published = _published_reduction(d[d["method"] == ref].iloc[0],
                                              d[d["method"] == method].iloc[0])
            at = math.nan
            for (n0, r0), (n1, r1) in zip(zip(lengths, reduction),
                                          zip(lengths[1:], reduction[1:])):
                if pd.notna(published) and min(r0, r1) <= published <= max(r0, r1) \
                        and r0 != r1:
                    at = n0 + (published - r0) / (r1 - r0) * (n1 - n0)
                    break
            rows += [{"setting": setting, "logits": logits, "method": method,
                      "reference": ref, "longest_len": n, "reduction": r,
                      "published_reduction": published, "published_at": at}
                     for n, r in zip(lengths, reduction)]
    return pd.DataFrame(rows)
