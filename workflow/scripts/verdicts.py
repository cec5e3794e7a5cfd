"""results/verdicts.csv: every method against the reference, paired, with intervals, judged by
the frozen analysis plan (its margins and gate)."""
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from logra.analysis.tables import base_evals
from logra.analysis.verdict import run_evals, verdicts
from logra.files import write_csv

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    evals = run_evals(snakemake.params.runs, snakemake.input.evals)
    bases = base_evals(snakemake.input.base)
    plan = json.loads(Path(snakemake.input.plan).read_text())
    table = verdicts(evals, bases, plan["reference"],
                     {task: m["margin"] for task, m in plan["margins"].items()},
                     plan["gate"]["alpha"], [tuple(pair) for pair in plan.get("contrasts", [])])
    write_csv(table, snakemake.output[0])
    print(table[["task", "method", "diff_mean", "diff_lo", "diff_hi", "margin", "call",
                 "gate_p", "informative"]].to_string())
