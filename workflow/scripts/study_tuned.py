"""results/study/tuned/{arm}.yaml: an arm's choice at a horizon ({arm}: <arm>_<horizon>) on the
validation split, from its grid's last window (logra.analysis.study.arm_choice), as
`study.tuned.<arm>_<horizon>` adopts it."""
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import yaml

from logra.analysis.study import arm_choice
from logra.analysis.tuning import lr_sweep_table
from logra.files import atomic_path, progress

i, p, arm = snakemake.input, snakemake.params, snakemake.wildcards.arm
with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    table = lr_sweep_table(i.runs, i.evals, p.sweep, p.knobs, p.declared)
    print(table.to_string())
    val = {}
    for run, path in zip(i.runs, i.evals, strict=True):
        s = json.loads(Path(run).read_text())
        val[s["method"], s["seed"]] = path
    record = arm_choice(table, p.sweep, arm, val, p.configs)
    del record["method"]  # the run of its point, named again from the grid when adopted
    with atomic_path(snakemake.output[0]) as tmp:
        tmp.write_text(
            f"# {arm}'s choice on the validation split (results/study/tuned/{arm}.yaml).\n"
            "# Adopt it: python -m logra.harness.adopt (config/tuned.yaml); the arm's grid then "
            "does not run again\n" + yaml.safe_dump({arm: record}, sort_keys=False, width=100,
                                                         default_flow_style=None))
    progress(f"study tuned {arm}", f"{record['option']} {record['value']:g}",
             bracketed=record["bracketed"])
