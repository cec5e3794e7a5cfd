"""The stability criterion (`stability.criterion`, declared in the config before any run),
applied to each stability run. It names no method and takes no number from one method's
settings: any run meets or fails it for the same reasons.

A run is stable when all four clauses hold: `ended` (it ended `ok`, not diverged or out of
memory); `held_out` (its held-out primary metric is at no point below the SFT base's by more
than `held_out.base_drop`, and at the last point within `held_out.peak_drop` of the curve's
best); `collapse` (the token entropy of its own samples stays at least
`collapse.entropy_fraction` of the base's, and its last pass@k within `collapse.pass_drop` of
its best); `spikes` (its per-step KL exceeds `spikes.factor` times the median of the steps
before it on at most a `spikes.share` of the steps). A fall is found where the data show it:
the 95% paired t-interval over the test problems lies wholly below −bound. The probe's realized
KL against the controller's prediction is a diagnostic (`kl_calibration`), not a clause.
Each clause in full: docs/stability.md.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from logra.analysis.verdict import paired_difference, t_interval

CLAUSES = ("ended", "held_out", "collapse", "spikes")


def criterion_text(criterion: dict) -> str:
    """The criterion in one sentence, as the figures' captions and the report state it."""
    h, c, s = criterion["held_out"], criterion["collapse"], criterion["spikes"]
    return (f"stable = ended ok; held-out {{metric}} never below the SFT base by more than "
            f"{h['base_drop']:g} and at the last point not below its best by more than "
            f"{h['peak_drop']:g}; exact token entropy ({c['prompts']} fixed prompts) >= "
            f"{c['entropy_fraction']:g} x the base's at every point and pass@k at the last "
            f"not below its best by more than {c['pass_drop']:g}; batch KL > {s['factor']:g} x "
            f"its trailing {s['window']}-step median on <= {s['share']:.0%} of steps (a fall: "
            "95% paired interval over problems wholly below -bound)")


def _fall(ref: dict[int, float], point: dict[int, float], what: str) -> tuple[float, float,
                                                                               float]:
    """(mean, lo, hi) of point − ref over the same problems (95% paired t-interval)."""
    return t_interval(paired_difference(point, ref, what))


def _held_out(points: dict[int, dict], h: dict) -> tuple[bool, dict, list[str]]:
    steps = sorted(points)
    if 0 not in points or len(steps) < 2:
        return False, {}, ["no held-out point after step 0"]
    acc = {s: points[s]["acc"] for s in steps}
    mean = {s: sum(v.values()) / len(v) for s, v in acc.items()}
    below = [(s, _fall(acc[0], acc[s], f"step {s} vs base")) for s in steps[1:]]
    worst_step, (d, lo, hi) = min(below, key=lambda x: x[1][0])
    best, last = max(steps, key=lambda s: mean[s]), steps[-1]
    pd_, plo, phi = _fall(acc[best], acc[last], "last vs best")
    why = []
    if any(b[2] < -h["base_drop"] for _, b in below):
        s, (bd, blo, bhi) = next((s, b) for s, b in below if b[2] < -h["base_drop"])
        why.append(f"below the base at step {s}: {bd:+.3f} [{blo:+.3f}, {bhi:+.3f}]")
    if phi < -h["peak_drop"]:
        why.append(f"last below the best (step {best}) by {pd_:+.3f} [{plo:+.3f}, {phi:+.3f}]")
    return not why, {
        "metric_base": mean[0], "metric_best": mean[best], "best_step": best,
        "metric_last": mean[last], "last_step": last, "vs_base_worst": d,
        "vs_base_worst_lo": lo, "vs_base_worst_hi": hi, "vs_base_worst_step": worst_step,
        "last_vs_best": pd_, "last_vs_best_lo": plo, "last_vs_best_hi": phi}, why


def _collapse(points: dict[int, dict], c: dict) -> tuple[bool, dict, list[str]]:
    steps = sorted(points)
    entropy = {s: points[s]["entropy"] for s in steps}
    ratio = {s: entropy[s] / entropy[0] if entropy[0] > 0 else math.nan for s in steps[1:]}
    passes = {s: points[s]["pass"] for s in steps}
    mean = {s: sum(v.values()) / len(v) for s, v in passes.items()}
    best, last = max(steps, key=lambda s: mean[s]), steps[-1]
    d, lo, hi = _fall(passes[best], passes[last], "pass@k last vs best")
    why = [f"entropy {ratio[s]:.2f} x the base's at step {s}" for s in steps[1:]
           if not ratio[s] >= c["entropy_fraction"]][:1]
    if hi < -c["pass_drop"]:
        why.append(f"pass@k at the last below its best (step {best}) by {d:+.3f} "
                   f"[{lo:+.3f}, {hi:+.3f}]")
    return not why, {
        "entropy_base": entropy[0], "entropy_last": entropy[last],
        "entropy_ratio_min": min(ratio.values(), default=math.nan),
        "kl_to_base_last": points[last]["kl_to_base"], "pass_best": mean[best],
        "pass_last": mean[last], "pass_last_vs_best": d, "pass_last_vs_best_lo": lo,
        "pass_last_vs_best_hi": hi}, why


def spikes(kl: pd.Series, s: dict) -> tuple[pd.Series, pd.Series]:
    """(spiked, judged), per step of `kl` (in step order): a step is judged when at least
    `min_history` steps precede it and their median is positive (a stretch of steps that did
    not move the policy gives no scale), and spikes when its KL exceeds `factor` x the median
    of the (up to) `window` steps before it. A non-finite KL is no spike and no history: it is
    `judge`'s to report."""
    kl = kl.astype(float).where(np.isfinite(kl.astype(float)))
    median = kl.shift(1).rolling(s["window"], min_periods=s["min_history"]).median()
    judged = (median > 0) & kl.notna()
    return judged & (kl > s["factor"] * median), judged


def judge(summary: dict, metrics: pd.DataFrame, points: dict[int, dict],
          criterion: dict) -> dict:
    """One run against the criterion. `points`: {step: {"acc": {doc_id: score}, "pass":
    {doc_id: 0/1}, "entropy", "kl_to_base"}} at each evaluated step (0 = the SFT base).
    Returns each clause's measurements, whether it holds (`<clause>_ok`), `stable` (all four),
    `decided_by` (the clauses that failed) and `why` (what each found)."""
    ended = summary["status"] == "ok"
    why = {"ended": [] if ended else [
        f"{summary['status']} at step "
        f"{summary.get('diverged_at_step') or summary.get('oom_at_step')}"]}
    held, held_m, why["held_out"] = _held_out(points, criterion["held_out"])
    if 0 in points and len(points) > 1:
        collapse, collapse_m, why["collapse"] = _collapse(points, criterion["collapse"])
    else:
        collapse, collapse_m, why["collapse"] = False, {}, ["no point after step 0"]
    spiked, judged = (int(x.sum()) for x in spikes(metrics["kl_batch"], criterion["spikes"]))
    share = spiked / judged if judged else math.nan
    bad = [int(i) + 1 for i in np.flatnonzero(~np.isfinite(metrics["kl_batch"].astype(float)))]
    calm = judged > 0 and share <= criterion["spikes"]["share"] and not bad
    why["spikes"] = ([] if judged > 0 and share <= criterion["spikes"]["share"] else [
        f"batch KL spiked on {spiked} of {judged} judged steps ({share:.1%})" if judged else
        f"no step with {criterion['spikes']['min_history']} steps before it"]) + ([
        f"batch KL not finite at {len(bad)} steps (metrics.csv rows {bad[:5]}), not judged"]
        if bad else [])
    ok = {"ended": ended, "held_out": held, "collapse": collapse, "spikes": calm}
    ratio = metrics["kl_real"].astype(float) / metrics["kl_pred"].astype(float)
    ratio = ratio[(metrics["kl_pred"].astype(float) > 0) & ratio.notna()]
    failed = [c for c in CLAUSES if not ok[c]]
    return ({f"{c}_ok": ok[c] for c in CLAUSES} | held_m | collapse_m | {
        "spikes": spiked, "spike_judged_steps": judged, "spike_share": share,
        "kl_batch_non_finite": len(bad),
        "kl_batch_median": float(metrics["kl_batch"].median()),
        "kl_batch_max": float(metrics["kl_batch"].max()),
        # the diagnostic: realized over predicted KL on the probe (steps with a prediction)
        "kl_calibration": float(ratio.median()) if len(ratio) else math.nan,
        "kl_real_max": float(metrics["kl_real"].max()),
        "stable": not failed, "decided_by": ", ".join(failed) or "all hold",
        "why": "; ".join(f"{c}: {w}" for c in failed for w in why[c]) or "all four hold"})


def read_points(path: str | Path) -> tuple[str, dict[int, dict]]:
    """(primary metric, points) of a results/stability/ curve (workflow/scripts/
    stability_eval.py), in `judge`'s form."""
    c = json.loads(Path(path).read_text())
    return c["primary"], {
        p["step"]: {"acc": {int(k): v for k, v in p["per_problem"].items()},
                    "pass": {int(k): v for k, v in p["per_problem_pass"].items()},
                    "entropy": p["entropy"], "kl_to_base": p["kl_to_base"]}
        for p in c["points"]}


def stability_table(summaries: list, metrics: list, curves: list,
                    criterion: dict) -> pd.DataFrame:
    """One row per stability run (paths of its summary.json, metrics.csv and
    results/stability/ curve, in the same order): the run, its measured peak memory, and
    `judge`'s clauses and outcome."""
    rows = []
    for s_path, m_path, c_path in zip(summaries, metrics, curves, strict=True):
        s = json.loads(Path(s_path).read_text())
        primary, points = read_points(c_path)
        options = s["config"]["method"].get("options", {})
        rows.append({"task": s["task"], "method": s["method"], "seed": s["seed"],
                     "rule": s["config"]["method"]["rule"],
                     "controller": options.get("controller", s["control"] is not None),
                     "step_size": s["step_size"]["value"], "steps": s["steps"],
                     "status": s["status"], "metric": primary,
                     "peak_mem_bytes": s.get("peak_mem_bytes"), "device": s["device"],
                     "model": s["model"],
                     "n_params": s["n_params"]}
                    | judge(s, pd.read_csv(m_path), points, criterion))
    return pd.DataFrame(rows)


def outcome_text(table: pd.DataFrame) -> str:
    """Each run's outcome in a line: method seed: stable, or the clauses that decided it."""
    return "; ".join(f"{r.method} seed {r.seed}: " + ("stable" if r.stable else
                                                      f"not stable ({r.decided_by})")
                     for r in table.itertuples())
