"""Build (or load) the base model and warm-start it by SFT on the task's train split."""
import tempfile
from contextlib import redirect_stderr, redirect_stdout

import torch

from logra.files import progress, read_jsonl, save_pretrained, write_json
from logra.repro import machine
from logra.rl.models import build_tiny, char_tokenizer, check_context, context_needed, load
from logra.rl.sft import sft
from logra.rl.tasks import get_task

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    torch.set_num_threads(snakemake.threads)
    spec, m, s = snakemake.params.task, snakemake.params.model, snakemake.params.sft
    task = get_task(spec["type"], **spec.get("options", {}))
    rows = read_jsonl(snakemake.input.train, required=("prompt", "answer"))
    examples, room = rows + read_jsonl(snakemake.input.test), snakemake.params.room
    source = m["name"]
    if source == "tiny":  # its context sized from the task's data unless the config sets it
        needed = context_needed(char_tokenizer(), task, examples, room)
        source = build_tiny(tempfile.mkdtemp(), seed=snakemake.params.seed,
                            **{"max_position_embeddings": needed, **m["tiny"]})
    model, tokenizer = load(source)
    check_context(model.config, context_needed(tokenizer, task, examples, room),
                  snakemake.wildcards.task, m["name"])
    report = {"steps": 0, "accuracy": None, "history": []}
    if s["steps"] > 0:
        report = sft(model, tokenizer, task, rows, steps=s["steps"],
                     batch_size=s["batch_size"], lr=s["lr"],
                     stop_at_accuracy=s["stop_at_accuracy"], eval_every=s["eval_every"],
                     eval_examples=s["eval_examples"], warmup_steps=s["warmup_steps"],
                     decay=s["decay"], decay_final=s["decay_final"],
                     max_new_tokens=snakemake.params.max_new_tokens, seed=snakemake.params.seed)
    save_pretrained(model, tokenizer, snakemake.output.model)
    write_json(snakemake.output.sft, {"task": snakemake.wildcards.task,
                                      "seed": snakemake.params.seed, "source": str(m["name"]),
                                      **report, "machine": machine()})
    progress(f"base {snakemake.wildcards.task}/seed{snakemake.params.seed}",
             sft_steps=report["steps"], accuracy=report["accuracy"])
