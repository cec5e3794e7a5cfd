"""The study (logra/analysis/study.py), as stated invariants: its contrasts, the seed count a
half-width asks for, each arm's choice and the frozen plan's seeds, and the tables its test
evaluations make (verdicts per update, the secondary endpoints' paired differences)."""
import math

import numpy as np
import pandas as pd
import pytest
import yaml

from logra.analysis.study import (adopted_choice, arm_choice, contrasts, horizon_table,
                                  sd_upper, seeds_for, study_plan, study_tables)
from logra.analysis.tuning import lr_sweep_table
from logra.analysis.verdict import t_quantile
from logra.files import write_json

PROBLEMS = 40
EVAL = {"primary": "sampled", "protocols": {"sampled": {"samples": 4, "temperature": 0.7},
                                            "greedy": {"samples": 1, "temperature": 0}}}
VERDICT = {"margin": {"fraction": 0.5, "floor": 0.01}, "gate": {"alpha": 0.05},
           "contrasts": []}


def _eval(path, acc, greedy=None, model_dir="m"):
    """An evaluation JSON whose per-problem sampled scores average `acc` (a multiple of
    1/PROBLEMS), greedy `greedy`."""
    hits = round(acc * PROBLEMS)
    g = round((acc if greedy is None else greedy) * PROBLEMS)
    write_json(path, {"primary": "sampled", "accuracy": hits / PROBLEMS, "model_dir": model_dir,
                      "problems": [{"doc_id": i, "sampled": {"acc": float(i < hits),
                                                             "pass": float(i < hits)},
                                    "greedy": {"acc": float(i < g), "pass": float(i < g)}}
                                   for i in range(PROBLEMS)],
                      "metrics": {"sampled": {"accuracy": hits / PROBLEMS,
                                              "pass_at_k": hits / PROBLEMS, "samples": 4},
                                  "greedy": {"accuracy": g / PROBLEMS, "pass_at_k": g / PROBLEMS,
                                             "samples": 1}}})
    return path


def test_contrasts_put_the_reference_first_then_each_later_arm_against_each_earlier():
    assert contrasts(["d", "t", "l"], "d") == [("t", "d"), ("l", "d"), ("l", "t")]
    assert contrasts(["d", "t", "l"], "t") == [("d", "t"), ("l", "t"), ("l", "d")]


@pytest.mark.parametrize("d", [[0.01, 0.03, -0.02], [0.1, -0.1, 0.05, 0.0], [0.002, 0.004]])
def test_seeds_for_is_the_fewest_whose_half_width_meets_the_target(d):
    sd = float(np.std(d, ddof=1))
    half = lambda n: t_quantile(0.975, n - 1) * sd / math.sqrt(n)  # noqa: E731
    n = seeds_for(d, 0.02)
    assert half(n) <= 0.02 and (n == 2 or half(n - 1) > 0.02)
    assert seeds_for(d, 0.01) >= n  # a narrower target never needs fewer
    assert math.isnan(seeds_for([0.1], 0.02))


def test_the_sd_bound_covers_the_true_sd_at_its_level():
    """`sd_upper` at level c lies above the true sd in a share c of samples of three normal
    differences (the validation seeds' count), is the sd at level 0, and grows with c; the
    seeds it asks for are never fewer than the bare sd's."""
    rng = np.random.default_rng(0)
    draws = rng.normal(0.0, 0.03, size=(4000, 3))
    covered = np.mean([sd_upper(d, 0.8) >= 0.03 for d in draws])
    assert covered == pytest.approx(0.8, abs=0.02)
    d = [0.01, 0.03, -0.02]
    assert sd_upper(d, 0) == pytest.approx(np.std(d, ddof=1))
    assert sd_upper(d, 0.5) < sd_upper(d, 0.8) < sd_upper(d, 0.95)
    assert seeds_for(d, 0.02, sd_level=0.8) > seeds_for(d, 0.02)
    assert math.isnan(sd_upper([0.1], 0.8))


def _study_sweep(tmp_path, val):
    """Validation runs and evaluations of a 3-arm study, 2 points each, 3 seeds: `val`:
    (arm, point index, seed) -> accuracy."""
    points, runs, evals, by_run = {}, [], [], {}
    for (arm, k, seed), acc in val.items():
        name = f"{arm}_p{k}"
        points[name] = (arm, [1e-4, 2e-4][k])
        run = tmp_path / "runs" / name / f"seed{seed}"
        write_json(run / "summary.json", {"task": "t", "method": name, "seed": seed,
                                          "status": "ok", "final_reward": 0.0})
        runs.append(run / "summary.json")
        evals.append(_eval(tmp_path / "val" / name / f"seed{seed}.json", acc,
                           model_dir=str(run / "model")))
        by_run[name, seed] = evals[-1]
    return points, runs, evals, by_run


# one horizon's design as its plan reads it: each arm's method there named as the arm
STUDY = {"task": "t", "horizon": "h4", "arms": {"d": "d", "x": "x", "l": "l"}, "reference": "d",
         "snapshot": 2, "seeds": {"min": 2, "max": 9, "half_width": 0.02}}


MARGINS = pd.DataFrame([{"task": "t", "margin": 0.025, "source": "s", "val_gain_mean": 0.05,
                         "val_gain_by_seed": "", "val_seeds": 3, "val_problems": PROBLEMS,
                         "lr": 1e-4, "metric": "sampled"}])


def _choices(tmp_path, val, study=STUDY):
    """Each arm's choice from its grid (`arm_choice`), the grid's points and the spec."""
    points, runs, evals, by_run = _study_sweep(tmp_path, val)
    table = lr_sweep_table(runs, evals, points, dict.fromkeys(study["arms"], "lr"))
    spec = {"eval": EVAL, "verdict": VERDICT, "n_test": PROBLEMS,
            "steps": dict.fromkeys(study["arms"], 4),
            "configs": {name: {"rule": arm, "options": {"lr": v}}
                        for name, (arm, v) in points.items()}}
    return {arm: arm_choice(table, points, arm, by_run, spec["configs"])
            for arm in study["arms"]}, points, spec


def _plan(tmp_path, val, study=STUDY):
    arms, _, spec = _choices(tmp_path, val, study)
    return study_plan(arms, study, list(range(20, 40)), MARGINS, spec)


def test_a_choice_by_successive_halving_is_among_the_points_run_on_every_seed(tmp_path):
    """Halving's record: the choice the best point over every seed, though a point screened
    out (run on the first seed) scored higher there; the screened point under `screen`."""
    val = {("d", 0, 0): 0.9} | {("d", 1, s): 0.4 for s in range(3)}
    val |= {(arm, k, s): 0.3 for arm in ("x", "l") for k in (0, 1) for s in range(3)}
    arms, _, _ = _choices(tmp_path, val)
    assert arms["d"]["method"] == "d_p1" and arms["d"]["val_accuracy"] == pytest.approx(0.4)
    assert arms["d"]["scores"] == [[2e-4, pytest.approx(0.4)]]
    assert arms["d"]["screen"] == [[1e-4, pytest.approx(0.9)]] and not arms["d"]["bracketed"]
    assert "screen" not in arms["x"]


def test_the_plan_freezes_each_arms_best_point_and_the_seeds_its_spread_asks_for(tmp_path):
    # every arm's second point is best; x and l differ from d by seed, l by more
    val = {}
    for seed, (dx, dl) in enumerate([(0.0, 0.05), (0.025, 0.1), (0.05, 0.0)]):
        for k in (0, 1):
            base = 0.3 + 0.1 * k
            val |= {("d", k, seed): base, ("x", k, seed): base + dx, ("l", k, seed): base + dl}
    plan = _plan(tmp_path, val)
    assert {arm: c["method"] for arm, c in plan["arms"].items()} == {
        "d": "d_p1", "x": "x_p1", "l": "l_p1"}
    assert plan["method_config"]["l"] == {"rule": "l", "options": {"lr": 2e-4}}
    rule = plan["seeds_rule"]
    assert rule["contrasts"]["l - x"]["by_seed"] == pytest.approx([0.05, 0.075, -0.05])
    needed = max(seeds_for(c["by_seed"], 0.02) for c in rule["contrasts"].values())
    assert rule["needed"] == needed and needed > STUDY["seeds"]["max"]
    # capped at max, said so; the seeds are the pool's first
    assert rule["capped"] and plan["seeds"] == list(range(20, 29))
    assert plan["contrasts"] == [["l", "x"]] and plan["reference"] == "d"
    assert plan["margins"]["t"]["margin"] == 0.025


def test_the_plan_on_the_sd_bound_asks_for_more_seeds_and_states_what_it_gives(tmp_path):
    """At sd_level 0.8 every contrast plans on its spread's upper bound: more seeds than on
    the spread, and the plan states each contrast's half-width at the n it froze, at the
    spread and at the bound."""
    val = {}
    for seed, dl in enumerate([0.0, 0.01, 0.02]):
        for k in (0, 1):
            val |= {("d", k, seed): 0.3 + 0.1 * k, ("x", k, seed): 0.3 + 0.1 * k,
                    ("l", k, seed): 0.3 + 0.1 * k + dl}
    study = STUDY | {"seeds": {"min": 2, "max": 60, "half_width": 0.01}}
    bare = _plan(tmp_path / "bare", val, study)["seeds_rule"]
    rule = _plan(tmp_path / "bound", val, study | {
        "seeds": study["seeds"] | {"sd_level": 0.8}})["seeds_rule"]
    assert rule["sd_level"] == 0.8 and rule["needed"] > bare["needed"]
    c = rule["contrasts"]["l - d"]
    assert c["sd_upper"] == pytest.approx(sd_upper(c["by_seed"], 0.8))
    assert c["seeds_needed"] == seeds_for(c["by_seed"], 0.01, sd_level=0.8) == rule["n"]
    assert c["half_width_at_n"]["sd_upper"] <= 0.01 < c["half_width_at_n"]["sd_upper"] * 1.5
    assert c["half_width_at_n"]["sd"] < c["half_width_at_n"]["sd_upper"]


def test_a_small_spread_asks_for_the_minimum(tmp_path):
    val = {(arm, k, seed): 0.3 + 0.1 * k + (0.025 if arm == "l" else 0.0)
           for arm in "dxl" for k in (0, 1) for seed in range(3)}
    plan = _plan(tmp_path, val)
    assert plan["seeds_rule"]["needed"] == 2 and plan["seeds"] == [20, 21]
    assert not plan["seeds_rule"]["capped"]


def test_an_adopted_choice_freezes_the_plan_its_grid_would(tmp_path):
    """An arm's record (`arm_choice` as results/study/tuned/<arm>_<horizon>.yaml writes it, through
    YAML), adopted under study.tuned, gives the plan its grid gives: the same choice, the same
    per-seed validation accuracies, so the same seeds; only `adopted` says where it came from."""
    val = {}
    for seed, (dx, dl) in enumerate([(0.0, 0.05), (0.025, 0.1), (0.05, 0.0)]):
        for k in (0, 1):
            val |= {("d", k, seed): 0.3 + 0.1 * k, ("x", k, seed): 0.3 + 0.1 * k + dx,
                    ("l", k, seed): 0.4 - 0.1 * k + dl}
    arms, points, spec = _choices(tmp_path, val)
    assert arms["l"]["value"] == 1e-4 and not arms["l"]["bracketed"]
    assert arms["x"]["by_seed"] == pytest.approx({0: 0.4, 1: 0.425, 2: 0.45})
    record = yaml.safe_load(yaml.safe_dump({k: v for k, v in arms["x"].items()
                                            if k != "method"}))
    adopted = dict(arms, x=adopted_choice(record, points, "x"))
    study = STUDY | {"tuned": {"x": record}}
    fresh = study_plan(arms, STUDY, list(range(20, 40)), MARGINS, spec)
    plan = study_plan(adopted, study, list(range(20, 40)), MARGINS, spec)
    assert plan["arms"]["x"].pop("adopted") and not fresh["arms"]["x"].pop("adopted")
    assert plan == fresh


def test_the_tables_compare_the_arms_at_each_update_by_seed(tmp_path):
    plan = {"task": "t", "reference": "d", "methods": ["d", "l"], "contrasts": [],
            "arms": {"d": {"method": "d_p1"}, "l": {"method": "l_p0"}}, "steps": {"d": 4, "l": 4},
            "margins": {"t": {"margin": 0.025}}, "gate": {"alpha": 0.05},
            "endpoints": {"snapshot": 2}}
    acc = {("d", 0): 0.5, ("d", 1): 0.6, ("d", 2): 0.55, ("l", 0): 0.45, ("l", 1): 0.6,
           ("l", 2): 0.5}
    runs, evals, bases = {}, {}, {}
    for (arm, seed), a in acc.items():
        runs[arm, seed] = tmp_path / arm / f"seed{seed}.json"
        write_json(runs[arm, seed], {"task": "t", "method": plan["arms"][arm]["method"],
                                     "seed": seed, "status": "ok",
                                     "token_entropy_mean": 0.1 * seed + (arm == "l"),
                                     "peak_mem_bytes": 100 if arm == "d" else 60})
        for step, shift in ((2, -0.1), (4, 0.0)):
            evals["t", arm, seed, step] = _eval(tmp_path / arm / f"{seed}_{step}.json", a + shift,
                                                greedy=a - 0.2)
        bases["t", seed] = _eval(tmp_path / f"base{seed}.json", 0.3)
    # the update's spectrum: two matrices, l's lower-rank by one, the second unchanged in d
    spectra = {}
    for (arm, seed) in acc:
        spectra[arm, seed] = tmp_path / arm / f"spectrum{seed}.csv"
        pd.DataFrame({"matrix": ["a", "b"], "rank": 4,
                      "energy_top_r": [0.5, math.nan if arm == "d" else 0.7],
                      "stable_rank": [6.0 - (arm == "l"), math.nan if arm == "d" else 2.0],
                      "rank_90": [10, 3]}).to_csv(spectra[arm, seed], index=False)
    # the policy's drift from its base at its last update: l further from it by 0.5 nats; l's
    # as the last point of a held-out curve (a horizon that judges stability), whose earlier
    # points are not read
    drifts = {}
    for (arm, seed) in acc:
        drifts[arm, seed] = tmp_path / arm / f"drift{seed}.json"
        drift = {"entropy": 1.0 + seed, "kl_to_base": 0.1 * seed + 0.5 * (arm == "l"),
                 "tokens": 100}
        write_json(drifts[arm, seed], drift if arm == "d" else {"points": [
            {"step": 0, "entropy": 9.0, "kl_to_base": 0.0, "tokens": 100},
            {"step": 4, **drift}]})
    t = study_tables(plan, runs, evals, bases, spectra, drifts)
    assert len(t["spectrum"]) == 12 and set(t["spectrum"]["method"]) == {"d", "l"}
    v = t["verdicts"].set_index("step")
    assert list(t["verdicts"]["endpoint"]) == ["secondary", "primary"]
    d = [acc["l", s] - acc["d", s] for s in range(3)]
    assert v.loc[4, "diff_mean"] == pytest.approx(np.mean(d))
    assert v.loc[2, "diff_mean"] == pytest.approx(np.mean(d))
    assert v.loc[4, "gate_passed"] == "3/3"  # d gains 0.2-0.3 over 0.3 at 40 problems
    s = t["summary"]
    assert list(s["method"]) == ["d"] * 3 + ["l"] * 3 and set(s["run_method"]) == {"d_p1", "l_p0"}
    assert s["step2_accuracy"].tolist() == pytest.approx(s["eval_accuracy"] - 0.1)
    sec = t["secondary"].set_index("metric")
    # the plan's declared endpoints first, in its order (t1 is not a protocol here)
    assert list(dict.fromkeys(sec.index))[:6] == [
        "eval_greedy", "eval_sampled_pass4", "policy_entropy", "kl_to_base",
        "update_stable_rank", "update_energy_top_r"]
    assert s["kl_to_base"].tolist() == pytest.approx([0, 0.1, 0.2, 0.5, 0.6, 0.7])
    assert sec.loc["kl_to_base", "diff_mean"] == pytest.approx(0.5)
    assert sec.loc["policy_entropy", "diff_mean"] == pytest.approx(0.0)
    assert sec.loc["token_entropy_mean", "diff_mean"] == pytest.approx(1.0)
    assert sec.loc["peak_mem_bytes", "diff_mean"] == pytest.approx(-40)
    assert sec.loc["eval_greedy", "diff_mean"] == pytest.approx(np.mean(d))
    assert "eval_sampled" not in sec.index and "step2_accuracy" not in sec.index
    # each run's mean over the matrices it changed: d 6 (b unchanged), l (5 + 2) / 2
    assert s["update_stable_rank"].tolist() == pytest.approx([6.0] * 3 + [3.5] * 3)
    assert sec.loc["update_stable_rank", "diff_mean"] == pytest.approx(-2.5)
    assert sec.loc["update_energy_top_r", "diff_mean"] == pytest.approx(0.6 - 0.5)


def test_the_report_section_states_the_plan_and_every_table(tmp_path):
    """REPORT.md's Study section: the choices and the seed rule as frozen, the verdicts at each
    update (primary first), the accuracy-memory table and the secondary endpoints."""
    from types import SimpleNamespace

    from logra.analysis.runs_report import _study
    assert "has not run" in "\n".join(_study(SimpleNamespace(study=None)))
    val = {(arm, k, seed): 0.3 + 0.1 * k + 0.01 * seed * (arm == "l")
           for arm in "dxl" for k in (0, 1) for seed in range(3)}
    plan = _plan(tmp_path / "val", val)
    runs, evals, bases = {}, {}, {}
    for arm in plan["arms"]:
        for seed in plan["seeds"]:
            runs[arm, seed] = tmp_path / arm / f"seed{seed}.json"
            write_json(runs[arm, seed], {"task": "t", "method": plan["arms"][arm]["method"],
                                         "seed": seed, "status": "ok", "peak_mem_bytes": 2**20})
            for step in (2, 4):
                evals["t", arm, seed, step] = _eval(tmp_path / arm / f"{seed}_{step}.json",
                                                    0.5 + 0.025 * (seed % 2) * (arm == "l"))
    for seed in plan["seeds"]:
        bases["t", seed] = _eval(tmp_path / f"base{seed}.json", 0.3)
    tables = study_tables(plan, runs, evals, bases)
    text = "\n".join(_study(SimpleNamespace(study={
        "horizons": {"h4": {"plan": plan} | tables},
        "across": horizon_table({"h4": plan}, {"h4": tables["summary"]})})))
    rule = plan["seeds_rule"]
    assert rule["n"] == max(rule["needed"], 2) and not rule["capped"]
    assert ("the most any contrast needs for a 95% half-width of 0.02 at its validation spread "
            f"is {rule['needed']}.") in text and f"run on {rule['n']} test seeds" in text
    assert text.index("verdicts at update 4 (primary)") < text.index(
        "verdicts at update 2 (secondary)") < text.index("Study, 4 updates: accuracy and memory")
    assert "## Study: the horizons (`results/study/horizons.csv`)" in text
    assert "| l − d | eval_greedy |" in text and "| l − x |" in text
    v = study_tables(plan, runs, evals, bases)["verdicts"]
    half = v[(v["step"] == 4) & (v["method"] == "l") & (v["reference"] == "d")]["half_width"]
    assert half.iloc[0] > 0 and f"(the plan aimed at 0.02): l − d {half.iloc[0]:.3f}; " in text


def test_the_horizons_table_holm_adjusts_the_shared_contrasts_and_pairs_their_seeds(tmp_path):
    """results/study/horizons.csv: each contrast every horizon runs (l against d; x runs at
    one horizon only, so it is left out) at each horizon, its per-seed differences' mean and
    interval, its answers Holm-adjusted over the horizons; and the horizon effect, the paired
    difference of the per-seed differences on the seeds both horizons ran; its figure draws."""
    from logra.analysis.verdict import contrast_tests, holm
    d4 = {0: -0.02, 1: -0.01, 2: -0.03, 3: -0.02}
    d8 = {0: 0.03, 1: 0.02, 2: 0.04}  # fewer seeds at the longer horizon
    rows = {"h4": [], "h8": []}
    for h, d in (("h4", d4), ("h8", d8)):
        for seed, x in d.items():
            rows[h] += [{"method": "d", "seed": seed, "eval_accuracy": 0.5, "base_accuracy": 0.3},
                        {"method": "l", "seed": seed, "eval_accuracy": 0.5 + x,
                         "base_accuracy": 0.3}]
    rows["h4"] += [{"method": "x", "seed": s, "eval_accuracy": 0.6, "base_accuracy": 0.3}
                   for s in d4]
    plans = {h: {"task": "t", "reference": "d", "methods": arms, "steps": dict.fromkeys(arms, n),
                 "margins": {"t": {"margin": m}}}
             for h, arms, n, m in (("h8", ["d", "l"], 8, 0.03), ("h4", ["d", "x", "l"], 4, 0.02))}
    t = horizon_table(plans, {h: pd.DataFrame(r) for h, r in rows.items()})
    m = t[t["statistic"] == "mean"].set_index("horizon")
    assert list(m.index) == ["h4", "h8"] and set(m["method"]) == {"l"}  # by updates, x out
    raw = [contrast_tests(list(d.values()), margin)["p_diff"]
           for d, margin in ((d4, 0.02), (d8, 0.03))]
    assert m["p_diff"].tolist() == pytest.approx(holm(raw))
    assert m.loc["h8", "diff_mean"] == pytest.approx(0.03) and m.loc["h8", "seeds"] == 3
    assert m.loc["h4", "margin"] == 0.02 and m.loc["h8", "gain_share"] == pytest.approx(
        1 + 0.03 / 0.2)
    e = t[t["statistic"] == "horizon effect"].iloc[0]
    assert e["horizon"] == "h8 - h4" and e["seeds"] == 3
    assert e["diff_mean"] == pytest.approx(np.mean([d8[s] - d4[s] for s in d8]))
    # one pair: Holm leaves its p, which is below 0.05 exactly where the interval excludes 0
    assert e["p_effect"] == pytest.approx(contrast_tests([d8[s] - d4[s] for s in d8], 0.0)[
        "p_diff"])
    assert bool(e["depends_on_horizon"]) == bool(e["diff_lo"] > 0 or e["diff_hi"] < 0)
    assert e["depends_on_horizon"]  # +0.05 on every shared seed, give or take 0.01
    from logra.analysis.figures import study_horizons
    study_horizons(t, [str(tmp_path / "h.png"), str(tmp_path / "h.pdf")])
    assert (tmp_path / "h.png").stat().st_size > 0 and (tmp_path / "h.pdf").stat().st_size > 0
    # a share without a gain (the reference gained nothing): its panel is empty, not an error
    empty = t[(t["statistic"] == "mean") & (t["horizon"] == "h4")].assign(
        gain_share=math.nan, gain_share_lo=math.nan, gain_share_hi=math.nan)
    study_horizons(empty, [str(tmp_path / "e.png"), str(tmp_path / "e.pdf")])
    assert (tmp_path / "e.png").stat().st_size > 0


def test_the_stability_contrasts_pair_each_measure_by_seed_and_count_each_clause():
    """A horizon's stability: each continuous measure of the criterion contrasted by seed (a
    run missing a measure drops its seed from that measure only), each clause's passes
    counted per arm over the seeds both ran."""
    from logra.analysis.stability import CLAUSES
    from logra.analysis.study import STABILITY_MEASURES, stability_contrasts
    rows = []
    for seed in range(4):
        for arm, shift in (("d", 0.0), ("l", 0.1)):
            rows.append({"method": arm, "seed": seed, **{m: seed + shift for m in
                                                        STABILITY_MEASURES},
                         **{f"{c}_ok": True for c in CLAUSES},
                         "stable": arm == "l" or seed < 2})
    rows.append({"method": "l", "seed": 9, **dict.fromkeys(STABILITY_MEASURES, 5.0),
                 **{f"{c}_ok": False for c in CLAUSES}, "stable": False})  # no pair
    table = pd.DataFrame(rows)
    table.loc[(table["method"] == "d") & (table["seed"] == 3), "spike_share"] = math.nan
    t = stability_contrasts(table, [("l", "d")]).set_index("measure")
    assert list(t.index) == [*STABILITY_MEASURES, *(f"{c}_ok" for c in CLAUSES), "stable"]
    assert t.loc["kl_to_base_last", "diff_mean"] == pytest.approx(0.1)
    assert t.loc["kl_to_base_last", "seeds"] == 4 and t.loc["spike_share", "seeds"] == 3
    assert t.loc["entropy_ratio_min", "mean_a"] == pytest.approx(1.6)
    assert t.loc["stable", ["passed_a", "passed_b"]].tolist() == ["4/4", "2/4"]
    assert t.loc["stable", "mean_b"] == 0.5 and t.loc["ended_ok", "passed_a"] == "4/4"
    # REPORT.md's section: the measures with their intervals, the clauses with their counts
    from logra.analysis.runs_report import _study_stability_section
    text = "\n".join(_study_stability_section(t.reset_index(), "results/study/h9", 9))
    assert "## Study, 9 updates: stability (`results/study/h9/stability_contrasts.csv`)" in text
    assert "| l − d | kl_to_base_last | 1.6 | 1.5 | +0.1 [+0.1, +0.1] | 4 |" in text
    assert "| l − d | stable | 4/4 | 2/4 |  | 4 |" in text
