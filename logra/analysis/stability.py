"""The stability criterion (`stability.criterion`, declared in the config before any run),
applied to each stability run.

A run is stable when all three hold:
1. it ended `ok` (not diverged by grpo's bounds, not out of memory); a run stopped by them
   fails here and its curves stop where it stopped;
2. its held-out primary metric (eval.primary on the test split, at each snapshot,
   `grpo.snapshot_every`, and at its last step) did not fall by more than `delta` from
   `from_step` to its last step: the upper end of the 95% paired t-interval of the drop,
   over the same test problems, is at most `delta` (a drop within the evaluation's noise of
   `delta` does not pass);
3. its realized KL per step (the loop's `kl_real`, on the probe half it did not train on)
   exceeds `kl_max` nats on at most a `kl_share` of its steps.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from logra.analysis.verdict import paired_difference, t_interval


def criterion_text(criterion: dict) -> str:
    """The criterion in one sentence, as the figures' captions and the report state it."""
    return (f"stable = ended ok; held-out {{metric}} fell from step {criterion['from_step']} "
            f"to the last by <= {criterion['delta']:g} (95% upper bound, paired over problems); "
            f"realized KL > {criterion['kl_max']:g} nats on <= {criterion['kl_share']:.0%} of "
            "steps")


def judge(summary: dict, metrics: pd.DataFrame, curve: dict[int, dict[int, float]],
          criterion: dict) -> dict:
    """One run against the criterion, `curve` its per-problem scores at each evaluated step
    ({step: {doc_id: score}}): each clause's measurement (the drop with its 95% interval),
    whether it holds, `stable` (all three) and `why` (the clauses that failed, named)."""
    frm, last = criterion["from_step"], max(curve)
    mean = {step: sum(v.values()) / len(v) for step, v in curve.items()}
    drop = lo = hi = math.nan
    if frm in curve and last > frm:
        drop, lo, hi = t_interval(paired_difference(curve[frm], curve[last], "held-out drop"))
    kl = metrics["kl_real"].astype(float)
    over = float((kl > criterion["kl_max"]).mean()) if len(kl) else math.nan
    ended_ok = summary["status"] == "ok"
    held = bool(not math.isnan(hi) and hi <= criterion["delta"])
    kl_ok = not math.isnan(over) and over <= criterion["kl_share"]
    why = [] if ended_ok else [f"{summary['status']} at step "
                               f"{summary.get('diverged_at_step') or summary.get('oom_at_step')}"]
    if not held:
        why.append(f"no held-out point at step {frm} and after it" if math.isnan(drop) else
                   f"held-out metric fell {drop:.3f} [{lo:.3f}, {hi:.3f}] from step {frm} "
                   f"(upper bound > {criterion['delta']:g})")
    if not kl_ok:
        why.append(f"realized KL > {criterion['kl_max']:g} on {over:.0%} of steps")
    return {"ended_ok": ended_ok, "metric_from": mean.get(frm), "metric_last": mean[last],
            "last_step": last, "metric_drop": drop, "metric_drop_lo": lo,
            "metric_drop_hi": hi, "metric_held": held,
            "kl_over_share": over, "kl_max_real": float(kl.max()) if len(kl) else math.nan,
            "kl_ok": kl_ok, "stable": ended_ok and held and kl_ok,
            "why": "; ".join(why) or "all three hold"}


def stability_table(summaries: list, metrics: list, curves: list,
                    criterion: dict) -> pd.DataFrame:
    """One row per stability run (paths of its summary.json, metrics.csv and
    results/stability/ curve, in the same order): the run, its measured peak memory, and
    `judge`'s clauses and outcome."""
    rows = []
    for s_path, m_path, c_path in zip(summaries, metrics, curves, strict=True):
        s = json.loads(Path(s_path).read_text())
        c = json.loads(Path(c_path).read_text())
        curve = {p["step"]: {int(k): v for k, v in p["per_problem"].items()}
                 for p in c["points"]}
        options = s["config"]["method"].get("options", {})
        rows.append({"task": s["task"], "method": s["method"], "seed": s["seed"],
                     "rule": s["config"]["method"]["rule"],
                     "controller": options.get("controller", s["control"] is not None),
                     "step_size": s["step_size"]["value"], "steps": s["steps"],
                     "status": s["status"], "metric": c["primary"],
                     "peak_mem_bytes": s.get("peak_mem_bytes"), "device": s["device"],
                     "model": s["model"],
                     "n_params": s["n_params"]}
                    | judge(s, pd.read_csv(m_path), curve, criterion))
    return pd.DataFrame(rows)


def outcome_text(table: pd.DataFrame) -> str:
    """Each run's outcome in a line: method seed: stable, or why not."""
    return "; ".join(f"{r.method} seed {r.seed}: " + ("stable" if r.stable else
                                                      f"not stable ({r.why})")
                     for r in table.itertuples())
