import os


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
        # the opt-in targets' results, each read if it exists and its stamp holds this config's
        # digest; else listed as stale (or not run)
        opt_in={target: dict(zip(paths, PLAN.stamps(target)))
                for target, paths in PLAN.opt_in.items()},
        digest=PLAN.digest,
        # the stamps as they are now: the first run after an opt-in target rebuilds the report
        # (a param, not an input: the report never asks for an opt-in target's work)
        stamps=lambda w: {s: open(s).read() for target in PLAN.opt_in
                          for s in PLAN.stamps(target) if os.path.exists(s)},
        criterion=config.get("stability", {}).get("criterion"),
        reference=PLAN.reference,
        horizons=list(PLAN.study_horizons),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/report/report.tsv",  # its own ledger cannot count it
    log:
        "results/logs/report.log",
    script:
        "../scripts/report.py"


# An opt-in result stamped with the digest of the config under which Snakemake brought it up to
# date (each opt-in target asks for its stamps): the report shows it while that config is the
# current one, and lists it as stale after the config changes
rule stamp:
    input:
        "results/{path}",
    output:
        "results/stamps/{path}.stamp",
    params:
        digest=PLAN.digest,
    wildcard_constraints:
        path=r"(?!stamps/)[\w/.-]+",
    conda:
        "../../environment.yml"
    log:
        "results/logs/stamps/{path}.log",
    script:
        "../scripts/stamp.py"
