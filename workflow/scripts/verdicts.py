"""results/verdicts.csv: every method against the reference, paired, with intervals."""
from contextlib import redirect_stderr, redirect_stdout

from logra.analysis.report import base_evals, write_csv
from logra.analysis.verdict import verdicts

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    evals = {}
    for run, path in zip(snakemake.params.runs, snakemake.input.evals, strict=True):
        task, method, seed = run.split("/")
        evals[task, method, int(seed.removeprefix("seed"))] = path
    bases = base_evals(snakemake.input.base)
    v = snakemake.params.verdict
    table = verdicts(evals, bases, v["reference"], v["margin"])
    write_csv(table, snakemake.output[0])
    print(table[["task", "method", "diff_mean", "diff_lo", "diff_hi", "call"]].to_string())
