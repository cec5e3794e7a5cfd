# `snakemake sync_regime`: the runs of every sync_regime regime (bf16 engine, delta vs low-rank
# sync) and their table, results/sync_regime.csv, which results/REPORT.md includes once written
rule sync_regime_table:
    input:
        runs=expand("results/runs/{run}/summary.json", run=PLAN.runs["sync_regime"]),
    output:
        "results/sync_regime.csv",
    params:
        regimes=PLAN.regimes,
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/sync_regime/table.tsv",
    log:
        "results/logs/sync_regime.log",
    script:
        "../scripts/sync_regime.py"
