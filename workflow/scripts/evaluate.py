"""lm-eval on one checkpoint (a GRPO run's final model, or a task's SFT base)."""
from contextlib import redirect_stderr, redirect_stdout

import torch

from logra.files import progress
from logra.harness.evaluate import evaluate

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    torch.set_num_threads(snakemake.threads)
    e = snakemake.params.eval
    out = evaluate(snakemake.params.model, snakemake.input.lmeval, snakemake.wildcards.task,
                   snakemake.output[0], e["protocols"], e["primary"],
                   seed=int(snakemake.wildcards.seed), limit=e["limit"],
                   batch_size=e["batch_size"], device=snakemake.config["device"],
                   dtype=e["dtype"], backend=e["backend"],
                   tracking=snakemake.config["tracking"])
    progress(snakemake.output[0].removeprefix("results/").removesuffix(".json"),
             **{f"{e['primary']} accuracy": out["accuracy"]}, problems=out["n"])
