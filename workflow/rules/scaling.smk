# `snakemake scaling_sweep`, then `snakemake scaling` (config `scaling`): tiny models of each
# size with their own SFT bases, each method tuned at the first size on the validation split
# and transferred (logra.harness.derived.add_scaling_methods), the transfer checked at one size,
# every size's runs compared with the reference on the test split (logra/analysis/scaling.py)
SIZES = (config.get("scaling") or {}).get("sizes", {})
SCALING_SEEDS = (config.get("scaling") or {}).get("seeds") or PLAN.seeds
SCALING_TASK = (config.get("scaling") or {}).get("task")
SCALING_BASES = [(size, seed) for size in SIZES for seed in SCALING_SEEDS]  # the test runs'


use rule base as scaling_base with:
    output:
        model=directory("results/base/{task}/{size}/seed{seed}/model"),
        sft="results/base/{task}/{size}/seed{seed}/sft.json",
    params:
        task=lambda w: config["tasks"][w.task],
        model=lambda w: {"name": "tiny", "tiny": SIZES[w.size]["model"]},
        sft=lambda w: PLAN.sft(w.task) | {"steps": SIZES[w.size]["sft_steps"]},
        max_new_tokens=config["grpo"]["max_new_tokens"],
        room=PLAN.generation_room,
        seed=lambda w: int(w.seed),
    benchmark:
        "results/benchmarks/scaling/base/{task}/{size}/seed{seed}.tsv",
    log:
        "results/logs/scaling/base/{task}/{size}/seed{seed}.log",


# each size's bases on the test split (its band, the reference's gain over it)
use rule eval_base as scaling_eval_base with:
    output:
        "results/eval/{task}/{size}/base_seed{seed}.json",
    benchmark:
        "results/benchmarks/scaling/eval_base/{task}/{size}/seed{seed}.tsv",
    log:
        "results/logs/scaling/eval_base/{task}/{size}/seed{seed}.log",


# results/scaling/lr_sweep.csv, the sweep at the first size under the bracket rule (the lr
# sweep's table, validation split), and its choices for config/tuned.yaml
# (results/scaling/tuned.yaml: `python -m logra.harness.adopt`)
use rule lr_sweep_table as scaling_sweep_table with:
    input:
        unpack(lambda w: tuning_inputs("scaling", [SCALING_TASK])),
    output:
        table="results/scaling/lr_sweep.csv",
        tuned="results/scaling/tuned.yaml",
    params:
        sweep=lambda w: PLAN.scaling.sweep,
        declared=lambda w: PLAN.declared("scaling"),
        adopted=None,  # the scaling sweep's records alone (workflow/scripts/lr_sweep.py)
    benchmark:
        "results/benchmarks/scaling/lr_sweep.tsv",
    log:
        "results/logs/scaling/lr_sweep.log",


# results/scaling/transfer_check.csv: the transferred values x check.factors at check.size
use rule lr_sweep_table as scaling_check_table with:
    input:
        runs=expand("results/runs/{run}/summary.json", run=PLAN.runs["scaling_check"]),
        evals=expand("results/lr_sweep/{run}.json", run=PLAN.runs["scaling_check"]),
    output:
        table="results/scaling/transfer_check.csv",
    params:
        sweep=lambda w: PLAN.scaling.check,
        declared=None,
    benchmark:
        "results/benchmarks/scaling/transfer_check.tsv",
    log:
        "results/logs/scaling/transfer_check.log",


rule scaling_table:
    input:
        evals=lambda w: [f"results/eval/{r[-1]}.json" for r in PLAN.scaling_grid()],
        summaries=lambda w: [f"results/runs/{r[-1]}/summary.json"
                             for r in PLAN.scaling_grid()],
        bases=[f"results/eval/{SCALING_TASK}/{size}/base_seed{seed}.json"
               for size, seed in SCALING_BASES],
        plan="results/analysis_plan.json",
        checks=["results/scaling/lr_sweep.csv", "results/scaling/transfer_check.csv"],
        # every job of the target: its CPU time against scaling.cpu_hours
        benchmarks=lambda w: PLAN.benchmarks("scaling", tuned_runs("scaling", [SCALING_TASK])[0]),
    output:
        report("results/scaling.csv", caption="../report/table.rst", category="Tables"),
    params:
        grid=lambda w: PLAN.scaling_grid(),
        bases=SCALING_BASES,
        scaling=config.get("scaling"),
        reference=PLAN.reference,
        methods=config["methods"],
        width=config["model"]["tiny"].get("hidden_size"),
        planner=config.get("planner"),
        grpo=config["grpo"],
        models={name: os.path.join(workflow.basedir, path) for name, path in
                (config.get("scaling") or {}).get("predict_models", {}).items()},
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/tables/scaling.tsv",
    log:
        "results/logs/tables/scaling.log",
    script:
        "../scripts/scaling_table.py"


rule scaling_figure:
    input:
        "results/scaling.csv",
    output:
        png=report("figures/scaling.png", caption="../report/scaling.rst", category="Figures"),
        pdf="figures/scaling.pdf",
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/figures/scaling.tsv",
    log:
        "results/logs/figures/scaling.log",
    script:
        "../scripts/scaling_figure.py"
