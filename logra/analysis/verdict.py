"""Verdicts: does a method keep the reference's accuracy? Paired comparisons with intervals.

Every accuracy here is the primary metric of the evaluations (`primary` in each evaluation JSON,
logra/harness/evaluate.py). A method's run and the reference's run of the same (task, seed)
share their prompts, seeds and evaluation problems, so each seed gives one paired difference
d_s = acc(method, s) − acc(reference, s), computed over the problems both evaluated. Per task and
method: `diff_mean` and its 95% t-interval over seeds; three answers at the task's margin δ
(`superiority`, `non_inferior`, `equivalent`), Holm-adjusted over the table's contrasts, in words
in `calls` and the non-inferiority answer as one word in `call`; the gate (did the reference gain
more than δ over its SFT base?); `gain_mean`, `gain_share`; power (`half_width`, `seeds_needed`).
Across tasks: the IQM of the paired differences, with a stratified bootstrap interval
(descriptive).

How each is computed, and why: docs/verdicts.md.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

CALLS = ("non-inferior", "inconclusive", "inferior")


def primary_of(eval_json: str | Path) -> str:
    """The primary protocol of one evaluation JSON."""
    return json.loads(Path(eval_json).read_text())["primary"]


def per_problem(eval_json: str | Path) -> dict[int, float]:
    """doc_id -> primary score (the mean over its samples) of one evaluation JSON
    (logra.harness.evaluate)."""
    e = json.loads(Path(eval_json).read_text())
    if not e["problems"]:
        raise ValueError(f"{eval_json}: no per-problem scores to pair on")
    return {p["doc_id"]: float(p[e["primary"]]["acc"]) for p in e["problems"]}


def paired_difference(a: dict[int, float], b: dict[int, float], what: str) -> np.ndarray:
    """Per-problem a − b over the same problems, in doc_id order; a problem missing on either
    side is an error."""
    if a.keys() != b.keys():
        raise ValueError(f"{what}: problems {sorted(b.keys() - a.keys())[:5]} missing on the "
                         f"first side, {sorted(a.keys() - b.keys())[:5]} on the second")
    return np.array([a[k] - b[k] for k in sorted(a)])


def t_quantile(q: float, df: int) -> float:
    """Student's t quantile. scipy is imported here, not at module level: the report's tables,
    which import this module, also run in benchmarks/gpu_check.py on a bare CUDA machine that has
    pandas but no scipy."""
    from scipy import stats
    return float(stats.t.ppf(q, df))


def t_interval(x, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi): the t-interval of the mean of `x` (df = len(x) − 1)."""
    x = np.asarray(x, dtype=float)
    mean = float(x.mean())
    if len(x) < 2:
        return mean, math.nan, math.nan
    half = t_quantile(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return mean, mean - half, mean + half


def paired_test(d) -> tuple[float, float]:
    """(mean, p): the one-sided paired t-test of mean(d) > 0 on per-problem differences `d`
    (t = mean / (sd / √n), df = n − 1). All differences equal: p is 0 if they are positive,
    else 1."""
    from scipy import stats
    d = np.asarray(d, dtype=float)
    mean, sd = float(d.mean()), float(d.std(ddof=1)) if len(d) > 1 else 0.0
    if sd == 0:
        return mean, 0.0 if mean > 0 else 1.0
    return mean, float(stats.t.sf(mean / (sd / math.sqrt(len(d))), len(d) - 1))


def holm(p: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values of a family of tests (NaN stays NaN and does not
    count): the k-th smallest of m becomes max over j ≤ k of min(1, (m − j + 1) · p_(j))."""
    finite = sorted((v, i) for i, v in enumerate(p) if not math.isnan(v))
    out, running = [math.nan] * len(p), 0.0
    for rank, (v, i) in enumerate(finite):
        running = max(running, min(1.0, (len(finite) - rank) * v))
        out[i] = running
    return out


def contrast_tests(d, margin: float) -> dict[str, float]:
    """The unadjusted p-values of one contrast's per-seed differences `d` (t-tests, df = seeds
    − 1): `p_diff` two-sided of a zero difference; `p_non_inferior` of d ≤ −margin;
    `p_inferior` of d ≥ −margin; `p_equivalent` TOST's, the larger of d ≤ −margin's and
    d ≥ margin's. NaN with fewer than two seeds."""
    d = np.asarray(d, dtype=float)
    if len(d) < 2:
        return dict.fromkeys(("p_diff", "p_non_inferior", "p_inferior", "p_equivalent"),
                             math.nan)
    above = paired_test(d + margin)[1]  # of d > −margin
    return {"p_diff": min(1.0, 2 * min(paired_test(d)[1], paired_test(-d)[1])),
            "p_non_inferior": above, "p_inferior": paired_test(-(d + margin))[1],
            "p_equivalent": max(above, paired_test(margin - d)[1])}


def fieller(a, b, level: float = 0.95) -> tuple[float, float, float]:
    """(mean(a) / mean(b), lo, hi): Fieller's interval for the ratio of the means of paired
    samples `a`, `b` (one pair per seed): every ρ for which the t-interval (df = n − 1) of
    a − ρ·b holds 0. Where b's mean is not clear of 0 at `level` the set is unbounded: NaN
    ends."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n = len(a)
    ratio = float(a.mean() / b.mean()) if b.mean() != 0 else math.nan
    if n < 2:
        return ratio, math.nan, math.nan
    t2 = t_quantile(0.5 + level / 2, n - 1) ** 2
    cov = np.cov(a, b, ddof=1) / n  # of the means
    qa = b.mean() ** 2 - t2 * cov[1, 1]  # (ā − ρ b̄)² ≤ t² var(ā − ρ b̄) as qa ρ² − 2 qb ρ + qc ≤ 0
    qb = a.mean() * b.mean() - t2 * cov[0, 1]
    qc = a.mean() ** 2 - t2 * cov[0, 0]
    if qa <= 0:
        return ratio, math.nan, math.nan
    root = math.sqrt(max(qb * qb - qa * qc, 0.0))
    return ratio, float((qb - root) / qa), float((qb + root) / qa)


def seeds_needed(d, margin: float, level: float = 0.95, power: float = 0.8) -> float:
    """The seeds a non-inferiority call needs at the spread and mean of the per-seed
    differences `d` and `margin`: the smallest n ≥ 2 with
    n ≥ ((t_(1+level)/2 + t_power) · sd / |mean + margin|)², t at df = n − 1. NaN with fewer
    than two seeds; inf when the mean sits on −margin."""
    d = np.asarray(d, dtype=float)
    if len(d) < 2:
        return math.nan
    sd, distance = float(d.std(ddof=1)), abs(float(d.mean()) + margin)
    if distance == 0:
        return math.inf
    # t quantiles exceed the normal's, so the normal count is a lower bound to start from
    from scipy import stats
    start = ((stats.norm.ppf(0.5 + level / 2) + stats.norm.ppf(power)) * sd / distance) ** 2
    if start > 100_000:
        return math.inf
    for n in range(max(2, math.floor(start)), 100_001):
        z = t_quantile(0.5 + level / 2, n - 1) + t_quantile(power, n - 1)
        if n >= (z * sd / distance) ** 2:
            return n
    return math.inf


def margin_table(ref_evals: dict[tuple[str, int], str | Path],
                 base_evals: dict[tuple[str, int], str | Path], tasks: list[str],
                 fraction: float, floor: float, lrs: dict[str, float]) -> pd.DataFrame:
    """results/margin.csv: per task, the non-inferiority margin fixed before any test
    evaluation: max(`floor`, `fraction` × the reference's mean gain over its SFT bases on the
    validation split), the gain per seed being the paired per-problem mean of the reference's
    validation run at its configured lr (`lrs`; at seeds that chose no lr) minus its seed's
    base. A task without them (not in lr_sweep.tasks, or the reference not swept) gets the
    floor. `ref_evals`, `base_evals`: (task, seed) -> validation evaluation JSON."""
    rows = []
    for task in tasks:
        seeds = sorted(s for t, s in ref_evals if t == task)
        gains = [float(paired_difference(per_problem(ref_evals[task, s]),
                                         per_problem(base_evals[task, s]),
                                         f"{task}/seed{s}: validation run vs its base").mean())
                 for s in seeds]
        gain = float(np.mean(gains)) if gains else math.nan
        margin = max(floor, fraction * gain) if gains else floor
        rows.append({
            "task": task, "margin": margin, "fraction": fraction, "floor": floor,
            "val_gain_mean": gain, "val_gain_by_seed": "; ".join(
                f"seed {s}: {g:+.4f}" for s, g in zip(seeds, gains)),
            "val_seeds": len(seeds), "lr": lrs.get(task, math.nan),
            "val_problems": len(per_problem(ref_evals[task, seeds[0]])) if seeds else 0,
            "metric": primary_of(ref_evals[task, seeds[0]]) if seeds else "",
            "source": (f"max(floor, {fraction:g} x the reference's mean validation gain over "
                       f"{len(seeds)} seed(s))" if gains
                       else "the floor: no validation runs of the reference on this task")})
    return pd.DataFrame(rows)


def analysis_plan(spec: dict, margins: pd.DataFrame) -> dict:
    """results/analysis_plan.json: what the test evaluations will be judged by, written before
    any of them runs. `spec`: the reference, methods, ablation methods, tasks, seeds, n_test,
    steps and method configs, the lr sweep's choices the config adopted (`tuned`: {task:
    {method: choice}}), and the config's `eval` and `verdict` sections; `margins`:
    `margin_table`'s rows."""
    ev, v = spec["eval"], spec["verdict"]
    return {
        "frozen": "before any test evaluation: every results/eval/ job waits for this file",
        "primary_metric": {"protocol": ev["primary"], **ev["protocols"][ev["primary"]],
                           "definition": "per problem the mean reward over its samples; a "
                                         "checkpoint's accuracy the mean over the test problems"},
        "other_metrics": {k: p for k, p in ev["protocols"].items() if k != ev["primary"]},
        **{k: spec[k] for k in ("reference", "methods", "ablation_methods", "tasks", "seeds",
                                "n_test", "steps", "method_config")},
        "tuned": spec.get("tuned", {}),
        "margins": {r["task"]: {k: r[k] for k in ("margin", "source", "val_gain_mean",
                                                  "val_gain_by_seed", "val_seeds",
                                                  "val_problems", "lr", "metric")}
                    for r in margins.to_dict("records")},
        "contrasts": [list(pair) for pair in v.get("contrasts", [])],
        "gate": {**v["gate"], "test": "did the reference gain more than the margin over its "
                 "SFT base on the mean over seeds: a one-sided t-test of the per-seed mean gains "
                 "minus the margin (each seed's own test, per problem, is reported beside it)"},
        "interval": "95% t-interval (df = seeds - 1) on the per-seed paired differences",
        "call": "three answers per contrast, each a t-test on the per-seed differences, "
                "Holm-adjusted over the contrasts of its table: better or worse (two-sided, "
                "5%), non-inferior at the margin (one-sided, 2.5%), equivalent within the "
                "margin (TOST, 2.5% each side); at one contrast the 95% interval's answers; "
                "reported whatever they say",
        "power": "seeds needed: the smallest n >= 2 with n >= ((t_0.975 + t_0.8) sd / "
                 "|mean + margin|)^2 at the observed per-seed spread and mean (df = n - 1)",
    }


def call(lo: float, hi: float, margin: float) -> str:
    """Non-inferiority at `margin`: the whole interval above −margin, wholly below, or neither."""
    if lo > -margin:
        return "non-inferior"
    if hi < -margin:
        return "inferior"
    return "inconclusive"


def iqm(x) -> float:
    """Interquartile mean: the mean after cutting int(n/4) values from each end (rliable's
    and scipy's `trim_mean(x, 0.25)` convention)."""
    x = np.sort(np.asarray(x, dtype=float))
    k = int(0.25 * len(x))
    return float(x[k:len(x) - k].mean())


def stratified_iqm_interval(diffs: dict[str, list[float]], resamples: int = 2000,
                            seed: int = 0) -> tuple[float, float, float]:
    """IQM of all per-(task, seed) differences and its percentile interval, resampling seeds
    with replacement within each task."""
    rng = np.random.default_rng(seed)
    groups = [np.asarray(v, dtype=float) for v in diffs.values()]
    boot = [iqm(np.concatenate([g[rng.integers(0, len(g), len(g))] for g in groups]))
            for _ in range(resamples)]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return iqm(np.concatenate(groups)), float(lo), float(hi)


def run_evals(runs: list[str], paths: list[str | Path]) -> dict[tuple[str, str, int], str | Path]:
    """{(task, method, seed): its evaluation} from `runs` ("task/method/seedN") and their
    evaluations in the same order. Each evaluation must be of its own run's model (its
    `model_dir` inside results/runs/<run>/, the saved model or a snapshot): one of another
    run's is an error that names both, so no two methods share a score."""
    out = {}
    for run, path in zip(runs, paths, strict=True):
        model = Path(json.loads(Path(path).read_text())["model_dir"]).as_posix()
        if f"runs/{run}/" not in model + "/":
            raise ValueError(f"{path} evaluates {model}, not a model of the run {run}")
        task, method, seed = run.split("/")
        out[task, method, int(seed.removeprefix("seed"))] = path
    return out


def verdicts(evals: dict[tuple[str, str, int], str | Path], bases: dict, reference: str,
             margins: dict[str, float], gate_alpha: float = 0.05,
             contrasts: list[tuple[str, str]] = ()) -> pd.DataFrame:
    """One row per (task, method other than `reference`), plus one per method across tasks,
    then the same for each of `contrasts` (method, against) whose two methods `evals` holds
    (`against` in the reference's place: its gain gates it), every contrast's answers
    Holm-adjusted over the table's (`with_calls`).

    `evals`: (task, method, seed) -> evaluation JSON; `bases`: task -> the SFT base's
    evaluation JSON, or (task, seed) -> one per seed; `margins`: task -> its margin
    (`margin_table`). Every evaluation must have the same primary metric."""
    methods = {m for _, m, _ in evals}
    pairs = [(m, a) for m, a in contrasts if {m, a} <= methods and a != reference]
    return with_calls(pd.concat(
        [_contrasts(evals, bases, reference, margins, gate_alpha)]
        + [_contrasts({k: v for k, v in evals.items() if k[1] in (m, a)}, bases, a, margins,
                      gate_alpha) for m, a in pairs], ignore_index=True))


def _contrasts(evals: dict, bases: dict, reference: str, margins: dict[str, float],
               gate_alpha: float) -> pd.DataFrame:
    """`verdicts`' rows of every method of `evals` against `reference`, before `with_calls`."""
    metrics = {primary_of(p) for p in [*evals.values(), *bases.values()]}
    if len(metrics) != 1:
        raise ValueError(f"evaluations with different primary metrics {sorted(metrics)}: "
                         "re-evaluate them under one eval.primary")
    metric = metrics.pop()
    scores = {key: per_problem(path) for key, path in evals.items()}
    base_scores = {key: per_problem(path) for key, path in bases.items()}
    tasks = sorted({t for t, _, _ in scores})
    methods = sorted({m for _, m, _ in scores} - {reference})
    missing = [t for t in tasks if t not in margins]
    if missing:
        raise ValueError(f"no margin for tasks {missing} (results/margin.csv)")
    rows, across = [], {}
    for method in methods:
        for task in tasks:
            seeds = sorted(s for t, m, s in scores if (t, m) == (task, method))
            ref_seeds = sorted(s for t, m, s in scores if (t, m) == (task, reference))
            if not seeds and not ref_seeds:
                raise ValueError(f"{task}: no evaluation of {method} or {reference}")
            if seeds != ref_seeds:
                raise ValueError(f"{task}: {method} has seeds {seeds}, {reference} has "
                                 f"{ref_seeds}: every seed needs both runs")
            base = [base_scores.get((task, s), base_scores.get(task)) for s in seeds]
            if any(b is None for b in base):
                raise ValueError(f"{task}: no SFT base evaluation for seeds "
                                 f"{[s for s, b in zip(seeds, base) if b is None]}")

            def diff(a, b, s, what):
                return paired_difference(a, b, f"{task}/seed{s}: {what}")
            d = [diff(scores[task, method, s], scores[task, reference, s], s,
                      f"{method} vs {reference}").mean() for s in seeds]
            gain = [diff(scores[task, method, s], b, s, f"{method} vs its base").mean()
                    for s, b in zip(seeds, base)]
            margin = margins[task]
            gain_ref = [diff(scores[task, reference, s], b, s, f"{reference} vs its base")
                        for s, b in zip(seeds, base)]
            gate = [(float(g.mean()), paired_test(g - margin)[1]) for g in gain_ref]
            passed = sum(p < gate_alpha for _, p in gate)
            gate_p = paired_test([g - margin for g, _ in gate])[1] if len(seeds) > 1 else 1.0
            mean, lo, hi = t_interval(d)
            g_mean, g_lo, g_hi = t_interval(gain)
            share, share_lo, share_hi = fieller(gain, [float(g.mean()) for g in gain_ref])
            across.setdefault(method, {})[task] = d
            rows.append({
                "task": task, "method": method, "reference": reference, "statistic": "mean",
                "metric": metric, "seeds": len(seeds),
                "problems": len(scores[task, method, seeds[0]]),
                "diff_mean": mean, "diff_lo": lo, "diff_hi": hi,
                "p_better": float(np.mean([1.0 if x > 0 else 0.5 if x == 0 else 0.0
                                           for x in d])),
                "margin": margin, **contrast_tests(d, margin),
                "diff_by_seed": "; ".join(f"seed {s}: {x:+.4f}" for s, x in zip(seeds, d)),
                "ref_gain_mean": float(np.mean([g for g, _ in gate])),
                "ref_gain_by_seed": "; ".join(f"seed {s}: {g:+.4f} (p {p:.3g})"
                                              for s, (g, p) in zip(seeds, gate)),
                "gate_passed": f"{passed}/{len(seeds)}", "gate_p": gate_p,
                "informative": bool(len(d) > 1 and gate_p < gate_alpha),
                "gain_mean": g_mean, "gain_lo": g_lo, "gain_hi": g_hi, "gain_share": share,
                "gain_share_lo": share_lo, "gain_share_hi": share_hi,
                "half_width": (hi - lo) / 2, "seeds_needed": seeds_needed(d, margin),
                "interval": "t (df = seeds - 1) on per-seed paired differences"})
        if len(tasks) > 1:
            mean, lo, hi = stratified_iqm_interval(across[method])
            rows.append({"task": "all", "method": method, "reference": reference,
                         "statistic": "IQM", "metric": metric,
                         "seeds": sum(len(v) for v in across[method].values()),
                         "diff_mean": mean, "diff_lo": lo, "diff_hi": hi,
                         "call": "none (descriptive interval)", "half_width": (hi - lo) / 2,
                         "interval": "IQM over tasks x seeds, stratified bootstrap over seeds"})
    return pd.DataFrame(rows)


def with_calls(table: pd.DataFrame) -> pd.DataFrame:
    """`table` (`verdicts`' rows) with each per-task contrast's p-values Holm-adjusted over the
    table's contrasts and its answers: `superiority`, `non_inferior`, `equivalent`, `call`,
    `calls` (docs/verdicts.md)."""
    table = table.copy()
    rows = table["statistic"] == "mean"
    for col in ("p_diff", "p_non_inferior", "p_inferior", "p_equivalent"):
        table.loc[rows, col] = holm(table.loc[rows, col].tolist())
    table["holm_contrasts"] = np.where(rows, int(rows.sum()), np.nan)
    answers = []
    for r in table[rows].itertuples():
        side = "better" if r.diff_mean > 0 else "worse"
        shown, ni, eq = r.p_diff < 0.05, r.p_non_inferior < 0.025, r.p_equivalent < 0.025
        answers.append({
            "superiority": side if shown else "not shown", "non_inferior": bool(ni),
            "equivalent": bool(eq),
            "call": "non-inferior" if ni else "inferior" if r.p_inferior < 0.025 else
            "inconclusive",
            "calls": f"{side}: {'yes' if shown else 'no'}; non-inferior at {r.margin:.3f}: "
                     f"{'yes' if ni else 'no'}; equivalent within ±{r.margin:.3f}: "
                     f"{'yes' if eq else 'no'}"})
    answers = pd.DataFrame(answers, index=table.index[rows])
    for col in answers:
        table[col] = answers[col].reindex(table.index).where(rows, table.get(col))
    return table


def coverage(interval: str, seeds: int = 3, problems: int = 1000, seed_sd: float = 0.02,
             accuracy: float = 0.45, effect: float = -0.01, sims: int = 2000,
             seed: int = 0) -> float:
    """Share of `sims` simulated default designs whose 95% interval (`"t"`: the t-interval on
    per-seed differences; `"bootstrap"`: a percentile bootstrap resampling seeds, then problems
    within them) contains the true mean difference `effect`. Each seed draws its own true
    effect (sd `seed_sd`) and its own reference accuracy (sd `seed_sd`); problems are scored
    0/1 with those rates, the method's and the reference's correct answers drawn independently
    given the rates."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(sims):
        p_ref = np.clip(accuracy + rng.normal(0, seed_sd, seeds), 0.01, 0.99)
        p_m = np.clip(p_ref + effect + rng.normal(0, seed_sd, seeds), 0.01, 0.99)
        ref = rng.random((seeds, problems)) < p_ref[:, None]
        m = rng.random((seeds, problems)) < p_m[:, None]
        per_problem_d = m.astype(float) - ref
        if interval == "t":
            _, lo, hi = t_interval(per_problem_d.mean(1))
        elif interval == "bootstrap":
            boot = []
            for _ in range(200):
                s = rng.integers(0, seeds, seeds)
                rows = per_problem_d[s]
                cols = rng.integers(0, problems, (seeds, problems))
                boot.append(np.take_along_axis(rows, cols, 1).mean())
            lo, hi = np.percentile(boot, [2.5, 97.5])
        else:
            raise ValueError(f"interval: unknown {interval!r}; known: t, bootstrap")
        hits += lo <= effect <= hi
    return hits / sims


