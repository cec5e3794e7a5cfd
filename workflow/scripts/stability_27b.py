"""figures/stability_27b.{png,pdf}: planner at scale, the long runs, planner vs measured."""
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pandas as pd

from logra.figures import stability_27b

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    runs, summaries = [], []
    for metrics, summary in zip(snakemake.input.metrics, snakemake.input.summaries, strict=True):
        s = json.loads(Path(summary).read_text())
        runs.append(pd.read_csv(metrics).assign(method=s["method"], seed=s["seed"]))
        summaries.append({k: s[k] for k in ("method", "seed", "device", "n_params", "steps",
                                            "status")}
                         | {"lr": s["config"]["method"]["options"].get("lr")})
    long_summary = pd.DataFrame(summaries)
    print(long_summary.to_string())
    stability_27b(pd.read_csv(snakemake.input.planner), pd.concat(runs), long_summary,
                  pd.read_csv(snakemake.input.sweep), [snakemake.output.png, snakemake.output.pdf])
