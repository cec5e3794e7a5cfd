"""figures/memory_reduction.{png,pdf}: the run grid and the memory sweep (measured)."""
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd

from logra.analysis.figures import memory_reduction

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    memory_reduction(pd.read_csv(snakemake.input.summary), pd.read_csv(snakemake.input.sweep),
                     [snakemake.output.png, snakemake.output.pdf], snakemake.params.reference)
