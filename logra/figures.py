"""Figures (matplotlib). Every figure says what it was made with: device, model size, steps.

`reward_curves`: mean training reward per GRPO step for each task (one panel each) and method
(one line each, mean over seeds, band = ± one sd over seeds, smoothed with a moving average
whose window is stated in the legend title).
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from logra.io import atomic_path  # noqa: E402


def scale_label(summary: pd.DataFrame) -> str:
    """'cpu, 1.36M params (tiny), 50 GRPO steps, 3 seeds' from the runs in `summary`."""
    def join(values, fmt=str):
        return "/".join(fmt(v) for v in sorted(set(values)))
    return (f"{join(summary['device'])}, {join(summary['n_params'], lambda n: f'{n / 1e6:.2f}M')}"
            f" params ({join(summary['model'])}), {join(summary['steps'])} GRPO steps, "
            f"{summary['seed'].nunique()} seeds")


def _save(fig, outputs) -> None:
    for out in outputs:
        with atomic_path(out) as tmp:
            fig.savefig(tmp, format=Path(out).suffix[1:], bbox_inches="tight", dpi=150)
    plt.close(fig)


def reward_curves(summary: pd.DataFrame, metrics_paths: list[str | Path], outputs: list[str],
                  window: int = 5) -> None:
    """Metrics files live at results/runs/{task}/{method}/seed{seed}/metrics.csv."""
    frames = []
    for p in map(Path, metrics_paths):
        df = pd.read_csv(p)
        df["task"], df["method"], df["seed"] = p.parts[-4], p.parts[-3], p.parts[-2]
        frames.append(df)
    data = pd.concat(frames)
    data["reward"] = data.groupby(["task", "method", "seed"])["reward_mean"].transform(
        lambda r: r.rolling(window, min_periods=1).mean())
    tasks = sorted(data["task"].unique())
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.4), squeeze=False,
                             sharey=True)
    for ax, task in zip(axes[0], tasks):
        for method, d in data[data["task"] == task].groupby("method"):
            stats = d.groupby("step")["reward"].agg(["mean", "std"]).fillna(0)
            ax.plot(stats.index, stats["mean"], label=method)
            ax.fill_between(stats.index, stats["mean"] - stats["std"],
                            stats["mean"] + stats["std"], alpha=0.2)
        ax.set_title(task)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("training reward (mean of group)")
    axes[0][-1].legend(title=f"moving avg {window}", fontsize=8)
    fig.suptitle(f"Training reward — measured on {scale_label(summary)}", fontsize=10)
    _save(fig, outputs)
