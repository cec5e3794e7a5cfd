"""figures/study_horizons.{png,pdf}: each horizon's difference from the reference with its
interval and its share of the reference's gain (logra.analysis.figures.study_horizons)."""
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd

from logra.analysis.figures import study_horizons

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    study_horizons(pd.read_csv(snakemake.input[0]), [snakemake.output.png, snakemake.output.pdf])
