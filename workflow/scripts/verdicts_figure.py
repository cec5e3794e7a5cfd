"""figures/verdicts.{png,pdf} from results/verdicts.csv."""
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd

from logra.analysis.figures import verdicts
from logra.analysis.tables import read_summary

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    i = snakemake.input
    verdicts(pd.read_csv(i.verdicts), read_summary(i.summary, i.runs),
             [snakemake.output.png, snakemake.output.pdf])
