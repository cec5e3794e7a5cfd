"""figures/memory_reduction.{png,pdf}: the run grid and the memory sweep (measured)."""
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd

from logra.analysis.figures import memory_reduction
from logra.analysis.tables import read_summary

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    i = snakemake.input
    memory_reduction(read_summary(i.summary, i.runs), pd.read_csv(i.sweep),
                     [snakemake.output.png, snakemake.output.pdf], snakemake.params.reference)
