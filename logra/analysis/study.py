"""The study (`snakemake study`, config `study`): a few arms at each of several horizons, each
horizon a study of its own (its arms on its schedule, tuned there on the validation split, then
compared on the test split over enough seeds), then the horizons against each other.

1. `study_plan`, per horizon before any of its test runs: each arm's choice from its grid (the
   lr sweep's table and bracket rule: `arm_choice`) or as `study.tuned` adopted it
   (`adopted_choice`); the margin from the reference's chosen point on the margin seeds; the
   test seeds, max(min, n) capped at max, n the most any contrast needs for a 95% half-width
   ≤ `half_width` at an upper confidence bound on its validation seeds' spread (`seeds_for`,
   `sd_upper` at `sd_level`), and the half-width n gives each; the analysis, frozen as the
   default target's (`logra.analysis.verdict.analysis_plan`): the primary metric at the last
   update, the margin, the gate, paired per-seed t-intervals, the three answers Holm-adjusted
   over the contrasts; the secondary endpoints in order (`SECONDARY_ORDER`).
2. `study_tables`, per horizon after: the verdicts at the last update (primary) and the
   snapshot, every run's row, its policy's drift from its base (exact entropy, KL to the base:
   logra/rl/drift.py), the update's spectrum (how low-rank each target matrix's final
   − base weights are: logra/measure/spectrum.py), and the secondary endpoints' paired
   differences (`secondary_table`), unadjusted.
3. `horizon_table`, across horizons: each contrast all of them run, Holm-adjusted over the
   horizons, and the horizon effect.
Contrasts: every arm against the reference, then each later arm against each earlier one
(dense AdamW, on LoGRA's weights, LoGRA: the last pair is the update rule on the same weights).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from logra.analysis.stability import CLAUSES
from logra.analysis.tables import eval_columns, summary_table
from logra.analysis.verdict import (analysis_plan, contrast_tests, fieller, holm, t_interval,
                                    t_quantile, verdicts, with_calls)


def contrasts(arms: list[str], reference: str) -> list[tuple[str, str]]:
    """(arm, against) pairs: every other arm against `reference`, then each later non-reference
    arm against each earlier one."""
    others = [a for a in arms if a != reference]
    return [(a, reference) for a in others] + [
        (b, a) for i, a in enumerate(others) for b in others[i + 1:]]


def sd_upper(d, level: float) -> float:
    """The one-sided `level` upper confidence bound on the sd of the per-seed differences `d`
    (ddof 1), from the chi-square law of their variance, sd · √((k−1) / χ²_(1−level), k−1) for k
    differences; the sd itself at level 0; NaN with fewer than two. Three validation seeds give
    an sd that is itself noisy (at level 0.8 the bound is 2.1x it), and a plan on the bare sd
    undershoots its target whenever the test spread comes out wider."""
    d = np.asarray(d, dtype=float)
    if len(d) < 2:
        return math.nan
    sd = float(d.std(ddof=1))
    if not level:
        return sd
    from scipy import stats  # as t_quantile: only where a plan is made
    return sd * math.sqrt((len(d) - 1) / stats.chi2.ppf(1 - level, len(d) - 1))


def half_width(sd: float, n: int, level: float = 0.95) -> float:
    """The half-width of a `level` t-interval of a mean over n seeds at spread `sd`."""
    return t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)


def seeds_for(d, target: float, level: float = 0.95, most: int = 10_000,
              sd_level: float = 0.0) -> float:
    """The fewest seeds n ≥ 2 whose `level` t-interval of a mean has half-width ≤ `target` at
    the spread of the per-seed differences `d` (`sd_upper` at `sd_level`; 0: their sd):
    t_(1+level)/2, n−1 · sd / √n; NaN with fewer than two differences, inf past `most`."""
    sd = sd_upper(d, sd_level)
    if math.isnan(sd):
        return math.nan
    for n in range(2, most + 1):
        if half_width(sd, n, level) <= target:
            return n
    return math.inf


def arm_choice(table: pd.DataFrame, points: dict[str, tuple[str, float]], arm: str,
               val_evals: dict[tuple[str, int], str | Path], configs: dict[str, dict]) -> dict:
    """An arm's choice at a horizon on the validation split (`arm`: its method there,
    `<arm>_<horizon>`), the record `study.tuned` adopts (results/study/tuned/<arm>_<horizon>.yaml):
    the chosen row of its grid (`lr_sweep_table` of its last
    window; `points`: {run method: (arm, value)}) as the run method of that point, its knob,
    value, mean validation accuracy and whether the bracket rule bracketed it; the accuracy at
    each validation seed (`val_evals`: (run method, seed) -> its evaluation), the window's
    scores (`scores`: the points run on every seed; under successive halving, `screen`: the
    others, on the first seed), and the chosen point's method config (`configs`), which the
    adopted record must still match. An arm without a choice (no point whose every seed
    finished) is an error that names it."""
    names = {(a, value): name for name, (a, value) in points.items()}
    t = table[table["method"] == arm]
    best = t[t["chosen"]]
    if not len(best):
        raise ValueError(f"study.arms.{arm}: no point of its grid finished on every validation "
                         "seed, so none can be chosen (results/study/tuned/)")
    r = best.iloc[0]
    full = t["n_seeds"] == t["n_seeds"].max()
    method = names[arm, float(r["lr"])]
    seeds = sorted(s for m, s in val_evals if m == method)
    return {"method": method, "option": str(r["option"]), "value": float(r["lr"]),
            "bracketed": bool(r["bracketed"]), "metric": str(r["metric"]),
            "val_accuracy": float(r["val_accuracy_mean"]),
            "by_seed": {int(s): float(json.loads(Path(val_evals[method, s]).read_text())[
                "accuracy"]) for s in seeds},
            **{key: [[float(v), None if pd.isna(a) else float(a)]
                     for v, a in zip(rows["lr"], rows["val_accuracy_mean"])]
               for key, rows in (("scores", t[full]), ("screen", t[~full])) if len(rows)},
            "config": configs[method]}


def adopted_choice(record: dict, points: dict[str, tuple[str, float]], arm: str) -> dict:
    """`study.tuned.<arm>`, `arm_choice`'s record as the config adopted it (checked against the
    arm's grid when the config is read: logra.harness.horizons.add_study_methods), with the run
    method of its point."""
    method = {(a, value): name for name, (a, value) in points.items()}[arm, record["value"]]
    return {"method": method, **record,
            "by_seed": {int(s): float(a) for s, a in record["by_seed"].items()}}


# the secondary endpoints in the order the plan declares them (then every other protocol's
# accuracy and pass@k, the update cosine and the measured peak): summary.csv's columns
SECONDARY_ORDER = ("eval_t1", "eval_greedy", "eval_sampled_pass4", "policy_entropy",
                   "kl_to_base", "update_stable_rank", "update_energy_top_r")


def study_plan(arms: dict[str, dict], study: dict, pool: list[int], margins: pd.DataFrame,
               spec: dict) -> dict:
    """results/study/<horizon>/analysis_plan.json (the module docstring, 1). `arms`: {the arm's
    method at the horizon: its choice} (`arm_choice`, or `adopted_choice` for one `study.tuned`
    adopted); `study`: the horizon's design (its `arms`, {arm: its method there}, `reference`,
    `seeds`, `snapshot`, `task`, `horizon`, `tuned`); `pool`: the candidate test seeds in order
    (at least its seeds' max); `margins`: `margin_table`'s row of the task, from the
    reference's chosen point on the margin seeds at this horizon; `spec`: `analysis_plan`'s
    eval, verdict, n_test and steps (by arm), and `configs`, every point's method config (the
    chosen ones' are frozen). A contrast's per-seed difference at a validation seed is the
    difference of the two arms' accuracies there (the mean of the paired per-problem
    differences: every arm is scored on the same validation problems)."""
    chosen = {arm: arms[name] for arm, name in study["arms"].items()}
    pairs = contrasts(list(study["arms"]), study["reference"])
    val_seeds = sorted(chosen[study["reference"]]["by_seed"])
    for arm, c in chosen.items():
        if sorted(c["by_seed"]) != val_seeds:
            raise ValueError(f"study.arms.{arm}: chosen on validation seeds {sorted(c['by_seed'])}"
                             f", the reference on {val_seeds}: the arms are compared by seed")
    bounds = study["seeds"]
    sd_level = bounds.get("sd_level", 0.0)
    need = {}
    for a, b in pairs:
        d = [chosen[a]["by_seed"][s] - chosen[b]["by_seed"][s] for s in val_seeds]
        need[f"{a} - {b}"] = {"by_seed": d, "sd": float(np.std(d, ddof=1)),
                              "sd_upper": sd_upper(d, sd_level),
                              "seeds_needed": seeds_for(d, bounds["half_width"],
                                                        sd_level=sd_level)}
    wanted = max(n["seeds_needed"] for n in need.values())
    n = int(min(bounds["max"], max(bounds["min"], wanted if math.isfinite(wanted) else
                                   bounds["max"])))
    for c in need.values():  # what n seeds give, stated before any test run
        c["half_width_at_n"] = {"sd": half_width(c["sd"], n),
                                "sd_upper": half_width(c["sd_upper"], n)}
    plan = analysis_plan(spec | {
        "reference": study["reference"], "methods": list(study["arms"]), "ablation_methods": [],
        "tasks": [study["task"]], "seeds": pool[:n],
        "method_config": {arm: spec["configs"][c["method"]] for arm, c in chosen.items()},
        "verdict": spec["verdict"] | {"contrasts": [[a, b] for a, b in pairs
                                                    if b != study["reference"]]},
        "tuned": {study["task"]: {arm: c["value"] for arm, c in chosen.items()}}},
        margins[margins["task"] == study["task"]])
    return plan | {
        "frozen": "before any test run of the horizon: every results/study/<horizon>/eval/ job "
                  "waits for this file",
        "task": study["task"], "horizon": study["horizon"],
        "arms": {arm: {k: v for k, v in c.items() if k != "config"} | {
            "adopted": study["arms"][arm] in (study.get("tuned") or {})}
            for arm, c in chosen.items()},
        "endpoints": {"primary": f"{plan['primary_metric']['protocol']} accuracy at the last "
                                 "update", "snapshot": study.get("snapshot"),
                      "secondary": list(SECONDARY_ORDER),
                      "secondary_rule": "paired t-intervals at the last update, in this order, "
                                        "then every other protocol's accuracy and pass@k, the "
                                        "update cosine, the measured peak and the snapshot's "
                                        "accuracies; none adjusted for multiplicity"},
        "intent_to_treat": "a run that stopped early (diverged, out of memory) counts as the "
                           "model it saved last, evaluated like every other: no run is dropped",
        "seeds_rule": {**bounds, "validation_seeds": val_seeds, "contrasts": need,
                       "needed": wanted, "n": n, "capped": bool(wanted > bounds["max"]),
                       "rule": "max(min, the most any contrast needs for a 95% half-width <= "
                               "half_width at the sd_level upper confidence bound of its "
                               "validation seeds' sd (0: the sd), at most max"}}


def _by_step(evals: dict, step: int) -> dict:
    return {(t, arm, s): p for (t, arm, s, st), p in evals.items() if st == step}


def study_tables(plan: dict, runs: dict[tuple[str, int], str | Path],
                 evals: dict[tuple[str, str, int, int], str | Path],
                 bases: dict[tuple[str, int], str | Path],
                 spectra: dict[tuple[str, int], str | Path] | None = None,
                 drifts: dict[tuple[str, int], str | Path] | None = None
                 ) -> dict[str, pd.DataFrame]:
    """results/study/<horizon>/{verdicts,summary,secondary,spectrum}.csv (the module docstring,
    2), of one horizon.
    `runs`: (arm, seed) -> summary.json; `evals`: (task, arm, seed, step) -> evaluation at that
    update (the last: each arm's grpo steps); `bases`: (task, seed) -> its SFT base's test
    evaluation; `spectra`: (arm, seed) -> its update's spectrum (logra.measure.spectrum, a row
    per target matrix), each run's mean over the matrices it changed a column of the summary
    (`SPECTRUM`) and a secondary endpoint; `drifts`: (arm, seed) -> its policy's drift from its
    base at its last update (`last_drift`), columns `DRIFT` of the summary and secondary
    endpoints."""
    last = {arm: plan["steps"][arm] for arm in plan["arms"]}
    steps = sorted({st for *_, st in evals})
    margins = {t: m["margin"] for t, m in plan["margins"].items()}
    pairs = [tuple(p) for p in plan["contrasts"]]
    tables = []
    for step in steps:
        v = verdicts(_by_step(evals, step), bases, plan["reference"], margins,
                     plan["gate"]["alpha"], pairs)
        v.insert(0, "endpoint", "primary" if step == max(last.values()) else "secondary")
        v.insert(1, "step", step)
        tables.append(v)
    keys = sorted(runs)
    task = plan["task"]
    summary = summary_table([runs[k] for k in keys],
                            [evals[task, arm, s, last[arm]] for arm, s in keys], bases)
    summary.insert(1, "arm", [arm for arm, _ in keys])
    summary = summary.rename(columns={"method": "run_method"}).rename(columns={"arm": "method"})
    snapshot = plan["endpoints"]["snapshot"]
    snap = pd.DataFrame([eval_columns(evals[task, arm, s, snapshot], f"step{snapshot}")
                         for arm, s in keys if (task, arm, s, snapshot) in evals])
    if snapshot and len(snap) == len(summary):
        summary = pd.concat([summary, snap], axis=1)
    spectrum = pd.concat([pd.read_csv(spectra[k]).assign(method=k[0], seed=k[1])
                          for k in keys if k in (spectra or {})], ignore_index=True) \
        if spectra else pd.DataFrame(columns=["method", "seed", "matrix"])
    if len(spectrum):
        means = spectrum.groupby(["method", "seed"])[list(SPECTRUM.values())].mean()
        summary = summary.join(means.rename(columns={v: k for k, v in SPECTRUM.items()}),
                               on=["method", "seed"])
    if drifts:
        drift = pd.DataFrame([{"method": arm, "seed": seed} | {
            column: last_drift(drifts[arm, seed])[key]
            for column, key in DRIFT.items()} for arm, seed in keys])
        summary = summary.merge(drift, on=["method", "seed"], how="left")
    return {"verdicts": pd.concat(tables, ignore_index=True), "summary": summary,
            "spectrum": spectrum,
            "secondary": secondary_table(summary, contrasts(plan["methods"], plan["reference"]),
                                         ("eval",) + ((f"step{snapshot}",) if snapshot else ()))}


def last_drift(path: str | Path) -> dict:
    """A test run's drift from its base at its last update (logra.rl.drift.policy_drift): its
    record (workflow/scripts/study_drift.py), or, at a horizon that judges stability, its
    held-out curve's last point (workflow/scripts/stability_eval.py), the same measurement of
    the same model on the same prompts and seed, so the curve's is not measured twice."""
    record = json.loads(Path(path).read_text())
    return record["points"][-1] if "points" in record else record


SECONDARY = ("token_entropy_mean", "update_cosine", "peak_mem_bytes")
# the summary's columns of each run's drift from its base at its last update (logra.rl.drift:
# the exact entropy of its own samples, KL(policy || base), per completion token)
DRIFT = {"policy_entropy": "entropy", "kl_to_base": "kl_to_base"}
# the summary's columns of each run's update spectrum: the mean over its changed target matrices
SPECTRUM = {"update_stable_rank": "stable_rank", "update_energy_top_r": "energy_top_r",
            "update_rank_90": "rank_90"}


def secondary_table(summary: pd.DataFrame, pairs: list[tuple[str, str]],
                    prefixes: tuple[str, ...]) -> pd.DataFrame:
    """Per contrast and secondary metric (`eval_columns`' columns of each of `prefixes` but
    the primary metric's, `SECONDARY`, the policy's `DRIFT` and the update's `SPECTRUM`; those
    of `SECONDARY_ORDER` first, in its order): the mean of the per-seed paired differences
    with its 95% t-interval, over the seeds both arms finished; not adjusted for multiplicity
    (descriptive)."""
    primary = summary["eval_metric"].iloc[0]
    metrics = [c for p in prefixes for c in summary.columns
               if c.startswith(p + "_") and c.removeprefix(p + "_") not in (
                   "accuracy", "metric", primary)] + list(SECONDARY) + [
                       c for c in (*DRIFT, *SPECTRUM) if c in summary.columns]
    declared = [c for c in SECONDARY_ORDER if c in metrics]  # the plan's order first
    metrics = declared + [c for c in dict.fromkeys(metrics) if c not in declared]
    ok = summary[summary["status"] == "ok"]
    rows = []
    for a, b in pairs:
        x, y = (ok[ok["method"] == m].set_index("seed") for m in (a, b))
        seeds = sorted(set(x.index) & set(y.index))
        for metric in metrics:
            d = (x.loc[seeds, metric].astype(float) - y.loc[seeds, metric].astype(float)).dropna()
            mean, lo, hi = t_interval(d) if len(d) else (math.nan,) * 3
            rows.append({"method": a, "against": b, "metric": metric, "seeds": len(d),
                         "mean_a": float(x.loc[seeds, metric].astype(float).mean()),
                         "mean_b": float(y.loc[seeds, metric].astype(float).mean()),
                         "diff_mean": mean, "diff_lo": lo, "diff_hi": hi})
    return pd.DataFrame(rows)


# the stability criterion's continuous measures (logra.analysis.stability.judge's columns),
# contrasted by seed where a horizon declares `stability`: the least entropy of the policy's
# own samples over its curve as a share of its base's, its KL to the base at the last point,
# the share of judged steps whose batch KL spiked, and pass@k and the primary metric at the
# last point minus their best on the curve
STABILITY_MEASURES = ("entropy_ratio_min", "kl_to_base_last", "spike_share",
                      "pass_last_vs_best", "last_vs_best")


def stability_contrasts(table: pd.DataFrame, pairs: list[tuple[str, str]]) -> pd.DataFrame:
    """results/study/<horizon>/stability_contrasts.csv from its stability.csv (`table`:
    logra.analysis.stability.stability_table's rows with `method` the arm; every test run as
    it ended, intent to treat). Per contrast (a, against b) of `pairs`, over the seeds both
    ran: each of `STABILITY_MEASURES`, both arms' means and the mean of the per-seed
    differences a − b with its 95% t-interval; then each of the criterion's clauses and
    `stable`, the share of each arm's runs that meet it and their count (`passed_a`,
    `passed_b`, "k/n"), without an interval (descriptive)."""
    rows = []
    for a, b in pairs:
        x, y = (table[table["method"] == m].set_index("seed") for m in (a, b))
        seeds = sorted(set(x.index) & set(y.index))
        x, y = x.loc[seeds], y.loc[seeds]
        for m in STABILITY_MEASURES:
            d = (x[m].astype(float) - y[m].astype(float)).dropna()
            mean, lo, hi = t_interval(d) if len(d) else (math.nan,) * 3
            rows.append({"method": a, "against": b, "measure": m, "seeds": len(d),
                         "mean_a": float(x[m].astype(float).mean()),
                         "mean_b": float(y[m].astype(float).mean()),
                         "diff_mean": mean, "diff_lo": lo, "diff_hi": hi})
        for clause in [f"{c}_ok" for c in CLAUSES] + ["stable"]:
            rows.append({"method": a, "against": b, "measure": clause, "seeds": len(seeds),
                         "mean_a": float(x[clause].astype(bool).mean()),
                         "mean_b": float(y[clause].astype(bool).mean()),
                         "passed_a": f"{int(x[clause].astype(bool).sum())}/{len(seeds)}",
                         "passed_b": f"{int(y[clause].astype(bool).sum())}/{len(seeds)}"})
    return pd.DataFrame(rows)


def horizon_table(plans: dict[str, dict], summaries: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """results/study/horizons.csv: the horizons against each other. `plans`, `summaries`: each
    horizon's frozen plan and summary.csv (a run per arm and test seed, intent to treat).

    Rows `statistic` "mean": at each horizon (by its updates) each contrast every horizon runs
    (each arm all horizons share, against the reference), from the per-seed differences of the
    primary accuracy at the last update (a run's accuracy is the mean over the same test
    problems, so their difference is the mean paired difference): the 95% t-interval, the share
    of the reference's gain over its SFT bases (Fieller) and the three answers at that
    horizon's margin, Holm-adjusted over these rows (`with_calls`: the horizons' shared
    contrasts are one family; each horizon's verdicts.csv adjusts over its own contrasts
    instead, the same test in another family). Rows "horizon effect": per such contrast and
    pair of horizons, the paired difference (longer − shorter) of its per-seed differences on
    the seeds both ran, with its 95% t-interval and its two-sided p Holm-adjusted over every
    pair (`p_effect`); `depends_on_horizon` only where that p is below 0.05 (then the interval
    excludes 0 too)."""
    order = sorted(plans, key=lambda h: plans[h]["steps"][plans[h]["reference"]])
    reference = {plans[h]["reference"] for h in order}
    if len(reference) != 1:
        raise ValueError(f"the horizons have different references {sorted(reference)}")
    reference = reference.pop()
    shared = [a for a in plans[order[0]]["methods"] if a != reference
              and all(a in plans[h]["methods"] for h in order)]
    per_seed, rows = {}, []
    for h in order:
        s, task = summaries[h], plans[h]["task"]
        margin = plans[h]["margins"][task]["margin"]
        ref = s[s["method"] == reference].set_index("seed")
        for arm in shared:
            x = s[s["method"] == arm].set_index("seed")
            seeds = sorted(set(x.index) & set(ref.index))
            d = (x.loc[seeds, "eval_accuracy"] - ref.loc[seeds, "eval_accuracy"]).astype(float)
            per_seed[h, arm] = d
            mean, lo, hi = t_interval(d)
            share, share_lo, share_hi = fieller(
                (x.loc[seeds, "eval_accuracy"] - x.loc[seeds, "base_accuracy"]).astype(float),
                (ref.loc[seeds, "eval_accuracy"] - ref.loc[seeds, "base_accuracy"]).astype(float))
            rows.append({"statistic": "mean", "horizon": h, "steps": plans[h]["steps"][arm],
                         "method": arm, "reference": reference, "task": task,
                         "seeds": len(d), "diff_mean": mean, "diff_lo": lo, "diff_hi": hi,
                         "margin": margin, **contrast_tests(d.to_numpy(), margin),
                         "gain_share": share, "gain_share_lo": share_lo,
                         "gain_share_hi": share_hi})
    effects = []
    for arm in shared:
        for i, short in enumerate(order):
            for long in order[i + 1:]:
                a, b = per_seed[long, arm], per_seed[short, arm]
                seeds = sorted(set(a.index) & set(b.index))
                d = (a.loc[seeds] - b.loc[seeds]).to_numpy()
                mean, lo, hi = t_interval(d) if len(seeds) > 1 else (math.nan,) * 3
                effects.append({"statistic": "horizon effect", "horizon": f"{long} - {short}",
                                "method": arm, "reference": reference, "seeds": len(seeds),
                                "diff_mean": mean, "diff_lo": lo, "diff_hi": hi,
                                "p_effect": contrast_tests(d, 0.0)["p_diff"]})
    for e, p in zip(effects, holm([e["p_effect"] for e in effects])):
        e |= {"p_effect": p, "depends_on_horizon": bool(p < 0.05)}
    return with_calls(pd.DataFrame(rows + effects))
