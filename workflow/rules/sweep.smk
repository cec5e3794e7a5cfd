# lm-eval under the primary protocol only (PLAN.primary_eval): the lr sweep's choice and the
# margin use nothing else (on the validation split, never on test), nor do the stability runs'
# held-out curves
use rule eval_run as lr_sweep_eval with:
    input:
        model="results/runs/{task}/{method}/seed{seed}/model",
        lmeval="results/data/{task}/lmeval_val",
    params:
        eval=PLAN.primary_eval,
        model=lambda wildcards, input: input.model,
    output:
        "results/lr_sweep/{task}/{method}/seed{seed}.json",
    benchmark:
        "results/benchmarks/lr_sweep/lr_sweep_eval/{task}/{method}/seed{seed}.tsv",
    log:
        "results/logs/lr_sweep/{task}/{method}/seed{seed}.log",


# each lr-sweep seed's SFT base on the validation split: the margin's reference point
use rule eval_base as lr_sweep_eval_base with:
    input:
        unpack(lambda w: {"lmeval": f"results/data/{w.task}/lmeval_val"} | base_input(w)),
    params:
        eval=PLAN.primary_eval,
        model=lambda wildcards, input: PLAN.start_model() or input.base,
    output:
        "results/lr_sweep/{task}/base_seed{seed}.json",
    benchmark:
        "results/benchmarks/lr_sweep/lr_sweep_eval_base/{task}/seed{seed}.tsv",
    log:
        "results/logs/lr_sweep/{task}/base_seed{seed}.log",


rule lr_sweep_table:
    input:
        runs=expand("results/runs/{run}/summary.json", run=PLAN.runs["lr_sweep"]),
        evals=expand("results/lr_sweep/{run}.json", run=PLAN.runs["lr_sweep"]),
    output:
        "results/lr_sweep.csv",
    params:
        sweep=PLAN.sweep,
        knobs=PLAN.sweep_knobs,
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/lr_sweep/lr_sweep.tsv",
    log:
        "results/logs/lr_sweep.log",
    script:
        "../scripts/lr_sweep.py"
