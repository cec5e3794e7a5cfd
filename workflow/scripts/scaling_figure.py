"""figures/scaling.{png,pdf}: the difference from the reference per size with its interval and
the trend; measured memory and step-time ratios, and the planner's at scale (predictions)."""
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd

from logra.analysis.figures import scaling

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    table = pd.read_csv(snakemake.input[0])
    print(table.to_string())
    scaling(table, [snakemake.output.png, snakemake.output.pdf])
