"""figures/verdicts.{png,pdf} from results/verdicts.csv."""
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd

from logra.analysis.figures import verdicts

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    verdicts(pd.read_csv(snakemake.input.verdicts), pd.read_csv(snakemake.input.summary),
             [snakemake.output.png, snakemake.output.pdf])
