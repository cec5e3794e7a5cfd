rule train:
    input:
        # the task's train split, and its SFT base unless the run starts from a hub model
        unpack(lambda w: {"train": f"results/data/{w.task}/train.jsonl"} | base_input(w)),
    output:
        summary="results/runs/{task}/{method}/seed{seed}/summary.json",
        metrics="results/runs/{task}/{method}/seed{seed}/metrics.csv",
        model=directory("results/runs/{task}/{method}/seed{seed}/model"),
    params:
        # the resolved run config: editing a method's options reruns its runs
        run=lambda w: PLAN.run_config(w.task, w.method, int(w.seed)),
        # not an output: Snakemake must not delete it when a job dies (resume reads it)
        checkpoint="results/checkpoints/{task}/{method}/seed{seed}",
        base=lambda wildcards, input: PLAN.start_model(wildcards.method) or input.base,
    threads: config["threads"]
    resources:
        **stage_resources("train"),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/train/train/{task}/{method}/seed{seed}.tsv",
    log:
        "results/logs/train/{task}/{method}/seed{seed}.log",
    script:
        "../scripts/train.py"
