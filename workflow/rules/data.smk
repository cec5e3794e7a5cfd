rule data:
    output:
        train="results/data/{task}/train.jsonl",
        test="results/data/{task}/test.jsonl",
    params:
        task=lambda w: config["tasks"][w.task],
        data=config["data"],
        hub_models=PLAN.hub_models,  # each must hold the task's prompts and completions
        room=PLAN.generation_room,
    resources:
        **stage_resources("data"),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/data/data/{task}.tsv",
    log:
        "results/logs/data/{task}.log",
    script:
        "../scripts/make_data.py"


# The lr sweep's validation split: n_val questions drawn after the train split (train and test
# stay as `data` writes them), so neither SFT nor GRPO trains on them.
use rule data as data_val with:
    output:
        val="results/data/{task}/val.jsonl",
    params:
        task=lambda w: config["tasks"][w.task],
        data=config["data"] | {"n_val": (config.get("lr_sweep") or {}).get("n_val", 0)},
        hub_models=PLAN.hub_models,
        room=PLAN.generation_room,
    benchmark:
        "results/benchmarks/lr_sweep/data_val/{task}.tsv",
    log:
        "results/logs/data/{task}_val.log",


# The lm-eval tasks that evaluate a held-out split, one per protocol of eval.protocols
# (logra/harness/evaluate.py): a rule of their own, so a change of protocols re-evaluates
# checkpoints without re-making the data they were trained on
rule lmeval_task:
    input:
        "results/data/{task}/test.jsonl",
    output:
        directory("results/data/{task}/lmeval"),
    params:
        task=lambda w: config["tasks"][w.task],
        max_gen_toks=config["eval"]["max_gen_toks"],
        protocols=config["eval"]["protocols"],
    resources:
        **stage_resources("data"),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/data/lmeval_task/{task}.tsv",
    log:
        "results/logs/data/{task}_lmeval.log",
    script:
        "../scripts/lmeval_task.py"


use rule lmeval_task as lmeval_task_val with:
    input:
        "results/data/{task}/val.jsonl",
    output:
        directory("results/data/{task}/lmeval_val"),
    benchmark:
        "results/benchmarks/lr_sweep/lmeval_task_val/{task}.tsv",
    log:
        "results/logs/data/{task}_lmeval_val.log",
