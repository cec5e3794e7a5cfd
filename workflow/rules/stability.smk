# The stability runs (stability.methods; `snakemake stability`: opt_in_methods and the
# controller ablation over opt_in_seeds): each run's held-out curve and drift (exact entropy, KL
# to its base) on its snapshots, the criterion declared in stability.criterion applied to every
# run (logra/analysis/stability.py), the figures. Test evaluations: they wait for the analysis
# plan, as eval_run does.
STABILITY_SETS = {"stability": "long", "stability_seeds": "stability_seeds",  # {table: its runs
                  "stability_controller": "controller"}  # in PLAN.runs}


rule stability_eval:
    input:
        unpack(lambda w: {"run": f"results/runs/{w.task}/{w.method}/seed{w.seed}/summary.json",
                          "lmeval": f"results/data/{w.task}/lmeval",
                          "test": f"results/data/{w.task}/test.jsonl",
                          "plan": "results/analysis_plan.json"} | base_input(w)),
    output:
        "results/stability/{task}/{method}/seed{seed}.json",
    params:
        eval=PLAN.primary_eval,
        base=lambda wildcards, input: PLAN.start_model() or input.base,
        prompts=config.get("stability", {}).get("criterion", {}).get("collapse", {}).get("prompts"),
    threads: config["threads"]
    resources:
        **stage_resources("eval"),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/stability/stability_eval/{task}/{method}/seed{seed}.tsv",
    log:
        "results/logs/stability/{task}/{method}/seed{seed}.log",
    script:
        "../scripts/stability_eval.py"


rule stability_table:
    input:
        summaries=lambda w: expand("results/runs/{run}/summary.json",
                                   run=PLAN.runs[STABILITY_SETS[w.set]]),
        metrics=lambda w: expand("results/runs/{run}/metrics.csv",
                                 run=PLAN.runs[STABILITY_SETS[w.set]]),
        curves=lambda w: expand("results/stability/{run}.json",
                                run=PLAN.runs[STABILITY_SETS[w.set]]),
    output:
        "results/{set}.csv",
    wildcard_constraints:
        set="|".join(STABILITY_SETS),
    params:
        criterion=config.get("stability", {}).get("criterion"),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/tables/{set}.tsv",
    log:
        "results/logs/tables/{set}.log",
    script:
        "../scripts/stability_table.py"


# figures/stability_27b (the default target's runs) and stability_27b_seeds (`snakemake
# stability`'s): the planner at scale, the runs' held-out curves, KL and memory
rule stability_27b:
    input:
        planner="results/memory/planner.csv",
        table="results/stability.csv",
        metrics=expand("results/runs/{run}/metrics.csv", run=PLAN.runs["long"]),
        curves=expand("results/stability/{run}.json", run=PLAN.runs["long"]),
    output:
        png=report("figures/stability_27b.png", caption="../report/stability_27b.rst",
                   category="Figures"),
        pdf="figures/stability_27b.pdf",
    params:
        criterion=config.get("stability", {}).get("criterion"),
        methods=config["methods"],
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/figures/stability_27b.tsv",
    log:
        "results/logs/figures/stability_27b.log",
    script:
        "../scripts/stability_27b.py"


use rule stability_27b as stability_27b_seeds with:
    input:
        planner="results/memory/planner.csv",
        table="results/stability_seeds.csv",
        metrics=expand("results/runs/{run}/metrics.csv", run=PLAN.runs["stability_seeds"]),
        curves=expand("results/stability/{run}.json", run=PLAN.runs["stability_seeds"]),
    output:
        png=report("figures/stability_27b_seeds.png", caption="../report/stability_27b.rst",
                   category="Figures"),
        pdf="figures/stability_27b_seeds.pdf",
    benchmark:
        "results/benchmarks/figures/stability_27b_seeds.tsv"
    log:
        "results/logs/figures/stability_27b_seeds.log",


# `snakemake stability`: {controller on, off} x step-size multiples (figures/stability_controller)
use rule stability_27b as stability_controller with:
    input:
        table="results/stability_controller.csv",
        metrics=expand("results/runs/{run}/metrics.csv", run=PLAN.runs["controller"]),
        curves=expand("results/stability/{run}.json", run=PLAN.runs["controller"]),
    output:
        png=report("figures/stability_controller.png",
                   caption="../report/stability_controller.rst", category="Figures"),
        pdf="figures/stability_controller.pdf",
    benchmark:
        "results/benchmarks/figures/stability_controller.tsv"
    log:
        "results/logs/figures/stability_controller.log",
