# Each method against the reference (config `verdict`): paired differences with 95% intervals
# and a non-inferiority call (logra/analysis/verdict.py), whatever they say.
rule verdicts:
    input:
        evals=expand("results/eval/{run}.json", run=RUNS),
        base=expand("results/eval/{task}/base_seed{seed}.json", task=TASKS, seed=SEEDS),
    output:
        report("results/verdicts.csv", caption="../report/table.rst", category="Tables"),
    params:
        runs=RUNS,
        verdict=config["verdict"],
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
        evals=expand("results/eval/{run}.json", run=ABLATION_RUNS),
        base=expand("results/eval/{task}/base_seed{seed}.json", task=TASKS, seed=SEEDS),
    output:
        "results/ablations/verdicts.csv",
    params:
        runs=ABLATION_RUNS,
        verdict=config["verdict"],
    benchmark:
        "results/benchmarks/ablations/verdicts.tsv",
    log:
        "results/logs/ablations/verdicts.log",


use rule verdicts_figure as ablation_verdicts_figure with:
    input:
        verdicts="results/ablations/verdicts.csv",
        summary="results/ablations/summary.csv",
    output:
        png="figures/ablations/verdicts.png",
        pdf="figures/ablations/verdicts.pdf",
    benchmark:
        "results/benchmarks/ablations/verdicts_figure.tsv",
    log:
        "results/logs/figures/ablations/verdicts.log",
