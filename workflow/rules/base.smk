rule base:
    input:
        train="results/data/{task}/train.jsonl",
    output:
        model=directory("results/base/{task}/model"),
        sft="results/base/{task}/sft.json",
    params:
        task=lambda w: config["tasks"][w.task],
        model=config["model"],
        sft=config["sft"],
        max_new_tokens=config["grpo"]["max_new_tokens"],
        seed=config["data"]["seed"],
    threads: config["threads"]
    conda:
        "../../environment.yml"
    log:
        "results/logs/base/{task}.log",
    script:
        "../scripts/make_base.py"
