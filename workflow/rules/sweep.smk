rule lr_sweep:
    input:
        expand(
            "results/runs/{task}/{method}/seed{seed}/summary.json",
            task=config.get("lr_sweep", {}).get("task", TASKS[0]),
            method=list(SWEEP),
            seed=config.get("lr_sweep", {}).get("seeds", [0]),
        ),
    output:
        "results/lr_sweep.csv",
    params:
        sweep=SWEEP,
    conda:
        "../../environment.yml"
    log:
        "results/logs/lr_sweep.log",
    script:
        "../scripts/lr_sweep.py"
