"""The report's sections on how the runs behaved and on the opt-in targets: KL calibration, step
control, update cosine, stability (the default target's and `snakemake stability`'s), sync,
the lr sweep, scaling, the ablations, TRL and the study."""
from __future__ import annotations

import pandas as pd

from logra.analysis.markdown import (SYNC_INTRO, ReportInputs, _accuracy_memory_section,
                                     _accuracy_section, _cost_section, _fmt,
                                     _memory_sweep_section, _metric_name, _pm, _section,
                                     _sync_section, _verdicts_section, amended_lines,
                                     markdown_table)
from logra.analysis.stability import criterion_text
from logra.analysis.tables import accuracy_table


def _kl_calibration(inputs: ReportInputs) -> list[str]:
    ok = inputs.ok
    out = []
    etas = (("eta_1", "η = 1"), ("eta_below_1", "η < 1"), ("eta_above_1", "η > 1"))
    columns = [f"kl_{eta}_{k}" for eta, _ in etas for k in ("steps", "median", "p10", "p90")]
    steps = ok.reindex(columns=[c for c in columns if c.endswith("_steps")]).apply(pd.to_numeric)
    calibrated = ok[(steps.fillna(0) > 0).any(axis=1)]  # runs with KL control
    if len(calibrated):
        cal = calibrated[["task", "method"]].join(
            calibrated.reindex(columns=columns).apply(pd.to_numeric)).groupby(
            ["task", "method"], as_index=False).median()
        out += _section("KL calibration", "results/summary.csv", "Realized KL on the probe's "
                        "held-out half / the KL predicted on its other half "
                        "(logra/optim/kl_control.py), at steps with η = 1 (the prediction is K₁), η < 1 and η > 1 (η²·K₁; "
                        "LoGRA's α reaches alpha_max): per run the median [p10, p90] over its "
                        "steps; shown, the median over seeds.",
                        {"task": cal["task"], "method": cal["method"], **{
                            f"{label}: steps": cal[f"kl_{eta}_steps"].fillna(0).astype(int)
                            for eta, label in etas},
                         **{f"{label}: ratio": [f"{m} [{lo}, {hi}]" for m, lo, hi in zip(
                             *(_fmt(cal[f"kl_{eta}_{k}"], ".2f") for k in ("median", "p10",
                                                                          "p90")))]
                            for eta, label in etas}})
    return out


def _step_control(inputs: ReportInputs) -> list[str]:
    """The step's control: how often at its cap, and what it costs."""
    ok = inputs.ok
    out = []
    controlled = ok[ok.reindex(columns=["control"])["control"].notna()]
    if len(controlled):
        c = controlled.groupby(["task", "method", "control"], as_index=False).agg(
            at_cap=("steps_at_cap_share", "mean"), seconds=("control_seconds", "mean"),
            step=("mean_step_time_s", "mean"))
        out += _section("Step control", "results/summary.csv", "Per method with a control of "
                        "its step (LoGRA's BudgetControl, the config's KLControl): the share of "
                        "steps whose scale it set at its cap (LoGRA: alpha_max), and its mean "
                        "seconds per step beside the mean step time (both without the profiled "
                        "steps); means over seeds.",
                        {"task": c["task"], "method": c["method"], "control": c["control"],
                         "at cap": _fmt(c["at_cap"], ".0%"),
                         "control s/step": _fmt(c["seconds"], ".3f"),
                         "step s": _fmt(c["step"], ".3f"),
                         "control share": _fmt(c["seconds"] / c["step"], ".0%")})
    return out


def _update_cosine(inputs: ReportInputs) -> list[str]:
    ok = inputs.ok
    out = []
    cosines = ok[ok.reindex(columns=["update_cosine"])["update_cosine"].notna()]
    if len(cosines):
        c = cosines.groupby(["task", "method"], as_index=False).agg(
            step=("cosine_step", "first"), mean=("update_cosine", "mean"),
            lo=("update_cosine", "min"), hi=("update_cosine", "max"), n=("seed", "nunique"))
        out += _section("Update vs gradient", "results/summary.csv", "At one step "
                        "(`grpo.cosine_step`), the cosine between the applied change of the "
                        "trained weights and the negative dense gradient of the same batch: "
                        "mean [min, max] over seeds.",
                        {"task": c["task"], "method": c["method"],
                         "step": _fmt(c["step"], ".0f"),
                         "cosine": [f"{m} [{lo}, {hi}]" for m, lo, hi in zip(
                             _fmt(c["mean"]), _fmt(c["lo"]), _fmt(c["hi"]))], "seeds": c["n"]})
    return out


def _stability(inputs: ReportInputs) -> list[str]:
    if inputs.stability is None:
        return []
    t, criterion = inputs.stability
    out = _stability_section(t, criterion, "Stability", "results/stability.csv",
                             "figures/stability_27b")
    for name, (title, figure) in STABILITY_OPT_IN.items():
        if (inputs.stability_opt_in or {}).get(name) is not None:
            out += _stability_section(inputs.stability_opt_in[name], criterion, title,
                                      f"results/{name}.csv", figure)
    if not inputs.stability_opt_in:
        out += ["", "`snakemake stability` has not run (it writes "
                + " and ".join(f"`results/{n}.csv`" for n in STABILITY_OPT_IN)
                + "; the next report includes them)."]
    return out


# `snakemake stability`'s tables: {name: (section title, figure)}
STABILITY_OPT_IN = {
    "stability_seeds": ("Stability: the long runs", "figures/stability_27b_seeds"),
    "stability_controller": ("Stability: the controller ablation",
                             "figures/stability_controller")}


def _stability_section(t: pd.DataFrame, criterion: dict, title: str, source: str,
                       figure: str) -> list[str]:
    metric = _metric_name(t["metric"].iloc[0])
    return _section(title, source,
                    "Each stability run against the criterion declared in the config "
                    f"(stability.criterion; {figure}): "
                    + criterion_text(criterion).format(metric=metric)
                    + f". Held-out: {metric} on the test split at the SFT base, the curve's "
                    "best and the last point; `worst vs base` and `last − best` with their "
                    "paired 95% intervals; `entropy`: the lowest exact token entropy over the "
                    "points as a multiple of the base's; `KL to base`: at the last point "
                    "(nats/token); `spikes`: steps whose batch KL spiked / steps judged; "
                    "`KL real/pred`: the probe's realized over predicted KL, median over steps "
                    "(a diagnostic of the controller's calibration, not a clause).",
                    {"method": t["method"], "seed": t["seed"], "steps": t["steps"],
                     "status": t["status"],
                     "base → best → last": [f"{a:.3f} → {b:.3f} (step {s}) → {c:.3f}"
                                            for a, b, s, c in zip(
                                                t["metric_base"], t["metric_best"],
                                                t["best_step"], t["metric_last"])],
                     "worst vs base [95%]": _interval(t, "vs_base_worst"),
                     "last − best [95%]": _interval(t, "last_vs_best"),
                     "entropy": _fmt(t["entropy_ratio_min"], ".2f"),
                     "pass@k last − best": _interval(t, "pass_last_vs_best"),
                     "KL to base": _fmt(t["kl_to_base_last"], ".3g"),
                     "spikes": [f"{a}/{b}" for a, b in zip(t["spikes"],
                                                           t["spike_judged_steps"])],
                     "KL real/pred": _fmt(t["kl_calibration"], ".2f"),
                     "stable": t["stable"].map({True: "yes", False: "no"}),
                     "why": t["why"]})


def _interval(t: pd.DataFrame, column: str) -> list[str]:
    """Column `column` with its `_lo`/`_hi` as "+d [+lo, +hi]" per row."""
    return [f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for d, lo, hi in zip(
        t[column], t[f"{column}_lo"], t[f"{column}_hi"])]


def _sync(inputs: ReportInputs) -> list[str]:
    ok, reference, sync_regime = inputs.ok, inputs.reference, inputs.sync_regime
    out = []
    out += _sync_section(ok, reference, "Sync", "results/summary.csv", SYNC_INTRO)
    if sync_regime is not None:
        for regime, d in sync_regime.groupby("regime", sort=False):
            delta = d.loc[d["sync_transport"] == "delta", "method"]
            per_method = d.groupby("method", sort=False).agg(
                option=("step_size_option", "first"), value=("step_size", "first"),
                ratio=("lr_over_w", "mean"))
            lrs = ", ".join(f"{m} {r.option} {r.value:g}" + (
                f" (lr/median|w| {r.ratio:.3g})" if pd.notna(r.ratio) else "")
                for m, r in per_method.iterrows())
            medians = "/".join(_fmt(d["base_median_abs_weight"].unique(), ".4g"))
            dtype = "/".join(sorted(set(d["rollout_dtype"])))
            out += _sync_section(
                d, delta.iloc[0] if len(delta) else None, f"Sync regime: {regime}",
                "results/sync_regime.csv", f"`snakemake sync_regime`, {d['task'].iloc[0]}, "
                f"{d['seed'].nunique()} seed(s), a {dtype} engine; median |w| of the base, "
                f"measured: {medians}; {lrs}. Columns as in Sync.")
    else:
        out += ["", "The sync regime runs have not run (`snakemake sync_regime` writes "
                "`results/sync_regime.csv`; the next report includes it)."]
    return out


def _lr_sweep(inputs: ReportInputs) -> list[str]:
    lr_sweep = inputs.lr_sweep
    out = []
    if lr_sweep is not None:
        chosen = lr_sweep[lr_sweep["chosen"]]
        added = (~lr_sweep["declared"]).groupby([lr_sweep["task"], lr_sweep["method"]]).sum()
        out += _section("lr sweep", "results/lr_sweep.csv", "The point (an lr; LoGRA's KL "
                        "budget) with the best mean validation accuracy, by "
                        f"{_metric_name(chosen['metric'].iloc[0])}, per task and method, out "
                        "of `budget` points run: the declared grid, spaced alike in step size, "
                        "and the points the bracket rule added beyond an edge that held the "
                        "best point (`added`, up to lr_sweep.extend); `bracketed`: the choice "
                        "lies inside the points run (else its number is a bound); `at cap`: "
                        "the share of its steps its control held at its cap (LoGRA: "
                        "alpha_max). The choices: results/tuned.yaml.",
                        {"task": chosen["task"], "method": chosen["method"],
                         "option": chosen["option"], "point": _fmt(chosen["lr"], "g"),
                         "budget": chosen["budget"],
                         "added": [added[t, m] for t, m in zip(chosen["task"], chosen["method"])],
                         "bracketed": chosen["bracketed"].map({True: "yes", False: "no"}),
                         "at cap": _fmt(chosen["at_cap_share"], ".0%"),
                         "validation accuracy": _pm(chosen["val_accuracy_mean"],
                                                    chosen["val_accuracy_sd"]),
                         "seeds": chosen["n_seeds"]})
    else:
        out += ["", "The lr sweep has not run (`snakemake lr_sweep` writes "
                "`results/lr_sweep.csv`; the next report includes it)."]
    return out


def _scaling(inputs: ReportInputs) -> list[str]:
    t = inputs.scaling
    if t is None:
        return ["", "The scaling comparison has not run (`snakemake scaling` writes "
                "`results/scaling.csv`; the next report includes it)."]
    m, trend = t[t["kind"] == "measured"], t[t["kind"] == "trend"]
    p, cost = t[t["kind"] == "prediction"], t[t["kind"] == "cost"].iloc[0]
    reference = t["reference"].dropna().iloc[0]
    out = _section("Scaling", "results/scaling.csv", "Each method against "
                   f"{reference} at each model size, tuned at the smallest (validation split) "
                   "and transferred (`scaling.transfer`): the mean over seeds of the paired "
                   "difference on the primary metric (test split) with its 95% t-interval and "
                   "call at the margin; the bases' mean (in the declared band?); the "
                   "reference's gain over its bases; measured ratios to the reference.",
                   {"size": m["size"], "parameters": _fmt(m["n_params"], ",.0f"),
                    "method": m["method"],
                    "difference [95%]": [f"{a:+.3f} [{lo:+.3f}, {hi:+.3f}]" for a, lo, hi in
                                         zip(m["diff_mean"], m["diff_lo"], m["diff_hi"])],
                    "call": m["call"],
                    "bases": [f"{b:.3f}" + ("" if ok else " (off band)")
                              for b, ok in zip(m["base_mean"], m["base_in_band"])],
                    "reference's gain": _fmt(m["ref_gain_mean"], "+.3f"),
                    "peak memory ratio": _fmt(m["memory_ratio"], ".2f"),
                    "step time ratio": _fmt(m["step_time_ratio"], ".2f")})
    tuning, check = t[t["kind"] == "tuning"], t[t["kind"] == "check"]
    out += ["", "Tuning (validation split) and the transfer's check:", ""]
    out += [f"- {r.method} at {r.size}: the sweep chose {r.option} {r.chosen_value:g}"
            + (" (on its grid's edge)" if r.on_edge else "") + f"; the config adopted "
            f"{r.adopted_value:g}" for r in tuning.itertuples()]
    out += [f"- {r.method} at {r.size}: of the transferred {r.option} times each factor, x"
            f"{r.chosen_factor:g} scored best ({r.validation_by_point})"
            for r in check.itertuples()]
    out += ["", "The trend: the least-squares slope of each size's mean difference against "
            "log10(parameters), with its 95% t-interval (the size is the unit: df = sizes - 2):",
            ""]
    out += [f"- {r.method}: {r.slope_per_decade:+.4f} [{r.slope_lo:+.4f}, {r.slope_hi:+.4f}] "
            f"per decade of parameters ({r.sizes:.0f} sizes, df {r.df:.0f}): {r.call}"
            for r in trend.itertuples()]
    if len(p):
        out += ["", "The planner's memory ratio to " + reference + " continued to the hub "
                "models' sizes (PREDICTIONS, the planner's setting): " + "; ".join(
                    f"{r.method} at {r.size} {r.memory_ratio:.2f}" for r in p.itertuples())
                + "."]
    out += ["", f"CPU time: {cost['cpu_hours']:.2f} h over {cost['jobs']:.0f} jobs, against a "
            f"cap of {cost['cap_hours']:g} h ({'within' if cost['within_cap'] else 'OVER'} "
            "it). A 30x span of character-level models does not speak for 1.5B-27B "
            "accuracy."]
    return out


def _ablations(inputs: ReportInputs) -> list[str]:
    ablations, reference = inputs.ablations, inputs.reference
    out = []
    if ablations is not None:
        a, where = ablations, "results/ablations"
        out += _accuracy_section(a["accuracy"], "Ablations: accuracy", f"{where}/accuracy.csv")
        if a.get("verdicts") is not None:
            out += _verdicts_section(a["verdicts"], "Ablations: verdicts",
                                     f"{where}/verdicts.csv")
        out += _cost_section(a["summary"], reference, "Ablations: measured cost",
                             f"{where}/summary.csv")
        if a.get("sweep") is not None:
            out += _memory_sweep_section(a["sweep"], "Ablations: memory sweep",
                                         f"{where}/memory_sweep.csv")
        out += _sync_section(a["summary"][a["summary"]["status"] == "ok"], reference,
                             "Ablations: sync", f"{where}/summary.csv", SYNC_INTRO)
    else:
        out += ["", "The ablations have not run (`snakemake ablations` writes "
                "`results/ablations/`; the next report includes them)."]
    return out


def _trl(inputs: ReportInputs) -> list[str]:
    trl = inputs.trl
    out = []
    if trl:
        rows = [(r, m) for r in trl for m in ("logra", "adamw")]
        out += _section("LoGRA in TRL", "results/trl/", "TRL's GRPOTrainer (generation by the "
                        "training model, no vLLM) from each task's seed-0 SFT base, with "
                        "`logra.LoGRAOptimizer` and with TRL's default AdamW "
                        "(logra/harness/trl_grpo.py): the measured peak of one update step (a "
                        "step without generation), the mean reward of the rollouts of the first "
                        "and the last steps, and LoGRA's mean α and share of steps at alpha_max "
                        "(its predicted-KL controller).",
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
                                 _fmt([r[m]["reward_last"] for r, m in rows]))],
                         "mean α": _fmt([r[m].get("alpha_mean") for r, m in rows], ".3g"),
                         "at alpha_max": _fmt([r[m].get("steps_at_alpha_max_share")
                                               for r, m in rows], ".0%")})
    else:
        out += ["", "LoGRA in TRL has not run (`snakemake trl` writes `results/trl/*.json`; the "
                "next report includes them)."]
    return out


def _spectrum_section(summary: pd.DataFrame, spectrum: pd.DataFrame, where: str,
                      title: str) -> list[str]:
    """Per arm, the update's spectrum (logra/measure/spectrum.py): each run's mean over the
    target matrices it changed, then the mean over its seeds; nothing where it was not
    measured (a study without a LoGRA arm)."""
    if "update_stable_rank" not in summary.columns or not len(spectrum):
        return []
    arms = summary.groupby("method", sort=False)
    return _section(title, f"{where}/spectrum.csv", "Is the RL update "
                    "low-rank here? Per arm, each target matrix's final − base weights: the "
                    "stable rank (the rank its energy spreads over), the share of its energy in "
                    f"its top {int(spectrum['rank'].iloc[0])} singular values (LoGRA's rank) and "
                    "the fewest singular values that hold 90% of it; each run's mean over the "
                    "matrices it changed, then the mean over seeds (their paired differences: "
                    "the secondary endpoints below).",
                    {"arm": list(arms.groups),
                     "stable rank": _fmt(arms["update_stable_rank"].mean(), ".1f"),
                     "energy in top r": _fmt(arms["update_energy_top_r"].mean(), ".3f"),
                     "rank for 90%": _fmt(arms["update_rank_90"].mean(), ".1f"),
                     "matrix size (min)": _fmt([spectrum[spectrum["method"] == a][
                         ["rows", "cols"]].min(axis=1).median() for a in arms.groups], ".0f"),
                     "seeds": arms["seed"].nunique().tolist()})


def _study(inputs: ReportInputs) -> list[str]:
    study = inputs.study
    if study is None:
        return ["", "The study has not run (`snakemake study` writes `results/study/`; the next "
                "report includes it)."]
    out = []
    for h, tables in study["horizons"].items():
        out += _study_horizon(h, tables)
    return out + _horizons_section(study["across"])


def _study_horizon(h: str, study: dict) -> list[str]:
    """One horizon's sections: its plan, verdicts, accuracy and memory, spectrum, secondary
    endpoints (results/study/<horizon>/)."""
    plan, v, where = study["plan"], study["verdicts"], f"results/study/{h}"
    arms, rule = plan["arms"], plan["seeds_rule"]
    last, needed = max(v["step"]), rule["needed"]
    need = ("unknown (fewer than two validation seeds)" if needed != needed else
            f"{needed:g}" + (f", above the cap of {rule['max']}" if rule["capped"] else ""))
    margin = plan["margins"][plan["task"]]
    out = _section(f"Study, {last} updates: the arms", f"{where}/analysis_plan.json, "
                   "results/study/tuned/", f"{', '.join(arms)} on {plan['task']}, {last} "
                   "updates each, every arm tuned at that horizon on the validation split "
                   f"(seeds {', '.join(map(str, rule['validation_seeds']))}) by the lr sweep's "
                   f"grid and bracket rule, then run on {rule['n']} test seeds (at least "
                   f"{rule['min']}, at most {rule['max']}): the most any contrast needs for a "
                   f"95% half-width of {rule['half_width']:g} at "
                   + (f"the {rule['sd_level']:g} upper confidence bound on "
                      if rule.get("sd_level") else "") + f"its validation spread is "
                   f"{need}. The plan was frozen before any test run; margin "
                   f"{margin['margin']:.3f} ({margin['source']}, the reference's chosen point "
                   f"at this horizon: {margin['val_gain_by_seed']}).",
                   {"arm": list(arms), "knob": [c["option"] for c in arms.values()],
                    "chosen": [f"{c['value']:g}" for c in arms.values()],
                    "bracketed": ["yes" if c["bracketed"] else "no (on an edge)"
                                  for c in arms.values()],
                    "validation accuracy": _fmt([c["val_accuracy"] for c in arms.values()]),
                    "chosen by": ["this run's grid" if not c.get("adopted") else
                                  "its grid, adopted (study.tuned)" for c in arms.values()]})
    out += ["", *amended_lines(plan)] if plan.get("amendments") else []
    out += ["", "Validation spread per contrast (sd of the per-seed differences and its upper "
            f"bound; the seeds it asks for; the 95% half-width {rule['n']} seeds give at each): "
            + "; ".join(f"{k}: {c['sd']:.4f}, {c.get('sd_upper', c['sd']):.4f}; "
                        f"{c['seeds_needed']}; " + ", ".join(
                            f"{x:.3f}" for x in (c.get("half_width_at_n") or {}).values())
                        for k, c in rule["contrasts"].items()) + "."]
    for step in sorted(set(v["step"]), reverse=True):
        what = "primary" if step == last else "secondary"
        out += _verdicts_section(v[v["step"] == step], f"Study, {last} updates: verdicts at "
                                 f"update {step} ({what})", f"{where}/verdicts.csv")
        rows = v[(v["step"] == step) & (v["statistic"] == "mean")]
        out += ["", "Half-widths of the 95% intervals (the plan aimed at "
                f"{rule['half_width']:g}): " + "; ".join(
                    f"{r.method} − {r.reference} {r.half_width:.3f}" for r in rows.itertuples())
                + "."]
    out += _accuracy_memory_section(accuracy_table(study["summary"]), plan["reference"], None,
                                    f"Study, {last} updates: accuracy and memory",
                                    f"{where}/summary.csv")
    out += _spectrum_section(study["summary"], study["spectrum"], where,
                             f"Study, {last} updates: the update's spectrum")
    s = study["secondary"]
    out += _section(f"Study, {last} updates: secondary endpoints", f"{where}/secondary.csv",
                    "Per contrast, the mean of the per-seed paired differences of each "
                    "secondary metric with its 95% t-interval, not adjusted for multiplicity "
                    "(descriptive), the plan's declared ones first in its order ("
                    + ", ".join(plan["endpoints"].get("secondary") or []) + "): every other "
                    "protocol's accuracy and pass@k at the last update (`eval_`) and at the "
                    "snapshot (`step<N>_`), token entropy on the runs' own samples, the update's "
                    "spectrum, the update cosine and the measured peak (bytes).",
                    {"contrast": [f"{a} − {b}" for a, b in zip(s["method"], s["against"])],
                     "metric": s["metric"], "first": _fmt(s["mean_a"], ".4g"),
                     "second": _fmt(s["mean_b"], ".4g"),
                     "difference [95%]": [f"{m} [{lo}, {hi}]" for m, lo, hi in zip(
                         *(_fmt(s[c], "+.4g") for c in ("diff_mean", "diff_lo", "diff_hi")))],
                     "seeds": s["seeds"]})
    return out + _study_stability_section(study.get("stability_contrasts"), where, last)


def _study_stability_section(t: pd.DataFrame | None, where: str, last: int) -> list[str]:
    """A horizon's stability_contrasts.csv, where it declares `stability`: each measure of the
    criterion per contrast with its paired interval, then each clause's passes per arm."""
    if t is None or not len(t):
        return []
    clause = t["measure"].str.endswith("_ok") | t["measure"].eq("stable")
    diff = [f"{m} [{lo}, {hi}]" for m, lo, hi in zip(
        *(_fmt(t[c], "+.4g") for c in ("diff_mean", "diff_lo", "diff_hi")))]
    return _section(
        f"Study, {last} updates: stability", f"{where}/stability_contrasts.csv",
        "Each test run judged by the stability criterion on its held-out curve "
        f"({where}/stability.csv; what each clause can and cannot show: docs/stability.md). "
        "Per contrast, each of the criterion's measures (the least entropy over the curve as "
        "a share of the base's, KL to the base at the last update, the share of steps whose "
        "batch KL spiked, pass@k and the primary metric at the last update minus their best): "
        "both arms' means and the mean of the per-seed differences with its 95% t-interval; "
        "then each clause's passes per arm. Descriptive, not adjusted.",
        {"contrast": [f"{a} − {b}" for a, b in zip(t["method"], t["against"])],
         "measure": t["measure"],
         "first": t["passed_a"].where(clause, _fmt(t["mean_a"], ".4g")),
         "second": t["passed_b"].where(clause, _fmt(t["mean_b"], ".4g")),
         "difference [95%]": pd.Series(diff).where(~clause, ""), "seeds": t["seeds"]})


def _horizons_section(t: pd.DataFrame | None) -> list[str]:
    """results/study/horizons.csv: each contrast every horizon runs, at each horizon with its
    answers Holm-adjusted over the horizons, then the horizon effects."""
    if t is None or not len(t):
        return []
    m, e = t[t["statistic"] == "mean"], t[t["statistic"] == "horizon effect"]

    def interval(r):
        return [f"{a} [{lo}, {hi}]" for a, lo, hi in zip(
            *(_fmt(r[c], "+.3f") for c in ("diff_mean", "diff_lo", "diff_hi")))]
    out = _section("Study: the horizons", "results/study/horizons.csv", "Each contrast every "
                   "horizon runs, at the last update of each (each horizon tuned, with its own "
                   "margin and seeds), its answers Holm-adjusted over the horizons; the share of "
                   "the reference's gain over its SFT bases with Fieller's 95% interval "
                   "(figure: `figures/study_horizons.png`).",
                   {"contrast": [f"{a} − {b}" for a, b in zip(m["method"], m["reference"])],
                    "updates": m["steps"].astype(int).tolist(),
                    "difference [95%]": interval(m),
                    "margin": _fmt(m["margin"], ".3f"), "calls (Holm)": m["calls"],
                    "share of gain [95%]": [f"{a} [{lo}, {hi}]" for a, lo, hi in zip(
                        *(_fmt(m[c], ".2f") for c in ("gain_share", "gain_share_lo",
                                                      "gain_share_hi")))],
                    "seeds": m["seeds"].tolist()})
    if len(e):
        out += ["", "The horizon effect: per contrast, the paired difference of its per-seed "
                "differences at two horizons (longer − shorter) on the seeds both ran, 95% "
                "t-interval, its two-sided p Holm-adjusted over every pair of horizons; the "
                "answer depends on the horizon only where that p is below 0.05.", "",
                markdown_table(pd.DataFrame({
                    "contrast": [f"{a} − {b}" for a, b in zip(e["method"], e["reference"])],
                    "horizons": e["horizon"], "effect [95%]": interval(e),
                    "p (Holm)": _fmt(e["p_effect"], ".3g"),
                    "depends on the horizon": ["yes" if x else "no"
                                               for x in e["depends_on_horizon"]],
                    "seeds": e["seeds"].tolist()}))]
    return out
