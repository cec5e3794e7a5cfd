"""results/study/horizons.csv: the study's horizons against each other, each contrast they all
run Holm-adjusted over the horizons, and the horizon effect (logra.analysis.study.horizon_table)."""
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pandas as pd

from logra.analysis.study import horizon_table
from logra.files import write_csv

i = snakemake.input
with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    plans = {Path(p).parent.name: json.loads(Path(p).read_text()) for p in i.plans}
    summaries = {Path(p).parent.name: pd.read_csv(p) for p in i.summaries}
    table = horizon_table(plans, summaries)
    write_csv(table, snakemake.output[0])
    print(table.to_string())
