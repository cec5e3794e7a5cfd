# `snakemake study` (config `study`, logra/analysis/study.py), at each horizon on its own
# (results/study/<horizon>/): each arm's grid run on the validation split under the bracket rule
# (workflow/rules/sweep.smk, table `study`) and its choice written (an arm `study.tuned` adopted
# skips its grid), the reference's chosen point run on the margin seeds, then the plan frozen
# (the choices, the margin, the test seeds from the validation spread, the analysis), then the
# chosen points' test runs, scored at the last update (and the horizon's snapshot), their drift
# from the base and their update's spectrum measured, compared by seed; then the horizons
# against each other (results/study/horizons.csv)
STUDY = config.get("study") or {}
STUDY_POINTS = {name: point for grid in PLAN.grids["study"].values()
                for name, point in grid.points().items()}


# an arm's choice at a horizon on the validation split from its grid's last window, the record
# `study.tuned.<arm>_<horizon>` adopts (`python -m logra.harness.adopt`: the grid then does not
# run again); a checkpoint: the margin's runs are the reference's chosen point
checkpoint study_tuned:
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


# what each horizon's plan is written from; once a test evaluation of it exists, a config that
# would rewrite it is refused (logra/harness/freeze.py). An arm's choice adopted
# (study.tuned) as its grid wrote it is no change.
STUDY_PLANS = {h: study_plan_spec(h) for h in PLAN.study_horizons}
for h, spec in STUDY_PLANS.items():
    freeze_guard(f"results/study/{h}/analysis_plan.json",
                 spec | {"study": {k: v for k, v in spec["study"].items() if k != "tuned"}},
                 [f"results/study/{h}/eval"], lambda spec: [spec["study"]["task"]])


checkpoint study_plan:
    input:
        unpack(lambda w: study_plan_inputs(STUDY_PLANS[w.horizon]["study"])),
    output:
        plan="results/study/{horizon}/analysis_plan.json",
    params:
        spec=lambda w: STUDY_PLANS[w.horizon],
        margin=config["verdict"]["margin"],
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/study/study_plan/{horizon}.tsv",
    log:
        "results/logs/study/study_plan/{horizon}.log",
    script:
        "../scripts/study_plan.py"


# a test run scored at update {step}: its snapshot there, or its saved model at the last update
# (or where it stopped, if earlier); after its horizon's plan, as every test evaluation
rule study_eval:
    input:
        run="results/runs/{task}/{method}/seed{seed}/summary.json",
        lmeval="results/data/{task}/lmeval",
        plan="results/study/{horizon}/analysis_plan.json",
    output:
        "results/study/{horizon}/eval/{task}/{method}/seed{seed}/step{step}.json",
    params:
        eval=config["eval"],
    threads: config["threads"]
    resources:
        **stage_resources("eval"),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/study/study_eval/{horizon}/{task}/{method}/seed{seed}/step{step}.tsv",
    log:
        "results/logs/study/eval/{horizon}/{task}/{method}/seed{seed}/step{step}.log",
    script:
        "../scripts/study_eval.py"


# a test run's policy at its last update against its SFT base: the exact token entropy of its
# own samples and its KL to the base, on the stability criterion's fixed test prompts
# (logra/rl/drift.py); after its horizon's plan, as every test evaluation. Where the horizon
# judges stability the table reads it from the run's curve, whose last point it is (study_curve)
rule study_drift:
    input:
        unpack(base_input),
        run="results/runs/{task}/{method}/seed{seed}/summary.json",
        test="results/data/{task}/test.jsonl",
        plan="results/study/{horizon}/analysis_plan.json",
    output:
        "results/study/{horizon}/drift/{task}/{method}/seed{seed}.json",
    params:
        eval=PLAN.primary_eval,
        base=lambda wildcards, input: PLAN.start_model(wildcards.method) or input.base,
        prompts=config["stability"]["criterion"]["collapse"]["prompts"] if STUDY else None,
    threads: config["threads"]
    resources:
        **stage_resources("eval"),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/study/study_drift/{horizon}/{task}/{method}/seed{seed}.tsv",
    log:
        "results/logs/study/drift/{horizon}/{task}/{method}/seed{seed}.log",
    script:
        "../scripts/study_drift.py"


# the update's spectrum of a test run: each target matrix's final weights against its SFT
# base (logra/measure/spectrum.py), at the rank and target modules of the study's LoGRA arm
rule study_spectrum:
    input:
        unpack(base_input),
        run="results/runs/{task}/{method}/seed{seed}/summary.json",
        plan="results/study/{horizon}/analysis_plan.json",
    output:
        "results/study/{horizon}/spectrum/{task}/{method}/seed{seed}.csv",
    threads: 1
    params:
        base=lambda wildcards, input: PLAN.start_model(wildcards.method) or input.base,
        options=lambda w: config["methods"][STUDY_LOGRA]["options"],
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/study/study_spectrum/{horizon}/{task}/{method}/seed{seed}.tsv",
    log:
        "results/logs/study/spectrum/{horizon}/{task}/{method}/seed{seed}.log",
    script:
        "../scripts/study_spectrum.py"


# a test run's held-out curve where its horizon declares `stability` (a snapshot every
# `every` updates): its SFT base, each snapshot and its last update scored on the test split,
# its drift from the base at each (workflow/scripts/stability_eval.py, as the stability runs');
# after its horizon's plan, as every test evaluation
use rule stability_eval as study_curve with:
    input:
        unpack(lambda w: {"run": f"results/runs/{w.task}/{w.method}/seed{w.seed}/summary.json",
                          "lmeval": f"results/data/{w.task}/lmeval",
                          "test": f"results/data/{w.task}/test.jsonl",
                          "plan": f"results/study/{w.horizon}/analysis_plan.json"}
               | base_input(w)),
    params:
        eval=PLAN.primary_eval,
        base=lambda wildcards, input: PLAN.start_model(wildcards.method) or input.base,
        prompts=config["stability"]["criterion"]["collapse"]["prompts"] if STUDY else None,
    output:
        "results/study/{horizon}/curve/{task}/{method}/seed{seed}.json",
    benchmark:
        "results/benchmarks/study/study_curve/{horizon}/{task}/{method}/seed{seed}.tsv",
    log:
        "results/logs/study/curve/{horizon}/{task}/{method}/seed{seed}.log",


# each test run judged by stability.criterion on its curve, and the arms contrasted by seed on
# the criterion's measures (logra.analysis.study.stability_contrasts: docs/stability.md)
rule study_stability:
    input:
        unpack(study_stability_inputs),
    output:
        **{name: f"results/study/{{horizon}}/{name}.csv" for name in STUDY_STABILITY},
    params:
        criterion=config.get("stability", {}).get("criterion"),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/study/study_stability/{horizon}.tsv",
    log:
        "results/logs/study/study_stability/{horizon}.log",
    script:
        "../scripts/study_stability.py"


rule study_table:
    input:
        unpack(study_inputs),
    output:
        **{name: f"results/study/{{horizon}}/{name}.csv" for name in STUDY_TABLES},
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/study/study_table/{horizon}.tsv",
    log:
        "results/logs/study/study_table/{horizon}.log",
    script:
        "../scripts/study_table.py"


# the horizons against each other: each contrast every horizon runs at each horizon, Holm over
# them, and the horizon effect, the paired difference of a contrast at two horizons on the seeds
# both ran (logra.analysis.study.horizon_table)
rule study_horizons:
    input:
        plans=[f"results/study/{h}/analysis_plan.json" for h in PLAN.study_horizons],
        summaries=[f"results/study/{h}/summary.csv" for h in PLAN.study_horizons],
    output:
        "results/study/horizons.csv",
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/study/study_horizons.tsv",
    log:
        "results/logs/study/study_horizons.log",
    script:
        "../scripts/study_horizons.py"


rule study_figure:
    input:
        "results/study/horizons.csv",
    output:
        png=report("figures/study_horizons.png", caption="../report/study_horizons.rst",
                   category="Figures"),
        pdf="figures/study_horizons.pdf",
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/figures/study_horizons.tsv",
    log:
        "results/logs/figures/study_horizons.log",
    script:
        "../scripts/study_figure.py"
