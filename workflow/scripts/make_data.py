"""Write a task's splits as JSONL (each split this rule outputs), after checking their lengths and
that every hub model's context holds them."""
from contextlib import redirect_stderr, redirect_stdout

from logra.files import write_jsonl
from logra.rl.tasks import check_lengths, check_overlap, get_task

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    spec, data, out = snakemake.params.task, snakemake.params.data, snakemake.output
    task = get_task(spec["type"], **spec.get("options", {}))
    splits = task.splits(data["seed"], data["n_train"], data["n_test"], data.get("n_val", 0))
    written = [split for split in splits if hasattr(out, split)]
    files = {split: getattr(out, split) for split in written}
    check_lengths(task, splits, data["max_example_chars"], files)
    for line in check_overlap(splits, files, data["allow_overlap"]):
        print(f"kept (data.allow_overlap): {line}")
    if snakemake.params.hub_models:  # torch and transformers, only when needed (start-up)
        from transformers import AutoConfig, AutoTokenizer

        from logra.rl.models import check_context, context_needed
    for name in snakemake.params.hub_models:  # before any job loads one: does the task fit?
        needed = context_needed(AutoTokenizer.from_pretrained(name), task,
                                [e for split in splits.values() for e in split],
                                snakemake.params.room)
        check_context(AutoConfig.from_pretrained(name), needed, snakemake.wildcards.task, name)
    for split in written:
        write_jsonl(getattr(out, split), splits[split])
    print(f"{snakemake.wildcards.task}: " + ", ".join(
        f"{len(splits[split])} {split}" for split in written) + " examples")
