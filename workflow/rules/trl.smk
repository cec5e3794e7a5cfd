# Opt-in (`snakemake --cores all trl`), not part of the default target: TRL's GRPOTrainer trains
# each task's seed-0 SFT base with LoGRA (logra.LoGRAOptimizer) and with TRL's AdamW for
# TRL_STEPS steps each (examples/trl_grpo_logra.py runs the same outside the workflow); the next
# results/REPORT.md collects results/trl/*.json.
TRL_STEPS = 40


rule trl_grpo:
    input:
        model="results/base/{task}/seed0/model",
        train="results/data/{task}/train.jsonl",
    output:
        "results/trl/{task}.json",
    params:
        task=lambda w: config["tasks"][w.task],
        steps=TRL_STEPS,
    threads: config["threads"]
    resources:
        **stage_resources("base"),  # one process on one device, as an SFT base job
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/trl/trl_grpo/{task}.tsv",
    log:
        "results/logs/trl/{task}.log",
    script:
        "../scripts/trl_grpo.py"


rule trl:
    input:
        PLAN.stamps("trl"),
