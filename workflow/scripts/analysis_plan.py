"""results/analysis_plan.json: the analysis, frozen before any test evaluation runs."""
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd

from logra.analysis.verdict import analysis_plan
from logra.files import write_json
from logra.harness.freeze import amendments

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    spec = snakemake.params.plan
    plan = analysis_plan(spec, pd.read_csv(snakemake.input.margin))
    # what it was written from (freeze.guard), and its amendments, if any
    plan |= {"spec": spec, "amendments": amendments(snakemake.output[0])}
    write_json(snakemake.output[0], plan)
    print({task: m["margin"] for task, m in plan["margins"].items()})
