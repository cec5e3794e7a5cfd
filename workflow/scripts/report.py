"""results/REPORT.md: the default target's tables and time ledger
(logra.analysis.report.report_markdown)."""
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pandas as pd

from logra.analysis.report import (STABILITY_OPT_IN, ReportInputs, current_opt_in,
                                   report_markdown)
from logra.analysis.tables import accuracy_table, read_summary, time_ledger
from logra.files import atomic_path, progress
from logra.harness.plan import STUDY_STABILITY, STUDY_TABLES


def table(paths):
    """The CSV of an optional input (a list of zero or one path), or None."""
    return pd.read_csv(paths[0]) if paths else None


def read(path: str, current: dict[str, Path]):
    """The table at `path` if it is a current opt-in result, else None."""
    return pd.read_csv(current[path]) if path in current else None


def ablation_tables(current: dict[str, Path]):
    """The tables `snakemake ablations` wrote under this config, or None."""
    tables = {k: read(f"results/ablations/{f}", current) for k, f in (
        ("summary", "summary.csv"), ("accuracy", "accuracy.csv"), ("verdicts", "verdicts.csv"),
        ("sweep", "memory_sweep.csv"))}
    return tables if tables["summary"] is not None and tables["accuracy"] is not None else None


def study_tables(current: dict[str, Path], horizons: list[str]):
    """The plans and tables `snakemake study` wrote under this config, per horizon, and the
    horizons' table (`across`), or None before every horizon's have."""
    out = {}
    for h in horizons:
        paths = {name: f"results/study/{h}/{name}.csv" for name in STUDY_TABLES}
        plan = f"results/study/{h}/analysis_plan.json"
        if not all(p in current for p in [plan, *paths.values()]):
            return None
        out[h] = {"plan": json.loads(Path(plan).read_text())} | {
            name: pd.read_csv(p) for name, p in paths.items()} | {
            name: read(f"results/study/{h}/{name}.csv", current) for name in STUDY_STABILITY}
    return {"horizons": out, "across": read("results/study/horizons.csv", current)} \
        if out else None


with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    i = snakemake.input
    current, stale = current_opt_in(snakemake.params.opt_in, snakemake.params.digest)
    ledger = time_ledger(i.benchmarks)
    summary, accuracy = read_summary(i.summary, i.runs), pd.read_csv(i.accuracy)
    try:  # accuracy.csv is summary.csv's means, written beside it
        pd.testing.assert_frame_equal(accuracy, accuracy_table(summary), check_dtype=False)
    except AssertionError as e:
        raise ValueError(f"{i.accuracy} is not the accuracy table of {i.summary}: remove both "
                         f"and rerun snakemake, which writes them again ({e})") from None
    text = report_markdown(ReportInputs(
        summary, accuracy,
        [json.loads(Path(p).read_text()) for p in i.runs],
        [json.loads(Path(p).read_text()) for p in i.long_runs], ledger,
        plan=json.loads(Path(i.plan).read_text()), verdicts=table(i.verdicts),
        sweep=table(i.sweep), planner=table(i.planner),
        paper_setting=table(i.paper_setting),
        lr_sweep=read("results/lr_sweep.csv", current),
        stability=(pd.read_csv(i.stability[0]), snakemake.params.criterion)
        if i.stability else None,
        stability_opt_in={name: read(f"results/{name}.csv", current)
                          for name in STABILITY_OPT_IN if f"results/{name}.csv" in current},
        trl=[json.loads(p.read_text()) for path, p in current.items()
             if path.startswith("results/trl/")],
        reference=snakemake.params.reference,
        sync_regime=read("results/sync_regime.csv", current),
        ablations=ablation_tables(current),
        sft=[json.loads(Path(p).read_text()) for p in i.sft],
        scaling=read("results/scaling.csv", current),
        memory_real=read("results/memory/real.csv", current),
        study=study_tables(current, snakemake.params.horizons),
        stale=stale, digest=snakemake.params.digest))
    with atomic_path(snakemake.output[0]) as tmp:
        tmp.write_text(text)
    progress("report results/REPORT.md", jobs=int(ledger["jobs"].sum()),
             job_seconds=float(ledger["seconds"].sum()))
