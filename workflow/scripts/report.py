"""results/REPORT.md: the default target's tables and time ledger
(logra.analysis.report.report_markdown)."""
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pandas as pd

from logra.analysis.report import STABILITY_OPT_IN, ReportInputs, report_markdown, time_ledger
from logra.files import atomic_path, progress


def table(paths):
    """The CSV of an optional input (a list of zero or one path), or None."""
    return pd.read_csv(paths[0]) if paths else None


def ablation_tables(folder: Path):
    """The tables `snakemake ablations` wrote before, or None if it has not run."""
    files = {"summary": "summary.csv", "accuracy": "accuracy.csv", "verdicts": "verdicts.csv",
             "sweep": "memory_sweep.csv"}
    if not all((folder / files[k]).exists() for k in ("summary", "accuracy")):
        return None
    return {k: pd.read_csv(folder / f) if (folder / f).exists() else None
            for k, f in files.items()}


with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    i = snakemake.input
    lr_sweep, regime = Path(snakemake.params.lr_sweep), Path(snakemake.params.sync_regime)
    scaling = Path(snakemake.params.scaling)
    ledger = time_ledger(i.benchmarks)
    text = report_markdown(ReportInputs(
        pd.read_csv(i.summary), pd.read_csv(i.accuracy),
        [json.loads(Path(p).read_text()) for p in i.runs],
        [json.loads(Path(p).read_text()) for p in i.long_runs], ledger,
        plan=json.loads(Path(i.plan).read_text()), verdicts=table(i.verdicts),
        sweep=table(i.sweep), planner=table(i.planner),
        paper_setting=table(i.paper_setting),
        lr_sweep=pd.read_csv(lr_sweep) if lr_sweep.exists() else None,
        stability=(pd.read_csv(i.stability[0]), snakemake.params.criterion)
        if i.stability else None,
        stability_opt_in={name: pd.read_csv(f"results/{name}.csv")
                          for name in STABILITY_OPT_IN if Path(f"results/{name}.csv").exists()},
        trl=[json.loads(p.read_text()) for p in sorted(Path(snakemake.params.trl).glob("*.json"))],
        reference=snakemake.params.reference,
        sync_regime=pd.read_csv(regime) if regime.exists() else None,
        ablations=ablation_tables(Path(snakemake.params.ablations)),
        sft=[json.loads(Path(p).read_text()) for p in i.sft],
        scaling=pd.read_csv(scaling) if scaling.exists() else None))
    with atomic_path(snakemake.output[0]) as tmp:
        tmp.write_text(text)
    progress("report results/REPORT.md", jobs=int(ledger["jobs"].sum()),
             job_seconds=float(ledger["seconds"].sum()))
