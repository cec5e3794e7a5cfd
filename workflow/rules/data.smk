rule data:
    output:
        train="results/data/{task}/train.jsonl",
        test="results/data/{task}/test.jsonl",
        lmeval=directory("results/data/{task}/lmeval"),
    params:
        task=lambda w: config["tasks"][w.task],
        data=config["data"],
        max_gen_toks=config["eval"]["max_gen_toks"],
    conda:
        "../../environment.yml"
    log:
        "results/logs/data/{task}.log",
    script:
        "../scripts/make_data.py"
