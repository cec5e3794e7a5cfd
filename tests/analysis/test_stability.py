"""The stability criterion (logra/analysis/stability.py): each clause decides on its own, and a
run is stable only when all three hold."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from logra.analysis.stability import judge, stability_table

CRITERION = {"from_step": 100, "delta": 0.05, "kl_max": 1e-3, "kl_share": 0.1}
OK = {"status": "ok"}


def kl(over: int, steps: int = 20) -> pd.DataFrame:
    """`steps` rows of realized KL, `over` of them above CRITERION's kl_max."""
    return pd.DataFrame({"kl_real": [2e-3] * over + [1e-4] * (steps - over)})


def scores(means: dict[int, float], spread: float = 0.0) -> dict[int, dict[int, float]]:
    """{step: {problem: score}} over 40 problems with these means; with `spread`, each step's
    scores are the mean ± spread at random (seeded), so drops between steps vary by problem."""
    rng = np.random.default_rng(0)
    return {step: dict(enumerate(m + spread * rng.choice([-1.0, 1.0], 40)))
            for step, m in means.items()}


@pytest.mark.parametrize("summary, curve, over, stable, why", [
    (OK, scores({0: 0.3, 100: 0.40, 200: 0.36}), 2, True, "all three hold"),  # -0.04; 10% over
    (OK, scores({0: 0.3, 100: 0.40, 200: 0.34}), 0, False, "fell 0.060 [0.060, 0.060]"),
    # a mean drop under delta whose interval reaches past it does not pass
    (OK, scores({0: 0.3, 100: 0.40, 200: 0.36}, spread=0.2), 0, False, "upper bound > 0.05"),
    (OK, scores({0: 0.3, 100: 0.40, 200: 0.40}), 3, False, "on 15% of steps"),
    ({"status": "diverged", "diverged_at_step": 150}, scores({0: 0.3, 100: 0.4, 140: 0.4}), 0,
     False, "diverged at step 150"),
    ({"status": "diverged", "diverged_at_step": 60}, scores({0: 0.3, 60: 0.1}), 0, False,
     "no held-out point at step 100"),
    (OK, scores({0: 0.3, 100: 0.4}), 0, False, "no held-out point at step 100 and after it"),
])
def test_a_run_is_stable_only_when_every_clause_holds(summary, curve, over, stable, why):
    verdict = judge(summary, kl(over), curve, CRITERION)
    assert verdict["stable"] is stable and why in verdict["why"]
    assert verdict["ended_ok"] is (summary["status"] == "ok")
    assert verdict["kl_over_share"] == over / 20


def test_the_table_reads_each_runs_files_in_order(tmp_path):
    rows = []
    for seed, last in ((0, 0.39), (1, 0.2)):
        run = tmp_path / f"seed{seed}"
        run.mkdir()
        (run / "summary.json").write_text(json.dumps({
            "task": "t", "method": "logra_stable", "seed": seed, "steps": 200, "status": "ok",
            "model": "tiny", "device": "cpu", "n_params": 10, "peak_mem_bytes": 1024,
            "control": {"kind": "BudgetControl"}, "step_size": {"value": 3e-3},
            "config": {"method": {"rule": "logra", "options": {}}}}))
        kl(0).to_csv(run / "metrics.csv", index=False)
        (run / "curve.json").write_text(json.dumps({"primary": "sampled", "points": [
            {"step": step, "per_problem": per_problem}
            for step, per_problem in scores({0: 0.3, 100: 0.4, 200: last}).items()]}))
        rows.append(run)
    t = stability_table([r / "summary.json" for r in rows], [r / "metrics.csv" for r in rows],
                        [r / "curve.json" for r in rows], CRITERION)
    assert list(t["seed"]) == [0, 1] and list(t["stable"]) == [True, False]
    assert t["controller"].tolist() == [True, True] and t["last_step"].tolist() == [200, 200]
    assert math.isclose(t.loc[1, "metric_drop"], 0.2)
    # the report: the default's table, and `snakemake stability`'s where it has run
    from types import SimpleNamespace

    from logra.analysis.report import _stability
    text = "\n".join(_stability(SimpleNamespace(stability=(t, CRITERION),
                                                stability_opt_in={"stability_seeds": t})))
    assert "## Stability: the long runs" in text and "controller ablation" not in text
    assert text.count("| logra_stable | 1 |") == 2 and "fell 0.200" in text
    alone = "\n".join(_stability(SimpleNamespace(stability=(t, CRITERION), stability_opt_in={})))
    assert "`snakemake stability` has not run" in alone
