# The Snakemake glue shared by every file of workflow/rules (each job's inputs that depend on its
# method, i.e. its SFT base, and the resources a stage's jobs ask a cluster for). All else they
# read is the plan (PLAN, logra/harness/plan.py) or `config`, its config.
import json
import sys
from pathlib import Path

import yaml
from snakemake.exceptions import IncompleteCheckpointException

from logra.harness import freeze
from logra.harness.runs import horizon_steps


def base_input(wildcards):
    """{"base": the SFT base a job of `wildcards` starts from}, or {} for a hub model."""
    return PLAN.base_input(wildcards)


def freeze_guard(plan, spec, test_dirs, tasks_of):
    """Before any job: refuse a config that would rewrite `plan` while a test evaluation of one
    of its tasks (a JSON under `<test dir>/<task>/`; `tasks_of(spec)`) exists under it, unless
    amend_plan (logra/harness/freeze.py)."""
    if not workflow.is_main_process:
        return
    changed = freeze.guard(plan, spec, test_dirs, tasks_of, config["amend_plan"],
                           workflow.dryrun)
    if changed:
        print(f"{plan}: amended (amend_plan): "
              + "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items()),
              file=sys.stderr)


def stage_resources(stage):
    """The resources of a job of `stage` (logra.harness.config.job_resources): a rule that asks
    none runs beside Snakemake under a cluster executor (the Snakefile's local rules)."""
    return PLAN.resources(stage)


# the tuning grids' rounds (the checkpoint `tuning_round`, workflow/rules/sweep.smk): the bracket
# rule of logra.analysis.tuning, and successive halving where a grid declares it
def tuning_window(w):
    """(window, keep) of round `w.round` of (`w.table`, `w.task`, `w.method`): the points
    (lo, hi) it scores and those of them it runs on every seed (None: all; `Grid.runs`): the
    grid's first round, then what the round before named."""
    if int(w.round) == 0:
        return PLAN.grids[w.table][w.method].first_round()
    before = json.loads(Path(checkpoints.tuning_round.get(
        table=w.table, task=w.task, method=w.method, round=int(w.round) - 1).output[0]).read_text())
    keep = before.get("next_keep")
    return tuple(before["next"]), None if keep is None else tuple(keep)


def window_runs(table, task, method, window, keep=None):
    """The validation runs of a grid's round, "task/method/seedN" (`Grid.runs`)."""
    return [f"{task}/{name}/seed{seed}" for name, seed in
            PLAN.grids[table][method].runs(window, keep, config["lr_sweep"]["seeds"])]


def tuned_rounds(table, task, method):
    """Every round of a grid up to the one that ends it (the checkpoints, run in turn), and
    that round's window and keep (`tuning_window`)."""
    rounds = []
    while True:
        rounds.append(checkpoints.tuning_round.get(table=table, task=task, method=method,
                                                   round=len(rounds)).output[0])
        result = json.loads(Path(rounds[-1]).read_text())
        if result["next"] is None:
            keep = result.get("keep")
            return rounds, tuple(result["window"]), None if keep is None else tuple(keep)


def tuned_runs(table, tasks):
    """([the runs of each grid's last round, "task/method/seedN"], [every grid's rounds]); a
    grid whose next round has not run gives that round's file, so every grid's round is asked
    for at once."""
    runs, rounds = [], []
    for task in tasks:
        for method in PLAN.grids[table]:
            try:
                done, window, keep = tuned_rounds(table, task, method)
            except IncompleteCheckpointException as pending:
                rounds.append(pending.targetfile)
                continue
            rounds += done
            runs += window_runs(table, task, method, window, keep)
    return runs, rounds


def tuning_inputs(table, tasks):
    """The input of a tuning table: every grid's rounds and the runs (`runs`, their summaries)
    and evaluations (`evals`) of each grid's last window."""
    runs, rounds = tuned_runs(table, tasks)
    return {"rounds": rounds, "runs": [f"results/runs/{run}/summary.json" for run in runs],
            "evals": [f"results/lr_sweep/{run}.json" for run in runs]}


def study_arm_inputs(arm):
    """The input of an arm's choice at a horizon (`study_tuned`, `arm` its method there): its
    grid's rounds, and the runs (`runs`, their summaries) and evaluations (`evals`) of its last
    round."""
    rounds, window, keep = tuned_rounds("study", config["study"]["task"], arm)
    runs = window_runs("study", config["study"]["task"], arm, window, keep)
    return {"rounds": rounds, "runs": [f"results/runs/{run}/summary.json" for run in runs],
            "evals": [f"results/lr_sweep/{run}.json" for run in runs]}


# the study's arm whose rank and target modules its update's spectrum is measured at (the first
# LoGRA arm; none: no spectrum)
STUDY_LOGRA = next((arm for arm in (config.get("study") or {}).get("arms", [])
                    if config["methods"][arm]["rule"] == "logra"), None)


def study_plan_spec(h):
    """What horizon `h`'s plan is written from (workflow/rules/study.smk): its grids' points
    (`sweep`), its design (`study`: its arms {arm: its method there}, the adopted choices
    among them in `tuned`), the candidate test seeds (`pool`), the margin's seeds and what
    `logra.analysis.verdict.analysis_plan` reads (`spec`)."""
    st, arms = config["study"], PLAN.study_horizons[h]
    design = st["horizons"][h]
    points = {name: point for grid in PLAN.grids["study"].values() if grid.method in
              arms.values() for name, point in grid.points().items()}
    return {"sweep": points,
            "study": {"task": st["task"], "horizon": h, "arms": arms,
                      "reference": st["reference"], "schedule": st["schedule"],
                      "snapshot": design.get("snapshot"), "seeds": design["seeds"],
                      "tuned": {n: st["tuned"][n] for n in arms.values()
                                if n in st.get("tuned", {})}},
            "pool": PLAN.study_seeds(design["seeds"]["max"]), "margin_seeds": PLAN.margin_seeds,
            "spec": {"eval": config["eval"], "verdict": config["verdict"],
                     "n_test": config["data"].get("n_test"),
                     "steps": {arm: PLAN.grpo(name)["steps"] for arm, name in arms.items()},
                     "configs": {name: config["methods"][name] for name in points}}}


def study_plan_inputs(st):
    """The input of a horizon's plan (`st`: its design, `study_plan_spec`'s `study`): the
    choices its arms' grids wrote (`tuned`; an adopted arm's is in the config), and the
    validation runs of the reference's chosen point on the margin seeds (`margin_refs`) with
    those seeds' SFT bases (`margin_bases`): the horizon's margin, from its own reference."""
    ref = st["arms"][st["reference"]]
    tuned = [f"results/study/tuned/{n}.yaml" for n in st["arms"].values() if n not in st["tuned"]]
    record = st["tuned"].get(ref)
    if record is None:
        try:
            path = checkpoints.study_tuned.get(arm=ref).output[0]
        except IncompleteCheckpointException as pending:  # every grid asked for at once
            return {"tuned": tuned, "margin_refs": [pending.targetfile], "margin_bases": []}
        record = yaml.safe_load(Path(path).read_text())[ref]
    point = next(n for n, (_, v) in PLAN.grids["study"][ref].points().items()
                 if v == record["value"])
    return {"tuned": tuned,
            "margin_refs": [f"results/lr_sweep/{st['task']}/{point}/seed{s}.json"
                            for s in PLAN.margin_seeds],
            "margin_bases": [f"results/lr_sweep/{st['task']}/base_seed{s}.json"
                             for s in PLAN.margin_seeds]}


# a horizon's test runs (workflow/rules/study.smk): known once its plan is frozen (the
# checkpoint `study_plan`: each arm's choice and the test seeds)
def study_runs(h):
    """{(arm, seed): "task/method/seedN"}: each arm's chosen point at horizon `h` at every test
    seed."""
    plan = json.loads(Path(checkpoints.study_plan.get(horizon=h).output.plan).read_text())
    return {(arm, seed): f"{plan['task']}/{c['method']}/seed{seed}"
            for arm, c in plan["arms"].items() for seed in plan["seeds"]}


def study_inputs(w):
    """A horizon's table's input: every test run's summary, its evaluations at the last update
    (and the horizon's snapshot), its drift from its base (its held-out curve, whose last point
    is that drift, where the horizon judges stability), its update's spectrum (where the
    horizon has the LoGRA arm), the test seeds' SFT base evaluations, the plan."""
    h, st = w.horizon, config["study"]
    runs = study_runs(h)
    snapshot = st["horizons"][h].get("snapshot")
    steps = ([snapshot] if snapshot else []) + [horizon_steps(h)]
    drift = "curve" if st["horizons"][h].get("stability") else "drift"
    return {"plan": f"results/study/{h}/analysis_plan.json",
            "runs": [f"results/runs/{run}/summary.json" for run in runs.values()],
            "spectra": [f"results/study/{h}/spectrum/{run}.csv" for run in runs.values()
                        if STUDY_LOGRA in PLAN.study_horizons[h]],
            "drifts": [f"results/study/{h}/{drift}/{run}.json" for run in runs.values()],
            "evals": [f"results/study/{h}/eval/{run}/step{step}.json" for run in runs.values()
                      for step in steps],
            "bases": sorted({f"results/eval/{st['task']}/base_seed{seed}.json"
                             for _, seed in runs})}


def study_stability_inputs(w):
    """A horizon's stability tables' input: its plan, and every test run's summary, metrics and
    held-out curve."""
    runs = study_runs(w.horizon).values()
    return {"plan": f"results/study/{w.horizon}/analysis_plan.json",
            "summaries": [f"results/runs/{run}/summary.json" for run in runs],
            "metrics": [f"results/runs/{run}/metrics.csv" for run in runs],
            "curves": [f"results/study/{w.horizon}/curve/{run}.json" for run in runs]}
