"""results/study/analysis_plan.json: each arm's choice (results/study/tuned/{arm}.yaml, or as
`study.tuned` adopted it), the test seeds and the analysis, frozen before any test run
(logra.analysis.study.study_plan)."""
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pandas as pd
import yaml

from logra.analysis.study import adopted_choice, study_plan
from logra.files import progress, write_json
from logra.harness.freeze import amendments

i, p = snakemake.input, snakemake.params
with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    records = {**p.study.get("tuned", {})}
    for path in i.tuned:
        records |= yaml.safe_load(Path(path).read_text())
    arms = {arm: adopted_choice(record, p.sweep, arm) for arm, record in records.items()}
    plan = study_plan(arms, p.study, p.pool, pd.read_csv(i.margin), p.spec)
    # what it was written from, for freeze.guard (an adopted choice is no change), and its
    # amendments, if any
    plan["spec"] = {"sweep": p.sweep, "study": {k: v for k, v in p.study.items() if k != "tuned"},
                    "pool": p.pool, "spec": p.spec}
    plan["amendments"] = amendments(snakemake.output.plan)
    write_json(snakemake.output.plan, plan)
    rule = plan["seeds_rule"]
    progress("study plan", **{arm: f"{c['option']} {c['value']:g}"
                              for arm, c in plan["arms"].items()},
             seeds=f"{rule['n']} (needed {rule['needed']}{', capped' if rule['capped'] else ''})")
