# results/REPORT.md: every table of the default target, formatted from its CSVs, and the time
# ledger: the wall seconds Snakemake benchmarked for each job of the default target, by stage
# (the first folder under results/benchmarks/). Its inputs name every job's benchmark, so a
# rule of the default target without a `benchmark:` stops the workflow here.
rule report:
    input:
        benchmarks=PLAN.benchmarks("all"),
        runs=expand("results/runs/{run}/summary.json", run=PLAN.runs["grid"]),
        long_runs=expand("results/runs/{run}/summary.json", run=PLAN.runs["long"]),
        stability=["results/stability.csv"] if PLAN.runs["long"] else [],
        sft=[] if PLAN.start_model() else
        expand("results/base/{task}/seed{seed}/sft.json", task=PLAN.tasks, seed=PLAN.seeds),
        summary="results/summary.csv",
        accuracy="results/accuracy.csv",
        plan="results/analysis_plan.json",
        verdicts=["results/verdicts.csv"] if PLAN.verdicts else [],
        sweep=["results/memory/sweep.csv"] if PLAN.paper else [],
        planner=["results/memory/planner.csv"] if PLAN.paper else [],
        paper_setting=["results/memory/paper_setting.csv"] if config.get("paper_setting") else [],
    output:
        report("results/REPORT.md", caption="../report/REPORT.rst", category="Results"),
    params:
        lr_sweep="results/lr_sweep.csv",  # included if `snakemake lr_sweep` wrote it before
        criterion=config.get("stability", {}).get("criterion"),
        trl="results/trl",  # its *.json, if `snakemake trl` wrote them before
        sync_regime="results/sync_regime.csv",  # if `snakemake sync_regime` wrote it before
        scaling="results/scaling.csv",  # if `snakemake scaling` wrote it before
        ablations="results/ablations",  # its tables, if `snakemake ablations` wrote them before
        reference=PLAN.reference,
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/report/report.tsv",  # its own ledger cannot count it
    log:
        "results/logs/report.log",
    script:
        "../scripts/report.py"
