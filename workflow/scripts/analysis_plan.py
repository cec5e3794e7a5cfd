"""results/analysis_plan.json: the analysis, frozen before any test evaluation runs."""
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd

from logra.analysis.verdict import analysis_plan
from logra.files import write_json

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    plan = analysis_plan(snakemake.params.plan, pd.read_csv(snakemake.input.margin))
    write_json(snakemake.output[0], plan)
    print({task: m["margin"] for task, m in plan["margins"].items()})
