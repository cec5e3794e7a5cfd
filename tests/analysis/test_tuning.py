"""Tuning on the validation split (logra/analysis/tuning.py), as stated invariants: the grid's
table and its choice, the bracket rule (an edge choice extends the grid by one point, an interior
one stops it, the cap stops it and is reported), and the choices written for the config, which
adopts them (logra.harness.config.apply_tuned)."""
from pathlib import Path

import pandas as pd
import pytest
import yaml

from logra.analysis.tuning import (lr_sweep_table, next_window, round_result,
                                   scaling_tuned_file, tuned_file)
from logra.files import write_json

SWEEP = {"adam_lr1": ("adam", 1e-4), "adam_lr2": ("adam", 1e-3), "adam_lr3": ("adam", 1e-2),
         "rule_lr1": ("rule", 1e-4), "rule_lr2": ("rule", 1e-3), "flaky_lr1": ("flaky", 1e-4)}
KNOBS = {"adam": "lr", "rule": "kl_budget", "flaky": "lr"}
# (task, run name, seed) -> (status, final training reward, validation accuracy)
RUNS = {("a", "adam_lr1", 0): ("ok", 0.9, 0.30), ("a", "adam_lr1", 1): ("ok", 0.9, 0.32),
        ("a", "adam_lr2", 0): ("ok", 0.1, 0.40), ("a", "adam_lr2", 1): ("ok", 0.1, 0.42),
        # the best accuracy on its one ok seed, but a seed diverged: not eligible
        ("a", "adam_lr3", 0): ("ok", 0.5, 0.45), ("a", "adam_lr3", 1): ("diverged", 0.0, 0.99),
        ("a", "rule_lr1", 0): ("ok", 0.3, 0.35), ("a", "rule_lr2", 0): ("ok", 0.4, 0.35),  # a tie
        ("a", "flaky_lr1", 0): ("oom", None, 0.50),  # no lr of this method finished
        # another task: its own choice
        ("b", "adam_lr1", 0): ("ok", 0.2, 0.60), ("b", "adam_lr2", 0): ("ok", 0.2, 0.50)}


def _sweep_files(root: Path):
    runs, vals = [], []
    for (task, name, seed), (status, reward, acc) in RUNS.items():
        run = root / "runs" / task / name / f"seed{seed}"
        control = {"steps_at_cap_share": 0.25 * seed} if name.startswith("rule") else None
        write_json(run / "summary.json", {"task": task, "method": name, "seed": seed,
                                          "status": status, "final_reward": reward,
                                          "control": control})
        val = root / "val" / task / name / f"seed{seed}.json"
        write_json(val, {"accuracy": acc, "primary": "sampled", "model_dir": str(run / "model")})
        runs.append(run / "summary.json")
        vals.append(val)
    return runs, vals


def test_lr_sweep_chooses_by_validation_accuracy_over_complete_lrs(tmp_path):
    runs, vals = _sweep_files(tmp_path)
    table = lr_sweep_table(runs, vals, SWEEP, KNOBS).set_index(["task", "method", "lr"])
    assert table.loc[("a", "adam", 1e-3), "val_accuracy_mean"] == pytest.approx(0.41)
    assert table.loc[("a", "adam", 1e-2), ["n_ok", "n_seeds"]].tolist() == [1, 2]
    assert table.loc[("a", "adam", 1e-2), "val_accuracy_mean"] == pytest.approx(0.45)  # ok seeds
    chosen = table[table["chosen"]].index.tolist()
    # not adam's best training reward (1e-4) nor its incomplete 1e-2; a tie: the smaller lr;
    # none for a method without a complete lr; each task its own
    assert chosen == [("a", "adam", 1e-3), ("a", "rule", 1e-4), ("b", "adam", 1e-4)]
    # a method's budget is the number of points it ran on the task; a choice at the end of
    # those points is flagged
    assert table.xs("adam", level="method")["budget"].to_dict() == {
        ("a", 1e-4): 3, ("a", 1e-3): 3, ("a", 1e-2): 3, ("b", 1e-4): 2, ("b", 1e-3): 2}
    assert table.xs("rule", level="method")["budget"].eq(2).all()
    assert table[table["on_edge"]].index.tolist() == [("a", "rule", 1e-4), ("b", "adam", 1e-4)]
    # each row names what its point set, and the share of its steps at the control's cap
    assert table.xs("rule", level="method")["option"].eq("kl_budget").all()
    assert table.loc[("a", "rule", 1e-4), "at_cap_share"] == 0.0
    assert table.loc[("a", "adam", 1e-3), ["option", "at_cap_share"]].isna().tolist() == [
        False, True]


def test_lr_sweep_refuses_evaluations_that_do_not_match_the_runs(tmp_path):
    runs, vals = _sweep_files(tmp_path)
    with pytest.raises(ValueError):  # one evaluation missing
        lr_sweep_table(runs, vals[:-1], SWEEP, KNOBS)
    with pytest.raises(ValueError, match="adam_lr1/seed1/model, not the model of .*adam_lr1/seed0"):
        lr_sweep_table(runs, [vals[1]] + vals[1:], SWEEP, KNOBS)


def test_the_table_marks_the_points_the_bracket_rule_added_and_whether_a_choice_is_inside(
        tmp_path):
    """`declared` says which points were declared; `on_edge` and `bracketed` are judged on the
    points run, the added ones included."""
    runs, vals = _sweep_files(tmp_path)
    table = lr_sweep_table(runs, vals, SWEEP, KNOBS, declared={"adam_lr1", "adam_lr2",
                                                               "rule_lr1", "rule_lr2",
                                                               "flaky_lr1"})
    t = table.set_index(["task", "method", "lr"])
    assert t["declared"].to_dict() == {k: k[2] != 1e-2 for k in t.index}  # adam_lr3 was added
    # adam on a: chosen 1e-3, inside 1e-4..1e-2: bracketed; rule on a: 1e-4, its smallest: not
    assert t.loc[("a", "adam", 1e-3), "bracketed"] and not t.loc[("a", "adam", 1e-3), "on_edge"]
    assert not t.xs("rule", level="method")["bracketed"].any()
    assert not t.xs("flaky", level="method")["bracketed"].any()  # nothing chosen


@pytest.mark.parametrize("window, chosen, expected", [
    ((-2, 3), -2, (-3, 3)),  # the smallest point is best: one point below
    ((-2, 3), 3, (-2, 4)),  # the largest: one point above
    ((-2, 3), 1, None),  # inside: the grid is done
    ((-3, 3), -3, (-4, 3)),  # still on its edge: again (1 of the cap's 2 used)
    ((-4, 3), -4, None),  # the cap (2 added points) is reached: done, not bracketed
    ((-3, 4), 4, None),  # one point each way is the cap too
    ((-2, 3), None, None),  # no point finished on every seed: nothing to extend toward
])
def test_the_bracket_rule_extends_an_edge_choice_until_it_is_inside_or_the_cap(window, chosen,
                                                                               expected):
    assert next_window(window, declared=(-2, 3), cap=2, chosen=chosen) == expected


def _table(task, method, scores):
    """lr_sweep_table's rows of one grid, from {point: mean validation accuracy}."""
    best = max(scores, key=lambda v: (scores[v], -v))
    points = sorted(scores)
    return pd.DataFrame({"task": task, "method": method, "lr": points, "option": "lr",
                         "metric": "sampled", "val_accuracy_mean": [scores[v] for v in points],
                         "chosen": [v == best for v in points],
                         "on_edge": [v == best and v in (points[0], points[-1]) for v in points],
                         "bracketed": best not in (points[0], points[-1])})


def test_rounds_follow_the_best_point_outward_and_report_a_capped_edge():
    """A grid whose validation accuracy keeps rising with the step: round 0 (the declared
    points) names the next point above, round 1 the next, round 2 stops at the cap with the
    choice still on its edge, reported as not bracketed."""
    values = {k: 1e-4 * 2.0 ** k for k in range(-2, 6)}  # declared -2..1, cap 2: up to 3
    score = {v: 0.1 * k for k, v in values.items()}  # rising with the step
    window, results = (-2, 1), []
    while window is not None:
        points = {values[k]: score[values[k]] for k in range(window[0], window[1] + 1)}
        result = round_result(_table("a", "adam", points), "a", "adam", values, window,
                              declared=(-2, 1), cap=2)
        results.append(result)
        window = tuple(result["next"]) if result["next"] else None
    assert [r["window"] for r in results] == [[-2, 1], [-2, 2], [-2, 3]]
    assert [r["chosen"] for r in results] == [values[1], values[2], values[3]]
    assert not results[-1]["bracketed"] and results[-1]["next"] is None
    assert results[-1]["scores"] == [[values[k], pytest.approx(0.1 * k)] for k in range(-2, 4)]
    # a peak inside stops at once
    peak = {values[k]: -abs(k) for k in range(-2, 2)}
    inside = round_result(_table("a", "adam", peak), "a", "adam", values, (-2, 1), (-2, 1), 2)
    assert inside["chosen"] == values[0] and inside["bracketed"] and inside["next"] is None
    with pytest.raises(ValueError, match="not the window"):
        round_result(_table("a", "adam", peak), "a", "adam", values, (-2, 2), (-2, 1), 2)


def _halving(tmp_path, accuracy, keep=2, declared=(-2, 3), cap=2):
    """Successive halving on one grid as the workflow runs it (`Grid.runs` each round, then
    `lr_sweep_table` and `round_result` over its runs): `accuracy(k, seed)` each run's
    validation accuracy. Returns the rounds' results and every run made, (k, seed)."""
    from logra.harness.derived import Grid
    values = {k: 1e-4 * 2.0 ** k for k in range(declared[0] - cap, declared[1] + cap + 1)}
    grid = Grid("adam", {k: f"adam_k{k}" for k in values}, values, declared, cap, keep)
    sweep = {name: ("adam", values[k]) for k, name in grid.names.items()}
    (window, kept), results, made = grid.first_round(), [], set()
    while window is not None:
        runs, vals = [], []
        for name, seed in grid.runs(window, kept, [10, 11, 12]):
            k = int(name.removeprefix("adam_k"))
            made.add((k, seed))
            run = tmp_path / name / f"seed{seed}"
            write_json(run / "summary.json", {"task": "a", "method": name, "seed": seed,
                                              "status": "ok", "final_reward": 0.0})
            write_json(run / "val.json", {"accuracy": accuracy(k, seed), "primary": "sampled",
                                          "model_dir": str(run / "model")})
            runs.append(run / "summary.json")
            vals.append(run / "val.json")
        result = round_result(lr_sweep_table(runs, vals, sweep, {"adam": "lr"}), "a", "adam",
                              values, window, declared, cap, kept, keep)
        results.append(result)
        window = tuple(result["next"]) if result["next"] else None
        kept = None if result.get("next_keep") is None else tuple(result["next_keep"])
    return values, results, made


def test_successive_halving_screens_on_one_seed_then_chooses_among_the_best_on_every_seed(
        tmp_path):
    """Halving (keep 2): every declared point on the first seed; the two best there on every
    seed; the choice the best of those over every seed, though a point screened out scored
    higher on its one seed; nothing else runs when that choice is inside."""
    acc = {-2: 0.1, -1: 0.5, 0: 0.6, 1: 0.55, 2: 0.2, 3: 0.3}
    values, results, made = _halving(tmp_path, lambda k, s: acc[k] if s == 10 else (
        0.9 if k == -1 else 0.1))
    screen, final = results
    assert screen["screen"] and screen["next"] == [-2, 3] and screen["next_keep"] == [0, 1]
    assert made == {(k, 10) for k in acc} | {(k, s) for k in (0, 1) for s in (11, 12)}
    # 0: (0.6 + 0.1 + 0.1) / 3 against 1: (0.55 + 0.1 + 0.1) / 3; -1 (0.9 on seeds never run)
    assert final["chosen"] == values[0] and final["bracketed"] and final["next"] is None
    assert final["keep"] == [0, 1]


def test_successive_halving_is_still_bracketed_a_point_added_on_every_seed(tmp_path):
    """A choice among the kept points on the window's edge adds the point beyond it, run on
    every seed, which joins the kept; up to the cap, then reported unbracketed."""
    values, results, made = _halving(tmp_path, lambda k, s: 0.1 * k + 0.01 * s)
    assert [r["window"] for r in results] == [[-2, 3], [-2, 3], [-2, 4], [-2, 5]]
    assert [r.get("keep") for r in results] == [[], [2, 3], [2, 3, 4], [2, 3, 4, 5]]
    assert results[-1]["chosen"] == values[5] and not results[-1]["bracketed"]
    assert results[-1]["next"] is None
    assert {(k, s) for k, s in made if s != 10} == {(k, s) for k in (2, 3, 4, 5) for s in (11, 12)}
    assert {k for k, s in made} == set(range(-2, 6))


def test_the_tuned_file_holds_each_choice_and_its_scores_and_the_config_adopts_it(tmp_path):
    """results/tuned.yaml as the lr sweep writes it, copied beside a config, sets each method's
    knob on its task (LoGRA's update_ratio and final budget following, as its sweep point
    had them) and leaves the other tasks' values as they were."""
    from logra.harness.config import resolve, task_options
    table = pd.concat([_table("countdown", "dense_adam", {5e-5: 0.30, 1e-4: 0.35, 2e-4: 0.33}),
                       _table("countdown", "logra", {2e-4: 0.31, 8e-4: 0.34}).assign(
                           option="kl_budget")])
    text = tuned_file(table, [10, 11, 12], "results/lr_sweep.csv")
    tuned = yaml.safe_load(text)["tuned"]["countdown"]
    assert tuned["dense_adam"] == {"option": "lr", "value": 1e-4, "bracketed": True,
                                   "metric": "sampled", "seeds": [10, 11, 12],
                                   "scores": [[5e-5, 0.3], [1e-4, 0.35], [2e-4, 0.33]]}
    assert tuned["logra"]["value"] == 8e-4 and not tuned["logra"]["bracketed"]
    # the scaling sweep's file: the same records, by method (scaling.tuned.<method>)
    assert yaml.safe_load(scaling_tuned_file(table, [10, 11, 12], "lr_sweep.csv")) == tuned
    root = Path(__file__).resolve().parents[2] / "config" / "config.yaml"
    (tmp_path / "config.yaml").write_text(root.read_text())
    before = resolve([], default=tmp_path / "config.yaml", fit_rules=False)
    (tmp_path / "tuned.yaml").write_text(text)
    after = resolve([], default=tmp_path / "config.yaml", fit_rules=False)
    dense, logra = after["methods"]["dense_adam"]["options"], after["methods"]["logra"]["options"]
    assert dense["lr"]["countdown"] == 1e-4
    assert logra["kl_budget"]["countdown"] == 8e-4
    assert logra["kl_budget_final"]["countdown"] == pytest.approx(8e-5)
    was = before["methods"]["logra"]["options"]
    was_here = task_options(was, "countdown")
    assert logra["update_ratio"]["countdown"] == pytest.approx(
        was_here["update_ratio"] * (8e-4 / was_here["kl_budget"]) ** 0.5)
    # a variant (tuned_as) takes its method's choice, its own options kept
    for variant in ("logra_stable", "logra_nocontrol", "logra_r21"):
        options = after["methods"][variant]["options"]
        assert {k: options[k]["countdown"] for k in ("kl_budget", "kl_budget_final",
                                                     "update_ratio")} \
            == {k: logra[k]["countdown"] for k in ("kl_budget", "kl_budget_final",
                                                   "update_ratio")}
        chosen = ("kl_budget", "kl_budget_final", "update_ratio")
        assert {k: v for k, v in options.items() if k not in chosen} == {
            k: v for k, v in before["methods"][variant]["options"].items() if k not in chosen}
    assert after["methods"]["dense_adam_stable"]["options"]["lr"]["countdown"] == 1e-4
    # a variant configured at another value than its method's takes the choice all the same
    assert before["methods"]["dense_adam_bf16"]["options"]["lr"] == 5e-5
    assert after["methods"]["dense_adam_bf16"]["options"]["lr"] == {"default": 5e-5,
                                                                    "countdown": 1e-4}
    for options, old in ((dense, before["methods"]["dense_adam"]["options"]), (logra, was)):
        for task in set(after["tasks"]) - {"countdown"}:
            assert task_options(options, task) == task_options(old, task)


def test_a_tuned_value_for_another_knob_or_an_unknown_method_is_refused(tmp_path):
    from logra.harness.config import ConfigError, resolve
    root = Path(__file__).resolve().parents[2] / "config" / "config.yaml"
    (tmp_path / "config.yaml").write_text(root.read_text())
    for entry, message in (
            ({"logra": {"option": "lr", "value": 1e-4}},
             r"tuned.countdown.logra.option: 'lr', but the method's knob is 'kl_budget'"),
            ({"nosuch": {"option": "lr", "value": 1e-4}},
             r"tuned.countdown.nosuch: not defined under methods"),
            ({"logra_stable": {"option": "kl_budget", "value": 1e-4}},
             r"tuned.countdown.logra_stable: the method takes 'logra''s choice \(its tuned_as\)")):
        (tmp_path / "tuned.yaml").write_text(yaml.safe_dump({"tuned": {"countdown": entry}}))
        with pytest.raises(ConfigError, match=message + r".*set by .*tuned.yaml"):
            resolve([], default=tmp_path / "config.yaml", fit_rules=False)


DENSE = {"option": "lr", "value": 1e-4, "bracketed": True, "metric": "sampled",
         "seeds": [10, 11, 12], "scores": [[5e-5, 0.30], [1e-4, 0.35], [2e-4, 0.33]]}


@pytest.mark.parametrize("change, message", [
    ({"value": 1e6}, r"tuned.countdown.dense_adam.value: 1000000.0 is not the rule's choice "
                     r"among its scores: 0.0001 scores 0.35"),
    ({"value": 2e-4}, r"value: 0.0002 is not the rule's choice among its scores"),
    ({"value": 1.0000000000001e-4}, None),  # the same float, written another way: adopted
    ({"scores": [[5e-5, 0.30], [1e-4, 0.35]]},
     r"bracketed: True, but its value 0.0001 is on an edge of them"),
    ({"scores": [[5e-5, "0.30"], [1e-4, 0.35], [2e-4, 0.33]]},
     r"scores: .* is not a list of \[value, accuracy or null\] pairs of numbers"),
    ({"metric": "greedy"}, r"metric: 'greedy', but eval.primary is 'sampled'"),
    ({"seeds": [0, 10]}, r"tuned.countdown.dense_adam.seeds: chosen on seeds \[0, 10\], of "
                         r"which \[0\] are test seeds"),
])
def test_a_tuned_record_is_its_rules_choice_among_its_own_scores(tmp_path, change, message):
    """config/tuned.yaml: each record's value is the best of its scores (within a float
    tolerance), `bracketed` says where it lies, its metric is eval.primary, and its seeds are
    no test seed; else the config stops naming the key, both values and the file."""
    from logra.harness.config import ConfigError, resolve
    root = Path(__file__).resolve().parents[2] / "config" / "config.yaml"
    (tmp_path / "config.yaml").write_text(root.read_text())
    entry = {"dense_adam": DENSE | change}
    (tmp_path / "tuned.yaml").write_text(yaml.safe_dump({"tuned": {"countdown": entry}}))
    if message is None:
        resolve([], default=tmp_path / "config.yaml", fit_rules=False)
        return
    with pytest.raises(ConfigError, match=message + r".*set by .*tuned.yaml"):
        resolve([], default=tmp_path / "config.yaml", fit_rules=False)


def test_a_variant_takes_the_choice_of_a_method_of_its_own_rule(tmp_path):
    from logra.harness.config import ConfigError, resolve
    root = Path(__file__).resolve().parents[2] / "config" / "config.yaml"
    line = "logra_r21: {<<: *logra, tuned_as: logra,"
    for leader, message in (
            ("nosuch", r"methods.logra_r21.tuned_as: 'nosuch' is not a method whose choice"),
            ("logra_r86", r"methods.logra_r21.tuned_as: 'logra_r86' is not a method whose"),
            ("galore", r"methods.logra_r21.tuned_as: 'galore' runs rule 'galore', 'logra_r21' "
                       r"runs 'logra'")):
        edit = (line, line.replace("tuned_as: logra", f"tuned_as: {leader}"))
        text = root.read_text()
        assert edit[0] in text
        (tmp_path / "config.yaml").write_text(text.replace(*edit))
        with pytest.raises(ConfigError, match=message):
            resolve([], default=tmp_path / "config.yaml", fit_rules=False)


def test_a_sweep_of_some_grids_keeps_the_choices_adopted_for_the_others(tmp_path):
    """`lr_sweep.methods` runs some grids: the target plans only theirs, and results/tuned.yaml
    holds their new choices over what config/tuned.yaml had adopted, the others' kept."""
    from logra.harness.config import ConfigError, resolve
    from logra.harness.plan import build_plan
    root = Path(__file__).resolve().parents[2] / "config" / "config.yaml"
    (tmp_path / "config.yaml").write_text(root.read_text())
    adopted = {"countdown": {
        "muon": {"option": "lr", "value": 4e-4, "bracketed": False, "metric": "sampled",
                 "seeds": [10], "scores": [[4e-4, 0.3], [8e-4, 0.28]]},
        "dense_adam": {"option": "lr", "value": 1e-4, "bracketed": True, "metric": "sampled",
                       "seeds": [10], "scores": [[5e-5, 0.3], [1e-4, 0.35], [2e-4, 0.33]]}}}
    (tmp_path / "tuned.yaml").write_text(yaml.safe_dump({"tuned": adopted}))
    (tmp_path / "some.yaml").write_text("lr_sweep: {methods: [muon, logra]}\n")
    config = resolve([tmp_path / "some.yaml"], default=tmp_path / "config.yaml", fit_rules=False)
    plan = build_plan(config, fit_rules=False)
    assert list(plan.grids["lr_sweep"]) == ["muon", "logra"]
    assert {r.split("/")[1].rsplit("_lr", 1)[0] for r in plan.runs["lr_sweep"]} == {"muon",
                                                                                  "logra"}
    assert "dense_adam_lr0p0001" in plan.sweep  # every anchor's grid: the margin reads it
    table = _table("countdown", "muon", {4e-4: 0.30, 8e-4: 0.36, 1.6e-3: 0.33})
    tuned = yaml.safe_load(tuned_file(table, [10], "lr_sweep.csv", config["tuned"]))["tuned"]
    assert tuned["countdown"]["muon"]["value"] == 8e-4 and tuned["countdown"]["muon"]["bracketed"]
    assert tuned["countdown"]["dense_adam"] == adopted["countdown"]["dense_adam"]
    (tmp_path / "some.yaml").write_text("lr_sweep: {methods: [sketch_adam]}\n")
    with pytest.raises(ConfigError, match=r"lr_sweep.methods\[0\]: 'sketch_adam' has no grid"):
        resolve([tmp_path / "some.yaml"], default=tmp_path / "config.yaml", fit_rules=False)
