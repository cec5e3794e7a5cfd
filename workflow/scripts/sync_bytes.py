"""figures/sync_bytes.{png,pdf}: bytes per policy sync of every transport and the log-prob
mismatch, measured in the runs, and predicted at scale."""
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd

from logra.analysis.figures import sync_bytes

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    sync_bytes(pd.read_csv(snakemake.input.summary), pd.read_csv(snakemake.input.planner),
               [snakemake.output.png, snakemake.output.pdf])
