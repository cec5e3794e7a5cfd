"""results/study/<horizon>/{verdicts,summary,secondary,spectrum}.csv: a study horizon's arms compared on the test split
as its frozen plan says (logra.analysis.study.study_tables)."""
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from logra.analysis.study import study_tables
from logra.analysis.tables import base_evals
from logra.files import write_csv

i = snakemake.input
with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    plan = json.loads(Path(i.plan).read_text())
    arm_of = {c["method"]: arm for arm, c in plan["arms"].items()}
    runs = {}
    for path in i.runs:
        s = json.loads(Path(path).read_text())
        runs[arm_of[s["method"]], s["seed"]] = path
    evals = {}
    for path in i.evals:  # results/study/<horizon>/eval/{task}/{method}/seed{seed}/step{step}.json
        p = Path(path)
        evals[p.parents[2].name, arm_of[p.parents[1].name],
              int(p.parent.name.removeprefix("seed")), int(p.stem.removeprefix("step"))] = path
    spectra = {}
    for path in i.spectra:  # results/study/<horizon>/spectrum/{task}/{method}/seed{seed}.csv
        p = Path(path)
        spectra[arm_of[p.parent.name], int(p.stem.removeprefix("seed"))] = path
    drifts = {}
    for path in i.drifts:  # results/study/<horizon>/{drift,curve}/{task}/{method}/seed{seed}.json
        p = Path(path)
        drifts[arm_of[p.parent.name], int(p.stem.removeprefix("seed"))] = path
    tables = study_tables(plan, runs, evals, base_evals(i.bases), spectra, drifts)
    for name, table in tables.items():
        write_csv(table, snakemake.output[name])
    print(tables["verdicts"][["step", "method", "reference", "diff_mean", "diff_lo", "diff_hi",
                              "calls"]].to_string())
