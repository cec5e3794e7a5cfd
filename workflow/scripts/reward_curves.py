"""figures/reward_curves.{png,pdf} from every run's metrics.csv."""
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd

from logra.analysis.figures import reward_curves

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    reward_curves(pd.read_csv(snakemake.input.summary), snakemake.input.metrics,
                  [snakemake.output.png, snakemake.output.pdf])
