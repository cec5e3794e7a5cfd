"""figures/sync_bytes.{png,pdf}: bytes per policy sync of every transport and the log-prob
mismatch, measured in the runs, and predicted at scale."""
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd

from logra.analysis.figures import sync_bytes
from logra.analysis.tables import read_summary

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    i = snakemake.input
    sync_bytes(read_summary(i.summary, i.runs), pd.read_csv(i.planner),
               [snakemake.output.png, snakemake.output.pdf])
