"""Verdicts (logra/analysis/verdict.py): intervals that cover at the default design, a gate test
of the right size, a power count that gives its power, a margin from validation runs, the right
call on constructed cases, and errors that name what is missing."""
import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from logra.analysis import verdict


@pytest.mark.parametrize("seed_sd", [0.02, 0.04])
def test_t_interval_covers_at_three_seeds(seed_sd):
    """The default design (3 seeds, 1,000 problems, seed-level spread like the measured one):
    the chosen interval covers the true difference in 93-97% of 10,000 simulations."""
    assert 0.93 <= verdict.coverage("t", seed_sd=seed_sd, sims=10_000) <= 0.97


def test_a_percentile_bootstrap_would_under_cover():
    """Why the t-interval: over 3 seeds a percentile bootstrap under-covers as the seed-level
    spread grows (300 simulations: the Monte Carlo sd is 0.015)."""
    assert verdict.coverage("bootstrap", seed_sd=0.04, sims=300) < 0.93


def test_iqm_is_scipys_trimmed_mean():
    x = np.random.default_rng(0).normal(size=37)
    assert verdict.iqm(x) == pytest.approx(stats.trim_mean(x, 0.25), abs=1e-12)
    assert verdict.iqm([1, 2, 3, 100]) == 2.5


@pytest.mark.parametrize("lo, hi, expected", [
    (-0.01, 0.03, "non-inferior"),   # the whole interval above -margin
    (-0.05, -0.03, "inferior"),      # wholly below
    (-0.03, 0.01, "inconclusive"),   # straddles -margin
    (-0.02, 0.01, "inconclusive"),   # touching the margin is not above it
])
def test_non_inferiority_call(lo, hi, expected):
    assert verdict.call(lo, hi, margin=0.02) == expected


def test_paired_test_by_hand():
    """d = 1, 0, 0, 1, 0.5: mean 0.5, sd 0.5, t = 0.5 / (0.5 / √5) = √5 at df 4."""
    mean, p = verdict.paired_test([1, 0, 0, 1, 0.5])
    assert mean == 0.5 and p == pytest.approx(stats.t.sf(np.sqrt(5), 4), rel=1e-12)
    assert p == pytest.approx(stats.ttest_1samp([1, 0, 0, 1, 0.5], 0,
                                                alternative="greater").pvalue)
    assert verdict.paired_test([0.25, 0.25]) == (0.25, 0.0)  # no spread: all gained
    assert verdict.paired_test([0.0, 0.0]) == (0.0, 1.0)


def test_paired_test_has_its_size_when_nothing_changed():
    """2,000 simulated gates with no difference: 1,000 problems of true accuracy ~ U(0, 1),
    the base and the reference each scored on 4 samples of each. At level 0.05 the test
    rejects in 4-6% of them (the Monte Carlo sd is 0.005)."""
    rng = np.random.default_rng(0)
    rejections = 0
    for _ in range(2000):
        p = rng.random(1000)
        base, ref = rng.binomial(4, p) / 4, rng.binomial(4, p) / 4
        rejections += verdict.paired_test(ref - base)[1] < 0.05
    assert 0.04 <= rejections / 2000 <= 0.06


def test_seeds_needed_by_hand():
    """sd 0.01, mean 0, margin 0.02: n ≥ ((t.975 + t.8) · 0.01 / 0.02)², the quantiles at
    df = n − 1, first holds at n = 5 (n = 4: (3.182 + 0.978)² / 4 = 4.33 > 4; n = 5:
    (2.776 + 0.941)² / 4 = 3.45)."""
    assert verdict.seeds_needed([-0.01, 0.0, 0.01], 0.02) == 5
    assert verdict.seeds_needed([0.0, 0.01, 0.02], 0.02) == 4  # ahead: farther from -margin
    assert verdict.seeds_needed([-0.03, -0.02, -0.01], 0.02) == np.inf  # on -margin
    assert np.isnan(verdict.seeds_needed([0.01], 0.02))
    assert verdict.seeds_needed([0.01, 0.01, 0.01], 0.02) == 2  # no spread


@pytest.mark.parametrize("mean, sd", [(0.0, 0.02), (-0.005, 0.02)])
def test_seeds_needed_gives_the_power_it_promises(mean, sd):
    """Seeds drawn from N(mean, sd): at the count `seeds_needed` gives for that spread, the
    interval clears -margin in at least 78% of 20,000 simulations (80% promised; the formula
    with t quantiles approximates the noncentral t)."""
    n = verdict.seeds_needed(np.array([-1.0, 0.0, 1.0]) * sd + mean, 0.02)
    x = np.random.default_rng(1).normal(mean, sd, (20_000, n))
    lo = x.mean(1) - stats.t.ppf(0.975, n - 1) * x.std(1, ddof=1) / np.sqrt(n)
    assert (lo > -0.02).mean() >= 0.78


def _eval(path, scores, primary="sampled"):
    path.write_text(json.dumps({"primary": primary, "accuracy": float(np.mean(scores)),
                                "n": len(scores),
                                "problems": [{"doc_id": i, primary: {"acc": a}}
                                             for i, a in enumerate(scores)]}))
    return path


def _design(tmp_path, method_scores, n=40, seeds=(0, 1, 2), ref_scores=None):
    """Reference 'ref' answers the first half of the problems (or `ref_scores[s]` of them); 'm'
    answers `method_scores[s]` problems; the base answers a quarter (10 of 40)."""
    evals = {}
    for s in seeds:
        k = ref_scores[s] if ref_scores is not None else n // 2
        evals["t", "ref", s] = _eval(tmp_path / f"ref{s}.json", [1] * k + [0] * (n - k))
        k = method_scores[s]
        evals["t", "m", s] = _eval(tmp_path / f"m{s}.json", [1] * k + [0] * (n - k))
    base = {"t": _eval(tmp_path / "base.json", [1] * (n // 4) + [0] * (n - n // 4))}
    return evals, base


def test_verdicts_pair_by_seed_and_problem(tmp_path):
    evals, base = _design(tmp_path, {0: 20, 1: 21, 2: 22})  # +0, +1, +2 problems of 40
    row = verdict.verdicts(evals, base, "ref", {"t": 0.02}).iloc[0]
    assert row["metric"] == "sampled"
    assert row["diff_mean"] == pytest.approx(1 / 40)
    mean, lo, hi = verdict.t_interval([0, 1 / 40, 2 / 40])
    assert (row["diff_lo"], row["diff_hi"]) == pytest.approx((lo, hi))
    assert row["p_better"] == pytest.approx((0.5 + 1 + 1) / 3)
    assert row["gain_mean"] == pytest.approx(21 / 40 - 10 / 40)
    # the gate: the reference answers 10 more of 40 than its base in every seed, 0.25 > 0.02
    assert row["ref_gain_mean"] == pytest.approx(10 / 40) and row["gate_passed"] == "3/3"
    assert row["informative"] and row["ref_gain_by_seed"].startswith("seed 0: +0.2500 (p ")
    assert row["diff_by_seed"] == "seed 0: +0.0000; seed 1: +0.0250; seed 2: +0.0500"
    assert row["call"] == verdict.call(lo, hi, 0.02) and row["margin"] == 0.02
    assert row["seeds_needed"] == verdict.seeds_needed([0, 1 / 40, 2 / 40], 0.02)


def test_each_runs_score_is_of_its_own_model(tmp_path):
    """The verdicts read each run's evaluation only if it scored that run's model (saved or a
    snapshot): two methods can print the same interval only from their own runs' scores."""
    runs = ["t/a/seed0", "t/b/seed0"]
    paths = []
    for run, model in zip(runs, ["results/runs/t/a/seed0/model",
                                 "results/runs/t/b/seed0/snapshots/step80"]):
        paths.append(tmp_path / f"{run.replace('/', '_')}.json")
        paths[-1].write_text(json.dumps({"model_dir": model}))
    assert verdict.run_evals(runs, paths) == {("t", "a", 0): paths[0], ("t", "b", 0): paths[1]}
    paths[1].write_text(json.dumps({"model_dir": "results/runs/t/a/seed0/model"}))
    with pytest.raises(ValueError, match=r"t_b_seed0.json evaluates results/runs/t/a/seed0/model,"
                                         r" not a model of the run t/b/seed0"):
        verdict.run_evals(runs, paths)


def test_a_method_that_learns_nothing_beside_a_reference_that_learns_is_inferior(tmp_path):
    """The method stays at its base (10 of 40, ±1) while the reference gains 10: the gate
    passes on the reference's gain, so the comparison is informative and the call inferior."""
    evals, base = _design(tmp_path, {0: 10, 1: 11, 2: 9})
    row = verdict.verdicts(evals, base, "ref", {"t": 0.05}).iloc[0]
    assert row["informative"] and row["call"] == "inferior"


def test_a_reference_that_gains_less_than_the_margin_makes_the_comparison_uninformative(
        tmp_path):
    """The reference gains nothing, or 1 problem of 40 (0.025, under the margin 0.03): a method
    that learns nothing is within the margin of it, so the gate fails."""
    for ref in (10, 11):
        evals, base = _design(tmp_path, {0: 10, 1: 11, 2: 10}, ref_scores=dict.fromkeys(
            range(3), ref))
        row = verdict.verdicts(evals, base, "ref", {"t": 0.03}).iloc[0]
        assert row["gate_passed"] == "0/3" and not row["informative"], ref


def test_the_gate_is_on_the_mean_gain_not_on_every_seed(tmp_path):
    """Four seeds, the reference gains 10 of 40 over its base in three and nothing in one: its
    mean gain (0.1875) beats the margin by a one-sided t over the seeds (t 2.68, df 3, p 0.04),
    informative though one seed fails its own test; three seeds, one of them at no gain, are
    too spread to show it (p 0.11)."""
    for ref, p in (({0: 20, 1: 20, 2: 20, 3: 10}, 0.04), ({0: 20, 1: 20, 2: 10}, 0.11)):
        evals, base = _design(tmp_path, dict.fromkeys(ref, 15), seeds=tuple(ref),
                              ref_scores=ref)
        row = verdict.verdicts(evals, base, "ref", {"t": 0.02}).iloc[0]
        gains = np.array([(k - 10) / 40 for k in ref.values()]) - 0.02
        t = gains.mean() / (gains.std(ddof=1) / np.sqrt(len(gains)))
        assert row["gate_p"] == pytest.approx(stats.t.sf(t, len(gains) - 1))
        assert row["gate_p"] == pytest.approx(p, abs=0.005)
        assert row["gate_passed"] == f"{len(ref) - 1}/{len(ref)}"
        assert row["informative"] == (p < 0.05)


def test_a_missing_seed_problem_margin_or_mixed_metric_is_named(tmp_path):
    evals, base = _design(tmp_path, {0: 20, 1: 21, 2: 22})
    del evals["t", "m", 2]
    with pytest.raises(ValueError, match=r"t: m has seeds \[0, 1\], ref has \[0, 1, 2\]"):
        verdict.verdicts(evals, base, "ref", {"t": 0.02})
    evals, base = _design(tmp_path, {0: 20, 1: 21, 2: 22})
    _eval(evals["t", "m", 1], [1] * 39)  # one problem fewer
    with pytest.raises(ValueError, match=r"t/seed1: m vs ref: problems \[39\]"):
        verdict.verdicts(evals, base, "ref", {"t": 0.02})
    evals, base = _design(tmp_path, {0: 20, 1: 21, 2: 22})
    with pytest.raises(ValueError, match=r"no margin for tasks \['t'\]"):
        verdict.verdicts(evals, base, "ref", {"u": 0.02})
    _eval(evals["t", "m", 1], [1] * 21 + [0] * 19, primary="greedy")
    with pytest.raises(ValueError, match=r"different primary metrics \['greedy', 'sampled'\]"):
        verdict.verdicts(evals, base, "ref", {"t": 0.02})


def test_margin_is_a_fraction_of_the_references_validation_gain_with_a_floor(tmp_path):
    """Seeds 10 and 11 gain 4 and 2 of 50 validation problems over their bases: mean 0.06, so
    half of it is 0.03; a gain of 0.01 gives the floor 0.02; a task without runs the floor."""
    def e(name, k):
        return _eval(tmp_path / f"{name}.json", [1] * k + [0] * (50 - k))
    refs = {("a", 10): e("a10", 24), ("a", 11): e("a11", 22), ("b", 10): e("b10", 21)}
    bases = {("a", 10): e("ba10", 20), ("a", 11): e("ba11", 20), ("b", 10): e("bb10", 20)}
    t = verdict.margin_table(refs, bases, ["a", "b", "c"], 0.5, 0.02,
                             {"a": 1e-4, "b": 2e-4}).set_index("task")
    assert t.loc["a", "val_gain_mean"] == pytest.approx(0.06)
    assert t.loc["a", "margin"] == pytest.approx(0.03)
    assert t.loc["a", "val_gain_by_seed"] == "seed 10: +0.0800; seed 11: +0.0400"
    assert t.loc["b", "margin"] == 0.02 and t.loc["b", "val_seeds"] == 1
    assert t.loc["c", "margin"] == 0.02 and t.loc["c", "val_seeds"] == 0
    assert "floor" in t.loc["c", "source"] and t.loc["a", "metric"] == "sampled"


def test_analysis_plan_states_metric_margins_gate_seeds_and_methods():
    margins = pd.DataFrame([{"task": "a", "margin": 0.03, "source": "s", "val_gain_mean": 0.06,
                             "val_gain_by_seed": "seed 10: +0.06", "val_seeds": 1,
                             "val_problems": 50, "lr": 1e-4, "metric": "sampled"}])
    protocols = {"greedy": {"samples": 1, "temperature": 0, "top_p": 1.0},
                 "sampled": {"samples": 4, "temperature": 0.7, "top_p": 0.7}}
    plan = verdict.analysis_plan(
        {"reference": "d", "methods": ["d", "l"], "ablation_methods": [], "tasks": ["a"],
         "seeds": [0, 1, 2], "n_test": 1000, "steps": {"d": 80, "l": 80},
         "method_config": {}, "eval": {"primary": "sampled", "protocols": protocols},
         "verdict": {"gate": {"alpha": 0.05}}}, margins)
    assert plan["primary_metric"]["protocol"] == "sampled"
    assert plan["primary_metric"]["samples"] == 4 and list(plan["other_metrics"]) == ["greedy"]
    assert plan["margins"]["a"]["margin"] == 0.03 and plan["gate"]["alpha"] == 0.05
    assert plan["seeds"] == [0, 1, 2] and plan["steps"] == {"d": 80, "l": 80}


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04: x3, x2, x1 = 0.03, 0.06, 0.04 -> step-down max: 0.03, 0.06, 0.06
    assert verdict.holm([0.04, 0.01, 0.03]) == pytest.approx([0.06, 0.03, 0.06])
    assert verdict.holm([0.5, float("nan")])[0] == 0.5  # NaN does not count in the family
    assert verdict.holm([0.6, 0.7]) == [1.0, 1.0]


@pytest.mark.parametrize("seed", range(40))
def test_one_contrasts_answers_are_its_95_interval(seed):
    """At one contrast (no adjustment): better/worse where the interval excludes 0,
    non-inferior where its lower end is above −δ, equivalent where it lies inside (−δ, δ)."""
    rng = np.random.default_rng(seed)
    d, margin = rng.normal(rng.normal(0, 0.02), 0.015, rng.integers(2, 6)), 0.02
    _, lo, hi = verdict.t_interval(d)
    p = verdict.contrast_tests(d, margin)
    assert (p["p_diff"] < 0.05) == (lo > 0 or hi < 0)
    assert (p["p_non_inferior"] < 0.025) == (lo > -margin)
    assert (p["p_inferior"] < 0.025) == (hi < -margin)
    assert (p["p_equivalent"] < 0.025) == (-margin < lo and hi < margin)


@pytest.mark.parametrize("seed", range(20))
def test_fiellers_interval_holds_each_ratio_whose_difference_interval_holds_zero(seed):
    rng = np.random.default_rng(seed)
    b = rng.normal(0.1, 0.01, 3)
    a = 0.8 * b + rng.normal(0, 0.01, 3)
    ratio, lo, hi = verdict.fieller(a, b)
    assert ratio == pytest.approx(a.mean() / b.mean()) and lo < ratio < hi
    for rho in np.linspace(lo - 1, hi + 1, 41):
        _, dlo, dhi = verdict.t_interval(a - rho * b)
        if not (math.isclose(rho, lo, abs_tol=1e-9) or math.isclose(rho, hi, abs_tol=1e-9)):
            assert (dlo <= 0 <= dhi) == (lo <= rho <= hi)
    assert verdict.fieller(0.5 * b, b)[1:] == pytest.approx((0.5, 0.5))  # exact: no spread
    assert all(map(math.isnan, verdict.fieller(a, [0.1, -0.1, 0.0])[1:]))  # b not clear of 0


def test_each_contrast_says_worse_non_inferior_and_equivalent_apart(tmp_path):
    """A method 2 to 4 problems of 40 behind (interval [−0.137, −0.013], wholly below 0):
    worse, yet neither non-inferior nor equivalent at δ 0.1 (the interval reaches below −0.1;
    its one-word call 'inconclusive'); at δ 0.2 worse and both. Holm over a table of two
    contrasts doubles the smaller p-value."""
    evals, base = _design(tmp_path, {0: 17, 1: 16, 2: 18})
    row = verdict.verdicts(evals, base, "ref", {"t": 0.1}).iloc[0]
    assert (row["superiority"], row["non_inferior"], row["equivalent"]) == ("worse", False, False)
    assert row["calls"] == ("worse: yes; non-inferior at 0.100: no; equivalent within "
                            "±0.100: no") and row["call"] == "inconclusive"
    assert row["holm_contrasts"] == 1
    wide = verdict.verdicts(evals, base, "ref", {"t": 0.2}).iloc[0]
    assert wide["calls"] == ("worse: yes; non-inferior at 0.200: yes; equivalent within "
                             "±0.200: yes") and wide["call"] == "non-inferior"
    # the share of the reference's gain: (17+16+18)/3 - 10 of 40 over its 10
    assert row["gain_share"] == pytest.approx((17 - 10) / 10)
    for s in (0, 1, 2):
        evals["t", "m2", s] = evals["t", "m", s]
    two = verdict.verdicts(evals, base, "ref", {"t": 0.1})
    p = verdict.contrast_tests(np.array([-3, -4, -2]) / 40, 0.1)["p_diff"]
    assert two["p_diff"].tolist() == pytest.approx([min(1, 2 * p)] * 2)
    assert (two["holm_contrasts"] == 2).all()


def test_a_declared_contrast_judges_a_method_against_another_in_the_same_table(tmp_path):
    """verdict.contrasts (method, against): beside every method against the reference, the
    method against `against` on the same seeds and problems (the update rule: LoGRA against
    dense AdamW on LoGRA's weights), its gate the gain of `against`; Holm counts every row; a
    contrast whose methods did not run is left out."""
    evals, base = _design(tmp_path, {0: 17, 1: 16, 2: 18})
    for s in (0, 1, 2):  # the control: 1 problem behind the reference in every seed
        evals["t", "ctl", s] = _eval(tmp_path / f"ctl{s}.json", [1] * 19 + [0] * 21)
    table = verdict.verdicts(evals, base, "ref", {"t": 0.1},
                             contrasts=[("m", "ctl"), ("m", "absent")])
    rows = table.set_index(["method", "reference"])
    assert sorted(rows.index) == [("ctl", "ref"), ("m", "ctl"), ("m", "ref")]
    assert rows.loc[("m", "ctl"), "diff_mean"] == pytest.approx((17 + 16 + 18) / 3 / 40 - 19 / 40)
    assert rows.loc[("m", "ctl"), "ref_gain_mean"] == pytest.approx(9 / 40)  # ctl over its base
    assert (table["holm_contrasts"] == 3).all()
