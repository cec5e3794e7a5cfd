"""results/summary.csv (one row per run) and results/accuracy.csv (base vs GRPO)."""
from contextlib import redirect_stderr, redirect_stdout

from logra.analysis.tables import accuracy_table, base_evals, summary_table
from logra.files import write_csv

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    summary = summary_table(snakemake.input.runs, snakemake.input.evals,
                            base_evals(snakemake.input.base))
    write_csv(summary, snakemake.output.summary)
    acc = accuracy_table(summary)
    write_csv(acc, snakemake.output.accuracy)
    print(acc.to_string())
