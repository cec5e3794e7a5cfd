"""`snakemake scaling`: each method against the reference at every model size, and the trend.

Per size and compared method (`kind` measured): the per-seed paired difference on the primary
metric with its 95% t-interval and non-inferiority call at the task's margin, the bases' mean
and band, the reference's gain over its bases, and the measured ratios to the reference. Per
compared method (`kind` trend): the slope of the size means of the per-seed differences against
log10(parameters), with its 95% t-interval (df = sizes − 2), `undetermined` while the interval
holds 0. The size is the unit: the seeds of one size share its model, so their differences are
not independent draws of the trend. `kind` tuning, check, prediction and cost: the validation
tables' choices, the planner's memory ratio, the target's CPU time against its cap.

Each kind in full, and why the size is the unit: docs/scaling.md.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from logra.analysis.verdict import call, paired_difference, per_problem, t_interval, t_quantile


def slope(x, y, level: float = 0.95) -> tuple[float, float, float]:
    """(slope, lo, hi): the least-squares slope of y on x and its t-interval (df = n − 2);
    NaN bounds with fewer than three points."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    xc = x - x.mean()
    b = float((xc * (y - y.mean())).sum() / (xc ** 2).sum())
    if len(x) < 3:
        return b, math.nan, math.nan
    resid = y - y.mean() - b * xc
    se = math.sqrt(float((resid ** 2).sum()) / (len(x) - 2) / float((xc ** 2).sum()))
    half = t_quantile(0.5 + level / 2, len(x) - 2) * se
    return b, b - half, b + half


def trend_call(lo: float, hi: float) -> str:
    """The slope's direction where its interval excludes 0, else `undetermined`."""
    if lo > 0:
        return "difference rises with size"
    if hi < 0:
        return "difference falls with size"
    return "undetermined"  # NaN bounds (two sizes) too


def scaling_table(runs: pd.DataFrame, bases: dict[tuple[str, int], str | Path],
                  reference: str, margin: float, band: tuple[float, float]) -> pd.DataFrame:
    """The measured and trend rows. `runs`: one row per (label, size, seed) with its `eval`
    and `summary` paths (labels: the methods, `<method>_frac` for a rank-fraction variant);
    `bases`: (size, seed) -> the SFT base's evaluation on the test split. Sizes in `runs`'
    order."""
    runs = runs.assign(scores=[per_problem(p) for p in runs["eval"]],
                       summary=[json.loads(Path(p).read_text()) for p in runs["summary"]])
    rows, points = [], {}
    for size, at in runs.groupby("size", sort=False):
        ref = at[at["label"] == reference].set_index("seed")
        seeds = sorted(ref.index)
        base = {s: per_problem(bases[size, s]) for s in seeds}
        base_acc = [float(np.mean(list(base[s].values()))) for s in seeds]
        ref_gain = [paired_difference(ref.at[s, "scores"], base[s],
                                      f"{size}/seed{s}: {reference} vs its base").mean()
                    for s in seeds]
        summary = ref.at[seeds[0], "summary"]
        for label, runs_of in at[at["label"] != reference].groupby("label", sort=False):
            m = runs_of.set_index("seed")
            if sorted(m.index) != seeds:
                raise ValueError(f"{size}: {label} has seeds {sorted(m.index)}, {reference} "
                                 f"has {seeds}: every seed needs both runs")
            d = [paired_difference(m.at[s, "scores"], ref.at[s, "scores"],
                                   f"{size}/seed{s}: {label} vs {reference}").mean()
                 for s in seeds]
            mean, lo, hi = t_interval(d)

            def ratio(key):
                return float(np.mean([m.at[s, "summary"][key] / ref.at[s, "summary"][key]
                                      for s in seeds]))
            n_params = summary["n_params"]
            points.setdefault(label, []).append((math.log10(n_params), mean))
            rows.append({
                "kind": "measured", "size": size, "method": label, "reference": reference,
                "n_params": n_params, "seeds": len(seeds),
                "diff_mean": mean, "diff_lo": lo, "diff_hi": hi, "margin": margin,
                "call": call(lo, hi, margin),
                "diff_by_seed": "; ".join(f"seed {s}: {x:+.4f}" for s, x in zip(seeds, d)),
                "base_mean": float(np.mean(base_acc)),
                "base_in_band": bool(band[0] <= np.mean(base_acc) <= band[1]),
                "ref_gain_mean": float(np.mean(ref_gain)),
                "memory_ratio": ratio("peak_mem_bytes"),
                "step_time_ratio": ratio("mean_step_time_s")})
    for label, xy in points.items():
        x, y = np.array(xy).T
        b, lo, hi = slope(x, y)
        rows.append({"kind": "trend", "size": "all", "method": label, "reference": reference,
                     "sizes": len(xy), "df": len(xy) - 2, "slope_per_decade": b,
                     "slope_lo": lo, "slope_hi": hi,
                     "intercept": float(y.mean() - b * x.mean()), "call": trend_call(lo, hi)})
    return pd.DataFrame(rows)


def predicted_ratios(planned: dict[tuple[str, str], dict], reference: str) -> pd.DataFrame:
    """`kind` prediction rows: per (hub model, label) of `planned` (the planner's rows,
    `logra.measure.planner.predict`, with `n_params`), its predicted per-GPU total over the
    reference's."""
    rows = []
    for (model, label), row in planned.items():
        if label == reference:
            continue
        rows.append({"kind": "prediction", "size": model, "method": label,
                     "reference": reference, "n_params": row["n_params"],
                     "memory_ratio": row["total"] / planned[model, reference]["total"]})
    return pd.DataFrame(rows)


def validation_rows(sweep: pd.DataFrame, check: pd.DataFrame, tuned: dict[str, float],
                    sizes: tuple[str, str], factors: list[float]) -> pd.DataFrame:
    """`kind` tuning and check rows from the validation tables (`lr_sweep_table`'s): per method
    the sweep's choice at the first size (`chosen_value`, `on_edge`) beside the value the config
    adopted (`tuned`), and at the check's size (`factors` times the transferred value) the
    factor that scored best (1: the transfer holds on this check), with every point's
    validation accuracy."""
    rows = []
    for kind, table, size in (("tuning", sweep, sizes[0]), ("check", check, sizes[1])):
        for method, t in table.groupby("method", sort=False):
            best = t[t["chosen"]]
            points = "; ".join(f"{v:g}: {a:.3f}" for v, a in zip(t["lr"], t["val_accuracy_mean"]))
            row = {"kind": kind, "size": size, "method": method, "option": t["option"].iloc[0],
                   "chosen_value": best["lr"].iloc[0] if len(best) else math.nan,
                   "on_edge": bool(best["on_edge"].any()), "validation_by_point": points}
            if kind == "tuning":
                row["adopted_value"] = tuned[method]
            else:
                factor = row["chosen_value"] * min(factors) / t["lr"].min()
                row["chosen_factor"] = float(f"{factor:.6g}")
            rows.append(row)
    return pd.DataFrame(rows)


def cost_row(benchmarks: list[str | Path], cap_hours: float) -> pd.DataFrame:
    """`kind` cost: the CPU hours of every job (Snakemake's benchmark `cpu_time`) and the cap."""
    hours = sum(pd.read_csv(b, sep="\t")["cpu_time"].sum() for b in benchmarks) / 3600
    return pd.DataFrame([{"kind": "cost", "size": "all", "jobs": len(benchmarks),
                          "cpu_hours": hours, "cap_hours": cap_hours,
                          "within_cap": bool(hours <= cap_hours)}])
