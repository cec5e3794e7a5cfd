RUNS = expand("{task}/{method}/seed{seed}", task=TASKS, method=METHODS, seed=SEEDS)


rule summary:
    input:
        runs=expand("results/runs/{run}/summary.json", run=RUNS),
        evals=expand("results/eval/{run}.json", run=RUNS),
        base=expand("results/eval/{task}/base.json", task=TASKS),
    output:
        summary="results/summary.csv",
        accuracy="results/accuracy.csv",
    conda:
        "../../environment.yml"
    log:
        "results/logs/summary.log",
    script:
        "../scripts/summarize.py"


rule reward_curves:
    input:
        summary="results/summary.csv",
        metrics=expand("results/runs/{run}/metrics.csv", run=RUNS),
    output:
        png="figures/reward_curves.png",
        pdf="figures/reward_curves.pdf",
    conda:
        "../../environment.yml"
    log:
        "results/logs/figures/reward_curves.log",
    script:
        "../scripts/reward_curves.py"
