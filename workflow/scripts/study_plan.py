"""results/study/lr_sweep.csv (the study grids' last windows, validation split) and
results/study/analysis_plan.json: each arm's choice, the test seeds and the analysis, frozen
before any test run (logra.analysis.study.study_plan)."""
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pandas as pd

from logra.analysis.study import study_plan
from logra.analysis.tuning import lr_sweep_table
from logra.files import progress, write_csv, write_json

i, p = snakemake.input, snakemake.params
with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    table = lr_sweep_table(i.runs, i.evals, p.sweep, p.knobs, p.declared)
    write_csv(table, snakemake.output.table)
    val = {}
    for run, path in zip(i.runs, i.evals, strict=True):
        s = json.loads(Path(run).read_text())
        val[s["method"], s["seed"]] = path
    plan = study_plan(table, p.sweep, val, p.study, p.pool, pd.read_csv(i.margin), p.spec)
    write_json(snakemake.output.plan, plan)
    print(table.to_string())
    rule = plan["seeds_rule"]
    progress("study plan", **{arm: f"{c['option']} {c['value']:g}"
                              for arm, c in plan["arms"].items()},
             seeds=f"{rule['n']} (needed {rule['needed']}{', capped' if rule['capped'] else ''})")
