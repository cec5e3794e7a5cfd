# results/REPORT.md: every table of the default target, formatted from its CSVs, and the time
# ledger: the wall seconds Snakemake benchmarked for each job of the default target, by stage
# (the first folder under results/benchmarks/). Its inputs name every job's benchmark, so a
# rule of the default target without a `benchmark:` stops the workflow here.
BENCH = "results/benchmarks"
# every GRPO run of the default target, and the (task, seed) of each SFT base they start from
TRAINED = list(dict.fromkeys(RUNS + LONG_RUNS + [
    f"{task}/{run}/seed{seed}" for task, run in MARGIN_RUNS.items() for seed in MARGIN_SEEDS]))
BASES = sorted({re.fullmatch(r"(\w+)/\w+/seed(\d+)", run).groups() for run in TRAINED})
DEFAULT_BENCHMARKS = (
    expand(f"{BENCH}/data/data/{{task}}.tsv", task=sorted({task for task, _ in BASES}))
    + expand(f"{BENCH}/data/lmeval_task/{{task}}.tsv", task=TASKS)
    + ([] if start_model(config) else
       [f"{BENCH}/base/base/{task}/seed{seed}.tsv" for task, seed in BASES])
    + expand(f"{BENCH}/train/train/{{run}}.tsv", run=TRAINED)
    + expand(f"{BENCH}/eval/eval_run/{{run}}.tsv", run=RUNS)
    + expand(f"{BENCH}/stability/stability_eval/{{run}}.tsv", run=LONG_RUNS)
    + expand(f"{BENCH}/eval/eval_base/{{task}}/seed{{seed}}.tsv", task=TASKS, seed=SEEDS)
    + [f"{BENCH}/lr_sweep/lr_sweep_eval/{task}/{run}/seed{seed}.tsv"
       for task, run in MARGIN_RUNS.items() for seed in MARGIN_SEEDS]
    + [f"{BENCH}/lr_sweep/lr_sweep_eval_base/{task}/seed{seed}.tsv"
       for task in MARGIN_RUNS for seed in MARGIN_SEEDS]
    + [f"{BENCH}/lr_sweep/{rule}/{task}.tsv" for task in MARGIN_RUNS
       for rule in ("data_val", "lmeval_task_val")]
    + expand(f"{BENCH}/tables/{{name}}.tsv",
             name=["summary", "fingerprints", "margin", "analysis_plan"]
             + (["verdicts"] if VERDICTS else []) + (["stability"] if LONG_RUNS else []))
    + expand(f"{BENCH}/figures/{{name}}.tsv", name=["reward_curves"]
             + (["verdicts"] if VERDICTS else [])
             + (["memory_reduction", "stability_27b", "sync_bytes"] if PAPER else []))
    + (expand(f"{BENCH}/memory/memory_point/{{size}}/{{method}}.tsv",
              size=list(MEMORY["sizes"]), method=MEMORY["methods"])
       + [f"{BENCH}/memory/memory_sweep.tsv", f"{BENCH}/memory/planner.tsv"] if PAPER else [])
    + ([f"{BENCH}/memory/paper_setting.tsv"] if PAPER_SETTING else [])
)


rule report:
    input:
        benchmarks=DEFAULT_BENCHMARKS,
        runs=expand("results/runs/{run}/summary.json", run=RUNS),
        long_runs=expand("results/runs/{run}/summary.json", run=LONG_RUNS),
        stability=["results/stability.csv"] if LONG_RUNS else [],
        sft=[] if start_model(config) else
        expand("results/base/{task}/seed{seed}/sft.json", task=TASKS, seed=SEEDS),
        summary="results/summary.csv",
        accuracy="results/accuracy.csv",
        plan="results/analysis_plan.json",
        verdicts=["results/verdicts.csv"] if VERDICTS else [],
        sweep=["results/memory/sweep.csv"] if PAPER else [],
        planner=["results/memory/planner.csv"] if PAPER else [],
        paper_setting=["results/memory/paper_setting.csv"] if PAPER_SETTING else [],
    output:
        report("results/REPORT.md", caption="../report/REPORT.rst", category="Results"),
    params:
        lr_sweep="results/lr_sweep.csv",  # included if `snakemake lr_sweep` wrote it before
        criterion=config.get("stability", {}).get("criterion"),
        trl="results/trl",  # its *.json, if `snakemake trl` wrote them before
        sync_regime="results/sync_regime.csv",  # if `snakemake sync_regime` wrote it before
        scaling="results/scaling.csv",  # if `snakemake scaling` wrote it before
        ablations="results/ablations",  # its tables, if `snakemake ablations` wrote them before
        reference=REFERENCE,
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/report/report.tsv",  # its own ledger cannot count it
    log:
        "results/logs/report.log",
    script:
        "../scripts/report.py"
