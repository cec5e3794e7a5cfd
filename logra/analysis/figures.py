"""Figures (matplotlib). Every figure says what it was made with: device, model size, steps.

`reward_curves`: mean training reward per GRPO step for each task (one panel each) and method
(one line each, mean over seeds, smoothed with a moving average whose window is stated in the
legend title; with at most `BAND_METHODS` methods, a band of ± one sd over seeds).
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from logra.analysis.stability import criterion_text, outcome_text, spikes  # noqa: E402
from logra.analysis.tables import scale_label, sync_table  # noqa: E402
from logra.common import PHASES, POLICIES, REPORTED_CHANGED_FRACTION, delta_bytes  # noqa: E402
from logra.files import atomic_path  # noqa: E402


def _save(fig, outputs) -> None:
    for out in outputs:
        with atomic_path(out) as tmp:
            fig.savefig(tmp, format=Path(out).suffix[1:], bbox_inches="tight", dpi=150)
    plt.close(fig)


BAND_METHODS = 4


def reward_curves(summary: pd.DataFrame, metrics_paths: list[str | Path], outputs: list[str],
                  window: int = 5) -> None:
    """Metrics files live at results/runs/{task}/{method}/seed{seed}/metrics.csv. One colour per
    method up to 20 (tab20's ten dark shades first, then its light ones); the ± sd band over
    seeds only for up to `BAND_METHODS` methods (more bands hide one another); the legend beside
    the panels."""
    frames = []
    for p in map(Path, metrics_paths):
        df = pd.read_csv(p)
        df["task"], df["method"], df["seed"] = p.parts[-4], p.parts[-3], p.parts[-2]
        frames.append(df)
    data = pd.concat(frames)
    data["reward"] = data.groupby(["task", "method", "seed"])["reward_mean"].transform(
        lambda r: r.rolling(window, min_periods=1).mean())
    tasks, methods = sorted(data["task"].unique()), sorted(data["method"].unique())
    shades = plt.get_cmap("tab20").colors
    shades = shades[0::2] + shades[1::2]  # tab20 pairs each hue (dark, light): tab10's darks first
    color = {m: shades[i % len(shades)] for i, m in enumerate(methods)}
    bands = len(methods) <= BAND_METHODS
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.4), squeeze=False,
                             sharey=True)
    for ax, task in zip(axes[0], tasks):
        for method, d in data[data["task"] == task].groupby("method"):
            stats = d.groupby("step")["reward"].agg(["mean", "std"]).fillna(0)
            ax.plot(stats.index, stats["mean"], label=method, color=color[method])
            if bands:
                ax.fill_between(stats.index, stats["mean"] - stats["std"],
                                stats["mean"] + stats["std"], color=color[method], alpha=0.2)
        ax.set_title(task)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("training reward (mean of group)")
    axes[0][-1].legend(title=f"moving avg {window}" + (", band ± sd" if bands else ""),
                       fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle(f"Training reward — measured on {scale_label(summary)}", fontsize=10)
    _save(fig, outputs)


PAPER_REDUCTION = 0.457  # the paper's reported LoGRA peak-memory reduction vs dense Adam
MB, GB = 2**20, 1e9


def _ok(df: pd.DataFrame, what: str) -> pd.DataFrame:
    ok = df[df["status"] == "ok"]
    if ok.empty:
        raise ValueError(f"{what}: no row with status ok to draw (statuses: "
                         f"{sorted(set(df['status']))})")
    return ok


def memory_reduction(summary: pd.DataFrame, sweep: pd.DataFrame, outputs: list[str],
                     reference: str) -> None:
    """(a) measured peak training memory per task and method (the run grid, mean over seeds),
    each method's change vs the `reference` method on its bar; (b) peak / the reference's per
    model size (the sweep), with the paper's LoGRA -45.7% as a reference line."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.2))
    runs = _ok(summary, "summary.csv")
    grid = runs.groupby(["task", "method"])["peak_mem_bytes"].mean().unstack() / MB
    grid.plot.bar(ax=ax, rot=0)
    if reference in grid.columns:
        for bars, method in zip(ax.containers, grid.columns):
            if method != reference:
                ratio = grid[method] / grid[reference]
                ax.bar_label(bars, [f"{r - 1:+.0%}" for r in ratio], fontsize=7)
    ax.set_ylabel("measured peak training memory (MB)")
    ax.set_xlabel("")
    ax.set_title(f"(a) GRPO runs, measured: {scale_label(summary)}", fontsize=9)
    ax.legend(fontsize=7)
    points = _ok(sweep, "memory sweep")
    for method, d in points.groupby("method"):
        bx.plot(d["n_params"], d["peak_mem_bytes_vs_reference"], marker="o", label=method)
    bx.axhline(1 - PAPER_REDUCTION, color="gray", ls="--", label="paper: LoGRA -45.7%")
    bx.set_xscale("log")
    bx.set_xlabel("parameters")
    bx.set_ylabel(f"peak memory / {reference}'s (measured)")
    shape = points.iloc[0]
    bx.set_title(f"(b) one GRPO step per size, measured: {shape['device']}, batch "
                 f"{shape['batch']} x {shape['seq_len']} tokens", fontsize=9)
    bx.legend(fontsize=7)
    bx.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, outputs)


PHASE_COLUMNS = [f"phase_{p}" for p in PHASES]


def stability_27b(table: pd.DataFrame, curves: list[str | Path], metrics: list[str | Path],
                  criterion: dict, outputs: list[str], planner: pd.DataFrame | None = None,
                  methods: dict | None = None, window: int = 25) -> None:
    """The stability runs against `criterion` (table: `logra.analysis.stability.stability_table`,
    curves and metrics in its row order), MEASURED, one line per run (no band hiding a seed; a
    run that is not stable dotted): at each evaluated point (0 = the SFT base) the held-out
    primary metric (with the training reward's moving average), pass@k, the exact token
    entropy on the fixed prompts (with each run's collapse bound) and the KL to the base; per
    step the batch KL (spikes marked), the step scale, the sampled-token entropy, the
    completion tokens per response and the trainer-vs-engine mismatch (moving averages over
    `window` steps). With `planner` (results/memory/planner.csv) and the config's `methods`:
    the planner's per-GPU memory by phase at its first model (PREDICTION) and a panel of the
    runs' measured peaks beside the planner's totals for the same rules at every planner model
    (PREDICTION)."""
    fig = plt.figure(figsize=(16, 19.2 if planner is not None else 14.4))
    grid = fig.add_gridspec(4 if planner is not None else 3, 3)
    axes = [fig.add_subplot(grid[r, i]) for r in range(3) for i in range(3)]
    if planner is not None:  # (j) by phase; (k) wider, for its labels
        axes += [fig.add_subplot(grid[3, 0]), fig.add_subplot(grid[3, 1:])]
    rules = sorted(set(table["method"]))
    colors = dict(zip(rules, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 3))
    metric = table["metric"].iloc[0]
    fraction = criterion["collapse"]["entropy_fraction"]
    for row, curve, path in zip(table.itertuples(), curves, metrics, strict=True):
        points = json.loads(Path(curve).read_text())["points"]
        m = pd.read_csv(path)
        style = dict(color=colors[row.method], ls="-" if row.stable else ":", lw=1)
        label = f"{row.method} s{row.seed}" + ("" if row.stable else
                                                f" (not stable: {row.decided_by})")
        steps = [q["step"] for q in points]
        axes[0].plot(steps, [q["accuracy"] for q in points], marker="o", ms=3, label=label,
                     **style)
        axes[0].plot(m["step"], m["reward_mean"].rolling(window, min_periods=1).mean(),
                     alpha=0.3, **(style | {"lw": 0.6}))
        for ax, value in ((axes[1], lambda q: sum(q["per_problem_pass"].values())
                           / len(q["per_problem_pass"])),
                          (axes[2], lambda q: q["entropy"]), (axes[3], lambda q: q["kl_to_base"])):
            ax.plot(steps, [value(q) for q in points], marker="o", ms=3, **style)
        axes[2].axhline(fraction * points[0]["entropy"], color=style["color"], ls="--", lw=0.6)
        spiked, _ = spikes(m["kl_batch"], criterion["spikes"])
        axes[4].plot(m["step"], m["kl_batch"], alpha=0.7, **(style | {"lw": 0.6}))
        axes[4].plot(m["step"][spiked], m["kl_batch"][spiked], "x", color=style["color"])
        axes[5].plot(m["step"], m["step_scale"], alpha=0.7, **(style | {"lw": 0.6}))
        for ax, column in zip(axes[6:9], ("token_entropy", "response_tokens_mean",
                                          "logp_mismatch_mean")):
            ax.plot(m["step"], m[column].rolling(window, min_periods=1).mean(), **style)
    axes[0].set(xlabel="GRPO step", ylabel=f"held-out {metric} accuracy (test split)")
    axes[0].set_title("\n".join(textwrap.wrap(
        f"(a) MEASURED: held-out {metric} (markers; faint: training reward, moving avg "
        f"{window}); {scale_label(table)}; "
        + criterion_text(criterion).format(metric=metric), 80)), fontsize=7)
    axes[0].legend(fontsize=6)
    prompts = criterion["collapse"]["prompts"]
    for ax, (letter, what, ylabel) in zip(axes[1:4], [
            ("b", f"pass@k of {metric} (test split)", "pass@k"),
            ("c", f"exact token entropy of its own samples, {prompts} fixed test prompts "
                  f"(dashed: {fraction:g} x its base's)", "entropy (nats per token)"),
            ("d", "exact KL(π ‖ π_SFT base) on the same samples", "KL to base (nats/token)")]):
        ax.set(xlabel="GRPO step", ylabel=ylabel)
        ax.set_title("\n".join(textwrap.wrap(f"({letter}) MEASURED at each point: {what}",
                                               70)), fontsize=8)
    sp = criterion["spikes"]
    axes[4].set(yscale="log", xlabel="GRPO step", ylabel="batch KL per step (nats/token)")
    axes[4].set_title("\n".join(textwrap.wrap(
        "(e) MEASURED: KL(π_old ‖ π_new) on the whole step batch; x: a spike (> "
        f"{sp['factor']:g} x the median of the {sp['window']} steps before)", 70)), fontsize=8)
    axes[5].set(xlabel="GRPO step", ylabel="step scale (LoGRA: α; else the schedule's)")
    axes[5].set_title("\n".join(textwrap.wrap("(f) MEASURED: the applied step scale; outcome: "
                                               + outcome_text(table), 80)), fontsize=7)
    for ax, (letter, what) in zip(axes[6:9], [
            ("g", "token entropy (nats; −mean log π of the sampled completion tokens)"),
            ("h", "completion tokens per response"),
            ("i", "|log π_trainer − log π_engine| per completion token")]):
        ax.set(xlabel="GRPO step", ylabel=what.split(" (")[0])
        ax.set_title(f"({letter}) MEASURED: {what}, moving avg {window}", fontsize=8)
    if planner is not None:
        model = planner["model"].iloc[0]
        p = planner[planner["model"] == model].set_index("method")
        phases = [c for c in PHASE_COLUMNS if c in p and p[c].notna().any()]
        (p[phases].rename(columns=lambda c: c.removeprefix("phase_")) / GB).plot.bar(
            ax=axes[9], rot=30)
        plt.setp(axes[9].get_xticklabels(), ha="right", fontsize=7)
        gpu = p["gpu_bytes"].iloc[0] / GB
        axes[9].axhline(gpu, color="red", ls="--", label=f"{gpu:.0f} GB GPU")
        axes[9].set_ylabel("GB per GPU (PREDICTION)")
        axes[9].set_title(f"(j) PREDICTION (planner) by phase: {model}, {p['gpus'].iloc[0]} "
                          f"GPUs x {gpu:.0f} GB, {p['sharding'].iloc[0]}, "
                          f"{p['policy'].iloc[0]}", fontsize=8)
        axes[9].legend(fontsize=6)
        _stability_memory(axes[10], table, planner, methods or {})
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, outputs)


def _stability_memory(ax, table: pd.DataFrame, planner: pd.DataFrame, methods: dict) -> None:
    """(k) the stability runs' measured peaks (MiB, mean over seeds) and, for each of their
    rules, the planner's per-GPU total at each planner model (GB, PREDICTION, first planner
    method of that rule), each row naming its unit; the GPU line in the title."""
    measured = table.groupby("method").agg(rule=("rule", "first"),
                                           peak=("peak_mem_bytes", "mean"))
    rows = []
    for method, r in measured.iterrows():
        rows.append((f"{method}: MEASURED here", r["peak"] / MB, "MiB"))
        planned = [m for m in dict.fromkeys(planner["method"])
                   if methods.get(m, {}).get("rule") == r["rule"]
                   and not planner.loc[planner["method"] == m, "offload"].astype(bool).any()]
        for model, q in planner[planner["method"].isin(planned[:1])].groupby("model"):
            rows.append((f"{planned[0]} @ {model}: PREDICTION", q["total"].iloc[0] / GB,
                         "GB/GPU, " + ("fits" if q["fits"].iloc[0] else "does not fit")))
    labels, values, units = zip(*rows) if rows else ((), (), ())
    ax.barh(range(len(rows)), values, color=["tab:blue" if "MEASURED" in x else "tab:gray"
                                             for x in labels])
    ax.set_yticks(range(len(rows)), [f"{x} ({u})" for x, u in zip(labels, units)], fontsize=6)
    ax.set_xscale("log")
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.3g}", va="center", fontsize=6)
    gpu = planner["gpu_bytes"].iloc[0] / GB
    ax.set_title(f"(k) memory: the runs' MEASURED peaks (blue, MiB) and the planner's "
                 f"PREDICTION\nper GPU for their rules at scale (gray, GB; {gpu:.0f} GB GPUs)",
                 fontsize=8)


def sync_bytes(summary: pd.DataFrame, planner: pd.DataFrame, outputs: list[str]) -> None:
    """(a) measured: bytes per step of every transport per method
    (`logra.analysis.tables.sync_table`, the applied one hatched); (b) measured: each run's
    trainer-vs-engine log-prob mismatch against the bytes its applied transport sent; (c)
    PREDICTION, planner: bytes per sync by each method's own transport and in full at scale; (d)
    PREDICTION: delta bytes at the planner's first model against the changed fraction
    (`logra.common.delta_bytes`), at the fractions the runs measured and the 1-3% reported elsewhere
    for production runs, beside each method's own and full bytes."""
    ok = _ok(summary, "runs")
    if "offload" in planner:  # an offloaded trainer syncs as the same method does
        planner = planner[~planner["offload"].astype(bool)]
    fig, axes = plt.subplots(1, 4, figsize=(22, 4.6))
    t = sync_table(ok)
    pivot = t.pivot(index="method", columns="transport", values="bytes_per_step") / MB
    pivot.plot.bar(ax=axes[0], rot=0, logy=True)
    for bars, transport in zip(axes[0].containers, pivot.columns):
        for bar, method in zip(bars, pivot.index):
            if ((t["method"] == method) & (t["transport"] == transport) & t["applied"]).any():
                bar.set_hatch("//")
    dtype = "/".join(sorted(set(ok["rollout_dtype"])))
    axes[0].set(ylabel="MB per step (measured)", xlabel="")
    axes[0].set_title(f"(a) measured, every transport (hatched: applied), {dtype} engine\n"
                      f"{scale_label(ok)}", fontsize=9)
    for method, d in ok.groupby("method"):
        axes[1].scatter(d["sync_bytes_per_step"] / MB, d["logp_mismatch_mean"], label=method)
    axes[1].set(xlabel="MB per step, applied transport (measured)",
                ylabel="mean |log π_trainer − log π_engine| (measured)")
    axes[1].set_title(f"(b) measured, one point per run: mismatch vs bytes ({dtype} engine)",
                      fontsize=9)
    table = planner.pivot(index="method", columns="model", values="sync_bytes") / GB
    table.plot.bar(ax=axes[2], rot=60, logy=True)
    axes[2].set_ylabel("GB per sync, own transport (PREDICTION)")
    axes[2].set_title(f"(c) PREDICTION, planner: {planner['policy'].iloc[0]} weights",
                      fontsize=9)
    model = planner["model"].iloc[0]
    p = planner[planner["model"] == model].set_index("method")
    b = POLICIES[p["policy"].iloc[0]]
    fractions = [f / 1000 for f in range(1, 1001)]
    for method in [m for m in p.index if m in set(ok["method"])] or list(p.index[:1]):
        line, = axes[3].plot(fractions, [delta_bytes(p.loc[method, "sync_trained_words"], f, b)
                                         / GB for f in fractions], label=f"{method}: delta")
        axes[3].axhline(p.loc[method, "sync_bytes"] / GB, color=line.get_color(), ls="--",
                        label=f"{method}: own transport")
        measured = ok.loc[ok["method"] == method, "sync_changed_fraction_per_step"].mean()
        if pd.notna(measured):
            axes[3].axvline(measured, color=line.get_color(), ls=":",
                            label=f"{method}: fraction measured here ({measured:.1%}, {dtype})")
    axes[3].axhline(p["sync_bytes_full"].max() / GB, color="k", ls="-.", label="full")
    axes[3].axvspan(*REPORTED_CHANGED_FRACTION, color="grey", alpha=0.25,
                    label="1-3% changed: reported elsewhere (7B-355B), not measured here")
    axes[3].set(xscale="log", yscale="log", xlabel="changed fraction of engine words per step",
                ylabel="GB per sync (PREDICTION)")
    axes[3].set_title(f"(d) PREDICTION, {model}: delta vs changed fraction", fontsize=9)
    for ax in axes[:3]:
        ax.legend(fontsize=6)
    axes[3].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, outputs)


def verdicts(table: pd.DataFrame, summary: pd.DataFrame, outputs: list[str]) -> None:
    """Each method's accuracy difference from the reference (logra/analysis/verdict.py) with its 95%
    interval, per task (one panel each, the IQM across tasks last), and the task's margin; then,
    beside the primary metric, each method's pass@k under the primary protocol and its runs'
    token entropy (mean ± sd over seeds, per task), the reference among them."""
    tasks = [t for t in table["task"].unique() if t != "all"] + (
        ["all"] if (table["task"] == "all").any() else [])
    methods = [table["reference"].iloc[0], *table["method"].unique()]
    fig, axes = plt.subplots(1, len(tasks) + 2, figsize=(3.6 * (len(tasks) + 2), 0.5 * len(
        methods) + 1.8), squeeze=False)
    reference, metric = table["reference"].iloc[0], table["metric"].iloc[0]
    colors = {"non-inferior": "tab:green", "inconclusive": "tab:orange", "inferior": "tab:red"}
    for ax, task in zip(axes[0], tasks):
        d = table[table["task"] == task].set_index("method")
        for method, r in d.iterrows():
            i = methods.index(method)
            ax.errorbar(r["diff_mean"], i, xerr=[[r["diff_mean"] - r["diff_lo"]],
                                                 [r["diff_hi"] - r["diff_mean"]]],
                        fmt="o", color=colors.get(r["call"], "gray"), capsize=3)
            if isinstance(r.get("calls"), str):  # the three answers (worse/better, NI, eq.)
                ax.text(0.02, i + 0.3, textwrap.fill(r["calls"].replace("; ", ";  "), 44),
                        fontsize=6, va="center",
                        transform=ax.get_yaxis_transform())  # x: the panel's, y: the row's
        ax.axvline(0, color="k", lw=0.8)
        if task != "all":
            ax.axvline(-d["margin"].iloc[0], color="gray", ls="--", lw=0.8)
        ax.set_title("across tasks (IQM, no call)" if task == "all" else task)
        ax.set_xlabel(f"{metric} accuracy − {reference}")
    ok = summary[(summary["status"] == "ok") & summary["method"].isin(methods)]
    pass_k = next((c for c in ok.columns if c.startswith(f"eval_{metric}_pass")), None)
    k = pass_k.rsplit("pass", 1)[1] if pass_k else "k"
    for ax, column, label in ((axes[0][-2], pass_k, f"{metric} pass@{k}"),
                              (axes[0][-1], "token_entropy_mean", "token entropy (nats)")):
        for j, (task, d) in enumerate(ok.groupby("task", sort=False)):
            if column is None or column not in d:
                continue
            g = d.groupby("method")[column].agg(["mean", "std"])
            ax.errorbar(g["mean"], [methods.index(m) + 0.15 * j for m in g.index],
                        xerr=g["std"].fillna(0), fmt="s", ms=4, capsize=2, label=task)
        ax.set_xlabel(label)
        ax.set_title(f"{label.split(' (')[0]}, per task")
        if ok["task"].nunique() > 1:
            ax.legend(fontsize=7)
    for ax in axes[0]:
        ax.set_yticks(range(len(methods)), methods)
        ax.set_ylim(len(methods) - 0.5, -0.5)
        ax.grid(alpha=0.3)
    problems = "/".join(str(int(p)) for p in sorted(table["problems"].dropna().unique()))
    fig.suptitle(textwrap.fill(
        f"{scale_label(summary)}, {problems} test problems; 95% intervals, each task's margin "
        "(dashed); non-inferiority green yes, orange inconclusive, red inferior; under each "
        "point its three answers; pass@k and token entropy: mean ± sd over seeds", 140),
        fontsize=8)
    fig.tight_layout()
    _save(fig, outputs)


def scaling(table: pd.DataFrame, outputs: list[str]) -> None:
    """results/scaling.csv (`logra.analysis.scaling`) in two panels over parameters (log):
    (a) MEASURED: each method's difference from the reference per size, its 95% interval, the
    least-squares trend over (size, seed) and the margin; (b) MEASURED: its peak-memory and
    step-time ratios to the reference; the planner's memory ratio at the hub models' sizes
    (PREDICTION, hollow)."""
    measured, trend = table[table["kind"] == "measured"], table[table["kind"] == "trend"]
    predicted, cost = table[table["kind"] == "prediction"], table[table["kind"] == "cost"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = dict(zip(dict.fromkeys(table["method"].dropna()),
                      plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for i, (method, m) in enumerate(measured.groupby("method", sort=False)):
        t = trend[trend["method"] == method].iloc[0]
        axes[0].errorbar(m["n_params"] * 1.04 ** i, m["diff_mean"], fmt="o", capsize=3,  # apart
                         yerr=[m["diff_mean"] - m["diff_lo"], m["diff_hi"] - m["diff_mean"]],
                         color=colors[method],
                         label=f"{method}: trend {t['slope_per_decade']:+.3f} "
                         f"[{t['slope_lo']:+.3f}, {t['slope_hi']:+.3f}] per decade, {t['call']}")
        x = m["n_params"].to_numpy()
        axes[0].plot(x, t["intercept"] + t["slope_per_decade"] * np.log10(x), ls=":",
                     color=colors[method])
        axes[1].plot(m["n_params"], m["memory_ratio"], "o-", color=colors[method],
                     label=f"{method}: peak memory (MEASURED)")
        axes[1].plot(m["n_params"], m["step_time_ratio"], "s--", color=colors[method],
                     alpha=0.6, label=f"{method}: step time (MEASURED)")
    for method, p in predicted.groupby("method", sort=False):
        axes[1].plot(p["n_params"], p["memory_ratio"], "o", mfc="none", color=colors[method],
                     label=f"{method}: memory per GPU (PREDICTION, planner)")
        for row in p.itertuples():
            axes[1].annotate(row.size, (row.n_params, row.memory_ratio), fontsize=6,
                             xytext=(3, 3), textcoords="offset points")
    axes[0].axhline(0, color="gray", lw=0.8)
    if len(measured):
        axes[0].axhline(-measured["margin"].iloc[0], color="red", ls="--", lw=0.8,
                        label=f"-margin {measured['margin'].iloc[0]:.3f}")
    reference = table["reference"].dropna().iloc[0]
    spent = (f"; {cost['cpu_hours'].iloc[0]:.1f} CPU h of a {cost['cap_hours'].iloc[0]:g} h "
             "cap" if len(cost) else "")
    axes[0].set(xscale="log", xlabel="parameters",
                ylabel=f"{measured['method'].iloc[0] if len(measured) else ''} − {reference}")
    axes[0].set_title("\n".join(textwrap.wrap(
        f"(a) MEASURED: difference from {reference} on the held-out primary metric, mean over "
        f"seeds with its 95% t-interval; dotted: the trend{spent}", 80)), fontsize=8)
    axes[1].axhline(1, color="gray", lw=0.8)
    axes[1].set(xscale="log", xlabel="parameters", ylabel=f"ratio to {reference}")
    axes[1].set_title("(b) MEASURED ratios here (filled); the planner's PREDICTION at scale "
                      "(hollow)", fontsize=8)
    for ax in axes:
        ax.legend(fontsize=6)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, outputs)


def study_horizons(table: pd.DataFrame, outputs: list[str]) -> None:
    """results/study/horizons.csv (`logra.analysis.study.horizon_table`) over each horizon's
    updates (log): (a) MEASURED: each contrast's mean difference at the horizon's last update
    with its 95% t-interval and that horizon's −margin; (b) MEASURED: its share of the
    reference's gain over the SFT bases with Fieller's 95% interval (an unbounded end is left
    open)."""
    m = table[table["statistic"] == "mean"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    for i, (method, t) in enumerate(m.groupby("method", sort=False)):
        x = t["steps"].to_numpy(dtype=float) * 1.03 ** i  # apart
        axes[0].errorbar(x, t["diff_mean"], fmt="o-", capsize=3, label=f"{method}",
                         yerr=[t["diff_mean"] - t["diff_lo"], t["diff_hi"] - t["diff_mean"]])
        lo = (t["gain_share"] - t["gain_share_lo"]).fillna(0).clip(lower=0)
        hi = (t["gain_share_hi"] - t["gain_share"]).fillna(0).clip(lower=0)
        axes[1].errorbar(x, t["gain_share"], yerr=[lo, hi], fmt="o-", capsize=3, label=method)
    steps = m.drop_duplicates("steps")
    axes[0].plot(steps["steps"], -steps["margin"], "r_", ms=14, label="−margin (each horizon's)")
    axes[0].axhline(0, color="gray", lw=0.8)
    reference = m["reference"].iloc[0] if len(m) else ""
    axes[0].set(xscale="log", xlabel="updates (each horizon tuned and run to its end)",
                ylabel=f"difference from {reference}")
    axes[0].set_title("\n".join(textwrap.wrap(
        f"(a) MEASURED: held-out primary metric, difference from {reference} at each "
        "horizon's last update, mean over seeds with its 95% t-interval", 70)), fontsize=8)
    axes[1].axhline(1, color="gray", lw=0.8)
    axes[1].set(xscale="log", xlabel="updates", ylabel=f"share of {reference}'s gain")
    axes[1].set_title("\n".join(textwrap.wrap(
        f"(b) MEASURED: gain over the SFT bases as a share of {reference}'s, Fieller's 95% "
        "interval (a missing bar end: unbounded)", 70)), fontsize=8)
    if len(steps):  # a panel with no finite point (a share without a gain) keeps the axis
        span = steps["steps"].to_numpy(dtype=float)
        for ax in axes:
            ax.set_xlim(span.min() / 1.5, span.max() * 1.5 * 1.03 ** len(m["method"].unique()))
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, outputs)
