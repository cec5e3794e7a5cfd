"""figures/stability_27b.{png,pdf}: planner at scale, the long runs, planner vs measured."""
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd

from logra.analysis.figures import stability_27b
from logra.analysis.verdict import long_run_tables

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    runs, long_summary = long_run_tables(snakemake.input.metrics, snakemake.input.summaries,
                                        snakemake.params.reference_rule)
    print(long_summary.to_string())
    stability_27b(pd.read_csv(snakemake.input.planner), runs, long_summary,
                  pd.read_csv(snakemake.input.sweep), [snakemake.output.png, snakemake.output.pdf])
