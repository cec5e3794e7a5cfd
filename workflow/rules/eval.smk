# Test evaluations wait for the analysis plan (verdicts.smk): the metric, margins, seeds and
# methods are fixed before any of them runs, and a plan that changes scores them again after it.
# Not `ancient`: Snakemake skips the needrun check of every job below a job it reruns, and does
# not rerun across an ancient edge, so the tables below it were left stale (a task switched in
# the config rewrote the plan and kept the old task's summary; snakemake/snakemake#4166)
rule eval_run:
    input:
        model="results/runs/{task}/{method}/seed{seed}/model",
        lmeval="results/data/{task}/lmeval",
        plan="results/analysis_plan.json",
    output:
        "results/eval/{task}/{method}/seed{seed}.json",
    params:
        eval=config["eval"],
        model=lambda wildcards, input: input.model,
    threads: config["threads"]
    resources:
        **stage_resources("eval"),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/eval/eval_run/{task}/{method}/seed{seed}.tsv",
    log:
        "results/logs/eval/{task}/{method}/seed{seed}.log",
    script:
        "../scripts/evaluate.py"


rule eval_base:
    input:
        unpack(lambda w: {"lmeval": f"results/data/{w.task}/lmeval",
                          "plan": "results/analysis_plan.json"}
                         | base_input(w)),
    output:
        "results/eval/{task}/base_seed{seed}.json",
    params:
        eval=config["eval"],
        model=lambda wildcards, input: PLAN.start_model() or input.base,
    threads: config["threads"]
    resources:
        **stage_resources("eval"),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/eval/eval_base/{task}/seed{seed}.tsv",
    log:
        "results/logs/eval/{task}/base_seed{seed}.log",
    script:
        "../scripts/evaluate.py"
