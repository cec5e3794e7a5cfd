"""results/REPORT.md: the workflow's tables (`logra.analysis.tables`) formatted as markdown
sections, each with its source file, whatever the numbers say; `report_markdown` joins them."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

from logra.analysis.stability import criterion_text
# the tables it formats; the table builders and write_csv, once here, are re-exported
from logra.analysis.tables import (  # noqa: F401
    SCALARS, SYNC_FIELDS, accuracy_memory_table, accuracy_table, base_evals, cost_table,
    eval_columns, low_rank_vs_delta, memory_sweep_table, paper_setting_curve,
    paper_setting_table, scale_label, summary_table, sync_regime_table, sync_table, time_ledger)
from logra.common import PHASES
from logra.files import write_csv  # noqa: F401


def low_rank_sentence(summary: pd.DataFrame, reference: str | None) -> str:
    """Where low-rank sync stands against delta sync, from `low_rank_vs_delta`, whatever it is."""
    parts = []
    for r in low_rank_vs_delta(summary, reference).itertuples(index=False):
        rival = ("the delta sync of its own updates" if r.vs == "own updates"
                 else f"{r.vs}'s delta sync (same task and seed)")
        spread = (f"{r.lo:.3g}-{r.hi:.3g}x over {r.n} (task, seed) pairs" if r.n > 1
                  else "one (task, seed) pair")
        parts.append(f"{r.method}'s low-rank sync sends {r.ratio:.3g}x the bytes per step of "
                     f"{rival}, {spread}, {r.engine_dtype} engine: "
                     f"{_fewer_or_more(r.lo, r.hi)}")
    return ("; ".join(parts) + ".") if parts else "No run applied a low-rank sync."


def _fewer_or_more(lo: float, hi: float) -> str:
    return ("fewer bytes in every pair" if hi < 1 else "more bytes in every pair" if lo > 1
            else "fewer in some pairs, more in others")


def _sync_section(summary: pd.DataFrame, reference: str | None, title: str, source: str,
                  intro: str) -> list[str]:
    t = sync_table(summary)
    return _section(title, source, intro, {
        "method": t["method"], "transport": t["transport"],
        "applied": t["applied"].map({True: "yes", False: ""}), "engine": t["engine_dtype"],
        "MiB per step": _fmt(t["bytes_per_step"], ".4f", 2**20),
        "sync s": _fmt(t["sync_seconds"], ".4f"),
        "changed fraction": _fmt(t["changed_fraction"], ".2%"),
        "mismatch mean": _fmt(t["logp_mismatch_mean"], ".2e"),
        "mismatch max": _fmt(t["logp_mismatch_max"], ".2e"), "runs": t["runs"]}) + [
        "", low_rank_sentence(summary, reference)]


def markdown_table(df: pd.DataFrame) -> str:
    """A GitHub-markdown table of `df`'s cells as they are (format them first)."""
    lines = ["| " + " | ".join(map(str, df.columns)) + " |",
             "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _fmt(values, spec: str = ".3f", scale: float = 1.0) -> list[str]:
    """Each value / scale formatted with `spec`; a missing value as "n/a"."""
    return ["n/a" if v is None or pd.isna(v) else format(v / scale, spec) for v in values]


def _pm(means, sds) -> list[str]:
    return [f"{m} ± {s}" for m, s in zip(_fmt(means), _fmt(sds))]


def _section(title: str, source: str, intro: str, table: dict) -> list[str]:
    return ["", f"## {title} (`{source}`)", "", intro, "", markdown_table(pd.DataFrame(table))]


def _metric_name(metric: str) -> str:
    return f"`{metric}` (the primary metric)"


def _others(table: pd.DataFrame, prefix: str) -> dict:
    """Every protocol's mean accuracy (and pass@k) but the primary's, as report columns."""
    primary = table["metric"].iloc[0]
    return {c.removeprefix(prefix).replace("_pass", " pass@"): _fmt(table[c])
            for c in table.columns if c.startswith(prefix) and c != f"{prefix}accuracy"
            and c != f"{prefix}metric" and c != f"{prefix}{primary}"}


def _accuracy_section(accuracy: pd.DataFrame, title: str, source: str) -> list[str]:
    return _section(title, source, "lm-eval accuracy after GRPO per task and method, "
                    f"{_metric_name(accuracy['metric'].iloc[0])}: mean ± sd over the seeds whose "
                    "run finished ok; beside it the means of the other protocols (pass@k: the "
                    "share of problems with a correct sample among k) and the policy's token "
                    "entropy on its own rollouts in nats, mean over the steps (a sharper policy: "
                    "lower).",
                    {"task": accuracy["task"], "method": accuracy["method"],
                     "accuracy": _pm(accuracy["accuracy_mean"], accuracy["accuracy_sd"]),
                     "gain over base": _fmt(accuracy["gain_mean"], "+.3f"),
                     **_others(accuracy, "eval_"),
                     **({"token entropy": _fmt(accuracy["token_entropy"])}
                        if "token_entropy" in accuracy else {}),
                     "seeds": accuracy["n_seeds"]})


def _verdicts_section(v: pd.DataFrame, title: str, source: str) -> list[str]:
    mean = v[v["statistic"] == "mean"]
    return _section(title, source, f"Accuracy by {_metric_name(v['metric'].iloc[0])} minus the "
                    "reference's, paired by task and seed, with its 95% interval; three "
                    "answers at the task's margin (better or worse, non-inferior, equivalent), "
                    "each a t-test Holm-adjusted over the table's contrasts; the method's gain "
                    "over its bases as a share of the reference's, with Fieller's 95% interval "
                    "(n/a ends: unbounded); the gate: the seeds in which the reference gained "
                    "more than the margin over its base (one-sided paired t-test on the test "
                    "problems), a comparison being informative when it passes; seeds needed: "
                    "for a call at 80% power at the observed mean and spread, a guide "
                    "(logra/analysis/verdict.py says how each is computed).",
                    {"task": mean["task"], "method": mean["method"],
                     "reference": mean["reference"],
                     "difference [95% interval]": [
                         f"{m} [{lo}, {hi}]" for m, lo, hi in zip(
                             *(_fmt(mean[c], "+.3f") for c in ("diff_mean", "diff_lo",
                                                               "diff_hi")))],
                     "margin": _fmt(mean["margin"], ".3f"),
                     f"answers (Holm over {len(mean)})": mean["calls"],
                     "share of the reference's gain [95%]": [
                         f"{m} [{lo}, {hi}]" for m, lo, hi in zip(
                             *(_fmt(mean[c], ".2f") for c in ("gain_share", "gain_share_lo",
                                                              "gain_share_hi")))],
                     "reference gain per seed": mean["ref_gain_by_seed"],
                     "gate": mean["gate_passed"],
                     "informative": mean["informative"].map({True: "yes", False: "no"}),
                     "seeds needed": _fmt(mean["seeds_needed"], ".0f")}) + _iqm_lines(v)


def _iqm_lines(v: pd.DataFrame) -> list[str]:
    iqm = v[v["statistic"] == "IQM"]
    if not len(iqm):
        return []
    return ["", "Across tasks, the IQM of the per-(task, seed) differences with a stratified "
            "bootstrap interval (descriptive: no call): " + "; ".join(
                f"{m} {d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for m, d, lo, hi in
                iqm[["method", "diff_mean", "diff_lo", "diff_hi"]].itertuples(index=False)) + "."]


def _cost_section(summary: pd.DataFrame, reference: str | None, title: str,
                  source: str) -> list[str]:
    t, ref = cost_table(summary, reference), reference or "the reference"
    return _section(title, source, "Per task and method, means over the runs that finished ok: "
                    "the update's peak memory as measured in the run (CUDA allocator on GPUs, "
                    f"torch's memory profiler on CPU) and its ratio to {ref}'s, the optimizer "
                    "state, seconds per step and sync bytes per step (the applied transport, "
                    "periodic full resyncs included). A run's peak is at the sequence lengths it "
                    "sampled in its profiled steps; the memory sweep compares methods at one "
                    "fixed shape.",
                    {"task": t["task"], "method": t["method"],
                     "peak (MiB)": _fmt(t["peak"], ".2f", 2**20),
                     "vs reference": _fmt(t["peak_vs_reference"]),
                     "optimizer state (MiB)": _fmt(t["state"], ".3f", 2**20),
                     "s per step": _fmt(t["step_s"], ".3f"),
                     "sync MiB per step": _fmt(t["sync"], ".4f", 2**20), "runs": t["runs"]})


def _accuracy_memory_section(accuracy: pd.DataFrame, reference: str | None,
                             planner: pd.DataFrame | None) -> list[str]:
    t = accuracy_memory_table(accuracy, reference, planner)
    predicted = [c for c in t if c.startswith("predicted ")]
    return _section("Accuracy and memory", "results/accuracy.csv, results/summary.csv" + (
        ", results/memory/planner.csv" if predicted else ""), "What a user choosing a method "
        "weighs: per task and method, the primary metric with its 95% t-interval over the "
        "seeds that finished, the update's peak memory as measured in these runs and its ratio "
        f"to {reference or 'the reference'}'s" + ("; beside them the planner's PREDICTION of "
        "GB per GPU at each of its models (predicted, not measured)" if predicted else "")
        + ".", {"task": t["task"], "method": t["method"],
                "accuracy [95%]": [f"{m} [{lo}, {hi}]" for m, lo, hi in zip(
                    *(_fmt(t[c]) for c in ("accuracy", "accuracy_lo", "accuracy_hi")))],
                "seeds": t["seeds"], "peak (MiB)": _fmt(t["peak_mem_bytes"], ".2f", 2**20),
                "vs reference": _fmt(t["peak_vs_reference"]),
                **{f"PREDICTION: GB per GPU, {c.removeprefix('predicted ')}":
                   _fmt(t[c], ".1f", 1e9) for c in predicted}})


def _memory_sweep_section(sweep: pd.DataFrame, title: str, source: str) -> list[str]:
    return _section(title, source, "One GRPO step per method and model size, measured; the "
                    "planner's prediction beside it (error = predicted / measured - 1).",
                    {"size": sweep["size"], "parameters": sweep["n_params"],
                     "method": sweep["method"], "status": sweep["status"],
                     "peak (MiB)": _fmt(sweep["peak_mem_bytes"], ".1f", 2**20),
                     "vs reference": _fmt(sweep["peak_mem_bytes_vs_reference"]),
                     "peak phase": sweep["peak_phase"],
                     "planner error": _fmt(sweep["planned_error"], "+.1%"),
                     "planner's peak phase": sweep["planned_peak_phase"]})


SYNC_INTRO = ("Per method and transport, means over the runs that finished ok of their per-step "
              "means: the serialized bytes each transport would send (measured in every run, "
              "whichever it applied); of the applied transport only, its seconds (pack + "
              "hand-over + apply; on CPU the hand-over is a local pipe to the engine's process) "
              "and the trainer-vs-engine |log-prob| mismatch over the sampled tokens; the engine "
              "words changed per step (logra/rl/weight_sync.py). LoGRA's low-rank transport "
              "sends α·D per target and the seeds the engine draws each projection from; the "
              "LoGRA authors' own runs synced full weights.")


def _machines(runs: list[dict]) -> str:
    seen = dict.fromkeys(
        f"{m['cpu_model']} ({m['cpu_vendor']}; torch {m['torch']} at {m['torch_capability']}, "
        f"transformers {m['transformers']}; pinned CPU path: "
        f"{'yes' if m['reproducible'] else 'no'})"
        for m in (r.get("machine") for r in runs) if m)
    return "; ".join(seen) or "not recorded"


@dataclasses.dataclass
class ReportInputs:
    """What results/REPORT.md is written from: the workflow's tables; `runs` and `long_runs`
    are the summary.json contents of the grid's runs and of the stability runs, `stability`
    their table (results/stability.csv) and the criterion it applied;
    `stability_opt_in` the tables of `snakemake stability` ({name: table}, `STABILITY_OPT_IN`);
    `reference` the method low-rank sync and measured peaks are compared with; `sft` the
    sft.json of each base the grid starts from (its held-out curve); `plan` the
    frozen analysis plan (results/analysis_plan.json); `ablations` the
    tables of `snakemake ablations` (results/ablations/: summary, accuracy, verdicts, sweep). A
    table that is None (its stage is not in the config, or the lr sweep, `snakemake
    sync_regime`, `snakemake ablations`, `snakemake scaling` or `snakemake memory_real` (its
    points, `memory_real`) has not run, or ran under
    another config) is left out, or its section says so; `stale` lists the opt-in results
    made under another config than this one (`digest`): {result, config_digest, target}."""
    summary: pd.DataFrame
    accuracy: pd.DataFrame
    runs: list[dict]
    long_runs: list[dict]
    ledger: pd.DataFrame
    plan: dict | None = None
    verdicts: pd.DataFrame | None = None
    sweep: pd.DataFrame | None = None
    planner: pd.DataFrame | None = None
    paper_setting: pd.DataFrame | None = None
    lr_sweep: pd.DataFrame | None = None
    stability: tuple[pd.DataFrame, dict] | None = None
    stability_opt_in: dict[str, pd.DataFrame] | None = None
    trl: list[dict] | None = None
    reference: str | None = None
    sync_regime: pd.DataFrame | None = None
    ablations: dict[str, pd.DataFrame | None] | None = None
    sft: list[dict] | None = None
    scaling: pd.DataFrame | None = None
    memory_real: pd.DataFrame | None = None
    stale: list[dict] = dataclasses.field(default_factory=list)
    digest: str | None = None

    @property
    def ok(self) -> pd.DataFrame:
        """The runs that finished."""
        return self.summary[self.summary["status"] == "ok"]


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
            f"Frozen {plan['frozen']}.", "",
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
            f"- Gate: {gate['test']}, at level {gate['alpha']:g}; informative when at least "
            f"{gate['share']:.0%} of the seeds pass.",
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
                "another config than this one (or before results were stamped); rerun its "
                "target to bring it up to date.", "", markdown_table(pd.DataFrame([
                    {"result": f"`{s['result']}`", "made under config":
                     f"`{s['config_digest']}`" if s["config_digest"] else "unknown (no stamp)",
                     "rerun": f"`snakemake --cores all {s['target']}`"} for s in inputs.stale]))]
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


def _planner(inputs: ReportInputs) -> list[str]:
    planner = inputs.planner
    if planner is None:
        return []
    offload = {c: planner[c] if c in planner else [None] * len(planner)
               for c in ("host", "pcie_bytes_per_step", "pcie_seconds_per_step")}
    return _section("Planner predictions", "results/memory/planner.csv", "Predicted, not "
                    "measured: bytes per GPU by the planner (logra/measure/planner.py); "
                    "`+offload`: FSDP's CPU offload, the node's host bytes and each GPU's "
                    "host-device traffic per update.",
                    {"model": planner["model"], "method": planner["method"],
                     "GPUs": planner["gpus"], "policy": planner["policy"],
                     "GB per GPU": _fmt(planner["total"], ".1f", 1e9),
                     "peak phase": planner["peak_phase"],
                     "GPU GB": _fmt(planner["gpu_bytes"], ".0f", 1e9),
                     "fits": planner["fits"],
                     "sync GB": _fmt(planner["sync_bytes"], ".3g", 1e9),
                     "host GB": _fmt(offload["host"], ".0f", 1e9),
                     "PCIe GB / update": _fmt(offload["pcie_bytes_per_step"], ".0f", 1e9),
                     "PCIe s / update": _fmt(offload["pcie_seconds_per_step"], ".1f")}
                    ) + [x for sentence in fit_sentences(planner, inputs.reference)
                         for x in ("", sentence)]


def _memory_real(inputs: ReportInputs) -> list[str]:
    t = inputs.memory_real
    if t is None:
        return (["", "The planner's check at a real architecture's shapes has not run "
                 "(`snakemake memory_real` writes `results/memory/real.csv`; the next report "
                 "includes it)."] if inputs.planner is not None else [])
    rows = [(r, phase) for _, r in t.iterrows() for phase in PHASES
            if pd.notna(r.get(f"planned_phase_{phase}")) and pd.notna(r.get(f"phase_{phase}"))]
    measured = pd.Series([r[f"phase_{p}"] for r, p in rows], dtype=float)
    planned = pd.Series([r[f"planned_phase_{p}"] for r, p in rows], dtype=float)
    return _section(
        "The planner at a real architecture's shapes", "results/memory/real.csv",
        f"`snakemake memory_real`: one update per method at {int(t['n_params'].iloc[0]):,} "
        f"parameters ({int(t['vocab_size'].iloc[0]):,}-token vocabulary, random weights), "
        f"{int(t['batch'].iloc[0])} sequences of {int(t['seq_len'].iloc[0])} tokens in "
        f"micro-batches of {int(t['micro_batch'].iloc[0])}, measured on {t['device'].iloc[0]} "
        "(live tensor bytes, logra.measure.memory.MemoryMeter) phase by phase, beside the "
        "planner's prediction of each phase, which no term fits to the measurement.",
        {"method": [r["method"] for r, _ in rows], "phase": [p for _, p in rows],
         "measured GiB": _fmt(measured, ".3f", 2**30), "planned GiB": _fmt(planned, ".3f", 2**30),
         "error": _fmt(planned / measured - 1, "+.1%"),
         "peak": ["yes" if p == r["peak_phase"] else "" for r, p in rows]})


def fit_sentences(planner: pd.DataFrame, reference: str) -> list[str]:
    """Per model of the planner's table, which methods its prediction fits on the GPU and
    which not, the reference first, each with its GB per GPU and peak phase, the offload
    rows with their host bytes and transfer time: written from the table, whatever it says."""
    out = []
    for model, rows in planner.groupby("model", sort=False):
        def said(r) -> str:
            extra = (f", {r['host'] / 1e9:.0f} GB on the host and {r['pcie_seconds_per_step']:.0f}"
                     " s of host-device transfer per update"
                     if "host" in r and pd.notna(r["host"]) else "")
            return f"{r['method']} {r['total'] / 1e9:.1f} GB ({r['peak_phase']}{extra})"
        first = rows.iloc[0]
        ref = rows[rows["method"] == reference]
        lead = (f"{said(ref.iloc[0])} {'fits' if ref.iloc[0]['fits'] else 'does not fit'}; "
                if len(ref) else "")
        rest = rows[rows["method"] != reference]
        fit, no = rest[rest["fits"] == True], rest[rest["fits"] != True]  # noqa: E712
        out.append(f"At {model} on {first['gpus']} GPUs of {first['gpu_bytes'] / 1e9:.0f} GB "
                   f"(predicted, per GPU): {lead}fit: "
                   f"{', '.join(said(r) for _, r in fit.iterrows()) or 'none'}; do not fit: "
                   f"{', '.join(said(r) for _, r in no.iterrows()) or 'none'}.")
    return out


def _paper_setting(inputs: ReportInputs) -> list[str]:
    if inputs.paper_setting is None:
        return []
    t = paper_setting_table(inputs.paper_setting)
    return _section(
        "The published memory reductions, predicted in their settings",
        "results/memory/paper_setting.csv",
        "Predicted, not measured (logra/measure/planner.py): one update's peak per training GPU "
        "at the setting's longest sequences, the methods at the authors' defaults, beside the "
        "published numbers. Where they differ, and why: (1) the published statistic "
        "(`memory/train_peak_allocated_gib`) is a mean over updates of each update's peak, at "
        "that update's own longest sequence, so the prediction bounds it from above for both "
        "methods, and the reduction moves with the sequence lengths the runs drew (the next "
        "table predicts it over those lengths); "
        "(2) logits 'chunked' is this project's training forward (log-probs 256 tokens at a "
        "time), 'full' the authors' (fp32 logits and a full log_softmax at every position): "
        "vocabulary-sized tensors added to both methods shrink or move the reduction; LoGRA's "
        "JVP probe is predicted as the authors' code runs it (paper_setting.probe: one "
        "sequence at a time over all its positions, eager attention's scores, fp32 logits and "
        "tangent, the float64 KL 64 positions at a time); (3) the port (port_7b) runs without the controller and trains the "
        "weights LoGRA leaves out (embeddings, output layer, norms) with AdamW, predicted so "
        "(their gradients and moments counted); elsewhere they are frozen as the authors "
        "freeze them, and 'frozen weights' AdamW' is what training them would add per GPU; "
        "under FSDP every method holds the root group (embeddings, output layer) gathered "
        "through forward and backward. 'without peak "
        "phase': the reduction were the method's peak phase left out (for LoGRA at a long "
        "completion, its predicted-KL probe). None of these numbers is a measurement: "
        "benchmarks/gpu_check.py measures the authors' statistic at 0.5B and 1.5B on one GPU.",
        {"setting": t["setting"], "logits": t["logits"], "tokens": t["seq_len"],
         "GPUs": t["gpus"],
         "reference": t["reference"], "GiB": _fmt(t["reference_gib"], ".2f"),
         "method": t["method"], "method GiB": _fmt(t["method_gib"], ".2f"),
         "reduction": _fmt(t["reduction"], ".1%"), "method's peak phase": t["peak_phase"],
         "without peak phase": _fmt(t["reduction_without_peak_phase"], ".1%"),
         "frozen weights' AdamW, GiB": _fmt(t["frozen_adamw_gib"], ".2f"),
         "published GiB": [f"{a} -> {b}" if pd.notna(a) else "n/a"
                           for a, b in zip(t["published_reference_gib"],
                                           t["published_method_gib"])],
         "published reduction": _fmt(t["published_reduction"], ".1%"),
         "source": t["source"]}) + _paper_setting_curve(inputs.paper_setting)


def _paper_setting_curve(predicted: pd.DataFrame) -> list[str]:
    if "statistic" not in predicted:
        return []
    c = paper_setting_curve(predicted)
    keys = ["setting", "logits", "method"]
    wide = c.pivot_table(index=keys, columns="longest_len", values="reduction", sort=False)
    first = c.groupby(keys, sort=False)[["published_reduction", "published_at"]].first()
    return _section(
        "The published memory reductions as the authors measure them",
        "results/memory/paper_setting.csv",
        "Predicted, not measured: the authors' statistic, the mean over updates of each "
        "update's peak, with every update's longest sequence (prompt included; the probe's "
        "sequences as long) at each length, the last the setting's cap (the table above). "
        "Each update's peak is set by its own longest micro-batch, so the runs' typical "
        "longest length, not in the sources, decides the published number; `meets it at`: the "
        "length at which the predicted reduction equals the published one (n/a: not within "
        "these lengths). No term is fitted to the published numbers.",
        {"setting": [k[0] for k in wide.index], "logits": [k[1] for k in wide.index],
         "method": [k[2] for k in wide.index],
         **{f"{int(n)} tokens": _fmt(wide[n], ".1%") for n in wide.columns},
         "published": _fmt(first["published_reduction"], ".1%"),
         "meets it at": _fmt(first["published_at"], ".0f")})


def _kl_calibration(inputs: ReportInputs) -> list[str]:
    ok = inputs.ok
    out = []
    etas = (("eta_1", "η = 1"), ("eta_below_1", "η < 1"), ("eta_above_1", "η > 1"))
    columns = [f"kl_{eta}_{k}" for eta, _ in etas for k in ("steps", "median", "p10", "p90")]
    steps = ok.reindex(columns=[c for c in columns if c.endswith("_steps")]).apply(pd.to_numeric)
    calibrated = ok[(steps.fillna(0) > 0).any(axis=1)]  # runs with KL control
    if len(calibrated):
        cal = calibrated[["task", "method"]].join(
            calibrated.reindex(columns=columns).apply(pd.to_numeric)).groupby(
            ["task", "method"], as_index=False).median()
        out += _section("KL calibration", "results/summary.csv", "Realized KL on the probe's "
                        "held-out half / the KL predicted on its other half "
                        "(logra/optim/kl_control.py), at steps with η = 1 (the prediction is K₁), η < 1 and η > 1 (η²·K₁; "
                        "LoGRA's α reaches alpha_max): per run the median [p10, p90] over its "
                        "steps; shown, the median over seeds.",
                        {"task": cal["task"], "method": cal["method"], **{
                            f"{label}: steps": cal[f"kl_{eta}_steps"].fillna(0).astype(int)
                            for eta, label in etas},
                         **{f"{label}: ratio": [f"{m} [{lo}, {hi}]" for m, lo, hi in zip(
                             *(_fmt(cal[f"kl_{eta}_{k}"], ".2f") for k in ("median", "p10",
                                                                          "p90")))]
                            for eta, label in etas}})
    return out


def _step_control(inputs: ReportInputs) -> list[str]:
    """The step's control: how often at its cap, and what it costs."""
    ok = inputs.ok
    out = []
    controlled = ok[ok.reindex(columns=["control"])["control"].notna()]
    if len(controlled):
        c = controlled.groupby(["task", "method", "control"], as_index=False).agg(
            at_cap=("steps_at_cap_share", "mean"), seconds=("control_seconds", "mean"),
            step=("mean_step_time_s", "mean"))
        out += _section("Step control", "results/summary.csv", "Per method with a control of "
                        "its step (LoGRA's BudgetControl, the config's KLControl): the share of "
                        "steps whose scale it set at its cap (LoGRA: alpha_max), and its mean "
                        "seconds per step beside the mean step time (both without the profiled "
                        "steps); means over seeds.",
                        {"task": c["task"], "method": c["method"], "control": c["control"],
                         "at cap": _fmt(c["at_cap"], ".0%"),
                         "control s/step": _fmt(c["seconds"], ".3f"),
                         "step s": _fmt(c["step"], ".3f"),
                         "control share": _fmt(c["seconds"] / c["step"], ".0%")})
    return out


def _update_cosine(inputs: ReportInputs) -> list[str]:
    ok = inputs.ok
    out = []
    cosines = ok[ok.reindex(columns=["update_cosine"])["update_cosine"].notna()]
    if len(cosines):
        c = cosines.groupby(["task", "method"], as_index=False).agg(
            step=("cosine_step", "first"), mean=("update_cosine", "mean"),
            lo=("update_cosine", "min"), hi=("update_cosine", "max"), n=("seed", "nunique"))
        out += _section("Update vs gradient", "results/summary.csv", "At one step "
                        "(`grpo.cosine_step`), the cosine between the applied change of the "
                        "trained weights and the negative dense gradient of the same batch: "
                        "mean [min, max] over seeds.",
                        {"task": c["task"], "method": c["method"],
                         "step": _fmt(c["step"], ".0f"),
                         "cosine": [f"{m} [{lo}, {hi}]" for m, lo, hi in zip(
                             _fmt(c["mean"]), _fmt(c["lo"]), _fmt(c["hi"]))], "seeds": c["n"]})
    return out


def _stability(inputs: ReportInputs) -> list[str]:
    if inputs.stability is None:
        return []
    t, criterion = inputs.stability
    out = _stability_section(t, criterion, "Stability", "results/stability.csv",
                             "figures/stability_27b")
    for name, (title, figure) in STABILITY_OPT_IN.items():
        if (inputs.stability_opt_in or {}).get(name) is not None:
            out += _stability_section(inputs.stability_opt_in[name], criterion, title,
                                      f"results/{name}.csv", figure)
    if not inputs.stability_opt_in:
        out += ["", "`snakemake stability` has not run (it writes "
                + " and ".join(f"`results/{n}.csv`" for n in STABILITY_OPT_IN)
                + "; the next report includes them)."]
    return out


# `snakemake stability`'s tables: {name: (section title, figure)}
STABILITY_OPT_IN = {
    "stability_seeds": ("Stability: the long runs", "figures/stability_27b_seeds"),
    "stability_controller": ("Stability: the controller ablation",
                             "figures/stability_controller")}


def _stability_section(t: pd.DataFrame, criterion: dict, title: str, source: str,
                       figure: str) -> list[str]:
    metric = _metric_name(t["metric"].iloc[0])
    return _section(title, source,
                    "Each stability run against the criterion declared in the config "
                    f"(stability.criterion; {figure}): "
                    + criterion_text(criterion).format(metric=metric)
                    + f". Held-out: {metric} on the test split at the SFT base, the curve's "
                    "best and the last point; `worst vs base` and `last − best` with their "
                    "paired 95% intervals; `entropy`: the lowest exact token entropy over the "
                    "points as a multiple of the base's; `KL to base`: at the last point "
                    "(nats/token); `spikes`: steps whose batch KL spiked / steps judged; "
                    "`KL real/pred`: the probe's realized over predicted KL, median over steps "
                    "(a diagnostic of the controller's calibration, not a clause).",
                    {"method": t["method"], "seed": t["seed"], "steps": t["steps"],
                     "status": t["status"],
                     "base → best → last": [f"{a:.3f} → {b:.3f} (step {s}) → {c:.3f}"
                                            for a, b, s, c in zip(
                                                t["metric_base"], t["metric_best"],
                                                t["best_step"], t["metric_last"])],
                     "worst vs base [95%]": _interval(t, "vs_base_worst"),
                     "last − best [95%]": _interval(t, "last_vs_best"),
                     "entropy": _fmt(t["entropy_ratio_min"], ".2f"),
                     "pass@k last − best": _interval(t, "pass_last_vs_best"),
                     "KL to base": _fmt(t["kl_to_base_last"], ".3g"),
                     "spikes": [f"{a}/{b}" for a, b in zip(t["spikes"],
                                                           t["spike_judged_steps"])],
                     "KL real/pred": _fmt(t["kl_calibration"], ".2f"),
                     "stable": t["stable"].map({True: "yes", False: "no"}),
                     "why": t["why"]})


def _interval(t: pd.DataFrame, column: str) -> list[str]:
    """Column `column` with its `_lo`/`_hi` as "+d [+lo, +hi]" per row."""
    return [f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for d, lo, hi in zip(
        t[column], t[f"{column}_lo"], t[f"{column}_hi"])]


def _sync(inputs: ReportInputs) -> list[str]:
    ok, reference, sync_regime = inputs.ok, inputs.reference, inputs.sync_regime
    out = []
    out += _sync_section(ok, reference, "Sync", "results/summary.csv", SYNC_INTRO)
    if sync_regime is not None:
        for regime, d in sync_regime.groupby("regime", sort=False):
            delta = d.loc[d["sync_transport"] == "delta", "method"]
            per_method = d.groupby("method", sort=False).agg(
                option=("step_size_option", "first"), value=("step_size", "first"),
                ratio=("lr_over_w", "mean"))
            lrs = ", ".join(f"{m} {r.option} {r.value:g}" + (
                f" (lr/median|w| {r.ratio:.3g})" if pd.notna(r.ratio) else "")
                for m, r in per_method.iterrows())
            medians = "/".join(_fmt(d["base_median_abs_weight"].unique(), ".4g"))
            dtype = "/".join(sorted(set(d["rollout_dtype"])))
            out += _sync_section(
                d, delta.iloc[0] if len(delta) else None, f"Sync regime: {regime}",
                "results/sync_regime.csv", f"`snakemake sync_regime`, {d['task'].iloc[0]}, "
                f"{d['seed'].nunique()} seed(s), a {dtype} engine; median |w| of the base, "
                f"measured: {medians}; {lrs}. Columns as in Sync.")
    else:
        out += ["", "The sync regime runs have not run (`snakemake sync_regime` writes "
                "`results/sync_regime.csv`; the next report includes it)."]
    return out


def _lr_sweep(inputs: ReportInputs) -> list[str]:
    lr_sweep = inputs.lr_sweep
    out = []
    if lr_sweep is not None:
        chosen = lr_sweep[lr_sweep["chosen"]]
        added = (~lr_sweep["declared"]).groupby([lr_sweep["task"], lr_sweep["method"]]).sum()
        out += _section("lr sweep", "results/lr_sweep.csv", "The point (an lr; LoGRA's KL "
                        "budget) with the best mean validation accuracy, by "
                        f"{_metric_name(chosen['metric'].iloc[0])}, per task and method, out "
                        "of `budget` points run: the declared grid, spaced alike in step size, "
                        "and the points the bracket rule added beyond an edge that held the "
                        "best point (`added`, up to lr_sweep.extend); `bracketed`: the choice "
                        "lies inside the points run (else its number is a bound); `at cap`: "
                        "the share of its steps its control held at its cap (LoGRA: "
                        "alpha_max). The choices: results/tuned.yaml.",
                        {"task": chosen["task"], "method": chosen["method"],
                         "option": chosen["option"], "point": _fmt(chosen["lr"], "g"),
                         "budget": chosen["budget"],
                         "added": [added[t, m] for t, m in zip(chosen["task"], chosen["method"])],
                         "bracketed": chosen["bracketed"].map({True: "yes", False: "no"}),
                         "at cap": _fmt(chosen["at_cap_share"], ".0%"),
                         "validation accuracy": _pm(chosen["val_accuracy_mean"],
                                                    chosen["val_accuracy_sd"]),
                         "seeds": chosen["n_seeds"]})
    else:
        out += ["", "The lr sweep has not run (`snakemake lr_sweep` writes "
                "`results/lr_sweep.csv`; the next report includes it)."]
    return out


def _scaling(inputs: ReportInputs) -> list[str]:
    t = inputs.scaling
    if t is None:
        return ["", "The scaling comparison has not run (`snakemake scaling` writes "
                "`results/scaling.csv`; the next report includes it)."]
    m, trend = t[t["kind"] == "measured"], t[t["kind"] == "trend"]
    p, cost = t[t["kind"] == "prediction"], t[t["kind"] == "cost"].iloc[0]
    reference = t["reference"].dropna().iloc[0]
    out = _section("Scaling", "results/scaling.csv", "Each method against "
                   f"{reference} at each model size, tuned at the smallest (validation split) "
                   "and transferred (`scaling.transfer`): the mean over seeds of the paired "
                   "difference on the primary metric (test split) with its 95% t-interval and "
                   "call at the margin; the bases' mean (in the declared band?); the "
                   "reference's gain over its bases; measured ratios to the reference.",
                   {"size": m["size"], "parameters": _fmt(m["n_params"], ",.0f"),
                    "method": m["method"],
                    "difference [95%]": [f"{a:+.3f} [{lo:+.3f}, {hi:+.3f}]" for a, lo, hi in
                                         zip(m["diff_mean"], m["diff_lo"], m["diff_hi"])],
                    "call": m["call"],
                    "bases": [f"{b:.3f}" + ("" if ok else " (off band)")
                              for b, ok in zip(m["base_mean"], m["base_in_band"])],
                    "reference's gain": _fmt(m["ref_gain_mean"], "+.3f"),
                    "peak memory ratio": _fmt(m["memory_ratio"], ".2f"),
                    "step time ratio": _fmt(m["step_time_ratio"], ".2f")})
    tuning, check = t[t["kind"] == "tuning"], t[t["kind"] == "check"]
    out += ["", "Tuning (validation split) and the transfer's check:", ""]
    out += [f"- {r.method} at {r.size}: the sweep chose {r.option} {r.chosen_value:g}"
            + (" (on its grid's edge)" if r.on_edge else "") + f"; the config adopted "
            f"{r.adopted_value:g}" for r in tuning.itertuples()]
    out += [f"- {r.method} at {r.size}: of the transferred {r.option} times each factor, x"
            f"{r.chosen_factor:g} scored best ({r.validation_by_point})"
            for r in check.itertuples()]
    out += ["", "The trend: the least-squares slope of each size's mean difference against "
            "log10(parameters), with its 95% t-interval (the size is the unit: df = sizes - 2):",
            ""]
    out += [f"- {r.method}: {r.slope_per_decade:+.4f} [{r.slope_lo:+.4f}, {r.slope_hi:+.4f}] "
            f"per decade of parameters ({r.sizes:.0f} sizes, df {r.df:.0f}): {r.call}"
            for r in trend.itertuples()]
    if len(p):
        out += ["", "The planner's memory ratio to " + reference + " continued to the hub "
                "models' sizes (PREDICTIONS, the planner's setting): " + "; ".join(
                    f"{r.method} at {r.size} {r.memory_ratio:.2f}" for r in p.itertuples())
                + "."]
    out += ["", f"CPU time: {cost['cpu_hours']:.2f} h over {cost['jobs']:.0f} jobs, against a "
            f"cap of {cost['cap_hours']:g} h ({'within' if cost['within_cap'] else 'OVER'} "
            "it). A 30x span of character-level models does not speak for 1.5B-27B "
            "accuracy."]
    return out


def _ablations(inputs: ReportInputs) -> list[str]:
    ablations, reference = inputs.ablations, inputs.reference
    out = []
    if ablations is not None:
        a, where = ablations, "results/ablations"
        out += _accuracy_section(a["accuracy"], "Ablations: accuracy", f"{where}/accuracy.csv")
        if a.get("verdicts") is not None:
            out += _verdicts_section(a["verdicts"], "Ablations: verdicts",
                                     f"{where}/verdicts.csv")
        out += _cost_section(a["summary"], reference, "Ablations: measured cost",
                             f"{where}/summary.csv")
        if a.get("sweep") is not None:
            out += _memory_sweep_section(a["sweep"], "Ablations: memory sweep",
                                         f"{where}/memory_sweep.csv")
        out += _sync_section(a["summary"][a["summary"]["status"] == "ok"], reference,
                             "Ablations: sync", f"{where}/summary.csv", SYNC_INTRO)
    else:
        out += ["", "The ablations have not run (`snakemake ablations` writes "
                "`results/ablations/`; the next report includes them)."]
    return out


def _trl(inputs: ReportInputs) -> list[str]:
    trl = inputs.trl
    out = []
    if trl:
        rows = [(r, m) for r in trl for m in ("logra", "adamw")]
        out += _section("LoGRA in TRL", "results/trl/", "TRL's GRPOTrainer (generation by the "
                        "training model, no vLLM) from each task's seed-0 SFT base, with "
                        "`logra.LoGRAOptimizer` and with TRL's default AdamW "
                        "(logra/harness/trl_grpo.py): the measured peak of one update step (a "
                        "step without generation), the mean reward of the rollouts of the first "
                        "and the last steps, and LoGRA's mean α and share of steps at alpha_max "
                        "(its predicted-KL controller).",
                        {"task": [r["task"] for r, _ in rows], "method": [m for _, m in rows],
                         "device": [r["device"] for r, _ in rows],
                         "parameters": [r["model"]["n_params"] for r, _ in rows],
                         "steps": [r["steps"] for r, _ in rows],
                         "peak (MiB)": _fmt([r[m]["peak_mem_bytes"] for r, m in rows], ".2f",
                                            2**20),
                         "vs AdamW": _fmt([r[m]["peak_mem_bytes"] / r["adamw"]["peak_mem_bytes"]
                                           for r, m in rows]),
                         "optimizer state (MiB)": _fmt([r[m]["optimizer_state_bytes"]
                                                        for r, m in rows], ".3f", 2**20),
                         "reward, first / last steps": [
                             f"{a} / {b} ({r['reward_window_steps']})" for (r, m), a, b in zip(
                                 rows, _fmt([r[m]["reward_first"] for r, m in rows]),
                                 _fmt([r[m]["reward_last"] for r, m in rows]))],
                         "mean α": _fmt([r[m].get("alpha_mean") for r, m in rows], ".3g"),
                         "at alpha_max": _fmt([r[m].get("steps_at_alpha_max_share")
                                               for r, m in rows], ".0%")})
    else:
        out += ["", "LoGRA in TRL has not run (`snakemake trl` writes `results/trl/*.json`; the "
                "next report includes them)."]
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
SECTIONS = (_title, _plan, _header, _bases, _results, _planner, _memory_real, _paper_setting, _kl_calibration,
            _step_control, _update_cosine, _stability, _sync, _lr_sweep, _ablations, _trl,
            _scaling, _time_ledger)


def report_markdown(inputs: ReportInputs) -> str:
    """results/REPORT.md: every section of `SECTIONS` over `inputs`."""
    return "\n".join(line for section in SECTIONS for line in section(inputs)) + "\n"


def current_opt_in(opt_in: dict[str, dict[str, str]],
                   digest: str) -> tuple[dict[str, Path], list[dict]]:
    """The opt-in results ({target: {result: its stamp}}) made under this config ({path: Path}:
    each exists and its stamp holds `digest`), and the stale ones (each exists, its stamp is
    another config's or missing)."""
    current, stale = {}, []
    for target, stamps in opt_in.items():
        for path, stamp in ((Path(p), Path(s)) for p, s in stamps.items()):
            if not path.exists():
                continue
            made = json.loads(stamp.read_text())["config_digest"] if stamp.exists() else None
            if made == digest:
                current[str(path)] = path
            else:
                stale.append({"result": str(path), "config_digest": made, "target": target})
    return current, stale

