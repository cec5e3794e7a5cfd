"""The report's building blocks: what it is written from (`ReportInputs`), markdown formatting
(`markdown_table`, `fmt`, `section`) and the sections several parts of the report share
(accuracy, verdicts, measured cost, accuracy and memory, the memory sweep, sync)."""
from __future__ import annotations

import dataclasses

import pandas as pd

from logra.analysis.tables import accuracy_memory_table, cost_table, low_rank_vs_delta, sync_table


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


def amended_lines(plan: dict) -> list[str]:
    """A plan's amendments (logra/harness/freeze.py), one report line each: none for a plan
    never amended."""
    return [f"- **Plan amended after test results existed** ({a['at']}, "
            f"{a['test_evaluations']} test evaluations; the plan before: `{a['archived']}`): "
            + "; ".join(f"`{k}` {old!r} → {new!r}" for k, (old, new) in a["changed"].items())
            + "." for a in plan.get("amendments") or []]


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
                    "(n/a ends: unbounded); the gate: a one-sided t-test over the seeds of the "
                    "reference's mean gain over its bases minus the margin (its p), a comparison "
                    "being informative when it rejects, beside the seeds whose own test on the "
                    "problems passed (descriptive); seeds needed: "
                    "for a call at 80% power at the observed mean and spread, a guide "
                    "(docs/verdicts.md says how each is computed).",
                    {"task": mean["task"], "method": mean["method"],
                     "reference": mean["reference"],
                     "difference [95% interval]": [
                         f"{m} [{lo}, {hi}]" for m, lo, hi in zip(
                             *(_fmt(mean[c], "+.3f") for c in ("diff_mean", "diff_lo",
                                                               "diff_hi")))],
                     "difference per seed": mean["diff_by_seed"],
                     "margin": _fmt(mean["margin"], ".3f"),
                     f"answers (Holm over {len(mean)})": mean["calls"],
                     "share of the reference's gain [95%]": [
                         f"{m} [{lo}, {hi}]" for m, lo, hi in zip(
                             *(_fmt(mean[c], ".2f") for c in ("gain_share", "gain_share_lo",
                                                              "gain_share_hi")))],
                     "reference gain per seed": mean["ref_gain_by_seed"],
                     "gate p": _fmt(mean["gate_p"] if "gate_p" in mean else [None] * len(mean),
                                    ".3g"),
                     "seeds passing": mean["gate_passed"],
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
                             planner: pd.DataFrame | None, title: str = "Accuracy and memory",
                             source: str = "results/accuracy.csv, results/summary.csv"
                             ) -> list[str]:
    t = accuracy_memory_table(accuracy, reference, planner)
    predicted = [c for c in t if c.startswith("predicted ")]
    return _section(title, source + (
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
    sync_regime`, `snakemake ablations`, `snakemake scaling`, `snakemake memory_real` (its
    points, `memory_real`) or `snakemake study` (`study`: each horizon's plan and tables,
    results/study/<horizon>/, and `across`, results/study/horizons.csv) has not run, or ran under
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
    study: dict | None = None
    stale: list[dict] = dataclasses.field(default_factory=list)
    digest: str | None = None

    @property
    def ok(self) -> pd.DataFrame:
        """The runs that finished."""
        return self.summary[self.summary["status"] == "ok"]
