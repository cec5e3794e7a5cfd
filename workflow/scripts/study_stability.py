"""results/study/<horizon>/stability.csv and stability_contrasts.csv: a horizon's test runs
judged by stability.criterion (logra.analysis.stability.stability_table, each run as it ended:
intent to treat), and its arms contrasted by seed on the criterion's measures
(logra.analysis.study.stability_contrasts)."""
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from logra.analysis.stability import stability_table
from logra.analysis.study import contrasts, stability_contrasts
from logra.files import write_csv

i = snakemake.input
with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    plan = json.loads(Path(i.plan).read_text())
    arm_of = {c["method"]: arm for arm, c in plan["arms"].items()}
    table = stability_table(i.summaries, i.metrics, i.curves, snakemake.params.criterion)
    table = table.rename(columns={"method": "run_method"})
    table.insert(1, "method", table["run_method"].map(arm_of))
    write_csv(table, snakemake.output.stability)
    out = stability_contrasts(table, contrasts(plan["methods"], plan["reference"]))
    write_csv(out, snakemake.output.stability_contrasts)
    print(out.to_string())
