"""The stability criterion (logra/analysis/stability.py): each clause fails a run built to fail it
and passes one built to pass it, deciding on its own; a run is stable only when all four hold;
the criterion names no method."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from logra.analysis.stability import CLAUSES, judge, spikes, stability_table

CRITERION = {"held_out": {"base_drop": 0.0, "peak_drop": 0.03},
             "collapse": {"prompts": 256, "entropy_fraction": 0.25, "pass_drop": 0.03},
             "spikes": {"factor": 10, "window": 50, "min_history": 10, "share": 0.01}}
OK = {"status": "ok"}
N = 200  # problems


def kl(spiked: int = 0, steps: int = 200) -> pd.DataFrame:
    """`steps` rows of batch KL around 1e-3 (±20%, seeded), `spiked` of them (after the 20th)
    at 50x; the probe's realized and predicted KL beside it."""
    rng = np.random.default_rng(0)
    batch = 1e-3 * rng.uniform(0.8, 1.2, steps)
    batch[20:20 + 30 * spiked:30] *= 50
    return pd.DataFrame({"kl_batch": batch, "kl_real": batch, "kl_pred": batch / 2})


def scores(means: dict[int, float], spread: float = 0.0, seed: int = 0) -> dict[int, dict]:
    """{step: {problem: score}} over N problems with these means; with `spread`, each step's
    scores are the mean ± spread at random (seeded), so differences between steps vary."""
    rng = np.random.default_rng(seed)
    return {step: dict(enumerate(m + spread * rng.choice([-1.0, 1.0], N)))
            for step, m in means.items()}


def points(acc: dict[int, float], passes: dict[int, float] | None = None,
           entropy: dict[int, float] | None = None, spread: float = 0.0) -> dict[int, dict]:
    """judge's points: accuracy and pass@k at these means, entropy 0.5 at every step unless
    given."""
    a, p = scores(acc, spread), scores(passes or {s: 0.6 for s in acc}, spread, seed=1)
    return {s: {"acc": a[s], "pass": p[s], "entropy": (entropy or {}).get(s, 0.5),
                "kl_to_base": 0.01 * s / 100} for s in acc}


GOOD = {0: 0.30, 100: 0.40, 200: 0.39}


@pytest.mark.parametrize("summary, curve, spiked, failed, why", [
    (OK, points(GOOD), 0, [], "all four hold"),
    # spikes: 1 in 190 judged steps (0.5%) passes, 2 (1.05% > 1%) fail
    (OK, points(GOOD), 1, [], "all four hold"),
    (OK, points(GOOD), 2, ["spikes"], "spikes: batch KL spiked on 2 of 190 judged steps"),
    ({"status": "diverged", "diverged_at_step": 150}, points({0: 0.3, 100: 0.4, 140: 0.4}), 0,
     ["ended"], "ended: diverged at step 150"),
    # held_out: a point below the base; the last below the best; a small or noisy fall passes
    (OK, points({0: 0.30, 100: 0.25, 200: 0.31}), 0, ["held_out"], "below the base at step 100"),
    (OK, points({0: 0.30, 100: 0.45, 200: 0.38}), 0, ["held_out"],
     "last below the best (step 100) by -0.070"),
    (OK, points({0: 0.30, 100: 0.42, 200: 0.40}), 0, [], "all four hold"),
    (OK, points({0: 0.30, 100: 0.45, 200: 0.40}, spread=0.3), 0, [], "all four hold"),
    # collapse: the entropy under a quarter of the base's at any point; pass@k fallen
    (OK, points(GOOD, entropy={0: 0.5, 100: 0.1, 200: 0.3}), 0, ["collapse"],
     "entropy 0.20 x the base's at step 100"),
    (OK, points(GOOD, passes={0: 0.6, 100: 0.7, 200: 0.6}), 0, ["collapse"],
     "pass@k at the last below its best (step 100) by -0.100"),
    (OK, points(GOOD, entropy={0: 0.5, 100: 0.2, 200: 0.2},
                passes={0: 0.6, 100: 0.62, 200: 0.6}), 0, [], "all four hold"),  # 0.4 x
    # two clauses at once: both named
    (OK, points({0: 0.30, 100: 0.20, 200: 0.20}, entropy={0: 0.5, 100: 0.05, 200: 0.05}), 3,
     ["held_out", "collapse", "spikes"], "spikes: batch KL spiked on 3 of 190 judged steps"),
    (OK, {0: points(GOOD)[0]}, 0, ["held_out", "collapse"], "no held-out point after step 0"),
])
def test_a_run_is_stable_only_when_every_clause_holds(summary, curve, spiked, failed, why):
    verdict = judge(summary, kl(spiked), curve, CRITERION)
    assert [c for c in CLAUSES if not verdict[f"{c}_ok"]] == failed
    assert verdict["stable"] is (not failed)
    assert verdict["decided_by"] == (", ".join(failed) or "all hold")
    assert why in verdict["why"]


def test_spikes_are_judged_against_the_trailing_median_once_there_is_history():
    s = {"factor": 10, "window": 3, "min_history": 2, "share": 0.5}
    kl_ = pd.Series([1.0, 1.0, 30.0, 1.0, 1.0, 1.0, 9.0, float("nan")])
    spiked, judged = spikes(kl_, s)
    assert judged.tolist() == [False, False] + [True] * 5 + [False]  # a NaN is not judged
    # step 3: median(1, 1) = 1 -> 30 spikes; step 4: median(1, 1, 30) = 1; step 7: 9 < 10
    assert spiked.tolist() == [False, False, True, False, False, False, False, False]
    # a history that did not move the policy (median 0) gives no scale: not judged
    spiked, judged = spikes(pd.Series([0.0, 0.0, 0.0, 1e-3, 1e-3, 1e-3]), s)
    assert judged.tolist() == [False] * 5 + [True] and not spiked.any()


def test_a_non_finite_batch_kl_is_reported_as_such_never_as_a_spike():
    metrics = kl(0)
    metrics.loc[100, "kl_batch"] = float("nan")
    verdict = judge(OK, metrics, points(GOOD), CRITERION)
    assert verdict["spikes"] == 0 and verdict["kl_batch_non_finite"] == 1
    assert not verdict["spikes_ok"] and verdict["decided_by"] == "spikes"
    assert "batch KL not finite at 1 steps (metrics.csv rows [101]), not judged" in verdict["why"]


def test_the_criterion_names_no_method_and_no_method_option():
    """No key or value of the declared criterion is a method's name or an option of any
    rule: it takes nothing from one method's settings."""
    import inspect
    from pathlib import Path

    from logra import rules
    from logra.harness.config import validate_file
    root = Path(__file__).resolve().parents[2]
    for name in ("config/config.yaml", "config/paper.yaml", "tests/data/smoke.yaml"):
        config = validate_file(root / name)
        criterion = config["stability"]["criterion"]
        words = set()

        def walk(x):
            if isinstance(x, dict):
                for k, v in x.items():
                    words.add(k)
                    walk(v)
            elif isinstance(x, str):
                words.add(x)
        walk(criterion)
        options = {p for m in config["methods"].values()
                   for p in inspect.signature(rules.rule_class(m["rule"])).parameters}
        assert not words & (set(config["methods"]) | options), name
        assert set(criterion) == {"held_out", "collapse", "spikes"}


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
        kl().to_csv(run / "metrics.csv", index=False)
        curve = points({0: 0.3, 100: 0.4, 200: last})
        (run / "curve.json").write_text(json.dumps({"primary": "sampled", "points": [
            {"step": step, "accuracy": sum(p["acc"].values()) / N, "per_problem": p["acc"],
             "per_problem_pass": p["pass"], "entropy": p["entropy"],
             "kl_to_base": p["kl_to_base"]} for step, p in curve.items()]}))
        rows.append(run)
    t = stability_table([r / "summary.json" for r in rows], [r / "metrics.csv" for r in rows],
                        [r / "curve.json" for r in rows], CRITERION)
    assert list(t["seed"]) == [0, 1] and list(t["stable"]) == [True, False]
    assert t["controller"].tolist() == [True, True] and t["last_step"].tolist() == [200, 200]
    assert math.isclose(t.loc[1, "last_vs_best"], -0.2) and t.loc[1, "decided_by"] == "held_out"
    assert t["kl_calibration"].tolist() == pytest.approx([2.0, 2.0])
    # the report: the default's table, and `snakemake stability`'s where it has run
    from types import SimpleNamespace

    from logra.analysis.report import _stability
    text = "\n".join(_stability(SimpleNamespace(stability=(t, CRITERION),
                                                stability_opt_in={"stability_seeds": t})))
    assert "## Stability: the long runs" in text and "controller ablation" not in text
    assert text.count("| logra_stable | 1 |") == 2 and "by -0.200" in text
    alone = "\n".join(_stability(SimpleNamespace(stability=(t, CRITERION), stability_opt_in={})))
    assert "`snakemake stability` has not run" in alone
