rule base:
    input:
        train="results/data/{task}/train.jsonl",
        test="results/data/{task}/test.jsonl",  # the tiny model's context is sized from both
    output:
        model=directory("results/base/{task}/seed{seed}/model"),
        sft="results/base/{task}/seed{seed}/sft.json",
    params:
        task=lambda w: config["tasks"][w.task],
        model=config["model"],
        sft=lambda w: PLAN.sft(w.task),
        max_new_tokens=config["grpo"]["max_new_tokens"],
        room=PLAN.generation_room,
        seed=lambda w: int(w.seed),  # the initialisation and SFT's batches
    threads: config["threads"]
    resources:
        **stage_resources("base"),
    conda:
        "../../environment.yml"
    benchmark:
        "results/benchmarks/base/base/{task}/seed{seed}.tsv",
    log:
        "results/logs/base/{task}/seed{seed}.log",
    script:
        "../scripts/make_base.py"
