"""results/stability/{task}/{method}/seed{seed}.json: one stability run's held-out curve, the
primary protocol on the test split (lm-eval, each point seeded by the run's seed) at step 0
(its SFT base), at each snapshot (grpo.snapshot_every) and at its last step (its saved model:
the last good one's step where it stopped early)."""
import json
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import torch

from logra.files import progress, write_json
from logra.harness.evaluate import evaluate

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    torch.set_num_threads(snakemake.threads)
    e, run = snakemake.params.eval, Path(snakemake.input.run).parent
    summary = json.loads(Path(snakemake.input.run).read_text())
    snapshots = sorted(((int(p.name.removeprefix("step")), p)
                        for p in (run / "snapshots").glob("step*")), key=lambda x: x[0])
    points = [(0, snakemake.params.base), *[(s, p) for s, p in snapshots
                                            if s < summary["model_step"]],
              (summary["model_step"], run / "model")]
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for step, model in dict(points).items():  # a run that stopped at step 0: one point
            r = evaluate(model, snakemake.input.lmeval, snakemake.wildcards.task,
                         Path(tmp) / "eval.json", e["protocols"], e["primary"],
                         seed=int(snakemake.wildcards.seed), limit=e["limit"],
                         batch_size=e["batch_size"], device=snakemake.config["device"],
                         dtype=e["dtype"])
            out.append({"step": step, "model_dir": str(model), "accuracy": r["accuracy"],
                        "n": r["n"], "metrics": r["metrics"],
                        "per_problem": {q["doc_id"]: q[e["primary"]]["acc"]
                                        for q in r["problems"]}})
            print(f"step {step}: {r['accuracy']:.4f}")
    write_json(snakemake.output[0], {"primary": e["primary"], "points": out})
    progress(snakemake.output[0].removeprefix("results/").removesuffix(".json"),
             **{f"{e['primary']} at step {p['step']}": p["accuracy"] for p in out})
