"""figures/reward_curves.{png,pdf} from every run's metrics.csv."""
from contextlib import redirect_stderr, redirect_stdout

from logra.analysis.figures import reward_curves
from logra.analysis.tables import read_summary

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    reward_curves(read_summary(snakemake.input.summary, snakemake.input.runs),
                  snakemake.input.metrics, [snakemake.output.png, snakemake.output.pdf])
