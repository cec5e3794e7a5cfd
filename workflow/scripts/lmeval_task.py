"""The lm-eval tasks (one per protocol) that evaluate a task's held-out split: the test split, or
the validation split for the lr sweep's and the margin's runs."""
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from logra.harness.evaluate import write_lmeval_task

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    spec = snakemake.params.task
    paths = write_lmeval_task(snakemake.wildcards.task, spec.get("options", {}),
                              Path(snakemake.input[0]), Path(snakemake.output[0]),
                              snakemake.params.protocols,
                              max_gen_toks=snakemake.params.max_gen_toks, task_type=spec["type"])
    print(f"{snakemake.wildcards.task}: lm-eval on {snakemake.input[0]}: {', '.join(paths)}")
