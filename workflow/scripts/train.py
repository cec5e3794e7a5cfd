"""One GRPO run: (task, method, seed) from the config; resumes from its checkpoint if any.
With grpo.nproc_per_node > 1 the run is started under torchrun, one rank per GPU (FSDP)."""
import json
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from logra.files import mib, progress, write_json
from logra.rl.loop import train
from logra.rl.summary import oom_result

nproc = snakemake.params.run["grpo"]["nproc_per_node"]
# the job's threads are shared by its ranks
cfg = dict(snakemake.params.run, threads=max(1, snakemake.threads // nproc))
out = Path(snakemake.output.summary).parent
args = [snakemake.params.base, snakemake.input.train, str(out), snakemake.params.checkpoint]
with open(snakemake.log[0], "a") as log, redirect_stdout(log), redirect_stderr(log):
    if nproc > 1:  # rank 0 writes summary.json
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "run_config.json", cfg)
        for stale in out.glob("oom.rank*.json"):  # from an earlier attempt
            stale.unlink()
        log.flush()
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc-per-node={nproc}", "-m", "logra.rl.loop",
                               str(out / "run_config.json"), *args,
                               "--tracking", json.dumps(snakemake.config["tracking"])],
                              stdout=log, stderr=subprocess.STDOUT)
        ooms = sorted(out.glob("oom.rank*.json"))
        if proc.returncode and not ooms:
            raise RuntimeError(f"torchrun exited with {proc.returncode}; see {snakemake.log[0]}")
        if ooms:  # a rank ran out of memory: recorded as the run's result
            summary = oom_result(cfg, args[0], out, json.loads(ooms[0].read_text()))
            write_json(snakemake.output.summary, summary)
        summary = json.loads(Path(snakemake.output.summary).read_text())
    else:
        summary = train(cfg, *args, tracking=snakemake.config["tracking"])
        write_json(snakemake.output.summary, summary)
    progress(f"train {cfg['run_id']}", summary["status"], steps=summary["steps"],
             reward=summary["final_reward"], peak=mib(summary["peak_mem_bytes"]))
