MEMORY = config.get("memory_sweep", {"sizes": {}, "methods": []})
PLANNER = config.get("planner")
STABILITY_RUNS = expand(
    "results/runs/{task}/{method}/seed{seed}/metrics.csv",
    task=config.get("stability", {}).get("task", TASKS[0]),
    method=config.get("stability", {}).get("methods", []),
    seed=SEEDS,
)


rule memory_point:
    output:
        "results/memory/{size}/{method}.json",
    params:
        size=lambda w: {k: v for k, v in MEMORY["sizes"][w.size].items() if k != "shape"},
        method=lambda w: run_config(config, TASKS[0], w.method, 0),
        shape=lambda w: MEMORY.get("shape", {}) | MEMORY["sizes"][w.size].get("shape", {}),
        steps=MEMORY.get("steps"),
    threads: config["threads"]
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/memory/memory_point/{size}/{method}.tsv",
    log:
        "results/logs/memory/{size}/{method}.log",
    script:
        "../scripts/memory_point.py"


rule memory_sweep:
    input:
        expand(
            "results/memory/{size}/{method}.json",
            size=list(MEMORY["sizes"]),
            method=MEMORY["methods"],
        ),
    output:
        report("results/memory/sweep.csv", caption="../report/table.rst", category="Tables"),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/memory/memory_sweep.tsv",
    log:
        "results/logs/memory/sweep.log",
    script:
        "../scripts/memory_sweep.py"


rule planner:
    output:
        report("results/memory/planner.csv", caption="../report/table.rst", category="Tables"),
    params:
        planner=PLANNER,
        methods={m: config["methods"][m] for m in (PLANNER or {}).get("methods", [])},
        # config.json paths are relative to the repository, not the working directory
        models={
            name: os.path.join(workflow.basedir, path)
            for name, path in (PLANNER or {}).get("models", {}).items()
        },
        probe_size=config["grpo"]["probe_size"],
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/memory/planner.tsv",
    log:
        "results/logs/memory/planner.log",
    script:
        "../scripts/planner.py"
