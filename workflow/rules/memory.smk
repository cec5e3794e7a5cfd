MEMORY = config.get("memory_sweep", {"sizes": {}, "methods": []})
# results/memory/sweep.csv: the default target's points; sweep_large.csv: every point
SWEEP_POINTS = {"sweep": MEMORY["sizes"], "sweep_large": MEMORY["sizes"]
                | MEMORY.get("opt_in_sizes", {})}
# results/memory/real.csv: memory_real's points, in the folder `real` (PLAN.memory_point)
MEMORY_REAL = config.get("memory_real")
PLANNER = config.get("planner")
PAPER_SETTING = config.get("paper_setting")


rule memory_point:
    output:
        "results/memory/{size}/{method}.json",
    params:
        point=lambda w: PLAN.memory_point(w.size, w.method),
    threads: config["threads"]
    resources:
        **stage_resources("memory"),
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
        lambda w: expand(
            "results/memory/{size}/{method}.json",
            size=list(SWEEP_POINTS[w.sweep]),
            method=MEMORY["methods"],
        ),
    output:
        report("results/memory/{sweep}.csv", caption="../report/table.rst", category="Tables"),
    wildcard_constraints:
        sweep="sweep|sweep_large",
    params:
        reference=PLAN.reference,
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/memory/memory_{sweep}.tsv",
    log:
        "results/logs/memory/{sweep}.log",
    script:
        "../scripts/memory_sweep.py"


use rule memory_sweep as ablation_memory_sweep with:
    input:
        expand(
            "results/memory/{size}/{method}.json",
            size=list(MEMORY["sizes"]),
            method=MEMORY["methods"] + MEMORY.get("ablation_methods", []),
        ),
    output:
        "results/ablations/memory_sweep.csv",
    benchmark:
        "results/benchmarks/ablations/memory_sweep.tsv",
    log:
        "results/logs/ablations/memory_sweep.log",


use rule memory_sweep as memory_real_table with:
    input:
        expand("results/memory/real/{method}.json", method=list((MEMORY_REAL or {}).get(
            "methods", {}))),
    output:
        report("results/memory/real.csv", caption="../report/table.rst", category="Tables"),
    benchmark:
        "results/benchmarks/memory/memory_real.tsv",
    log:
        "results/logs/memory/memory_real.log",


rule planner:
    output:
        report("results/memory/planner.csv", caption="../report/table.rst", category="Tables"),
    params:
        planner=PLANNER,
        methods={m: config["methods"][m] for m in (PLANNER or {}).get("methods", [])},
        offloaded={m: config["methods"][m] for m in (PLANNER or {}).get("offload", [])},
        # config.json paths are relative to the repository, not the working directory
        models={
            name: os.path.join(workflow.basedir, path)
            for name, path in (PLANNER or {}).get("models", {}).items()
        },
        grpo=config["grpo"],
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/memory/planner.tsv",
    log:
        "results/logs/memory/planner.log",
    script:
        "../scripts/planner.py"


rule paper_setting:
    output:
        report("results/memory/paper_setting.csv", caption="../report/table.rst",
               category="Tables"),
    params:
        paper_setting=PAPER_SETTING,
        models={  # config.json paths are relative to the repository
            name: os.path.join(workflow.basedir, s["model"])
            for name, s in (PAPER_SETTING or {}).get("settings", {}).items()
        },
        grpo=config["grpo"],
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/memory/paper_setting.tsv",
    log:
        "results/logs/memory/paper_setting.log",
    script:
        "../scripts/paper_setting.py"
