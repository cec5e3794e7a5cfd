"""results/sync_regime.csv: the sync regime runs' sync means
(logra.analysis.report.sync_regime_table)."""
from contextlib import redirect_stderr, redirect_stdout

from logra.analysis.tables import sync_regime_table
from logra.files import write_csv

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    table = sync_regime_table(snakemake.input.runs, snakemake.params.regimes)
    write_csv(table, snakemake.output[0])
    print(table.to_string())
