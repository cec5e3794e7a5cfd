"""Write a task's train/test JSONL and its lm-eval task definition."""
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from logra.evaluate import write_lmeval_task
from logra.tasks import get_task, write_jsonl

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    spec, data = snakemake.params.task, snakemake.params.data
    task = get_task(spec["type"], **spec.get("options", {}))
    splits = task.splits(data["seed"], data["n_train"], data["n_test"])
    write_jsonl(snakemake.output.train, splits["train"])
    write_jsonl(snakemake.output.test, splits["test"])
    write_lmeval_task(snakemake.wildcards.task, spec.get("options", {}),
                      Path(snakemake.output.test), Path(snakemake.output.lmeval),
                      max_gen_toks=snakemake.params.max_gen_toks, task_type=spec["type"])
    print(f"{snakemake.wildcards.task}: {len(splits['train'])} train, "
          f"{len(splits['test'])} test examples")
