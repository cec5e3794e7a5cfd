# lm-eval under the primary protocol only: the lr sweep's choice and the margin use nothing
# else (on the validation split, never on test), nor do the stability runs' held-out curves
PRIMARY_EVAL = config["eval"] | {"protocols": {config["eval"]["primary"]:
                                           config["eval"]["protocols"][config["eval"]["primary"]]}}


use rule eval_run as lr_sweep_eval with:
    input:
        model="results/runs/{task}/{method}/seed{seed}/model",
        lmeval="results/data/{task}/lmeval_val",
    params:
        eval=PRIMARY_EVAL,
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
        unpack(lambda w: {"lmeval": f"results/data/{w.task}/lmeval_val"} | base_input(config, w)),
    params:
        eval=PRIMARY_EVAL,
        model=lambda wildcards, input: start_model(config) or input.base,
    output:
        "results/lr_sweep/{task}/base_seed{seed}.json",
    benchmark:
        "results/benchmarks/lr_sweep/lr_sweep_eval_base/{task}/seed{seed}.tsv",
    log:
        "results/logs/lr_sweep/{task}/base_seed{seed}.log",


SWEEP_RUNS = expand(
    "{task}/{method}/seed{seed}",
    task=LR_SWEEP.get("tasks", []),
    method=list(SWEEP),
    seed=LR_SWEEP.get("seeds", [0]),
)


rule lr_sweep:
    input:
        runs=expand("results/runs/{run}/summary.json", run=SWEEP_RUNS),
        evals=expand("results/lr_sweep/{run}.json", run=SWEEP_RUNS),
    output:
        "results/lr_sweep.csv",
    params:
        sweep=SWEEP,
        knobs=sweep_knobs(config),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/lr_sweep/lr_sweep.tsv",
    log:
        "results/logs/lr_sweep.log",
    script:
        "../scripts/lr_sweep.py"
