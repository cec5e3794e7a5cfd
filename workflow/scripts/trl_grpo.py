"""results/trl/{task}.json: TRL's GRPOTrainer with LoGRA and with AdamW from the task's seed-0
SFT base (logra.harness.trl_grpo.compare, with the config's options)."""
from contextlib import redirect_stderr, redirect_stdout

import torch

from logra.files import progress, read_jsonl, write_json
from logra.harness.trl_grpo import compare, config_options
from logra.rl.tasks import get_task

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    torch.set_num_threads(snakemake.threads)
    spec = snakemake.params.task
    task = get_task(spec["type"], **spec.get("options", {}))
    rows = read_jsonl(snakemake.input.train, required=("prompt", "answer"))
    result = compare(snakemake.input.model, task, rows, steps=snakemake.params.steps,
                     **config_options(snakemake.config, snakemake.wildcards.task), seed=0,
                     tracking=snakemake.config["tracking"],
                     track_dir=f"results/trl/{snakemake.wildcards.task}")
    result["base"] = snakemake.input.model
    write_json(snakemake.output[0], result)
    progress(f"trl {snakemake.wildcards.task}", **{
        f"{m} peak MiB": result[m]["peak_mem_bytes"] / 2**20 for m in ("logra", "adamw")},
        **{f"{m} reward": result[m]["reward_last"] for m in ("logra", "adamw")})
