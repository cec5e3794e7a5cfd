rule data:
    output:
        train="results/data/{task}/train.jsonl",
        test="results/data/{task}/test.jsonl",
        lmeval=directory("results/data/{task}/lmeval"),
    params:
        task=lambda w: config["tasks"][w.task],
        data=config["data"],
        max_gen_toks=config["eval"]["max_gen_toks"],
        protocols=config["eval"]["protocols"],
        hub_models=hub_models(config),  # each must hold the task's prompts and completions
        room=generation_room(config),
    resources:
        **job_resources(config, "data"),
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
        lmeval=directory("results/data/{task}/lmeval_val"),
    params:
        task=lambda w: config["tasks"][w.task],
        data=config["data"] | {"n_val": LR_SWEEP.get("n_val", 0)},
        max_gen_toks=config["eval"]["max_gen_toks"],
        protocols=config["eval"]["protocols"],
        hub_models=hub_models(config),
        room=generation_room(config),
    benchmark:
        "results/benchmarks/lr_sweep/data_val/{task}.tsv",
    log:
        "results/logs/data/{task}_val.log",
