# `snakemake study` (config `study`, logra/analysis/study.py): each arm's grid run on the
# validation split under the bracket rule (workflow/rules/sweep.smk, table `study`) and its
# choice written (an arm `study.tuned` adopted skips its grid), then the plan frozen (the
# choices, the test seeds from the validation spread, the analysis), then the chosen points'
# test runs, scored at the snapshot and the last update, compared by seed
STUDY = config.get("study") or {}
STUDY_POINTS = {name: point for grid in PLAN.grids["study"].values()
                for name, point in grid.points().items()}


# an arm's choice on the validation split from its grid's last window, the record
# `study.tuned.<arm>` adopts (`python -m logra.harness.adopt`: the grid then does not run again)
rule study_tuned:
    input:
        unpack(lambda w: study_arm_inputs(w.arm)),
    output:
        "results/study/tuned/{arm}.yaml",
    params:
        sweep=STUDY_POINTS,
        knobs=PLAN.sweep_knobs,
        declared=PLAN.declared("study"),
        configs={name: config["methods"][name] for name in STUDY_POINTS},
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/study/tuned/{arm}.tsv",
    log:
        "results/logs/study/tuned/{arm}.log",
    script:
        "../scripts/study_tuned.py"


# what the study's plan is written from; once a test evaluation exists, a config that would
# rewrite it is refused (logra/harness/freeze.py). An arm's choice adopted (study.tuned) as its
# grid wrote it is no change.
STUDY_PLAN = {
    "sweep": STUDY_POINTS, "study": STUDY,
    "pool": PLAN.study_seeds(STUDY["seeds"]["max"]) if STUDY else [],
    "spec": {"eval": config["eval"], "verdict": config["verdict"],
             "n_test": config["data"].get("n_test"),
             "steps": {arm: PLAN.grpo(arm)["steps"] for arm in STUDY.get("arms", [])},
             "configs": {name: config["methods"][name] for name in STUDY_POINTS}}}
if STUDY:
    freeze_guard("results/study/analysis_plan.json",
                 STUDY_PLAN | {"study": {k: v for k, v in STUDY.items() if k != "tuned"}},
                 ["results/study/eval"], lambda spec: [spec["study"]["task"]])


checkpoint study_plan:
    input:
        tuned=[f"results/study/tuned/{arm}.yaml" for arm in STUDY.get("arms", [])
               if arm not in STUDY.get("tuned", {})],
        margin="results/margin.csv",
    output:
        plan="results/study/analysis_plan.json",
    params:
        **STUDY_PLAN,
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/study/study_plan.tsv",
    log:
        "results/logs/study/study_plan.log",
    script:
        "../scripts/study_plan.py"


# a test run scored at update {step}: its snapshot there, or its saved model at the last update
# (or where it stopped, if earlier); after the plan, as every test evaluation
rule study_eval:
    input:
        run="results/runs/{task}/{method}/seed{seed}/summary.json",
        lmeval="results/data/{task}/lmeval",
        plan="results/study/analysis_plan.json",
    output:
        "results/study/eval/{task}/{method}/seed{seed}/step{step}.json",
    params:
        eval=config["eval"],
    threads: config["threads"]
    resources:
        **stage_resources("eval"),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/study/study_eval/{task}/{method}/seed{seed}/step{step}.tsv",
    log:
        "results/logs/study/eval/{task}/{method}/seed{seed}/step{step}.log",
    script:
        "../scripts/study_eval.py"


# the update's spectrum of a test run: each target matrix's final weights against its SFT
# base's (logra/measure/spectrum.py), at the rank and target modules of the study's LoGRA arm
rule study_spectrum:
    input:
        unpack(base_input),
        run="results/runs/{task}/{method}/seed{seed}/summary.json",
        plan="results/study/analysis_plan.json",
    output:
        "results/study/spectrum/{task}/{method}/seed{seed}.csv",
    threads: 1
    params:
        base=lambda wildcards, input: PLAN.start_model(wildcards.method) or input.base,
        options=lambda w: config["methods"][STUDY_LOGRA]["options"],
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/study/study_spectrum/{task}/{method}/seed{seed}.tsv",
    log:
        "results/logs/study/spectrum/{task}/{method}/seed{seed}.log",
    script:
        "../scripts/study_spectrum.py"


rule study_table:
    input:
        unpack(study_inputs),
    output:
        **{name: f"results/study/{name}.csv" for name in STUDY_TABLES},
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/study/study_table.tsv",
    log:
        "results/logs/study/study_table.log",
    script:
        "../scripts/study_table.py"
