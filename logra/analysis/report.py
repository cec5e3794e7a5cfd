"""results/REPORT.md: the workflow's tables (`logra.analysis.tables`) formatted as markdown
sections, each with its source file, whatever the numbers say; `report_markdown` joins them."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

# what other modules import from here as before: the inputs, the sync sentence, the fit
# sentences, the opt-in stability tables
from logra.analysis.markdown import (  # noqa: F401
    ReportInputs, _accuracy_memory_section, _accuracy_section, _cost_section, _fmt,
    _memory_sweep_section, _metric_name, _others, _section, _verdicts_section, amended_lines,
    low_rank_sentence, markdown_table)
from logra.analysis.memory_report import _memory_real, _paper_setting, _planner, fit_sentences
from logra.analysis.runs_report import (STABILITY_OPT_IN, _ablations, _kl_calibration, _lr_sweep,
                                        _scaling, _stability, _step_control, _study, _sync,
                                        _trl, _update_cosine)
# the table builders and write_csv, once here, are re-exported
from logra.analysis.tables import (  # noqa: F401
    SCALARS, SYNC_FIELDS, accuracy_memory_table, accuracy_table, base_evals, cost_table,
    eval_columns, low_rank_vs_delta, memory_sweep_table, paper_setting_curve,
    paper_setting_table, scale_label, summary_table, sync_regime_table, sync_table, time_ledger)
from logra.files import write_csv  # noqa: F401


def _machines(runs: list[dict]) -> str:
    seen = dict.fromkeys(
        f"{m['cpu_model']} ({m['cpu_vendor']}; torch {m['torch']} at {m['torch_capability']}, "
        f"transformers {m['transformers']}; pinned CPU path: "
        f"{'yes' if m['reproducible'] else 'no'})"
        for m in (r.get("machine") for r in runs) if m)
    return "; ".join(seen) or "not recorded"


def _title(inputs: ReportInputs) -> list[str]:
    return ["# Results", "", "Written by the workflow (rule `report`) from the files named in "
            "each section; every number is formatted from them."]


def _plan(inputs: ReportInputs) -> list[str]:
    """The analysis plan as it was frozen before the test evaluations ran."""
    plan = inputs.plan
    if plan is None:
        return []
    primary = plan["primary_metric"]

    def protocol(p):
        return ("greedy" if p["temperature"] == 0 else
                f"{p['samples']} samples at temperature {p['temperature']:g}, top-p "
                f"{p.get('top_p', 1.0):g}")
    margins = pd.DataFrame([{"task": t, **m} for t, m in plan["margins"].items()])
    steps = ", ".join(f"{m} {s}" for m, s in plan["steps"].items())
    gate = plan["gate"]
    return ["", "## Analysis plan (`results/analysis_plan.json`)", "",
            f"Frozen {plan['frozen']}.", "", *amended_lines(plan),
            f"- Primary metric: `{primary['protocol']}`, {protocol(primary)}; "
            f"{primary['definition']}. Reported beside it: " + "; ".join(
                f"`{k}` ({protocol(p)})" for k, p in plan["other_metrics"].items()) + ".",
            (f"- Compared: {', '.join(m for m in plan['methods'] if m != plan['reference'])} "
             f"against `{plan['reference']}`" if plan["reference"] in plan["methods"] else
             f"- Compared: nothing (runs {', '.join(plan['methods'])}; the reference, "
             f"`{plan['reference']}` (verdict.reference), is not among them)")
            + (f" (ablations: {', '.join(plan['ablation_methods'])})"
               if plan["ablation_methods"] else "")
            + f", on {', '.join(plan['tasks'])}, seeds {', '.join(map(str, plan['seeds']))}, "
            f"{plan['n_test']} test problems; GRPO steps: {steps}.",
            f"- Gate: {gate['test']}, at level {gate['alpha']:g}; informative when it passes.",
            f"- Interval: {plan['interval']}. Call: {plan['call']}. Power: {plan['power']}.",
            "- Tuned on the validation split (config/tuned.yaml): " + ("; ".join(
                f"{m} on {t}, {c['option']} {c['value']:g} ("
                + ("bracketed" if c.get("bracketed") else "on its grid's edge: a bound") + ")"
                for t, chosen in plan.get("tuned", {}).items() for m, c in chosen.items())
                or "nothing adopted; every value as config/config.yaml gives it") + ".",
            "", markdown_table(pd.DataFrame({
                "task": margins["task"], "margin": _fmt(margins["margin"], ".4f"),
                "reference's validation gain": _fmt(margins["val_gain_mean"], "+.4f"),
                "per seed": margins["val_gain_by_seed"].fillna(""),
                "validation problems": margins["val_problems"],
                "reference lr": _fmt(margins["lr"], "g"), "source": margins["source"]}))]


def _header(inputs: ReportInputs) -> list[str]:
    summary, ok = inputs.summary, inputs.ok
    seeds = ", ".join(map(str, sorted(set(summary["seed"]))))
    out = ["", f"- Runs: {scale_label(summary)} ({seeds}); {len(ok)} of {len(summary)} runs "
           "finished ok.",
           f"- Machine: {_machines(inputs.runs + inputs.long_runs)}."]
    if inputs.long_runs:
        steps = "/".join(str(s) for s in sorted({x["steps"] for x in inputs.long_runs}))
        out.append(f"- Stability runs: {len(inputs.long_runs)} runs of "
                   f"{', '.join(sorted({x['method'] for x in inputs.long_runs}))}, {steps} steps.")
    if inputs.digest:
        out.append(f"- Config digest: `{inputs.digest}`.")
    if inputs.stale:
        out += ["", "**Stale opt-in results, left out of this report**: each was made under "
                "another config than this one, has no readable stamp, or was changed after it "
                "was stamped; rerun its target to bring it up to date.", "", markdown_table(pd.DataFrame([
                    {"result": f"`{s['result']}`", "made under config":
                     f"`{s['config_digest']}`" if s["config_digest"] else "unknown",
                     "why": s["why"], "rerun": f"`snakemake --cores all {s['target']}`"}
                    for s in inputs.stale]))]
    return out


def _bases(inputs: ReportInputs) -> list[str]:
    bases = inputs.accuracy.groupby("task", as_index=False).first()
    return _section("SFT bases", "results/accuracy.csv", "lm-eval accuracy of each task's SFT "
                    f"base, {_metric_name(bases['metric'].iloc[0])}, mean over seeds; beside it "
                    "the other protocols'.",
                    {"task": bases["task"], "base accuracy": _fmt(bases["base_accuracy"]),
                     **_others(bases, "base_")}) + _sft_curves(inputs.sft)


def _sft_curves(sft: list[dict] | None) -> list[str]:
    """Each base's held-out greedy accuracy along its SFT steps: a jump shows here."""
    rows = [{"task": s["task"], "seed": s["seed"],
             **{f"step {h['step']}": f"{h['accuracy']:.3f}" for h in s["history"]}}
            for s in sorted(sft or [], key=lambda s: (s["task"], s["seed"])) if s["history"]]
    if not rows:
        return []
    return _section("SFT curves", "results/base/{task}/seed{seed}/sft.json", "Greedy accuracy "
                    "on SFT's held-out slice of the train split (`sft.eval_examples`) every "
                    "`sft.eval_every` steps, per base.",
                    pd.DataFrame(rows).fillna("").to_dict("list"))


def _results(inputs: ReportInputs) -> list[str]:
    """Accuracy, verdicts, measured cost, the memory sweep."""
    out = _accuracy_section(inputs.accuracy, "Accuracy", "results/accuracy.csv")
    if inputs.verdicts is not None:
        out += _verdicts_section(inputs.verdicts, "Verdicts", "results/verdicts.csv")
    out += _cost_section(inputs.summary, inputs.reference, "Measured cost", "results/summary.csv")
    out += _accuracy_memory_section(inputs.accuracy, inputs.reference, inputs.planner)
    if inputs.sweep is not None:
        out += _memory_sweep_section(inputs.sweep, "Memory sweep", "results/memory/sweep.csv")
    return out


def _time_ledger(inputs: ReportInputs) -> list[str]:
    ledger = inputs.ledger
    out = []
    total = pd.concat([ledger, pd.DataFrame([{"stage": "total", "jobs": ledger["jobs"].sum(),
                                              "seconds": ledger["seconds"].sum(),
                                              "share": 1.0}])])
    out += _section("Time ledger", "results/benchmarks/", "Wall seconds of every job of the "
                    "default target (Snakemake's `benchmark:` files), summed per stage; jobs that "
                    "ran side by side each count in full, and this report's own job is not in it.",
                    {"stage": total["stage"], "jobs": total["jobs"],
                     "seconds": _fmt(total["seconds"], ".1f"),
                     "share": _fmt(total["share"], ".1%")})
    return out


# the report's sections, in order
SECTIONS = (_title, _plan, _header, _bases, _results, _planner, _memory_real, _paper_setting,
            _kl_calibration, _step_control, _update_cosine, _stability, _sync, _lr_sweep,
            _ablations, _trl, _scaling, _study, _time_ledger)


def report_markdown(inputs: ReportInputs) -> str:
    """results/REPORT.md: every section of `SECTIONS` over `inputs`."""
    return "\n".join(line for section in SECTIONS for line in section(inputs)) + "\n"


def current_opt_in(opt_in: dict[str, dict[str, str]],
                   digest: str) -> tuple[dict[str, Path], list[dict]]:
    """The opt-in results ({target: {result: its stamp}}) made under this config ({path: Path}:
    each exists, its stamp holds `digest` and the result's SHA-256 is the one stamped), and the
    stale ones, each with `why`: its stamp is another config's, missing or malformed, or the
    result was changed after it was stamped."""
    from logra.repro import file_digest
    current, stale = {}, []
    for target, stamps in opt_in.items():
        for path, stamp in ((Path(p), Path(s)) for p, s in stamps.items()):
            if not path.exists():
                continue
            try:
                record = json.loads(stamp.read_text()) if stamp.exists() else {}
                made = record.get("config_digest")
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                record, made = None, None
            why = ("no stamp" if not stamp.exists() else f"malformed stamp {stamp}"
                   if record is None else "made under another config" if made != digest
                   else "changed after it was stamped" if record.get("sha256") not in (
                       None, file_digest(path)) else None)
            if why is None:
                current[str(path)] = path
            else:
                stale.append({"result": str(path), "config_digest": made, "target": target,
                              "why": why})
    return current, stale

