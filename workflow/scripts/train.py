"""One GRPO run: (task, method, seed) from the config; resumes from its checkpoint if any.
With grpo.nproc_per_node > 1 the run is started under torchrun, one rank per GPU (FSDP)."""
import json
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from logra.io import write_json
from logra.train import train

cfg = dict(snakemake.params.run, threads=snakemake.threads)
out = Path(snakemake.output.summary).parent
args = [snakemake.params.base, snakemake.input.train, str(out), snakemake.params.checkpoint]
nproc = cfg["grpo"]["nproc_per_node"]
with open(snakemake.log[0], "a") as log, redirect_stdout(log), redirect_stderr(log):
    if nproc > 1:  # rank 0 writes summary.json
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "run_config.json", cfg)
        log.flush()
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc-per-node={nproc}", "-m", "logra.train",
                        str(out / "run_config.json"), *args],
                       stdout=log, stderr=subprocess.STDOUT, check=True)
        summary = json.loads(Path(snakemake.output.summary).read_text())
    else:
        summary = train(cfg, *args)
        write_json(snakemake.output.summary, summary)
    print(json.dumps({k: summary[k] for k in ("status", "final_reward", "peak_mem_bytes")}))
