"""results/study/<horizon>/eval/{task}/{method}/seed{seed}/step{step}.json: a study run scored on the test
split at update {step}: its snapshot there, else its saved model (its last update, or its last
good one where it stopped before {step}: intent to treat)."""
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import torch

from logra.files import progress
from logra.harness.evaluate import evaluate

w, e = snakemake.wildcards, snakemake.params.eval
with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    torch.set_num_threads(snakemake.threads)
    run = Path(snakemake.input.run).parent
    snapshot = run / "snapshots" / f"step{w.step}"
    reached = json.loads(Path(snakemake.input.run).read_text())["model_step"]
    if not snapshot.is_dir() and reached > int(w.step):
        raise FileNotFoundError(f"{snapshot}: the run reached update {reached} but kept no "
                                f"snapshot at {w.step} (its grpo.snapshot_every)")
    model = snapshot if snapshot.is_dir() else run / "model"
    out = evaluate(str(model), snakemake.input.lmeval, w.task, snakemake.output[0],
                   e["protocols"], e["primary"], seed=int(w.seed), limit=e["limit"],
                   batch_size=e["batch_size"], device=snakemake.config["device"],
                   dtype=e["dtype"], backend=e["backend"],
                   tracking=snakemake.config["tracking"])
    progress(snakemake.output[0].removeprefix("results/").removesuffix(".json"),
             **{f"{e['primary']} accuracy": out["accuracy"]}, problems=out["n"])
