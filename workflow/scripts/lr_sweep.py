"""results/lr_sweep.csv: validation accuracy and training reward per (task, method, point of its
knob: an lr, LoGRA's KL budget); the point with the best validation accuracy per task and
method is `chosen`."""
from contextlib import redirect_stderr, redirect_stdout

from logra.analysis.report import lr_sweep_table, write_csv

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    table = lr_sweep_table(snakemake.input.runs, snakemake.input.evals, snakemake.params.sweep,
                           snakemake.params.knobs)
    write_csv(table, snakemake.output[0])
    print(table.to_string())
