rule train:
    input:
        base="results/base/{task}/model",
        train="results/data/{task}/train.jsonl",
    output:
        summary="results/runs/{task}/{method}/seed{seed}/summary.json",
        metrics="results/runs/{task}/{method}/seed{seed}/metrics.csv",
        model=directory("results/runs/{task}/{method}/seed{seed}/model"),
    params:
        # the resolved run config: editing a method's options reruns its runs
        run=lambda w: run_config(config, w.task, w.method, int(w.seed)),
        # not an output: Snakemake must not delete it when a job dies (resume reads it)
        checkpoint="results/checkpoints/{task}/{method}/seed{seed}",
    threads: config["threads"]
    conda:
        "../../environment.yml"
    log:
        "results/logs/train/{task}/{method}/seed{seed}.log",
    script:
        "../scripts/train.py"
