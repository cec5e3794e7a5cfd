"""The memory and speed sweep in one process: every (size, method) point, ratios vs dense Adam.

    python benchmarks/memory_and_speed.py [--config config/config.yaml] [--sizes m1,m11] [--threads 1]

Runs `logra.harness.memory_point.measure` for the config's `memory_sweep` sizes and methods, one
after the other in this process (the Snakemake rules run the same function one point per job), and
prints the measured peak, the planner's prediction and error, update / rollout time and sync
bytes, each beside its ratio to dense Adam at the same size. Nothing is written.
"""
from __future__ import annotations

from logra.repro import pin_cpu

pin_cpu()  # before torch loads: time the kernels the workflow's CPU jobs run (logra/repro.py)

import argparse

import pandas as pd
import torch

from logra.analysis.tables import memory_sweep_table
from logra.harness.config import run_config, validate_file
from logra.harness.memory_point import measure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--sizes", help="comma-separated size names (default: all)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    config = validate_file(args.config)
    sweep = config["memory_sweep"]
    sizes = args.sizes.split(",") if args.sizes else list(sweep["sizes"])
    points = {}
    for size in sizes:
        for method in sweep["methods"]:
            cfg = run_config(config, next(iter(config["tasks"])), method, 0)
            points[size, method] = measure(sweep["sizes"][size], cfg["method"], sweep["shape"],
                                           cfg["grpo"], steps=sweep["steps"],
                                           device=config["device"],
                                           budget_bytes=cfg["memory_budget_bytes"])
    table = memory_sweep_table(points, "dense_adam")
    table["peak_MB"] = table["peak_mem_bytes"] / 2**20
    table["params_M"] = table["n_params"] / 1e6
    cols = ["size", "params_M", "method", "status", "peak_MB", "peak_mem_bytes_vs_reference",
            "planned_error", "update_time_s", "update_time_s_vs_reference", "rollout_time_s",
            "sync_bytes_per_step_vs_reference"]
    with pd.option_context("display.width", 200, "display.precision", 3):
        print(f"{config['device']}, {args.threads} thread(s), shape {sweep['shape']}")
        print(table[cols].to_string(index=False))


if __name__ == "__main__":
    main()
