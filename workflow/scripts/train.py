"""One GRPO run: (task, method, seed) from the config; resumes from its checkpoint if any."""
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from logra.io import write_json
from logra.train import train

with open(snakemake.log[0], "a") as log, redirect_stdout(log), redirect_stderr(log):
    cfg = dict(snakemake.params.run, threads=snakemake.threads)
    summary = train(cfg, snakemake.input.base, snakemake.input.train,
                    Path(snakemake.output.summary).parent, snakemake.params.checkpoint)
    write_json(snakemake.output.summary, summary)
    print(json.dumps({k: summary[k] for k in ("status", "final_reward", "peak_mem_bytes")}))
