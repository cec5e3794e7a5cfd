# Each task's margin, from validation runs only: the lr sweep's runs of the reference at its
# configured lr and their seeds' SFT bases, on the validation split (logra/analysis/verdict.py)
rule margin:
    input:
        refs=[f"results/lr_sweep/{task}/{run}/seed{seed}.json"
              for task, run in PLAN.margin_runs.items() for seed in PLAN.margin_seeds],
        bases=[f"results/lr_sweep/{task}/base_seed{seed}.json"
               for task in PLAN.margin_runs for seed in PLAN.margin_seeds],
    output:
        "results/margin.csv",
    params:
        tasks=PLAN.tasks,
        margin=config["verdict"]["margin"],
        lrs={task: PLAN.sweep[run][1] for task, run in PLAN.margin_runs.items()},
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/tables/margin.tsv",
    log:
        "results/logs/margin.log",
    script:
        "../scripts/margin.py"


# The analysis plan, frozen before any test evaluation (every eval_run and eval_base waits for
# it): the primary metric, the margins, the gate, the seeds, steps and methods compared; once a
# test evaluation exists, a config that would rewrite it is refused (logra/harness/freeze.py)
freeze_guard("results/analysis_plan.json", PLAN.plan_spec,
             ["results/eval", "results/stability"], lambda spec: spec["tasks"])
rule analysis_plan:
    input:
        margin="results/margin.csv",
    output:
        "results/analysis_plan.json",
    params:
        plan=PLAN.plan_spec,
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/tables/analysis_plan.tsv",
    log:
        "results/logs/analysis_plan.log",
    script:
        "../scripts/analysis_plan.py"


# Each method against the reference (config `verdict`): paired differences with 95% intervals
# and a non-inferiority call (docs/verdicts.md), whatever they say.
rule verdicts:
    input:
        evals=expand("results/eval/{run}.json", run=PLAN.runs["grid"]),
        base=expand("results/eval/{task}/base_seed{seed}.json", task=PLAN.tasks, seed=PLAN.seeds),
        plan="results/analysis_plan.json",
    output:
        report("results/verdicts.csv", caption="../report/table.rst", category="Tables"),
    params:
        runs=PLAN.runs["grid"],
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/tables/verdicts.tsv",
    log:
        "results/logs/verdicts.log",
    script:
        "../scripts/verdicts.py"


rule verdicts_figure:
    input:
        verdicts="results/verdicts.csv",
        summary="results/summary.csv",
        runs=expand("results/runs/{run}/summary.json", run=PLAN.runs["grid"]),
    output:
        png=report("figures/verdicts.png", caption="../report/verdicts.rst",
                   category="Figures"),
        pdf="figures/verdicts.pdf",
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/figures/verdicts.tsv",
    log:
        "results/logs/figures/verdicts.log",
    script:
        "../scripts/verdicts_figure.py"


use rule verdicts as ablation_verdicts with:
    input:
        evals=expand("results/eval/{run}.json", run=PLAN.runs["ablations"]),
        base=expand("results/eval/{task}/base_seed{seed}.json", task=PLAN.tasks, seed=PLAN.seeds),
        plan="results/analysis_plan.json",
    output:
        "results/ablations/verdicts.csv",
    params:
        runs=PLAN.runs["ablations"],
    benchmark:
        "results/benchmarks/ablations/verdicts.tsv",
    log:
        "results/logs/ablations/verdicts.log",


use rule verdicts_figure as ablation_verdicts_figure with:
    input:
        verdicts="results/ablations/verdicts.csv",
        summary="results/ablations/summary.csv",
        runs=expand("results/runs/{run}/summary.json", run=PLAN.runs["ablations"]),
    output:
        png="figures/ablations/verdicts.png",
        pdf="figures/ablations/verdicts.pdf",
    benchmark:
        "results/benchmarks/ablations/verdicts_figure.tsv",
    log:
        "results/logs/figures/ablations/verdicts.log",
