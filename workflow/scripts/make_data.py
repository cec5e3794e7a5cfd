"""Write a task's splits as JSONL (each split this rule outputs) and the lm-eval task definition
that evaluates its held-out split: `val` for the lr sweep's rule, `test` otherwise."""
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer

from logra.harness.evaluate import write_lmeval_task
from logra.rl.models import check_context, context_needed
from logra.rl.tasks import check_lengths, get_task, write_jsonl

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    spec, data, out = snakemake.params.task, snakemake.params.data, snakemake.output
    task = get_task(spec["type"], **spec.get("options", {}))
    splits = task.splits(data["seed"], data["n_train"], data["n_test"], data.get("n_val", 0))
    written = [split for split in splits if hasattr(out, split)]
    check_lengths(task, splits, data["max_example_chars"],
                  {split: getattr(out, split) for split in written})
    for name in snakemake.params.hub_models:  # before any job loads one: does the task fit?
        needed = context_needed(AutoTokenizer.from_pretrained(name), task,
                                [e for split in splits.values() for e in split],
                                snakemake.params.room)
        check_context(AutoConfig.from_pretrained(name), needed, snakemake.wildcards.task, name)
    for split in written:
        write_jsonl(getattr(out, split), splits[split])
    held_out = "val" if "val" in written else "test"
    write_lmeval_task(snakemake.wildcards.task, spec.get("options", {}),
                      Path(getattr(out, held_out)), Path(out.lmeval), snakemake.params.protocols,
                      max_gen_toks=snakemake.params.max_gen_toks, task_type=spec["type"])
    print(f"{snakemake.wildcards.task}: " + ", ".join(
        f"{len(splits[split])} {split}" for split in written) + f" examples; lm-eval on {held_out}")
