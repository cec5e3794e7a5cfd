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


# The bracket rule (logra.analysis.tuning), a round at a time: round 0 scores a grid's declared
# points on the validation split (under successive halving, on the first seed); each round names
# the next one's window (one point beyond the edge that holds the best point; halving's screen:
# the best it keeps), or none when the grid is done. A checkpoint: the runs of round r+1 are
# known once round r has run (workflow/rules/common.smk `tuning_window`)
checkpoint tuning_round:
    input:
        runs=lambda w: expand("results/runs/{run}/summary.json",
                              run=window_runs(w.table, w.task, w.method, *tuning_window(w))),
        evals=lambda w: expand("results/lr_sweep/{run}.json",
                               run=window_runs(w.table, w.task, w.method, *tuning_window(w))),
    output:
        "results/tuning/{table}/{task}/{method}/round{round}.json",
    wildcard_constraints:
        table="lr_sweep|scaling|study",
        round=r"\d+",
    params:
        grid=lambda w: PLAN.grids[w.table][w.method],
        spec=tuning_window,
        sweep=lambda w: PLAN.grids[w.table][w.method].points(),
        knobs=PLAN.sweep_knobs,
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/lr_sweep/tuning_round/{table}/{task}/{method}/round{round}.tsv",
    log:
        "results/logs/lr_sweep/tuning/{table}/{task}/{method}/round{round}.log",
    script:
        "../scripts/tuning_round.py"


# results/lr_sweep.csv: every point each grid ran (the bracket rule's added points too); the
# choices for config/tuned.yaml (`python -m logra.harness.adopt`)
rule lr_sweep_table:
    input:
        unpack(lambda w: tuning_inputs("lr_sweep", config["lr_sweep"]["tasks"])),
    output:
        table="results/lr_sweep.csv",
        tuned="results/tuned.yaml",
    params:
        sweep=PLAN.sweep,
        knobs=PLAN.sweep_knobs,
        declared=PLAN.declared("lr_sweep"),
        seeds=(config.get("lr_sweep") or {}).get("seeds", []),
        adopted=config["tuned"],  # kept for the grids this sweep does not run
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/lr_sweep/lr_sweep.tsv",
    log:
        "results/logs/lr_sweep.log",
    script:
        "../scripts/lr_sweep.py"
