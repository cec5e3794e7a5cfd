rule summary:
    input:
        runs=expand("results/runs/{run}/summary.json", run=PLAN.runs["grid"]),
        evals=expand("results/eval/{run}.json", run=PLAN.runs["grid"]),
        base=expand("results/eval/{task}/base_seed{seed}.json", task=PLAN.tasks, seed=PLAN.seeds),
    output:
        summary=report("results/summary.csv", caption="../report/table.rst", category="Tables"),
        accuracy=report("results/accuracy.csv", caption="../report/table.rst", category="Tables"),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/tables/summary.tsv",
    log:
        "results/logs/summary.log",
    script:
        "../scripts/summarize.py"


rule reward_curves:
    input:
        summary="results/summary.csv",
        metrics=expand("results/runs/{run}/metrics.csv", run=PLAN.runs["grid"]),
        runs=expand("results/runs/{run}/summary.json", run=PLAN.runs["grid"]),
    output:
        png=report("figures/reward_curves.png", caption="../report/reward_curves.rst",
                   category="Figures"),
        pdf="figures/reward_curves.pdf",
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/figures/reward_curves.tsv",
    log:
        "results/logs/figures/reward_curves.log",
    script:
        "../scripts/reward_curves.py"


use rule summary as ablation_summary with:
    input:
        runs=expand("results/runs/{run}/summary.json", run=PLAN.runs["ablations"]),
        evals=expand("results/eval/{run}.json", run=PLAN.runs["ablations"]),
        base=expand("results/eval/{task}/base_seed{seed}.json", task=PLAN.tasks, seed=PLAN.seeds),
    output:
        summary="results/ablations/summary.csv",
        accuracy="results/ablations/accuracy.csv",
    benchmark:
        "results/benchmarks/ablations/summary.tsv",
    log:
        "results/logs/ablations/summary.log",


use rule summary as reinforce_summary with:
    input:
        runs=expand("results/runs/{run}/summary.json", run=PLAN.runs["reinforce"]),
        evals=expand("results/eval/{run}.json", run=PLAN.runs["reinforce"]),
        base=expand("results/eval/{task}/base_seed{seed}.json", task=PLAN.tasks, seed=PLAN.seeds),
    output:
        summary="results/reinforce/summary.csv",
        accuracy="results/reinforce/accuracy.csv",
    benchmark:
        "results/benchmarks/reinforce/summary.tsv",
    log:
        "results/logs/reinforce/summary.log",


use rule reward_curves as reinforce_reward_curves with:
    input:
        summary="results/reinforce/summary.csv",
        metrics=expand("results/runs/{run}/metrics.csv", run=PLAN.runs["reinforce"]),
        runs=expand("results/runs/{run}/summary.json", run=PLAN.runs["reinforce"]),
    output:
        png="figures/reinforce/reward_curves.png",
        pdf="figures/reinforce/reward_curves.pdf",
    benchmark:
        "results/benchmarks/reinforce/reward_curves.tsv",
    log:
        "results/logs/figures/reinforce/reward_curves.log",


use rule reward_curves as ablation_reward_curves with:
    input:
        summary="results/ablations/summary.csv",
        metrics=expand("results/runs/{run}/metrics.csv", run=PLAN.runs["ablations"]),
        runs=expand("results/runs/{run}/summary.json", run=PLAN.runs["ablations"]),
    output:
        png="figures/ablations/reward_curves.png",
        pdf="figures/ablations/reward_curves.pdf",
    benchmark:
        "results/benchmarks/ablations/reward_curves.tsv",
    log:
        "results/logs/figures/ablations/reward_curves.log",


rule memory_reduction:
    input:
        summary="results/summary.csv",
        runs=expand("results/runs/{run}/summary.json", run=PLAN.runs["grid"]),
        sweep="results/memory/sweep.csv",
    output:
        png=report("figures/memory_reduction.png", caption="../report/memory_reduction.rst",
                   category="Figures"),
        pdf="figures/memory_reduction.pdf",
    params:
        reference=PLAN.reference,
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/figures/memory_reduction.tsv",
    log:
        "results/logs/figures/memory_reduction.log",
    script:
        "../scripts/memory_reduction.py"


rule sync_bytes:
    input:
        planner="results/memory/planner.csv",
        summary="results/summary.csv",
        runs=expand("results/runs/{run}/summary.json", run=PLAN.runs["grid"]),
    output:
        png=report("figures/sync_bytes.png", caption="../report/sync_bytes.rst",
                   category="Figures"),
        pdf="figures/sync_bytes.pdf",
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/figures/sync_bytes.tsv",
    log:
        "results/logs/figures/sync_bytes.log",
    script:
        "../scripts/sync_bytes.py"
