# What every stage computed, as SHA-256 digests (logra/repro.py): two reproductions agree
# bit for bit exactly when their fingerprints.csv files are equal.
rule fingerprints:
    input:
        data=expand("results/data/{task}/{split}.jsonl", task=PLAN.tasks, split=["train", "test"]),
        bases=[] if PLAN.start_model() else expand("results/base/{task}/seed{seed}/model",
                                                    task=PLAN.tasks, seed=PLAN.seeds),
        runs=expand("results/runs/{run}/summary.json", run=list(dict.fromkeys(PLAN.runs["grid"] + PLAN.runs["long"]))),
        evals=expand("results/eval/{run}.json", run=PLAN.runs["grid"])
        + expand("results/eval/{task}/base_seed{seed}.json", task=PLAN.tasks, seed=PLAN.seeds),
    output:
        "results/fingerprints.csv",
    resources:
        **stage_resources("fingerprints"),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/tables/fingerprints.tsv",
    log:
        "results/logs/fingerprints.log",
    script:
        "../scripts/fingerprints.py"
