# What every stage computed, as SHA-256 digests (logra/repro.py): two reproductions agree
# bit for bit exactly when their fingerprints.csv files are equal.
rule fingerprints:
    input:
        data=expand("results/data/{task}/{split}.jsonl", task=TASKS, split=["train", "test"]),
        bases=[] if start_model(config) else expand("results/base/{task}/seed{seed}/model",
                                                    task=TASKS, seed=SEEDS),
        runs=expand("results/runs/{run}/summary.json", run=list(dict.fromkeys(RUNS + LONG_RUNS))),
        evals=expand("results/eval/{run}.json", run=RUNS)
        + expand("results/eval/{task}/base_seed{seed}.json", task=TASKS, seed=SEEDS),
    output:
        "results/fingerprints.csv",
    resources:
        **job_resources(config, "fingerprints"),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/tables/fingerprints.tsv",
    log:
        "results/logs/fingerprints.log",
    script:
        "../scripts/fingerprints.py"
