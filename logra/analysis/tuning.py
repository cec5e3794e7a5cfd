"""Tuning on the validation split: each method's grid scored (`lr_sweep_table`), the bracket
rule that extends a grid whose best point lies on its edge (`next_window`), and the choices
written for the config to adopt (`choices`: results/tuned.yaml, results/scaling/tuned.yaml).

The bracket rule, declared in the config before any run (`lr_sweep.extend`): a grid whose best
validation point is its smallest or largest gains one point beyond that edge, at the grid's
spacing, and is scored again; this repeats while the best point is on an edge, up to `extend`
added points. A choice still on an edge then is reported as not bracketed (its method's
number is a bound: its best point may lie further out). The workflow runs the rule one round
at a time (workflow/rules/sweep.smk: a Snakemake checkpoint per round); only validation seeds
and the validation split enter it.

Successive halving (a study horizon's `halving: {keep: n}`, declared before its runs, for a
horizon too long to run every point on every seed): the first round scores the declared points
on the first validation seed; the n best of them (the smaller value on a tie) then run on every
seed, and the choice is the best of those over every seed. The bracket rule then applies to
that choice: a point it adds runs on every seed and joins them.
"""
from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

import pandas as pd
import yaml


def lr_sweep_table(run_jsons: list[str | Path], val_jsons: list[str | Path],
                   sweep: dict[str, tuple[str, float]], knobs: dict[str, str],
                   declared: Collection[str] | None = None) -> pd.DataFrame:
    """One row per (task, method, lr): `option`, what the point `lr` sets (`knobs[method]`:
    an lr, LoGRA's kl_budget), lm-eval accuracy (the primary metric, `metric`) on the task's
    validation split, final training reward (mean of the last 10 steps) and the share of
    steps its control held at its cap (`at_cap_share`; NaN without a control), mean ± sd over
    the seeds whose run finished ok,
    `chosen`: per task and method, the one lr with the best mean validation accuracy among
    the lrs scored on the most seeds (successive halving scores the others on one) whose
    every seed finished ok (the smaller lr on a tie; none if no lr qualifies),
    `budget`: the method's number of points run, `declared`: the point is one of its grid's
    declared points (`declared`, run names; default every point), not one the bracket rule
    added, `on_edge`: the choice is the smallest or largest point run (the optimum may lie
    outside), and `bracketed`, per task and method: a point was chosen, not on an edge.
    `val_jsons[i]` evaluates the run of `run_jsons[i]`. The test split is never used."""
    rows = []
    for run, val in zip(run_jsons, val_jsons, strict=True):
        s, v = json.loads(Path(run).read_text()), json.loads(Path(val).read_text())
        if Path(v["model_dir"]) != Path(run).parent / "model":
            raise ValueError(f"{val} evaluates {v['model_dir']}, not the model of {run}")
        method, lr = sweep[s["method"]]
        ok = s["status"] == "ok"
        rows.append({"task": s["task"], "method": method, "lr": lr, "seed": s["seed"],
                     "status": s["status"], "metric": v["primary"],
                     "declared": declared is None or s["method"] in declared,
                     "val_accuracy": v["accuracy"] if ok else float("nan"),
                     "final_reward": s["final_reward"] if ok else float("nan"),
                     "at_cap_share": (s.get("control") or {}).get("steps_at_cap_share")})
    out = pd.DataFrame(rows).groupby(["task", "method", "lr"]).agg(
        metric=("metric", "first"), val_accuracy_mean=("val_accuracy", "mean"),
        val_accuracy_sd=("val_accuracy", "std"),
        final_reward_mean=("final_reward", "mean"), final_reward_sd=("final_reward", "std"),
        at_cap_share=("at_cap_share", "mean"),
        n_ok=("val_accuracy", "count"), n_seeds=("seed", "nunique"),
        declared=("declared", "all")).reset_index()
    most = out.groupby(["task", "method"])["n_seeds"].transform("max")
    complete = out[(out["n_ok"] == out["n_seeds"]) & (out["n_seeds"] == most)]
    best = complete.groupby(["task", "method"])["val_accuracy_mean"].idxmax()
    out.insert(3, "option", out["method"].map(knobs))
    out["chosen"] = out.index.isin(best)
    lrs = out.groupby(["task", "method"])["lr"]
    out["budget"] = lrs.transform("size")
    out["on_edge"] = out["chosen"] & (out["lr"].eq(lrs.transform("min"))
                                      | out["lr"].eq(lrs.transform("max")))
    chosen = out[out["chosen"]].set_index(["task", "method"])["on_edge"]
    out["bracketed"] = [(t, m) in chosen.index and not chosen[t, m]
                        for t, m in zip(out["task"], out["method"])]
    return out


def next_window(window: tuple[int, int], declared: tuple[int, int], cap: int,
                chosen: int | None) -> tuple[int, int] | None:
    """The bracket rule's next window of a grid (points lo..hi, k steps from its anchor) whose
    best point is `chosen` (None: no point qualified), or None when the grid is done: its best
    point is inside, or it has added `cap` points beyond its `declared` window."""
    lo, hi = window
    if chosen is None or (declared[0] - lo) + (hi - declared[1]) >= cap:
        return None
    return (lo - 1, hi) if chosen == lo else (lo, hi + 1) if chosen == hi else None


def round_result(table: pd.DataFrame, task: str, method: str, values: dict[int, float],
                 window: tuple[int, int], declared: tuple[int, int], cap: int,
                 keep: list[int] | None = None, halving: int = 0) -> dict:
    """One round of the bracket rule on (task, method)'s grid (`values`: {k: point}), scored
    over `window` (`lr_sweep_table`'s rows): each point's mean validation accuracy, the choice
    and the window of the next round (None: the grid is done), as the round's JSON. Under
    successive halving (`halving` n, `keep` the points run on every seed; [] in the screen,
    the first round): the screen names the n best as the next round's `keep` over the same
    window; a later round chooses among `keep`, and a point the bracket rule adds joins it."""
    t = table[(table["task"] == task) & (table["method"] == method)]
    if sorted(t["lr"]) != sorted(values[k] for k in range(window[0], window[1] + 1)):
        raise ValueError(f"{task}/{method}: the scored points {sorted(t['lr'])} are not the "
                         f"window {window} of its grid")
    ks = {v: k for k, v in values.items()}
    best = t[t["chosen"]]
    chosen = float(best["lr"].iloc[0]) if len(best) else None
    k = ks.get(chosen)
    out = {"task": task, "method": method, "window": list(window),
           "scores": [[float(v), None if pd.isna(a) else float(a)]
                      for v, a in zip(t["lr"], t["val_accuracy_mean"])],
           "chosen": chosen, "bracketed": k is not None and k not in (window[0], window[1])}
    if keep is not None and not keep:  # the screen: the n best go on to every seed
        done = t[t["n_ok"] == t["n_seeds"]].sort_values(["val_accuracy_mean", "lr"],
                                                        ascending=[False, True])
        kept = sorted(ks[float(v)] for v in done["lr"].iloc[:halving])
        return out | {"keep": [], "screen": True,
                      "next": list(window) if kept else None, "next_keep": kept or None}
    nxt = next_window(window, declared, cap, k)
    if keep is None:
        return out | {"next": list(nxt) if nxt else None}
    added = [] if nxt is None else [nxt[0]] if nxt[0] < window[0] else [nxt[1]]
    return out | {"keep": list(keep), "next": list(nxt) if nxt else None,
                  "next_keep": sorted([*keep, *added]) if nxt else None}


def choices(table: pd.DataFrame, seeds: list[int]) -> dict[str, dict[str, dict]]:
    """Per task and method of a final tuning table (`lr_sweep_table`), its record: the chosen
    point of its knob (`option`, `value`), whether it is bracketed, the metric, the seeds and
    every point scored ([point, mean validation accuracy]); a method without a choice has
    none."""
    out: dict[str, dict[str, dict]] = {}
    for (task, method), t in table.groupby(["task", "method"], sort=False):
        best = t[t["chosen"]]
        if not len(best):
            continue
        out.setdefault(task, {})[method] = {
            "option": str(best["option"].iloc[0]), "value": float(best["lr"].iloc[0]),
            "bracketed": bool(best["bracketed"].iloc[0]), "metric": str(best["metric"].iloc[0]),
            "seeds": [int(s) for s in seeds],
            "scores": [[float(v), None if pd.isna(a) else round(float(a), 4)]
                       for v, a in zip(t["lr"], t["val_accuracy_mean"])]}
    return out


ADOPT = "# Adopt it: python -m logra.harness.adopt (config/tuned.yaml)\n"


def tuned_file(table: pd.DataFrame, seeds: list[int], source: str,
               adopted: dict | None = None) -> str:
    """results/tuned.yaml from the final lr sweep table: under `tuned`, per task and method,
    its record (`choices`), over the choices already `adopted` (the config's `tuned`: a sweep
    of some grids keeps the others'); adopted into config/tuned.yaml (logra.harness.adopt),
    the config takes each value (logra.harness.config.apply_tuned). A method without a choice
    keeps what was adopted for it."""
    tuned = {task: dict(chosen) for task, chosen in (adopted or {}).items()}
    for task, records in choices(table, seeds).items():
        tuned.setdefault(task, {}).update(records)
    head = (f"# Written by the lr_sweep target from {source}: per task and method, the point of "
            "its knob\n# with the best mean validation accuracy over the seeds, under the bracket "
            "rule (lr_sweep.extend);\n# the grids it did not run keep the choices the config had "
            "adopted.\n")
    return head + ADOPT + yaml.safe_dump({"tuned": tuned}, sort_keys=False, width=100)


def scaling_tuned_file(table: pd.DataFrame, seeds: list[int], source: str) -> str:
    """results/scaling/tuned.yaml from the scaling sweep's final table (one task, the first
    size): per method its record (`choices`), adopted as `scaling.tuned.<method>`."""
    records = {m: r for chosen in choices(table, seeds).values() for m, r in chosen.items()}
    head = (f"# Written by the scaling_sweep target from {source}: per method,\n# the point of "
            "its knob at the first size with the best mean validation accuracy over\n# the "
            "seeds, under the bracket rule.\n")
    return head + ADOPT + yaml.safe_dump(records, sort_keys=False, width=100)
