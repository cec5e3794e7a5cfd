"""results/stability*.csv: each stability run against stability.criterion."""
from contextlib import redirect_stderr, redirect_stdout

from logra.analysis.stability import stability_table
from logra.files import write_csv

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    i = snakemake.input
    table = stability_table(i.summaries, i.metrics, i.curves, snakemake.params.criterion)
    write_csv(table, snakemake.output[0])
    print(table.to_string())
