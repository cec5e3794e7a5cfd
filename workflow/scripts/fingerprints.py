"""results/fingerprints.csv: the digests of every stage's results (logra/repro.py)."""
from contextlib import redirect_stderr, redirect_stdout

from logra.files import write_csv
from logra.harness.fingerprints import fingerprint_table

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    i = snakemake.input
    table = fingerprint_table(list(i.data), list(i.bases), list(i.runs), list(i.evals))
    write_csv(table, snakemake.output[0])
    print(table.groupby("stage").size().to_string())
