"""A tuning table (results/lr_sweep.csv, results/scaling/*.csv): validation accuracy and training
reward per (task, method, point of its knob: an lr, LoGRA's KL budget); the point with the best
validation accuracy per task and method is `chosen` (logra.analysis.tuning). With a `tuned`
output, the choices for the config to adopt: the lr sweep's results/tuned.yaml over the
choices already adopted (`adopted`), the scaling sweep's results/scaling/tuned.yaml without."""
from contextlib import redirect_stderr, redirect_stdout

from logra.analysis.tuning import lr_sweep_table, scaling_tuned_file, tuned_file
from logra.files import atomic_path, write_csv

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    table = lr_sweep_table(snakemake.input.runs, snakemake.input.evals, snakemake.params.sweep,
                           snakemake.params.knobs, snakemake.params.get("declared"))
    write_csv(table, snakemake.output.table)
    if "tuned" in snakemake.output.keys():
        with atomic_path(snakemake.output.tuned) as tmp:
            adopted, seeds = snakemake.params.get("adopted"), snakemake.params.seeds
            tmp.write_text(scaling_tuned_file(table, seeds, snakemake.output.table)
                           if adopted is None else
                           tuned_file(table, seeds, snakemake.output.table, adopted))
    print(table.to_string())
