"""figures/stability_27b*.{png,pdf} and figures/stability_controller: the stability runs against
stability.criterion, measured; with the planner's predictions at scale where it is an input."""
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd

from logra.analysis.figures import stability_27b

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    i = snakemake.input
    table = pd.read_csv(i.table)
    print(table.to_string())
    stability_27b(table, i.curves, i.metrics, snakemake.params.criterion,
                  [snakemake.output.png, snakemake.output.pdf],
                  planner=pd.read_csv(i.planner) if "planner" in i.keys() else None,
                  methods=snakemake.params.methods)
